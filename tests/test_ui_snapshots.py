"""SVG snapshots of the main layout and the debug pane (deterministic fake engine, fixed size).

Update them after an intended change with: pytest tests/test_ui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from ui_fake_engine import fake_app, submit, wait_until  # noqa: E402

SIZE = (120, 40)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_CHAT_HOME", str(tmp_path))


async def _one_reply(pilot) -> None:
    app = pilot.app
    app.query_one("#input").cursor_blink = False  # NOTE: a blinking cursor differs from run to run
    await wait_until(pilot, lambda: app.engine is not None)
    await submit(pilot, "Tell me about the fox")
    await wait_until(pilot, lambda: len(app.session.messages) == 2 and not app.generating)
    await pilot.pause()


def test_main_layout_after_a_reply(snap_compare):
    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=_one_reply)


def test_narrow_layout_keeps_the_chat_wide(snap_compare):
    # NOTE: under 110 columns the tree panel leaves the chat's side; the status line says how to show it
    assert snap_compare(fake_app(), terminal_size=(90, 30), run_before=_one_reply)


def test_debug_pane_one_round_back(snap_compare):
    async def run_before(pilot):
        await _one_reply(pilot)
        await pilot.press("f2", "f3")
        await pilot.pause()

    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=run_before)


def test_thinking_expanded(snap_compare):
    async def run_before(pilot):
        await _one_reply(pilot)
        pilot.app.query_one(".thinking").collapsed = False
        await pilot.pause()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()

    assert snap_compare(fake_app(), terminal_size=SIZE, run_before=run_before)
