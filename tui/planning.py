"""The half of the wizard's app that keeps the plan and the bundle following the spec.

:class:`PlanningApp` is the base of :class:`tui.app.DtrainApp`. Every change to the session's
spec (a step posts :class:`~tui.messages.StepValidated`) re-plans in a worker thread after a
short quiet time (exclusive: a newer spec cancels the older job, whose result is then stale and
ignored), and once the decision step was opened the bundle is rendered in the same thread, so the
UI thread only ever draws. Results are recorded in the :class:`~tui.session.WizardSession`; the
wizard screen is then asked to draw it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from textual import work
from textual.app import App
from textual.timer import Timer

from engine.errors import one_line
from tui import services
from tui.lifecycle import torn_down
from tui.messages import (
    BundleRendered,
    BundleRenderFailed,
    PlanComputed,
    PlanFailed,
    PlanStarted,
    StepEntered,
    StepValidated,
)
from tui.session import INPUT_STEPS, Step, WizardSession

if TYPE_CHECKING:
    from engine.plan.result import Plan
    from engine.plan.specs import Spec
    from tui.screens.wizard import WizardScreen

PLAN_DELAY_S = 0.12
"""Quiet time after the last keystroke before planning: typing "4096" plans once, not four times."""

REPLANNING_STEPS = (*INPUT_STEPS, Step.DECISION, Step.LAUNCH)
"""Steps whose validation may change the spec the planner reads."""

BUNDLE_STEPS = (Step.DECISION, Step.CONFIGS, Step.LAUNCH)
"""Entering one of these renders the bundle from then on (the next stop is Configs)."""


class PlanningApp(App[int]):
    """Plans ``session.spec`` whenever it changes; ``plan_delay_s`` is the quiet time."""

    def __init__(self, session: WizardSession, plan_delay_s: float) -> None:
        super().__init__()
        self.session = session
        self.plan_delay_s = plan_delay_s
        self._plan_timer: Timer | None = None
        self._auto_plan: tuple[Spec, Plan | None, str] | None = None
        """The last unforced spec planned for a forced one's cost line, its plan or refusal."""
        self._warmed = False

    @property
    def wizard(self) -> WizardScreen | None:
        """The wizard screen (under the monitor or help screen when those are open); None
        once the app has begun tearing it down, when a plan or a bundle that arrives has
        nothing left to draw on."""
        from tui.screens.wizard import WizardScreen

        for screen in self.screen_stack:
            if isinstance(screen, WizardScreen):
                return None if torn_down(screen) else screen
        return None

    @property
    def idle(self) -> bool:
        """No plan pending or running (tests and the benchmark wait for this)."""
        s = self.session
        return self._plan_timer is None and not s.planning and not s.needs_render()

    def on_mount(self) -> None:
        self.call_after_refresh(self.schedule_plan)

    def on_step_validated(self, message: StepValidated) -> None:
        if message.step in REPLANNING_STEPS:
            self.schedule_plan()

    def on_step_entered(self, message: StepEntered) -> None:
        # From the decision step on, the bundle is rendered in the background: the configs
        # step then opens on its files, not on a wait for the writers.
        if message.step in BUNDLE_STEPS:
            self.want_bundle()

    def want_bundle(self) -> None:
        """Render the bundle from now on, with each plan (in the plan's worker thread), and
        now if the plan has none yet: the configs step was reached, or built ahead."""
        self.session.bundle_wanted = True
        if self.session.needs_render():
            self._render_worker(self.session.plan, self.session.generation)

    def schedule_plan(self) -> None:
        """Plan the session's spec after the quiet time, unless the plan is already for it."""
        s = self.session
        if not s.inputs_valid():
            if self._plan_timer is not None:
                self._plan_timer.stop()
                self._plan_timer = None
            s.refuse_plan()
            self._show_plan_state()
            return
        if s.plan_is_current():
            return
        if self._plan_timer is not None:
            self._plan_timer.stop()
        self._plan_timer = self.set_timer(max(self.plan_delay_s, 0.001), self._start_plan)
        s.planning = True
        if self.wizard is not None:
            self.wizard.show_nav()

    def replan(self) -> None:
        """Plan again even if the spec did not change."""
        self.session.forget_plan()
        self.schedule_plan()

    def _start_plan(self) -> None:
        self._plan_timer = None
        spec, generation = self.session.begin_plan()
        self.post_message(PlanStarted(generation))
        self._plan_worker(spec, generation)

    @work(thread=True, exclusive=True, group="plan", exit_on_error=False, description="planning")
    def _plan_worker(self, spec: Spec, generation: int) -> None:
        t0 = time.perf_counter()
        try:
            plan = services.make_plan(spec)
        except Exception as e:  # noqa: BLE001 - every refusal becomes one line on screen
            self.post_message(PlanFailed(one_line(e), generation))
            return
        elapsed = time.perf_counter() - t0
        self.post_message(PlanComputed(plan, generation, elapsed, self._forcing(plan)))
        if self.session.bundle_wanted:
            self._render(plan, generation)

    def _forcing(self, plan: Plan) -> str:
        """With a forced layout, the auto plan of the same spec and what forcing costs (in the
        worker thread; the last auto plan is kept, so forcing one degree after another plans
        the unforced spec once)."""
        if not plan.forced:
            return ""
        from engine.plan.annotate import forcing_cost
        from engine.plan.specs import LayoutSpec

        auto_spec = plan.spec.model_copy(update={"layout": LayoutSpec()})
        cached = self._auto_plan
        if cached is None or cached[0] != auto_spec:
            try:
                cached = (auto_spec, services.make_plan(auto_spec), "")
            except Exception as e:  # noqa: BLE001 - the refusal is shown in the line
                cached = (auto_spec, None, one_line(e))
            self._auto_plan = cached
        return forcing_cost(plan, cached[1], cached[2])

    @work(thread=True, exclusive=True, group="render", exit_on_error=False, description="rendering")
    def _render_worker(self, plan: Plan | None, generation: int) -> None:
        if plan is not None:
            self._render(plan, generation)

    def _render(self, plan: Plan, generation: int) -> None:
        """Render the bundle (in a worker thread) and post the result."""
        try:
            files = services.render_bundle(plan)
        except Exception as e:  # noqa: BLE001
            self.post_message(BundleRenderFailed(one_line(e), generation))
            return
        self.post_message(BundleRendered(files, generation))

    # --- results ------------------------------------------------------------------------------
    def on_plan_started(self, message: PlanStarted) -> None:
        if self.wizard is not None:
            self.wizard.show_plan_pending()

    def on_plan_computed(self, message: PlanComputed) -> None:
        if self.session.plan_computed(
            message.plan, message.generation, message.elapsed_s, message.forcing
        ):
            self.session.planning = self._plan_timer is not None
            self._show_plan_state()
            if not self._warmed:
                self._warmed = True
                self.warm_up()

    def warm_up(self) -> None:
        """After the first plan is drawn: get ready, in a thread, what a later key needs (the
        app lists the profiles for ^o). Nothing here."""

    def on_plan_failed(self, message: PlanFailed) -> None:
        if self.session.plan_failed(message.message, message.generation):
            self.session.planning = self._plan_timer is not None
            self._show_plan_state()

    def on_bundle_rendered(self, message: BundleRendered) -> None:
        if self.session.bundle_rendered(message.files, message.generation):
            self._show_bundle_state()

    def on_bundle_render_failed(self, message: BundleRenderFailed) -> None:
        if self.session.bundle_failed(message.message, message.generation):
            self._show_bundle_state()

    def _show_plan_state(self) -> None:
        if self.wizard is not None:
            self.wizard.show_plan_state()

    def _show_bundle_state(self) -> None:
        if self.wizard is not None:
            self.wizard.show_bundle_state()
