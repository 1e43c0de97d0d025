"""Tree-visualisation debug pane: one round of the current reply in full, steppable."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Static

from ddtree_chat.ui.tree_layout import show_piece

COLUMNS = ("node", "token id", "text", "depth", "parent", "draft logp", "target's choice", "accepted")


class DebugPane(Vertical, can_focus=False):
    BINDINGS = [
        Binding("left_square_bracket", "step(-1)", "Prev round", show=False),
        Binding("right_square_bracket", "step(1)", "Next round", show=False),
        Binding("left_curly_bracket", "first", "First round", show=False),
        Binding("right_curly_bracket", "last", "Latest round", show=False),
    ]

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = "Round detail"
        self.rounds: list[dict] = []
        self.index: int | None = None  # None: follow the newest round
        self.piece = str

    def compose(self) -> ComposeResult:
        yield Static("no rounds yet", id="debug-header")
        table = DataTable(id="debug-table", zebra_stripes=True, cursor_type="row")
        table.add_columns(*COLUMNS)
        yield table

    @property
    def current(self) -> int:
        if not self.rounds:
            return -1
        return len(self.rounds) - 1 if self.index is None else self.index

    def reset(self, piece) -> None:
        self.piece = piece
        self.rounds = []
        self.index = None
        self.refresh_view()

    def add_rounds(self, rounds: list[dict]) -> None:
        self.rounds.extend(ev for ev in rounds if not ev.get("prefill"))  # NOTE: the prompt's forward drafts no tree
        if self.index is None and self.display:
            self.refresh_view()

    def action_step(self, delta: int) -> None:
        if not self.rounds:
            return
        target = max(0, min(len(self.rounds) - 1, self.current + delta))
        self.index = None if target == len(self.rounds) - 1 and delta > 0 else target
        self.refresh_view()

    def action_first(self) -> None:
        if self.rounds:
            self.index = 0
            self.refresh_view()

    def action_last(self) -> None:
        self.index = None
        self.refresh_view()

    def refresh_view(self) -> None:
        header = self.query_one("#debug-header", Static)
        table = self.query_one(DataTable)
        table.clear()
        i = self.current
        if i < 0:
            header.update("no rounds yet — send a message")
            return
        ev = self.rounds[i]
        tree = ev.get("tree") or {}
        follow = " (following)" if self.index is None else ""
        header.update(Text.assemble(
            ("round ", "dim"), (f"{i + 1}/{len(self.rounds)}", "bold"), (follow, "dim"),
            ("   accepted ", "dim"), (str(ev.get("accepted_length", len(ev.get("token_ids") or ()))), "bold green"),
            ("   nodes ", "dim"), (str(len(tree.get("tokens") or ())), "bold"),
            ("   F3 prev  F4 next  ([ ] { } when the table has focus)", "dim"),
        ))
        for row in round_rows(tree, self.piece):
            table.add_row(*row)

    def on_show(self) -> None:
        self.refresh_view()


def round_rows(tree: dict, piece) -> list[tuple]:
    tokens = tree.get("tokens") or []
    n = len(tokens)
    parents = tree.get("parents") or [-1] * n
    depth = tree.get("depth") or [0] * n
    logp = tree.get("draft_logprobs") or [None] * n
    target = tree.get("target_tokens") or [None] * n
    accepted = set(tree.get("accepted_nodes") or ())
    rows = []
    for i, tok in enumerate(tokens):
        ok = i in accepted
        style = "bold green" if ok else ""
        tgt = target[i] if i < len(target) else None
        rows.append((
            Text(str(i), style=style), Text(str(tok), style=style), Text(show_piece(piece(tok), 18), style=style),
            str(depth[i] if i < len(depth) else ""), "root" if parents[i] < 0 else str(parents[i]),
            "" if logp[i] is None or parents[i] < 0 else f"{float(logp[i]):.3f}",
            "" if tgt is None else f"{show_piece(piece(tgt), 12)} ({tgt})",
            Text("yes" if ok else "no", style="bold green" if ok else "dim"),
        ))
    return rows
