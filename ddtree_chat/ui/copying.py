"""What /copy takes from a reply: the answer, or its last fenced code block."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def code_blocks(markdown: str) -> list[str]:
    """The bodies of the fenced code blocks, in order (a block left open by a stopped reply runs to the end)."""
    blocks, body, fence = [], [], None
    for line in markdown.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence, body = m.group(1), []
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)):]:
            blocks.append("\n".join(body))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        blocks.append("\n".join(body))
    return blocks
