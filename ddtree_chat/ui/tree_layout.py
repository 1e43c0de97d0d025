"""Lay out one DDTree round's draft tree as a few readable lines (pure logic, no Textual).

The accepted path is drawn as an unindented spine, so a deep tree never grows wider than
the panel; at each step the drafter's best rejected alternatives hang off the spine, each
compressed to its most likely continuation plus a count of the nodes it hides. When the
tree is too big for the line budget, fewer alternatives are shown and the rest are
summed up in "+N more" lines. This keeps 8..256-node trees readable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Line:
    kind: str  # "root" | "accepted" | "rejected" | "more" | "bonus" | "summary"
    text: str  # token text (already made visible) or the message
    extra: str = ""  # dimmed continuation (best chain below a rejected node, counts)
    node: int | None = None
    depth: int = 0


def show_piece(piece: str, width: int = 14) -> str:
    """Make a token's text visible on one line: spaces at the edges, newlines, tabs."""
    text = piece.replace("\n", "⏎").replace("\t", "⇥").replace("\r", "")
    if text.startswith(" "):
        text = "␣" + text[1:]
    if text.endswith(" ") and len(text) > 1:
        text = text[:-1] + "␣"
    if not text:
        text = "∅"
    return text if len(text) <= width else text[: width - 1] + "…"


class _Tree:
    def __init__(self, tree: dict):
        self.tokens = list(tree.get("tokens") or [])
        n = len(self.tokens)
        self.parents = list(tree.get("parents") or [-1] * n)
        self.depth = list(tree.get("depth") or [0] * n)
        self.logp = list(tree.get("draft_logprobs") or [0.0] * n)
        self.accepted = list(tree.get("accepted_nodes") or ([0] if n else []))
        self.target = list(tree.get("target_tokens") or [])
        self.children: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(self.parents):
            if 0 <= p < n and p != i:
                self.children[p].append(i)
        for kids in self.children:
            kids.sort(key=lambda k: (-self.logp[k], k))
        self._size: dict[int, int] = {}

    def size(self, node: int) -> int:
        """Nodes in the subtree at `node`, itself included (iterative: trees can be deep)."""
        if node not in self._size:
            order, stack = [], [node]
            while stack:
                v = stack.pop()
                order.append(v)
                stack.extend(self.children[v])
            for v in reversed(order):
                self._size[v] = 1 + sum(self._size[c] for c in self.children[v])
        return self._size[node]


def layout(tree: dict, piece: Callable[[int], str], max_lines: int = 40, max_siblings: int = 3, chain_len: int = 3) -> list[Line]:
    t = _Tree(tree)
    if not t.tokens:
        return [Line("summary", "no draft tree this round (autoregressive step)")]
    # Shrink step by step: fewer alternatives per step, then no "+N more" lines, then cut.
    attempts = [(k, True) for k in range(max_siblings, -1, -1)] + [(0, False)]
    for siblings, show_more in attempts:
        lines = _lines(t, piece, siblings, chain_len, show_more)
        if len(lines) <= max_lines:
            return lines
    keep = max(max_lines - 3, 1)
    return lines[:keep] + [Line("more", f"… {len(lines) - keep - 2} more accepted steps")] + lines[-2:]


def _lines(t: _Tree, piece: Callable[[int], str], siblings: int, chain_len: int, show_more: bool = True) -> list[Line]:
    out: list[Line] = []
    path = t.accepted
    for step, node in enumerate(path):
        kind = "root" if step == 0 else "accepted"
        out.append(Line(kind, show_piece(piece(t.tokens[node])), node=node, depth=t.depth[node]))
        nxt = path[step + 1] if step + 1 < len(path) else None
        others = [k for k in t.children[node] if k != nxt]
        for k in others[:siblings]:
            out.append(_rejected(t, piece, k, chain_len))
        hidden = others[siblings:]
        if hidden and show_more:
            nodes = sum(t.size(k) for k in hidden)
            out.append(Line("more", f"+{len(hidden)} more", f"({nodes} node{'' if nodes == 1 else 's'})", depth=t.depth[node] + 1))
    last = path[-1] if path else 0
    if last < len(t.target):
        out.append(Line("bonus", show_piece(piece(t.target[last])), "target's token", depth=t.depth[last] + 1))
    drafted = len(t.tokens) - 1
    max_depth = max(t.depth) if t.depth else 0
    out.append(Line("summary", f"{drafted} drafted · depth {max_depth} · accepted {len(path) - 1}"))
    return out


def _rejected(t: _Tree, piece: Callable[[int], str], node: int, chain_len: int) -> Line:
    chain, v = [], node
    while t.children[v] and len(chain) < chain_len:
        v = t.children[v][0]
        chain.append(show_piece(piece(t.tokens[v]), 8))
    shown = 1 + len(chain)
    rest = t.size(node) - shown
    extra = (" → " + " ".join(chain) if chain else "") + (f" (+{rest})" if rest > 0 else "")
    return Line("rejected", show_piece(piece(t.tokens[node])), extra, node=node, depth=t.depth[node])
