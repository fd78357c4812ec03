"""Which pane each wizard step has, and the screen base that builds each step once and keeps it:
on the step's first visit, or (in a terminal) ahead of it in idle time, so that a move only
switches to a built step. A step built ahead is also laid out ahead, hidden (see
:func:`lay_out_hidden`), and again when a plan or a bundle redraws it.
:class:`~tui.screens.wizard.WizardScreen` is the one screen built on it; it enters the steps,
this base only builds them."""

from __future__ import annotations

import gc

from textual._compositor import Compositor
from textual.geometry import Size
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import AwaitMount
from textual.widgets import ContentSwitcher

from tui.lifecycle import torn_down
from tui.screens.configs import ConfigsStep
from tui.screens.decision import DecisionStep
from tui.screens.hardware import HardwareStep
from tui.screens.launch import LaunchStep
from tui.screens.model import ModelStep
from tui.screens.network import NetworkStep
from tui.screens.step import StepPane
from tui.screens.training import TrainingStep
from tui.session import Step, WizardSession

STEP_PANES: dict[Step, type[StepPane]] = {
    Step.MODEL: ModelStep,
    Step.HARDWARE: HardwareStep,
    Step.NETWORK: NetworkStep,
    Step.TRAINING: TrainingStep,
    Step.DECISION: DecisionStep,
    Step.CONFIGS: ConfigsStep,
    Step.LAUNCH: LaunchStep,
}
"""The pane of each step, with the wizard's session: built once, when the step is first visited
or (in a terminal) ahead of it in idle time, and kept; a move switches to it."""

BUILD_AHEAD_AFTER_S = 0.05
"""Idle time before the next step not built yet is built ahead (in a terminal): one step at a
time, so keys typed meanwhile wait at most one step's build."""


def step_class(step: Step) -> type[StepPane]:
    """The pane class of ``step``."""
    return STEP_PANES[Step(step)]


LAYOUT_PASSES = 6
"""Layouts of a hidden step at most, one per idle moment, until no widget changes size: a
second pass once its scrollbars show (the fields are then a column narrower), more as that
changes what wraps and scrolls inside it (Configs' preview settles in four or five)."""


def lay_out_hidden(pane: StepPane, size: Size) -> bool:
    """Lay out ``pane`` (hidden, ``display`` off) at ``size``, the size it gets when shown, on
    a compositor of its own: nothing reaches the screen. Each widget keeps what it worked out
    (its arrangement, size, virtual size, scrollbars), so the move that shows the step reuses
    it: the first visit to a step built ahead laid out every widget of it (40-60 ms for
    Decision or Configs, most of the visit). Returns whether it settled: no widget changed
    size. If some did, they take that in when the app is next idle (and forget their
    arrangement): lay it out again then."""
    compositor = Compositor()
    compositor.reflow(pane, size)
    resized = False
    for widget, geometry in compositor.layers:
        # What the screen's own layout does for each widget it places (less the events: the
        # move that shows the step sends them).
        if widget._size_updated(
            geometry.region.size, geometry.virtual_size, geometry.container_size
        ):
            resized = True
    return not resized


