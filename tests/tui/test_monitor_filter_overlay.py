"""The monitor's filter box opens over the bottom of the screen, on a layer of its own: the rank
panes keep their size (opening it lays out and redraws no pane), and it takes the keys."""

from __future__ import annotations

import asyncio

from engine.monitor.tail import ListSource
from tests.test_screenshots import _screenshots
from tests.tui.wizard_support import until
from tui.screens.monitor import MonitorApp
from tui.widgets.filter_box import FilterBox
from tui.widgets.rank_pane import RankPane


async def _open_filter() -> None:
    shots = _screenshots()
    app = MonitorApp(ListSource(shots.failed_run()), world_size=4, clock=lambda: shots.CLOCK)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(
            pilot,
            lambda: app.monitor is not None and app.monitor.finished is not None,
            "the run's end",
        )
        m = app.monitor
        assert m is not None
        await pilot.pause()
        panes = list(m.query(RankPane))
        assert panes
        before = [p.region for p in panes]
        await pilot.press("slash")
        box = m.query_one(FilterBox)
        await until(pilot, lambda: box.is_open and box.has_focus, "the filter box")
        await pilot.pause()
        assert [p.region for p in panes] == before  # no pane laid out again
        assert box.region.bottom == app.size.height  # at the bottom of the screen
        await pilot.press(*"OutOfMemory", "enter")
        await until(pilot, lambda: m.grid.pattern is not None, "the filter")
        assert not box.is_open


def test_the_filter_box_opens_over_the_panes_without_laying_them_out() -> None:
    asyncio.run(_open_filter())
