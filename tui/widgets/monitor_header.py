"""The monitor's header row: the run's name and state, ranks and nodes, lines so far, and what
the grid shows (view, page, zoom, filter), with the error count when there are errors.

One row, always: an update repaints it and never lays the screen out again (it changes with
every batch). Colours are component classes (the terminal's ANSI colours the monitor always
used), not Python strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from engine.monitor.state import Snapshot
from engine.rundir.record import FINAL_STATES, RunState
from tui.format import plural

if TYPE_CHECKING:  # the grid is handed in; this module never makes one
    from tui.widgets.pane_grid import PaneGrid

_STATE_CLASS: dict[str, str] = {
    RunState.FAILED: "failed",
    RunState.SUCCEEDED: "succeeded",
    RunState.STOPPED: "stopped",
}
"""Run state -> its component class (``monitor-header--<name>``); any other (starting, running,
or a state a newer launcher wrote) is ``live``."""


GENERIC_START = "starting "
"""How a launch backend's own STARTING message begins ("starting 8 ranks on 2 node(s)"): the
header says it its own way. Any other message (a Slurm job pending) is what is happening."""


def starting_text(run_state: str, snap: Snapshot, nodes: int = 0) -> str | None:
    """What the run is doing while no rank has printed a line yet (torchrun and Python's
    imports take seconds), e.g. ``launching torchrun on 2 nodes…``; None once a rank line
    came, or the run is over."""
    if run_state in FINAL_STATES or any(st.lines for st in snap.ranks.values()):
        return None
    if run_state == RunState.STARTING and snap.run_message:
        if not snap.run_message.startswith(GENERIC_START):
            return f"{snap.run_message}…"
    where = f" on {plural(nodes, 'node')}" if nodes > 0 else ""
    if run_state == RunState.STARTING:
        return f"launching torchrun{where}…"
    return f"torchrun started{where}; waiting for the first rank line…"


class MonitorHeader(Static):
    COMPONENT_CLASSES = {
        "monitor-header--badge",
        "monitor-header--title",
        "monitor-header--live",
        "monitor-header--failed",
        "monitor-header--succeeded",
        "monitor-header--stopped",
        "monitor-header--emphasis",
        "monitor-header--filter",
        "monitor-header--errors",
    }
    DEFAULT_CSS = """
    MonitorHeader { height: 1; background: $panel; padding: 0 1; }
    MonitorHeader > .monitor-header--badge { text-style: bold reverse; }
    MonitorHeader > .monitor-header--title { text-style: bold; }
    MonitorHeader > .monitor-header--live { color: ansi_cyan; }
    MonitorHeader > .monitor-header--failed { color: ansi_red; text-style: bold; }
    MonitorHeader > .monitor-header--succeeded { color: ansi_green; }
    MonitorHeader > .monitor-header--stopped { color: ansi_yellow; }
    MonitorHeader > .monitor-header--emphasis { text-style: bold; }
    MonitorHeader > .monitor-header--filter { color: ansi_yellow; text-style: bold; }
    MonitorHeader > .monitor-header--errors { color: ansi_red; text-style: bold; }
    """

    def show(
        self,
        title: str,
        run_state: str,
        snap: Snapshot,
        lines: int,
        grid: PaneGrid,
        *,
        nodes: int = 0,
    ) -> None:
        """Redraw the row: ``lines`` delivered so far; view, page, zoom and filter of ``grid``;
        ``nodes``: the nodes launched (0: not known), said while no rank has printed yet."""
        part = self._part
        header = Text(no_wrap=True, overflow="ellipsis")
        header.append(" monitor ", part("badge"))
        header.append(f" {title} ", part("title"))
        header.append(f"● {run_state}", part(_STATE_CLASS.get(run_state, "live")))
        starting = starting_text(run_state, snap, nodes)
        if starting is not None:
            # Seconds of "0 ranks · 0 lines" say nothing: say what is happening instead.
            header.append(f": {starting}", part("live"))
            if snap.errors:  # a node's error before any rank printed (ssh, torchrun itself)
                header.append(f"  {plural(len(snap.errors), 'error')}", part("errors"))
            self.update(header, layout=False)
            return
        if grid.root_cause is not None and run_state == RunState.FAILED:
            # Early in the row: a narrow terminal cuts the row's end, never this.
            header.append(f" · root cause: rank {grid.root_cause}", part("errors"))
        # What changes what the user sees (errors, filter, zoom, page) before the counts: at
        # 80 columns the run's name and state fill most of the row and its end is cut.
        if snap.errors:
            n = len(snap.errors)
            header.append(f"  {n} error{'s' if n > 1 else ''}", part("errors"))
        if grid.pattern is not None:
            header.append(f"  filter {grid.pattern.text!r}", part("filter"))
        if grid.zoomed:
            header.append(f"  zoom {grid.zoomed}", part("emphasis"))
        if grid.pages > 1:
            header.append(f"  page {grid.page + 1}/{grid.pages}", part("emphasis"))
        nodes = len({st.node for st in snap.ranks.values()}) or 1
        ranks = len(snap.ranks)
        header.append(
            f"  {ranks} rank{'' if ranks == 1 else 's'} · {nodes} node{'s' if nodes > 1 else ''}"
        )
        header.append(f"  {plural(lines, 'line')}")
        header.append(f"  view {grid.view}")
        self.update(header, layout=False)  # one row, always

    def _part(self, name: str) -> Style:
        return self.get_component_rich_style(f"monitor-header--{name}", partial=True)
