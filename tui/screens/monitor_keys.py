"""The monitor's keys over its layout: focus, zoom, pages, rank / node view, the side panel and
the NCCL pane, the filter, the next error, leaving and help. :class:`MonitorKeys` is the base
of :class:`tui.screens.monitor.MonitorScreen`, which builds the widgets, reads the run and owns
the bindings (the help lists them); here is only what a key does to what is on screen.
"""

from __future__ import annotations

from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Input

from engine.monitor.compare import PlanFigures, compare
from engine.monitor.logparse import ErrorKind
from engine.monitor.machines import machines
from engine.monitor.state import ErrorRecord, Snapshot
from tui.screens.monitor_help import MonitorHelp
from tui.widgets.charts import RankCharts
from tui.widgets.filter_box import FilterBox
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.monitor_side import MonitorSide
from tui.widgets.nccl_pane import NcclPane
from tui.widgets.pane_grid import PaneGrid
from tui.widgets.plan_line import PlanLine
from tui.widgets.rank_pane import LinePattern, RankPane

SIDE_MIN_SCREEN_WIDTH = 110
"""Below this width the rank table / chart / error side panel is hidden (``t`` shows it), and
it comes back when the terminal is widened again, unless ``t`` chose otherwise."""


def first_error(errors: tuple[ErrorRecord, ...] | list[ErrorRecord], root: int | None) -> int:
    """Where the first ``e`` goes: the root-cause rank's first error, else the first error that
    is not torchrun's ``ChildFailedError`` wrapper (which only repeats a rank's failure)."""
    for i, rec in enumerate(errors):
        if root is not None and rec.rank == root and rec.kind != ErrorKind.CHILD_FAILED:
            return i
    for i, rec in enumerate(errors):
        if rec.kind != ErrorKind.CHILD_FAILED:
            return i
    return 0


