"""The monitor's charts (``p``): loss, throughput and step time per rank over their recent steps,
drawn with textual-plotext (plotext's line plots in a Textual widget), one line per rank.

A run of many ranks shows :data:`MAX_SERIES` of them: the focused rank, the ranks flagged SLOW
and the rank the run is blamed on first, then the lowest ranks. Drawn by
:class:`tui.screens.monitor.MonitorScreen` from its snapshot while shown; a chart whose data
did not change is not drawn again (plotext builds the whole canvas each time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual_plotext import PlotextPlot

from engine.monitor.state import RankState, Snapshot

MAX_SERIES = 6
"""Ranks drawn at once: more lines than this are a tangle in a terminal cell grid."""
CHARTS = ("loss", "throughput", "step")
"""The charts, by id suffix: ``#chart-loss``, ``#chart-throughput``, ``#chart-step``."""


def pick_ranks(snap: Snapshot, focused: int | None, root: int | None) -> list[int]:
    """The ranks drawn: the focused one, the blamed one and the SLOW ones first, then the
    lowest, :data:`MAX_SERIES` in all (in rank order)."""
    first = [r for r in (focused, root) if r is not None and r in snap.ranks]
    first += [r for r, st in sorted(snap.ranks.items()) if st.straggler]
    chosen: list[int] = []
    for r in [*first, *sorted(snap.ranks)]:
        if r not in chosen:
            chosen.append(r)
        if len(chosen) == MAX_SERIES:
            break
    return sorted(chosen)


def series(st: RankState, chart: str) -> list[float]:
    if chart == "loss":
        return list(st.loss_history)
    if chart == "throughput":
        return list(st.tps_history)
    return list(st.step_time_history)


class RankCharts(Horizontal):
    """Three plots side by side; hidden (class ``-hidden``) until ``p``."""

    DEFAULT_CSS = """
    RankCharts { height: 14; border-top: hkey $panel-lighten-2; }
    RankCharts.-hidden { display: none; }
    RankCharts PlotextPlot { width: 1fr; height: 1fr; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, classes="-hidden")
        self.drawn: dict[str, dict[int, list[float]]] = {}
        """What each chart shows, by chart then rank (for tests, and to skip a redraw)."""
        self.titles: dict[str, str] = {}

    def compose(self) -> ComposeResult:
        for chart in CHARTS:
            yield PlotextPlot(id=f"chart-{chart}")

    def show(self, snap: Snapshot, focused: int | None, root: int | None) -> None:
        ranks = pick_ranks(snap, focused, root)
        units = {snap.ranks[r].throughput_unit for r in ranks if snap.ranks[r].tps_history}
        unit = units.pop() if len(units) == 1 else "throughput"
        titles = {"loss": "loss", "throughput": unit, "step": "step time (s)"}
        for chart in CHARTS:
            data = {r: series(snap.ranks[r], chart) for r in ranks}
            data = {r: v for r, v in data.items() if v}
            if self.drawn.get(chart) == data and self.titles.get(chart) == titles[chart]:
                continue
            self.drawn[chart] = data
            self.titles[chart] = titles[chart]
            self._draw(self.query_one(f"#chart-{chart}", PlotextPlot), titles[chart], data)

    @staticmethod
    def _draw(plot: PlotextPlot, title: str, data: Mapping[int, Sequence[float]]) -> None:
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(title if data else f"{title}: no steps yet")
        plt.xlabel("step")
        for rank, values in data.items():
            plt.plot(list(range(1, len(values) + 1)), list(values), label=f"r{rank}")
        plot.refresh()
