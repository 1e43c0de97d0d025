"""Live DDTree panel: the latest round's draft tree, accepted lengths, running numbers."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Sparkline, Static

from ddtree_chat.modes import Mode
from ddtree_chat.ui.tree_layout import Line, layout

STYLES = {
    "root": ("●", "bold"),
    "accepted": ("✓", "bold green"),
    "rejected": ("·", "dim"),
    "more": (" ", "dim italic"),
    "bonus": ("★", "bold yellow"),
    "summary": ("", "italic"),
}
SPARK_ROUNDS = 48


def render_lines(lines: list[Line]) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for line in lines:
        mark, style = STYLES[line.kind]
        if line.kind in ("rejected", "more"):
            text.append("  ├ ", style="dim")
        elif line.kind == "summary":
            text.append("\n")
        if mark.strip():
            text.append(mark + " ", style=style)
        text.append(line.text, style=style + (" reverse" if line.kind == "accepted" else ""))
        if line.extra:
            text.append(" " + line.extra.strip() if line.kind != "rejected" else line.extra, style="dim")
        text.append("\n")
    text.rstrip()
    return text


def device_label(info: dict) -> str:
    """e.g. "cuda:0 graphs", "cuda ×8", "cpu": where the engine runs and whether rounds replay CUDA graphs."""
    device = str(info.get("device", "–"))
    if int(info.get("tp") or 1) > 1:
        device = f"{device} ×{info['tp']}"
    return f"{device} graphs" if info.get("cuda_graphs") else device


class Stats:
    """Running numbers for the reply in progress (from event data only: no UI clock).

    Counted as the engine's done event counts them: the prompt's forward (the "prefill"
    event) adds a token and a forward but no round, so the panel and the reply footer agree.
    """

    def __init__(self):
        self.rounds = 0
        self.forwards = 0
        self.tokens = 0
        self.elapsed = 0.0
        self.done: dict | None = None

    def add(self, ev: dict) -> None:
        self.rounds += 0 if ev.get("prefill") else 1
        self.forwards += 1
        self.tokens += len(ev.get("token_ids") or ())
        self.elapsed += float(ev.get("elapsed_s") or 0.0)  # NOTE: the engine reports per-round time

    @property
    def tokens_per_second(self) -> float | None:
        if self.done and self.done.get("tokens_per_second") is not None:
            return float(self.done["tokens_per_second"])
        return self.tokens / self.elapsed if self.elapsed > 0 else None

    @property
    def per_forward(self) -> float | None:
        if self.done and self.done.get("mean_accepted_length") is not None:
            return float(self.done["mean_accepted_length"])
        return self.tokens / self.forwards if self.forwards else None


class TreePanel(Vertical):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = "DDTree"
        self.lengths: deque[int] = deque(maxlen=SPARK_ROUNDS)
        self.stats = Stats()
        self.info: dict = {}
        self.mode = "-"
        self.budget: int | None = None
        self.piece = str
        self.last_round: dict | None = None
        self.last_tree: dict | None = None  # the last round that drafted: shown while auto runs plain steps

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="tree-scroll"):
            yield Static("waiting for the first round…", id="tree-view")
        yield Label("accepted tokens per round", id="spark-label")
        yield Sparkline(list(self.lengths), id="accept-spark", summary_function=max)
        yield Static("", id="tree-stats")

    def on_mount(self) -> None:
        self._render_stats()

    def configure(self, info: dict, piece, mode: str, budget: int | None) -> None:
        self.info, self.piece, self.mode, self.budget = info, piece, mode, budget
        self._render_stats()

    def reset(self) -> None:
        """A new chat: no tree, no history of accepted lengths, no numbers."""
        self.lengths.clear()
        self.last_round = self.last_tree = None
        self.stats = Stats()
        self.query_one("#tree-view", Static).update("waiting for the first round…")
        self.query_one(Sparkline).data = []
        self._render_stats()

    def start_reply(self, mode: str, budget: int | None) -> None:
        self.mode, self.budget = mode, budget
        self.stats = Stats()
        self._render_stats()

    def add_rounds(self, rounds: list[dict]) -> None:
        if not rounds:
            return
        for ev in rounds:
            self.stats.add(ev)
            self.lengths.append(int(ev.get("accepted_length") or len(ev.get("token_ids") or ())))
            if len((ev.get("tree") or {}).get("tokens") or ()) > 1:
                self.last_tree = ev
        self.last_round = rounds[-1]
        self.mode = rounds[-1].get("mode", self.mode)
        self.budget = rounds[-1].get("budget", self.budget)
        self._render_tree(rounds[-1])
        self.query_one(Sparkline).data = list(self.lengths)
        self._render_stats()

    def finish(self, done: dict) -> None:
        self.stats.done = done
        self._render_stats()

    def _render_tree(self, ev: dict) -> None:
        height = max(8, self.query_one("#tree-scroll").size.height or 20)
        note = None
        if ev.get("auto_budget") and ev.get("mode") == Mode.AR:  # NOTE: auto found no tree that pays
            note = Text("auto: plain steps, as no tree pays here; it drafts one now and then."
                        + ("\nThe last tree:" if self.last_tree else ""), style="dim italic")
            ev = self.last_tree or ev
        taken = len(note.split()) if note is not None else 0  # the note's lines
        lines = layout(ev.get("tree") or {}, self.piece, max_lines=height - taken)
        view = render_lines(lines)
        self.query_one("#tree-view", Static).update(Text("\n").join([note, view]) if note is not None else view)

    def _render_stats(self) -> None:
        s, info = self.stats, self.info
        tps = f"{s.tokens_per_second:.1f}" if s.tokens_per_second is not None else "–"
        per = f"{s.per_forward:.2f}" if s.per_forward is not None else "–"
        device = device_label(info)
        rows = [
            ("tok/s", tps), ("tok/fwd", per), ("rounds", str(s.rounds)), ("tokens", str(s.tokens)),
            ("mode", self.mode or "–"), ("budget", str(self.budget) if self.budget and self.mode != Mode.AR else "–"),
            ("device", str(device)),
        ]
        text = Text()
        for i, (name, value) in enumerate(rows):
            text.append(f"{name:>7} ", style="dim")
            text.append(f"{value:<10}" if i % 2 == 0 else value, style="bold")
            if i % 2 == 1 and i < len(rows) - 1:
                text.append("\n")
        self.query_one("#tree-stats", Static).update(text)
