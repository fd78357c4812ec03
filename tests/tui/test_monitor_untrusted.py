"""Escape sequences in rank output never reach the terminal through the monitor's panes."""

from __future__ import annotations

import asyncio

from engine.monitor.textsafe import has_control
from engine.rundir.events import LineBatch, LineEvent, RankExit, RunStateChanged
from tests.engine.test_untrusted_files import HOSTILE
from tests.tui.test_monitor import CLOCK, app_for, settle
from tui.widgets.rank_pane import RankPane


def test_rank_node_and_nccl_panes_hold_and_draw_no_control_character() -> None:
    asyncio.run(_panes())


async def _panes() -> None:
    batches = [
        [RunStateChanged("running", "started", CLOCK)],
        [LineBatch(0, 0, "stdout", tuple(HOSTILE)), LineBatch(0, 1, "stdout", ("ok",))],
        [LineEvent(0, 1, "stderr", "\x1b]52;c;cHduZWQ=\x07 NCCL WARN \x1b[2Jboom")],
        [LineBatch(0, None, "stdout", ("\x1b]0;node title\x07launcher up",))],
        [RankExit(0, 0, 0, CLOCK), RankExit(0, 1, 0, CLOCK)],
        [RunStateChanged("succeeded", "done", CLOCK)],
    ]
    app = app_for(batches, world=2)
    async with app.run_test(size=(160, 48)) as pilot:
        m = await settle(pilot)
        for key in ("r0", "r1", "nccl"):
            lines = m.pane_lines(key)
            assert lines, key
            assert not any(has_control(x) for x in lines), (key, lines)
        assert "clipboard" in m.pane_lines("r0")
        for pane in m.query(RankPane):
            for y in range(pane.size.height):
                text = "".join(seg.text for seg in pane.render_line(y))
                assert not has_control(text), (pane.key, text)
        await pilot.press("q")
