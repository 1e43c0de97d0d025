"""Up/Down in the input walk this chat's earlier messages, like a shell's history."""

from __future__ import annotations


class Recall:
    """Steps through `entries` (oldest first) while the input is empty or shows an unedited recalled entry."""

    def __init__(self):
        self.pos: int | None = None
        self.shown: str | None = None

    def reset(self) -> None:
        self.pos = self.shown = None

    def step(self, entries: list[str], text: str, delta: int) -> str | None:
        """The text the input should show after Up (delta -1) or Down (+1); None: not ours (move the cursor)."""
        browsing = self.pos is not None and text == self.shown
        if not entries or (text and not browsing):
            return None
        if not browsing:
            if delta > 0:
                return None
            self.pos = len(entries)
        pos = max(0, self.pos + delta)
        if pos >= len(entries):  # down past the newest: back to an empty input
            self.reset()
            return ""
        self.pos, self.shown = pos, entries[pos]
        return self.shown