class StepsScreen(Screen[None]):
    """A screen with one pane per step in a :class:`ContentSwitcher` (``_switcher``, set by
    the subclass's compose), each built once."""

    build_ahead: bool | None = None
    """Build the steps not visited yet in idle time, so that a move only switches (None: in a
    terminal; not in a headless test, whose steps are built on their first visit, as tests
    that build a step themselves expect)."""

    def __init__(self, session: WizardSession, *, id: str) -> None:  # noqa: A002
        super().__init__(id=id)
        self.session = session
        self._panes: dict[str, StepPane] = {}
        """The steps built so far (a query walked the whole screen, several times a move)."""
        self._mounting: dict[str, AwaitMount] = {}
        """Each built step's mounting (awaited again by a move to a step still being built)."""
        self._switcher: ContentSwitcher | None = None
        self._ahead_timer: Timer | None = None
        self._unlaid: dict[Step, int] = {}
        """Hidden steps to lay out (see :func:`lay_out_hidden`), built ahead or drawn again
        while hidden, with the passes left for each."""
        self._frozen = False
        self.holding_keys = True
        """A step is being entered (the first one from the start): the app holds the keys
        that arrive meanwhile and hands them, in order, to the field that gets the focus."""

    @property
    def current(self) -> Step:
        return self.session.current

    def pane(self, step: str) -> StepPane | None:
        """The step's pane, or None while it has not been built yet."""
        return self._panes.get(step)

    def _mount_pane(self, step: Step, pane: StepPane) -> AwaitMount:
        assert self._switcher is not None, "a step was built before the screen was composed"
        mounting = self._switcher.mount(pane)
        self._panes[step] = pane  # in the DOM from here on, as a query would find it
        self._mounting[step] = mounting
        return mounting

    async def _built(self, step: Step) -> StepPane:
        """The step's pane, built now if it was not, and ready (composed and loaded); the
        first visit to a step built ahead loads and validates the spec as it is now."""
        pane = self.pane(step)
        if pane is None:
            pane = step_class(step)(self.session)
            await self._mount_pane(step, pane)
        elif pane.ahead:
            if not pane.ready:
                await self._mounting[step]  # being built ahead: its widgets are on their way
            pane.entered()
        elif step in (Step.NETWORK, Step.LAUNCH):
            pane.revalidate()  # their summaries depend on the hardware step
        return pane

    # --- building ahead -------------------------------------------------------------------------
    def lay_out_ahead(self, *steps: Step) -> None:
        """The hidden ``steps`` (those built) were drawn again (a plan or a bundle arrived): lay
        them out again in idle time (in a terminal), so that the next visit only switches."""
        for step in steps:
            pane = self._panes.get(step)
            if pane is not None and not pane.display:
                self._unlaid[step] = LAYOUT_PASSES
        if self._unlaid:
            self._build_ahead_later()

    def _build_ahead_later(self) -> None:
        ahead = self.build_ahead if self.build_ahead is not None else not self.app.is_headless
        more = self._unlaid or len(self._panes) < len(STEP_PANES)
        if ahead and self._ahead_timer is None and more:
            self._ahead_timer = self.set_timer(BUILD_AHEAD_AFTER_S, self._build_one_ahead)

    async def _build_one_ahead(self) -> None:
        """Lay out a hidden step built or drawn again (one pass), or build the next step not
        built yet (after the current one first), hidden; then schedule what comes next."""
        self._ahead_timer = None
        switcher = self._switcher
        if switcher is None or torn_down(self) or torn_down(switcher) or self.holding_keys:
            return  # a move is under way: it schedules the next build itself
        if self._unlaid:
            step = next(iter(self._unlaid))
            left = self._unlaid.pop(step)
            pane = self._panes[step]
            if pane.ready and not pane.display and not torn_down(pane) and switcher.size:
                if left == LAYOUT_PASSES:
                    pane.draw_ahead()
                if not lay_out_hidden(pane, switcher.size) and left > 1:
                    self._unlaid[step] = left - 1
        else:
            order = list(Step)
            i = order.index(self.current)
            todo = [s for s in order[i + 1 :] + order[:i] if s not in self._panes]
            if not todo:
                return
            pane = step_class(todo[0])(self.session)
            pane.ahead = True
            pane.display = False
            await self._mount_pane(todo[0], pane)
            self._unlaid[todo[0]] = LAYOUT_PASSES
        if not self._frozen and not self._unlaid and len(self._panes) == len(STEP_PANES):
            # Every step is built and laid out, for good: the collector need not walk their
            # thousands of widgets again (a full collection took 0.1-0.6 s, a random step
            # switch's stall).
            gc.freeze()
            self._frozen = True
        self._build_ahead_later()
