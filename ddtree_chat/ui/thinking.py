"""Split a streamed reply into "thinking" (between <think> and </think>) and the answer.

With thinking on, the generation prompt already opened <think>, so the reply starts
inside the thinking part and only the closing tag appears in the stream.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


class ThinkSplitter:
    def __init__(self, in_think: bool):
        self.in_think = in_think
        self.thinking = ""
        self.answer = ""
        self._tail = ""  # a possible partial tag held back until the next chunk decides it

    def feed(self, text: str) -> tuple[str, str]:
        """Return (new thinking text, new answer text) for this chunk."""
        text = self._tail + text
        self._tail = ""
        think_out, answer_out = [], []
        while text:
            tag = CLOSE if self.in_think else OPEN
            at = text.find(tag)
            if at >= 0:
                (think_out if self.in_think else answer_out).append(text[:at])
                text = text[at + len(tag):]
                self.in_think = not self.in_think
                continue
            keep = _partial_suffix(text, tag)
            (think_out if self.in_think else answer_out).append(text[: len(text) - keep])
            self._tail = text[len(text) - keep:]
            break
        think, answer = "".join(think_out), "".join(answer_out)
        if not self.answer:
            answer = answer.lstrip()  # the blank line after </think> is not part of the answer
        self.thinking += think
        self.answer += answer
        return think, answer

    def flush(self) -> tuple[str, str]:
        """End of stream: a held-back partial tag was just text."""
        tail, self._tail = self._tail, ""
        if not tail:
            return "", ""
        if self.in_think:
            self.thinking += tail
            return tail, ""
        self.answer += tail
        return "", tail


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_text(text: str, in_think: bool) -> tuple[str, str]:
    s = ThinkSplitter(in_think)
    s.feed(text)
    s.flush()
    return s.thinking, s.answer
