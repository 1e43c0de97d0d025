"""The conversation column: message widgets and the multi-line input."""

from __future__ import annotations

from rich.console import RenderableType
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static, TextArea

from ddtree_chat.ui.recall import Recall
from ddtree_chat.ui.thinking import ThinkSplitter, split_text

NEWLINE_KEYS = {"ctrl+j", "shift+enter", "alt+enter", "ctrl+enter"}


class UserMessage(Static):
    """What the user typed, shown as plain text (it is text, not markup)."""

    def __init__(self, text: str):
        super().__init__(text, markup=False, classes="message user")
        self.border_title = "You"


class Note(Static):
    """Output of a slash command, a warning or an error, inside the conversation."""

    def __init__(self, text: RenderableType, kind: str = "info"):
        super().__init__(text, markup=False, classes=f"message note {kind}")


class AssistantMessage(Vertical):
    """A reply: collapsed thinking above, the answer as streamed Markdown below."""

    def __init__(self, in_think: bool, answer: str = "", thinking: str = "", footer: str = ""):
        super().__init__(classes="message assistant")
        self.border_title = "Assistant"
        self.splitter = ThinkSplitter(in_think)
        self._started_in_think = in_think
        self._initial = (answer, thinking, footer)
        self._streams: dict[str, object] = {}

    def compose(self) -> ComposeResult:
        answer, thinking, footer = self._initial
        title = f"Thinking ({_words(thinking)} words)" if thinking else "Thinking…"
        with Collapsible(title=title, collapsed=True, classes="thinking") as c:
            c.display = bool(thinking.strip())  # shown once there is thinking text, never as an empty block
            yield Markdown(thinking, classes="thinking-text")
        yield Markdown(answer, classes="answer")
        footer_widget = Static(footer, markup=False, classes="reply-footer")
        footer_widget.display = bool(footer)
        yield footer_widget

    def _stream(self, name: str, widget: Markdown):
        if name not in self._streams:
            self._streams[name] = Markdown.get_stream(widget)
        return self._streams[name]

    async def append(self, text: str) -> None:
        think, answer = self.splitter.feed(text)
        if think:
            collapsible = self.query_one(".thinking", Collapsible)
            collapsible.display = bool(self.splitter.thinking.strip())
            collapsible.title = f"Thinking… ({_words(self.splitter.thinking)} words)"
            await self._stream("think", self.query_one(".thinking-text", Markdown)).write(think)
        if answer:
            await self._stream("answer", self.query_one(".answer", Markdown)).write(answer)

    async def finish(self, footer: str, full_text: str | None = None) -> tuple[str, str]:
        """Stop streaming and render the whole reply once (the stream may have skipped work).

        `full_text` (the engine's final text) wins over the streamed pieces when given.
        """
        self.splitter.flush()
        for stream in self._streams.values():
            await stream.stop()
        self._streams.clear()
        if full_text is not None:
            self.splitter.thinking, self.splitter.answer = split_text(full_text, self._started_in_think)
        thinking, answer = self.splitter.thinking.strip(), self.splitter.answer.strip()
        collapsible = self.query_one(".thinking", Collapsible)
        collapsible.display = bool(thinking)
        unfinished = ", unfinished" if thinking and self.splitter.in_think else ""
        collapsible.title = f"Thinking ({_words(thinking)} words{unfinished})"
        await self.query_one(".thinking-text", Markdown).update(thinking)
        await self.query_one(".answer", Markdown).update(answer)
        self.set_footer(footer)
        return thinking, answer

    def set_footer(self, footer: str) -> None:
        widget = self.query_one(".reply-footer", Static)
        widget.update(footer)
        widget.display = bool(footer)


def _words(text: str) -> int:
    return len(text.split())


class ChatInput(TextArea):
    """Enter sends; ctrl+j (or shift/alt+enter where the terminal reports them) adds a newline.

    Up/Down in an empty input recall this chat's earlier messages (`entries` gives them);
    PageUp/PageDown scroll the conversation, not the input.
    """

    BINDINGS = [
        Binding("pageup", "app.scroll_chat(-1)", "Scroll up", show=False),
        Binding("pagedown", "app.scroll_chat(1)", "Scroll down", show=False),
    ]

    class Submitted(Message):
        def __init__(self, text: str):
            super().__init__()
            self.text = text

    def __init__(self, **kwargs):
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus", **kwargs)
        self.entries = lambda: []
        self.recall = Recall()

    def give_back(self, text: str) -> None:
        """Return a message the app could not take yet; keys typed since stay after it."""
        self.text = text + self.text
        self.move_cursor(self.document.end)

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                # NOTE: cleared here, not when the app handles the message: keys typed right after
                # Enter land in an empty input instead of joining the text just sent.
                self.clear()
                self.recall.reset()
                self.post_message(self.Submitted(text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        if event.key in ("up", "down"):
            recalled = self.recall.step(self.entries(), self.text, -1 if event.key == "up" else 1)
            if recalled is not None:
                event.stop()
                event.prevent_default()
                self.text = recalled
                self.move_cursor(self.document.end)
                return
        await super()._on_key(event)