class MonitorKeys(Screen[None]):
    """What the monitor's keys do. The monitor sets the widgets and state below and draws
    the header, strip and side panel (:meth:`_render_chrome`)."""

    grid: PaneGrid
    nccl: NcclPane
    can_go_back: bool
    """A wizard lies beneath: ``b`` (or ``esc`` with nothing to clear, or ``q``) goes back."""
    error_cursor: int | None
    _side_choice: bool | None
    """Shown (True) or hidden (False) by ``t``; None: by the terminal's width."""
    _nccl_full: bool

    @property
    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def _composed(self) -> bool:
        raise NotImplementedError

    def _render_chrome(self) -> None:
        raise NotImplementedError

    # ---- sizes ---------------------------------------------------------------------------

    def _size_side(self) -> None:
        if not self._composed():
            return  # a resize while the app tears the screen down: no side panel to size
        hidden = self.app.size.width < SIDE_MIN_SCREEN_WIDTH
        if self._side_choice is not None:
            hidden = not self._side_choice
        self.query_one(MonitorSide).set_class(hidden, "-hidden")

    def _size_nccl_pane(self) -> None:
        """The NCCL pane: a fifth of the screen, the whole of it with ``c`` held full, and one
        line (its title) while it has nothing to show (a gloo run): not a Tab stop then."""
        nccl = self.nccl
        empty = not self._nccl_full and nccl.buffer.total == 0 and not nccl.warning
        nccl.set_class(empty, "-empty")
        nccl.can_focus = not empty
        if self._nccl_full:
            nccl.styles.height = "1fr"
        else:
            nccl.styles.height = 1 if empty else max(5, self.app.size.height // 5)

    def _show_fullscreen(self) -> None:
        """``z``: the zoomed pane (or the NCCL pane) alone, header, strip and side hidden."""
        self.set_class(self.grid.zoomed is not None and not self._nccl_full, "-fullscreen")
        if self.has_class("-nccl-full") != self._nccl_full:
            self.set_class(self._nccl_full, "-nccl-full")
            self._size_nccl_pane()

    # ---- focus, zoom, pages, views ------------------------------------------------------

    def action_cycle(self, step: int) -> None:
        """Focus the next pane, across pages (and the NCCL pane at the end of the cycle)."""
        cur = self.focused
        if isinstance(cur, Input):
            self.focus_next() if step > 0 else self.focus_previous()
            return
        here = cur.key if isinstance(cur, RankPane) else None
        key = self.grid.next_key(here, step, with_nccl=not self.nccl.has_class("-hidden"))
        if key is not None:
            self._focus_key(key)

    def _focus_key(self, key: str) -> None:
        if key == "nccl":
            self.nccl.focus()
        else:
            self.grid.focus_key(key)

    def action_zoom(self) -> None:
        """Full screen for the focused pane (the NCCL pane too); again: back to the grid."""
        if self._nccl_full:
            self._nccl_full = False
            self.nccl.focus()
        elif self.focused is self.nccl and self.grid.zoomed is None:
            self._nccl_full = True
        else:
            self.grid.zoom(self.focused)
        self._show_fullscreen()
        self.grid.schedule_relayout()

    def action_toggle_sideways(self) -> None:
        """Long lines: cut at the pane's edge, or scroll sideways with ``←``/``→``."""
        on = not self.grid.sideways
        self.grid.set_sideways(on)
        self.notify("long lines scroll sideways (← →)" if on else "long lines are cut at the edge")

    def action_page(self, step: int) -> None:
        self.grid.turn_page(step)

    def action_toggle_view(self) -> None:
        self.grid.toggle_view()

    def action_toggle_nccl(self) -> None:
        self.nccl.toggle_class("-hidden")
        self.grid.schedule_relayout()

    def action_toggle_side(self) -> None:
        side = self.query_one(MonitorSide)
        self._side_choice = side.has_class("-hidden")
        self._size_side()
        self.grid.schedule_relayout()

    # ---- the machines: GPU panel, charts, plan against measured ----------------------

    plan_figures: PlanFigures | None
    """What the run's plan.json promises (the monitor reads it once)."""

    def action_toggle_gpus(self) -> None:
        """``g``: show / hide the GPU panel (per node: each rank's GPU, or its CPU use)."""
        self.query_one(GpuPanel).toggle_class("-hidden")
        self._render_chrome()
        self.grid.schedule_relayout()

    def action_toggle_charts(self) -> None:
        """``p``: show / hide the loss, throughput and step-time charts."""
        self.query_one(RankCharts).toggle_class("-hidden")
        self._render_chrome()
        self.grid.schedule_relayout()

    def _show_machines(self, snap: Snapshot, focused: int | None, root: int | None) -> None:
        """The plan line always; the GPU panel and the charts while shown (plotext and the
        bars are drawn only for a person to see)."""
        self.query_one(PlanLine).show(compare(self.plan_figures, snap.ranks))
        panel = self.query_one(GpuPanel)
        if not panel.has_class("-hidden"):
            plan = self.plan_figures
            panel.show(machines(snap.ranks), plan.mem_bytes if plan is not None else None)
        charts = self.query_one(RankCharts)
        if not charts.has_class("-hidden"):
            charts.show(snap, focused, root)

    def action_follow(self) -> None:
        focused = self.focused
        if isinstance(focused, RankPane):
            focused.resume()

    # ---- filter / search / errors -------------------------------------------------------

    def action_search(self) -> None:
        self.query_one(FilterBox).open(self.grid.pattern)

    def on_filter_box_applied(self, msg: FilterBox.Applied) -> None:
        self.set_filter(msg.pattern)
        self.grid.refocus()

    def set_filter(self, pattern: LinePattern | None) -> None:
        """Show only lines matching ``pattern`` in every pane (None: show everything)."""
        self.grid.set_pattern(pattern)
        self.nccl.set_pattern(pattern)
        self._render_chrome()

    def action_clear(self) -> None:
        """Esc: close the filter box, else drop the filter, else leave the full screen, else go
        back to the wizard (when there is one)."""
        box = self.query_one(FilterBox)
        if box.is_open:
            box.close()
            self.grid.refocus()
        elif self.grid.pattern is not None:
            self.set_filter(None)
        elif self._nccl_full or self.grid.zoomed is not None:
            self._nccl_full = False
            self.grid.unzoom()
            self._show_fullscreen()
        elif self.can_go_back:
            self.action_back()

    def action_next_error(self) -> None:
        errors = self.snapshot.errors
        if not errors:
            self.notify("no errors so far")
            return
        if self.error_cursor is None:
            self.error_cursor = first_error(errors, self.grid.root_cause)
        else:
            self.error_cursor = (self.error_cursor + 1) % len(errors)
        if self.grid.pattern is not None:
            self.set_filter(None)
        self.grid.show_error(errors[self.error_cursor])
        self._render_chrome()

    # ---- leaving, help ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "back":
            return self.can_go_back
        if action == "quit":
            return not self.can_go_back  # False: q falls through to "leave", out of the footer
        if action == "stop_run":
            return not self.run_over  # nothing left to stop: out of the footer
        return True

    @property
    def run_over(self) -> bool:
        """The run has ended (the source said so, or its state is final)."""
        raise NotImplementedError

    def action_back(self) -> None:
        """Back to the wizard; the run goes on and ``Open run…`` (or ``ctrl+g``) reopens this."""
        if not self.can_go_back:
            self.notify("no wizard behind this monitor: q quits (the run goes on)")
            return
        self.app.pop_screen()

    def action_leave(self) -> None:
        """``q``, the same in every monitor: leave it, never stopping the run (back to the
        wizard, or quit ``dtrain-tui monitor``)."""
        if self.can_go_back:
            self.action_back()
        else:
            self.app.exit(0)

    def action_quit(self) -> None:
        """``q`` in ``dtrain-tui monitor`` (no wizard beneath): the footer's ``q Quit``."""
        self.action_leave()

    def action_help(self) -> None:
        bindings = [b for b in self.BINDINGS if isinstance(b, Binding)]
        self.app.push_screen(MonitorHelp(bindings, can_go_back=self.can_go_back))
