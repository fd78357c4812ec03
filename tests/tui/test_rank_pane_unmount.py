"""A pane the compositor paints once more after it was removed (its map still holds it until
the next layout) must draw, not raise: Textual clears a removed widget's component styles, and
the monitor's relayout removes and re-creates panes under a running firehose. This was the
intermittent ``KeyError: 'rank-pane--tag'`` of tests/tui/test_wizard_launch.py."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.strip import Strip

from tui.widgets.nccl_pane import NcclPane
from tui.widgets.rank_pane import PaneBuffer, RankPane


class _Panes(App[None]):
    def compose(self) -> ComposeResult:
        yield RankPane(PaneBuffer(100, tagged=True), "n0", id="node")
        yield NcclPane(100, id="nccl")


def test_a_removed_pane_still_paints_its_last_frame() -> None:
    async def go() -> None:
        app = _Panes()
        async with app.run_test(size=(80, 24)) as pilot:
            node = app.query_one("#node", RankPane)
            nccl = app.query_one("#nccl", NcclPane)
            node.write_lines(["hello", "Traceback (most recent call last):"], tag=1)
            nccl.write_lines(["NCCL INFO Using network Socket"], tag=0)
            nccl.warning = "NCCL chose Socket — fix: set NCCL_IB_HCA"
            node.set_pattern(None)
            await pilot.pause()
            for pane in (node, nccl):
                await pane.remove()
                assert not pane.is_attached
                assert len(pane.render_lines(Region(0, 0, 40, 3))) == 3
                assert isinstance(pane.render_line(0), Strip)

    asyncio.run(go())
