"""How a reply's text reads as Markdown (the chat view and the exports share it; no Textual here)."""

from __future__ import annotations

import re

# A reply that opens like Python source (the demo coder answers with bare code) is shown as a code block.
_CODE_START = re.compile(r"\s*(def |async def |class |import |from \S+ import |@\w)")


def looks_like_code(answer: str) -> bool:
    return "```" not in answer and bool(_CODE_START.match(answer))


def answer_markdown(answer: str) -> str:
    return f"```python\n{answer}\n```" if looks_like_code(answer) else answer
