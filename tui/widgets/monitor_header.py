"""The monitor's header row: the run's name and state, ranks and nodes, lines so far, and what
the grid shows (view, page, zoom, filter), with the error count when there are errors.

One row, always: an update repaints it and never lays the screen out again (it changes with
every batch). Colours are component classes (the terminal's ANSI colours the monitor always
used), not Python strings.
"""

from __future__ import annotations

from dataclasses import dataclass
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


MIN_TITLE = 12
"""Characters of the run's name kept however narrow the row (its date and the start of its
name: ``20261202-133…``)."""
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


def starting_short(run_state: str) -> str:
    """:func:`starting_text` for a narrow row."""
    return "launching torchrun…" if run_state == RunState.STARTING else "waiting for rank output…"


SHORTEN_TURN = 2
"""When a part's short text replaces it: after the view is left out (turn 1), before anything
else goes."""


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of the row: ``style`` a component class ("": plain), ``short`` its text where
    the row is narrow (at :data:`SHORTEN_TURN`), ``drop`` its turn to be left out (0: never),
    ``title``: the run's name, cut to what is left when nothing else can go."""

    text: str
    style: str = ""
    short: str | None = None
    drop: int = 0
    title: bool = False


def fit_parts(parts: list[Part], width: int) -> list[tuple[str, str]]:
    """(text, style) of ``parts`` fitted into ``width`` columns: as they are when they fit;
    else turn by turn (a part left out, short texts for long ones) until they do; then the
    title cut."""
    texts = [p.text for p in parts]
    kept = list(range(len(parts)))
    turns = sorted({p.drop for p in parts if p.drop} | {SHORTEN_TURN})
    for turn in turns:
        if sum(len(texts[i]) for i in kept) <= width:
            break
        if turn == SHORTEN_TURN:
            texts = [
                p.short if p.short is not None else t for p, t in zip(parts, texts, strict=True)
            ]
        kept = [i for i in kept if parts[i].drop != turn]
    over = sum(len(texts[i]) for i in kept) - width
    for i in kept:
        if over > 0 and parts[i].title:
            name = texts[i].strip()
            keep = max(MIN_TITLE, len(name) - over - 1)
            if keep < len(name):
                texts[i] = f" {name[:keep]}… "
    return [(texts[i], parts[i].style) for i in kept]


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

    _shown: tuple[str, str, Snapshot, int, PaneGrid, int] | None = None
    """What the row last showed: drawn again, fitted anew, when its width changes."""

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
        ``nodes``: the nodes launched (0: not known), said while no rank has printed yet.
        Fitted to the row's width (:func:`fit_parts`); a resize fits it again."""
        self._shown = (title, run_state, snap, lines, grid, nodes)
        parts = [Part(" monitor ", "badge", drop=3), Part(f" {title} ", "title", title=True)]
        parts.append(Part(f"● {run_state}", _STATE_CLASS.get(run_state, "live")))
        starting = starting_text(run_state, snap, nodes)
        if starting is not None:
            # Seconds of "0 ranks · 0 lines" say nothing: say what is happening instead.
            parts.append(Part(f": {starting}", "live", short=f": {starting_short(run_state)}"))
            if snap.errors:  # a node's error before any rank printed (ssh, torchrun itself)
                parts.append(Part(f"  {plural(len(snap.errors), 'error')}", "errors"))
            self._draw(parts)
            return
        if grid.root_cause is not None and run_state == RunState.FAILED:
            short = f" · root cause r{grid.root_cause}"
            parts.append(Part(f" · root cause: rank {grid.root_cause}", "errors", short=short))
        # What changes what the user sees (errors, filter, zoom, page) before the counts: at
        # 80 columns the run's name and state fill most of the row.
        if snap.errors:
            parts.append(Part(f"  {plural(len(snap.errors), 'error')}", "errors"))
        if grid.pattern is not None:
            parts.append(Part(f"  filter {grid.pattern.text!r}", "filter"))
        if grid.zoomed:
            parts.append(Part(f"  zoom {grid.zoomed}", "emphasis"))
        if grid.pages > 1:
            parts.append(Part(f"  page {grid.page + 1}/{grid.pages}", "emphasis"))
        node_count = len({st.node for st in snap.ranks.values()}) or 1
        parts.append(Part(f"  {plural(len(snap.ranks), 'rank')}"))
        parts.append(Part(f" · {plural(node_count, 'node')}", drop=5))
        parts.append(Part(f"  {plural(lines, 'line')}", drop=4))
        parts.append(Part(f"  view {grid.view}", drop=1))
        self._draw(parts)

    def on_resize(self) -> None:
        if self._shown is not None:
            self.show(*self._shown[:5], nodes=self._shown[5])

    def _draw(self, parts: list[Part]) -> None:
        width = self.content_region.width or 10_000  # not laid out yet: all of it
        header = Text(no_wrap=True, overflow="ellipsis")
        for text, style in fit_parts(parts, width):
            header.append(text, self._part(style) if style else "")
        self.update(header, layout=False)  # one row, always

    def _part(self, name: str) -> Style:
        return self.get_component_rich_style(f"monitor-header--{name}", partial=True)
