"""A batch of rank lines that reaches the wizard's live monitor while the app shuts down draws
nothing. Back in the wizard the monitor stays installed but off the screen stack; at exit
Textual closes such a screen node by node, in no order, and CI saw the chart's label gone while
the screen still handled a batch (NoMatches('#chart-loss-label'), test_monitor_ux under load)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Label

from engine.plan.specs import demo_spec
from tests.tui.test_monitor_ux import Gentle, _run_json
from tests.tui.wizard_support import until
from tui.app import DtrainApp
from tui.lifecycle import torn_down
from tui.messages import RankLinesReceived, RunStarted
from tui.screens.monitor import MonitorScreen
from tui.screens.wizard import WizardScreen
from tui.widgets.rank_chart import RankChart


def test_lines_for_a_monitor_half_closed_at_exit_are_not_a_crash(tmp_path: Path) -> None:
    async def go() -> None:
        run = tmp_path / "runs" / "20261127-010000-live"
        _run_json(run)
        src = Gentle()
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", run_root=run.parent)
        async with app.run_test(size=(120, 40)) as pilot:
            app.post_message(RunStarted(src, run))
            await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor")
            m: MonitorScreen = app.live_monitor
            await until(pilot, lambda: m.delivered > 0, "no lines")
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, WizardScreen), "not back")
            assert not torn_down(m)
            # What App._shutdown does: stop running, then close the nodes one by one; here
            # the chart's label first, the screen still there to handle a batch.
            label = m.query_one(RankChart).query_one("#chart-loss-label", Label)
            await label.remove()
            app._running = False
            try:
                assert torn_down(m)
                snap = m.snapshot
                await m.on_rank_lines_received(RankLinesReceived({}, {}, [], snap, 0))
                m._render_chrome()
            finally:
                app._running = True
            src.stop()

    asyncio.run(go())
