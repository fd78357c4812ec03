"""The wizard screen: the step sidebar, one pane per step (model → … → launch), a status line and
the keys to move. It moves through the :class:`~tui.session.WizardSession` (which refuses a
forward move while an earlier step is invalid) and draws what the session holds; the app asks it
to draw again when a plan, a bundle or a write or launch result arrives."""

from __future__ import annotations

from typing import cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.color import Color
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Button, ContentSwitcher, Header, Static

from tui.lifecycle import torn_down
from tui.messages import StepEntered, StepValidated
from tui.screens.configs import RENDERING, ConfigsStep
from tui.screens.decision import DecisionStep
from tui.screens.launch import LaunchStep
from tui.screens.step import StepPane
from tui.screens.step_panes import STEP_PANES, StepsScreen, step_class
from tui.session import Step, WizardSession
from tui.widgets.steady_footer import SteadyFooter
from tui.widgets.step_nav import StepNav

__all__ = ["STEP_PANES", "WizardScreen", "step_class"]


class WizardScreen(StepsScreen):
    BINDINGS = [
        # ^n / ^b: in the step list's own key hint and on the Back / Next buttons; the footer
        # keeps room for f1 Help and ^q Quit at 80 columns.
        Binding("ctrl+n", "next", "Next", priority=True, show=False),
        Binding("ctrl+b", "back", "Back", priority=True, show=False),
        Binding("ctrl+s", "app.write_bundle", "Write", priority=True),
        Binding("ctrl+l", "app.launch", "Launch", priority=True),
        Binding("ctrl+r", "app.replan", "Re-plan", show=False),
        Binding("ctrl+o", "app.profiles", "Profiles"),
        Binding("ctrl+g", "app.open_run", "Open run"),
        Binding("ctrl+t", "app.toggle_dark", "Theme", show=False),
        Binding("f1", "app.help", "Help"),
    ]

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session, id="wizard")
        self._status: tuple[str, bool] = ("", False)
        self._bar_on: StepPane | None = None
        """The step drawn with the focus bar."""
        self._nav: StepNav | None = None
        self._status_line: Static | None = None
        self._after_plan: Step | None = None
        """A forward move asked for while the plan was being worked out: made once it is in."""
        self._buttons: dict[str, Button] = {}
        """The frame's widgets, kept when composed: a query for one walks every built step
        (tens of milliseconds a move with all seven built)."""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≡")
        self._nav = StepNav(list(Step), id="nav")
        self._switcher = ContentSwitcher(id="steps")
        self._status_line = Static("", id="status-line", markup=False)
        self._buttons = {
            "back": Button("◀ Back", id="back", compact=True),
            "next": Button("Next ▶", id="next", compact=True),
        }
        with Horizontal(id="main"):
            yield self._nav
            # Steps are built when first visited, the first one right after the first frame:
            # the frame (sidebar, status line, keys) is on screen before the fields are built.
            # Each is built once and kept: a later visit only switches to it.
            yield self._switcher
        with Horizontal(id="navbar"):
            yield self._buttons["back"]
            yield self._status_line
            yield self._buttons["next"]
        yield SteadyFooter()

    def on_mount(self) -> None:
        for button in self._buttons.values():
            button.can_focus = False  # clicking Back/Next keeps the focus in the step's fields
        self.sub_title = ""
        # The accent bar of the step holding the focus (see _mark_focused_step).
        self.watch(self, "focused", self._mark_focused_step, init=False)
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)
        self.call_after_refresh(self._enter, self.current)
        # The header names the profile and unsaved changes; reading the spec waits until the
        # first frame is drawn (the default profile is read then).
        self.call_after_refresh(self._show_header)

    def _show_header(self) -> None:
        header_text = getattr(self.app, "header_text", None)
        if header_text is not None:
            self.sub_title = header_text()

    # --- the focused step's bar -----------------------------------------------------------------
    def _mark_focused_step(self, focused: Widget | None) -> None:
        """Draw the accent bar on the step holding the focus (an inline border, not a
        ``.step:focus-within`` rule: with that rule Textual restyles every widget of the step
        left and the step entered on each move, most of a step switch)."""
        pane: StepPane | None = None
        node = focused
        while node is not None:
            if isinstance(node, StepPane):
                pane = node
                break
            node = node.parent if isinstance(node.parent, Widget) else None
        if pane is self._bar_on:
            return
        if self._bar_on is not None:
            self._bar_on.styles.clear_rule("border_left")
            self._bar_on.refresh()
        self._bar_on = pane
        if pane is not None:
            accent = Color.parse(self.app.get_css_variables()["accent"])
            pane.styles.border_left = ("thick", accent)

    def _theme_changed(self, _theme: object) -> None:
        pane, self._bar_on = self._bar_on, None
        if pane is not None and not torn_down(self):
            self._mark_focused_step(pane)

    # --- panes --------------------------------------------------------------------------------
    @property
    def _decision(self) -> DecisionStep | None:
        return cast(DecisionStep | None, self.pane(Step.DECISION))

    @property
    def _configs(self) -> ConfigsStep | None:
        return cast(ConfigsStep | None, self.pane(Step.CONFIGS))

    @property
    def _launch(self) -> LaunchStep | None:
        return cast(LaunchStep | None, self.pane(Step.LAUNCH))

    def reload_steps(self) -> None:
        """The session got a whole new spec (a loaded profile): refill every built step."""
        for pane in list(self._panes.values()):
            pane.reload()

    # --- drawing the session ------------------------------------------------------------------
    def show_nav(self) -> None:
        nav = self._nav
        if nav is None or torn_down(self) or torn_down(nav) or not nav.is_attached:
            return  # being torn down (or not composed yet): no sidebar to draw on
        s = self.session
        invalid = {k: bool(v) for k, v in s.step_errors.items()}
        if s.batch_refused:
            invalid[Step.TRAINING] = True  # refused at its Global batch field: no ✓ beside a ✗
        pending = {Step.DECISION} if s.planning else set()
        unfit = s.plan is not None and not s.plan.recommended.fits
        nav.set_state(s.current, invalid, pending, planned=s.plan is not None, unfit=unfit)
        if self._after_plan is not None and not s.planning:  # the plan is in (or refused)
            target, self._after_plan = self._after_plan, None
            if s.plan is not None:
                self.call_later(self.go, target)
        for pane in list(self._panes.values()):
            pane.session_changed()  # the plan or its refusal changed: steps that show it follow

    def set_status(self, text: str, *, error: bool = False) -> None:
        if (text, error) == self._status:
            return
        line = self._status_line
        if line is None or torn_down(self) or torn_down(line) or not line.is_attached:
            return  # being torn down (or not composed yet)
        self._status = (text, error)
        line.update(text)
        line.set_class(error, "-error")

    def _show_step_status(self) -> None:
        errors = self.session.errors(self.current)
        if errors:
            self.set_status(f"✗ {errors[0]}", error=True)
        else:
            self.set_status(self.session.plan_summary())

    def show_plan_pending(self) -> None:
        if self._decision is not None:
            self._decision.show_pending()

    def show_plan_state(self) -> None:
        """Bring the decision pane (if built), the sidebar, the status line and the configs
        pane up to date with the session's plan."""
        s = self.session
        decision = self._decision
        # A pane still being built draws the session's plan itself once mounted (on_mount).
        if decision is not None and decision.ready:
            if s.plan is not None:
                decision.show_plan(s.plan, s.plan_elapsed_s)
            elif s.plan_failure:
                decision.show_failure(s.plan_failure)
        self.show_nav()
        if s.plan is None and s.plan_failure and s.current == Step.DECISION:
            self.set_status(f"✗ {s.plan_failure}", error=True)
        elif not s.errors(s.current):
            self.set_status(s.plan_summary())
        self.show_bundle_state()
        if self._launch is not None and s.plan is not None:
            self._launch.show_plan()
        self.lay_out_ahead(Step.DECISION, Step.LAUNCH)

    def show_bundle_state(self) -> None:
        configs = self._configs
        if configs is None:
            return
        if self.session.bundle:
            configs.show_files(self.session.bundle)
        else:
            configs.show_error(self.session.bundle_error or RENDERING)
        self.lay_out_ahead(Step.CONFIGS)

    def show_result(self, step: Step, text: str, *, ok: bool, confirm: bool = False) -> None:
        """The outcome of writing (``step`` configs) or launching (``step`` launch): on that
        step's pane if it is built, and on the status line (its first line). ``confirm``: a
        question, not an outcome (what a write would change; ^s again goes ahead)."""
        if step == Step.CONFIGS and self._configs is not None:
            self._configs.show_result(text, ok=ok, confirm=confirm)
        elif step == Step.LAUNCH and self._launch is not None:
            self._launch.show_result(text, ok=ok)
        mark = "✓ " if ok and not confirm else ("⚠ " if ok else "✗ ")
        first = text.splitlines()[0] if text else ""
        if confirm:
            first += " · press ^s again to write"
        self.set_status(mark + first, error=not ok)

    def show_launch_progress(self, text: str) -> None:
        """How a launch is going, on the launch pane only (the status line keeps the plan)."""
        if self._launch is not None:
            self._launch.show_result(text, ok=True)

    @on(StepValidated)
    def _validated(self, event: StepValidated) -> None:
        # Not stopped: the app re-plans on it.
        self.session.record(event.step, event.errors)
        self.show_nav()
        if event.step == self.current:
            self._show_step_status()

    # --- moving -------------------------------------------------------------------------------
    async def action_next(self) -> None:
        steps = list(Step)
        i = steps.index(self.current)
        if i + 1 < len(steps):
            await self.go(steps[i + 1])

    async def action_back(self) -> None:
        steps = list(Step)
        i = steps.index(self.current)
        if i > 0:
            await self.go(steps[i - 1])

    @on(Button.Pressed, "#next")
    async def _next_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        await self.action_next()

    @on(Button.Pressed, "#back")
    async def _back_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        await self.action_back()

    @on(StepNav.Picked)
    async def _picked(self, event: StepNav.Picked) -> None:
        event.stop()
        await self.go(event.step)

    async def go(self, step: str) -> bool:
        """Move to ``step``; forward moves are refused while an earlier step is invalid."""
        target, self._after_plan = Step(step), None
        if target == self.current:
            return True
        bad = self.session.blocker(target)
        if bad == Step.DECISION == self.current and self.session.planning:
            self._after_plan = target  # typed ahead of the plan: not refused, only delayed
            self.set_status(f"planning… {target} opens when the plan is in")
            return False
        if bad is not None:
            errors = self.session.errors(bad) or ["invalid"]
            self.set_status(f"✗ fix {bad} first: {errors[0]}", error=True)
            self.app.bell()
            if bad != self.current:
                await self._enter(bad)
            return False
        await self._enter(target)
        return True

    async def _enter(self, step: Step) -> None:
        self.holding_keys = True
        try:
            await self._build_and_show(step)
        finally:
            # After the focus callback that ``focus()`` queued on the app: the held keys go to
            # the field that has it by then.
            self.app.call_later(self._release_keys)

    def _release_keys(self) -> None:
        self.holding_keys = False
        release = getattr(self.app, "release_type_ahead", None)
        if release is not None:
            release()
        self._build_ahead_later()

    async def _build_and_show(self, step: Step) -> None:
        switcher = self._switcher
        assert switcher is not None, "entered a step before the wizard was composed"
        pane = await self._built(step)
        self.session.current = step
        switcher.current = f"step-{step}"
        self.post_message(StepEntered(step))
        if step == Step.CONFIGS:
            # The files on disk may have changed meanwhile; redrawn only if anything did.
            cast(ConfigsStep, pane).refresh_files(if_changed=True)
        target = pane.first_focus()
        if target is not None:
            target.focus()
        if step == Step.CONFIGS:
            # The file list has the focus; the title, buttons and write result stay in view.
            pane.call_after_refresh(pane.scroll_home, animate=False)
        self.show_nav()
        self._show_step_status()
        self._buttons["back"].disabled = step == Step.MODEL
        self._buttons["next"].disabled = step == Step.LAUNCH
