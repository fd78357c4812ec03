"""The monitor's side panel: the rank table, the loss / throughput chart of the focused rank (or
the first), and the error list. ``t`` hides it; below a width the screen starts with it hidden."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Label

from engine.monitor.state import Snapshot
from tui.widgets.error_list import ErrorList
from tui.widgets.rank_chart import RankChart
from tui.widgets.rank_table import RankTable


class MonitorSide(Vertical):
    DEFAULT_CSS = """
    MonitorSide { width: 52; border-left: vkey $panel-lighten-2; }
    MonitorSide.-hidden { display: none; }
    MonitorSide #rank-table { height: 1fr; }
    MonitorSide #errors-title { color: $error; padding: 0 1; }
    MonitorSide #error-list { height: auto; max-height: 8; }
    """

    def __init__(self, *, idle_after_s: float, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.idle_after_s = idle_after_s

    def compose(self) -> ComposeResult:
        yield RankTable(idle_after_s=self.idle_after_s, id="rank-table")
        yield RankChart(id="rank-chart")
        yield Label("errors", id="errors-title")
        yield ErrorList(id="error-list")

    def show(
        self,
        snap: Snapshot,
        selected: int | None,
        error_cursor: int | None,
        root_cause: int | None = None,
    ) -> None:
        """Redraw from ``snap``; ``selected``: the focused rank (None: none focused);
        ``root_cause``: the rank a failed run is blamed on (marked, its peers dimmed)."""
        self.query_one(RankTable).show(snap, selected, root_cause)
        if selected is None and snap.ranks:
            selected = min(snap.ranks)
        self.query_one(RankChart).show(snap.ranks.get(selected) if selected is not None else None)
        self.query_one(ErrorList).show(snap.errors, error_cursor)
