"""``dtrain-tui`` with no subcommand: the wizard. ``cli.main`` calls :func:`run_app`.

The app holds the one :class:`~engine.plan.specs.Spec` being edited; each step edits one part of it.
Every change re-plans in a worker thread (exclusive: a newer spec cancels the older job, whose
result is then ignored), then renders the bundle in the same thread, so the UI thread only ever
draws. Nothing here imports torch, deepspeed or sky; the engine modules that need them are
imported when the user asks for what needs them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen
from textual.timer import Timer

from engine.errors import DtrainError, one_line
from engine.plan.specs import Spec, demo_spec
from tui import services
from tui.format import count, seconds
from tui.messages import (
    BundleRendered,
    BundleRenderFailed,
    BundleWriteFailed,
    BundleWritten,
    PlanComputed,
    PlanFailed,
    PlanStarted,
)
from tui.screens.step import StepPane

if TYPE_CHECKING:
    from engine.plan.result import Plan
    from tui.screens.wizard import WizardScreen

DEFAULT_PROFILE = "local-cpu-demo"
"""The built-in profile the wizard opens on when no ``--profile`` is given."""

PLAN_DELAY_S = 0.12
"""Quiet time after the last keystroke before planning: typing "4096" plans once, not four times."""


class DtrainApp(App[int]):
    """The wizard. ``spec`` is the starting spec (None: the built-in default profile, else the
    embedded demo); ``out_dir`` where the bundle is written;
    ``run_root`` where launched runs keep their logs."""

    CSS_PATH = "app.tcss"
    TITLE = "dtrain-tui"
    COMMANDS: ClassVar[set[Any]] = App.COMMANDS | {lambda: _wizard_commands()}
    BINDINGS: ClassVar[list[Any]] = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        spec: Spec | None = None,
        *,
        out_dir: Path | None = None,
        run_root: Path | None = None,
        config_dir: Path | None = None,
        profile_name: str | None = None,
        plan_delay_s: float = PLAN_DELAY_S,
        show_timings: bool = True,
    ) -> None:
        super().__init__()
        self._spec: Spec | None = spec
        self.out_dir = out_dir if out_dir is not None else Path("dtrain-bundle")
        self.run_root: Path | None = run_root
        """Where runs keep their logs; None: the engine's default (user data dir)."""
        self._force_next_write = False
        self.config_dir = config_dir
        self.profile_name = profile_name
        self.plan_delay_s = plan_delay_s
        self.show_timings = show_timings
        """Show how long planning took (off for snapshot tests, which must be repeatable)."""
        self.plan: Plan | None = None
        self.plan_elapsed_s = 0.0
        self.bundle: dict[str, str] = {}
        self.bundle_wanted = False
        self._bundle_generation = -1
        self.plan_failure = ""
        self.bundle_error = ""
        self.planning = False
        self.plan_generation = 0
        self._plan_timer: Timer | None = None
        self._planned_spec: Spec | None = None
        self.last_status = ""
        if profile_name:
            self.sub_title = f"profile {profile_name}"

    @property
    def spec(self) -> Spec:
        """The spec being edited. Without one given, the built-in default profile is read on
        first use, after the first frame is drawn (start-up speed)."""
        if self._spec is None:
            self._spec = initial_spec(None, self.config_dir)
        return self._spec

    @spec.setter
    def spec(self, value: Spec) -> None:
        self._spec = value

    def get_default_screen(self) -> Screen[Any]:
        from tui.screens.wizard import WizardScreen

        return WizardScreen()

    @property
    def wizard(self) -> WizardScreen | None:
        """The wizard screen (under the monitor or help screen when those are open)."""
        from tui.screens.wizard import WizardScreen

        for screen in self.screen_stack:
            if isinstance(screen, WizardScreen):
                return screen
        return None

    # --- the spec -----------------------------------------------------------------------------
    def set_section(self, section: str, value: Any) -> None:
        """A step hands over a validated sub-spec; re-plan if anything changed."""
        if getattr(self.spec, section) == value:
            return
        self.spec = self.spec.model_copy(update={section: value})
        self.schedule_plan()

    def schedule_plan(self) -> None:
        wiz = self.wizard
        if wiz is None or not wiz.is_mounted:
            return
        if not wiz.inputs_valid():
            bad = next(
                s for s in ("model", "hardware", "network", "training") if wiz.step_errors.get(s)
            )
            if self._plan_timer is not None:
                self._plan_timer.stop()
                self._plan_timer = None
            self.plan_generation += 1  # a plan still running for the old spec is now stale
            self.planning = False
            self.plan = None
            self._planned_spec = None
            self.plan_failure = f"fix the {bad} step first: {wiz.step_errors[bad][0]}"
            self.bundle = {}
            self.bundle_error = "No plan: fix the earlier steps."
            wiz.step_errors["decision"] = [self.plan_failure]
            self._show_plan_state()
            return
        if self._planned_spec == self.spec and (self.plan is not None or self.planning):
            return
        if self._plan_timer is not None:
            self._plan_timer.stop()
        self._plan_timer = self.set_timer(max(self.plan_delay_s, 0.001), self._start_plan)
        self.planning = True
        wiz.refresh_nav()

    def _start_plan(self) -> None:
        self._plan_timer = None
        self.plan_generation += 1
        self._planned_spec = self.spec
        self.post_message(PlanStarted(self.plan_generation))
        self._plan_worker(self.spec, self.plan_generation)

    @work(thread=True, exclusive=True, group="plan", exit_on_error=False, description="planning")
    def _plan_worker(self, spec: Spec, generation: int) -> None:
        t0 = time.perf_counter()
        try:
            plan = services.make_plan(spec)
        except Exception as e:  # noqa: BLE001 - every refusal becomes one line on screen
            self.post_message(PlanFailed(one_line(e) or type(e).__name__, generation))
            return
        self.post_message(PlanComputed(plan, generation, time.perf_counter() - t0))
        if self.bundle_wanted:
            self._render(plan, generation)

    def _render(self, plan: Plan, generation: int) -> None:
        """Render the bundle (in a worker thread) and post the result."""
        try:
            files = services.render_bundle(plan)
        except Exception as e:  # noqa: BLE001
            self.post_message(BundleRenderFailed(one_line(e) or type(e).__name__, generation))
            return
        self.post_message(BundleRendered(files, generation))

    def want_bundle(self) -> None:
        """The configs step is open: from now on every plan is rendered too (until then the
        writers are not run, so typing in the first steps costs one plan per pause, no more)."""
        self.bundle_wanted = True
        if self.plan is not None and self._bundle_generation != self.plan_generation:
            self._render_worker(self.plan, self.plan_generation)

    @work(thread=True, exclusive=True, group="render", exit_on_error=False, description="rendering")
    def _render_worker(self, plan: Plan, generation: int) -> None:
        self._render(plan, generation)

    @property
    def idle(self) -> bool:
        """No plan pending or running (tests and the benchmark wait for this)."""
        return (
            self._plan_timer is None
            and not self.planning
            and (
                not self.bundle_wanted
                or self.plan is None
                or self._bundle_generation == self.plan_generation
            )
        )

    def on_plan_started(self, message: PlanStarted) -> None:
        wiz = self.wizard
        if wiz is not None and wiz.decision is not None:
            wiz.decision.show_pending()

    def on_plan_computed(self, message: PlanComputed) -> None:
        if message.generation != self.plan_generation:
            return
        self.planning = self._plan_timer is not None
        self.plan = message.plan
        self.plan_failure = ""
        self.bundle_error = ""
        self.plan_elapsed_s = message.elapsed_s
        wiz = self.wizard
        if wiz is not None:
            wiz.step_errors["decision"] = []
        self._show_plan_state()

    def on_plan_failed(self, message: PlanFailed) -> None:
        if message.generation != self.plan_generation:
            return
        self.planning = self._plan_timer is not None
        self.plan = None
        self.plan_failure = message.message
        self.bundle = {}
        self.bundle_error = f"No plan: {message.message}"
        wiz = self.wizard
        if wiz is not None:
            wiz.step_errors["decision"] = [message.message]
        self._show_plan_state()

    def on_bundle_rendered(self, message: BundleRendered) -> None:
        if message.generation != self.plan_generation:
            return
        self.bundle = message.files
        self._bundle_generation = message.generation
        self.bundle_error = ""
        self._show_bundle_state()

    def on_bundle_render_failed(self, message: BundleRenderFailed) -> None:
        if message.generation != self.plan_generation:
            return
        self.bundle = {}
        self._bundle_generation = message.generation
        self.bundle_error = f"The writers refused this plan: {message.message}"
        self._show_bundle_state()

    def _show_plan_state(self) -> None:
        """Bring the decision pane (if built), the sidebar and the status line up to date."""
        wiz = self.wizard
        if wiz is None:
            return
        decision = wiz.decision
        if decision is not None:
            if self.plan is not None:
                decision.show_plan(self.plan, self.plan_elapsed_s)
            elif self.plan_failure:
                decision.show_failure(self.plan_failure)
        wiz.refresh_nav()
        if self.plan is None and self.plan_failure and wiz.current == "decision":
            wiz.set_status(f"✗ {self.plan_failure}", error=True)
        elif not wiz.step_errors.get(wiz.current):
            wiz.set_status(self.status_text())
        self._show_bundle_state()

    def _show_bundle_state(self) -> None:
        wiz = self.wizard
        configs = wiz.configs if wiz is not None else None
        if configs is None:
            return
        if self.bundle:
            configs.show_files(self.bundle)
        else:
            configs.show_error(self.bundle_error or "Rendering the bundle…")

    def status_text(self) -> str:
        if self.plan is None:
            return "Planning…" if self.planning else "No plan yet."
        lay = self.plan.recommended
        return (
            f"{lay.strategy.value} · {lay.framework.value} · {seconds(lay.step_time_s)}/step · "
            f"{count(lay.tokens_per_s)} tok/s · {'fits' if lay.fits else 'does NOT fit'}"
        )

    # --- actions ------------------------------------------------------------------------------
    def goto(self, step: str) -> None:
        """Open ``step`` (from the command palette or any other screen)."""
        self.call_later(self._goto, step)

    async def _goto(self, step: str) -> None:
        wiz = self.wizard
        if wiz is not None:
            while len(self.screen_stack) > 1 and self.screen is not wiz:
                self.pop_screen()
            await wiz.go(step)

    def action_replan(self) -> None:
        self._planned_spec = None
        self.schedule_plan()

    def action_toggle_dark(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_profiles(self) -> None:
        try:
            from profiles.store import ProfileStore
            from tui.screens.profiles import ProfilesScreen
        except ModuleNotFoundError:
            self.notify("Profiles are not available in this build.", severity="warning")
            return
        screen = ProfilesScreen(
            ProfileStore(self.config_dir), spec=self.spec, current=self.profile_name
        )
        self.push_screen(screen, self._profile_chosen)

    def _profile_chosen(self, profile: Any) -> None:
        if profile is None:
            return
        self.profile_name = str(getattr(profile, "name", "") or "") or None
        self.sub_title = f"profile {self.profile_name}" if self.profile_name else ""
        spec = getattr(profile, "spec", None)
        if isinstance(spec, Spec) and spec != self.spec:
            self.load_spec(spec)

    def load_spec(self, spec: Spec) -> None:
        """Replace the whole spec (a loaded profile) and refill every step from it."""
        self.spec = spec
        wiz = self.wizard
        if wiz is None:
            return
        for pane in wiz.query(StepPane):
            pane.reload()
        self.action_replan()

    def action_write_bundle(self) -> None:
        if self.plan is None:
            self._write_result("nothing to write yet: the plan is not ready", ok=False)
            return
        force, self._force_next_write = self._force_next_write, False
        self._write_worker(self.plan, self.out_dir, force)

    @work(thread=True, exclusive=True, group="write", exit_on_error=False, description="writing")
    def _write_worker(self, plan: Plan, out: Path, force: bool) -> None:
        try:
            report = services.write_bundle(plan, out, force=force)
        except Exception as e:  # noqa: BLE001
            self.post_message(BundleWriteFailed(one_line(e) or type(e).__name__))
            return
        self.post_message(BundleWritten(out, write_summary(report, out)))

    def on_bundle_written(self, message: BundleWritten) -> None:
        self._write_result(message.summary, ok=True)

    def on_bundle_write_failed(self, message: BundleWriteFailed) -> None:
        text = message.message
        if "force" in text:
            # The writers refused to replace files the user edited: a second ^s backs them up.
            self._force_next_write = True
            text += " · press ^s again to back those files up and write"
        self._write_result(text, ok=False)

    def _write_result(self, text: str, *, ok: bool) -> None:
        wiz = self.wizard
        if wiz is not None:
            if wiz.configs is not None:
                wiz.configs.show_result(text, ok=ok)
            wiz.set_status(("✓ " if ok else "✗ ") + text, error=not ok)
        self.notify(text, severity="information" if ok else "error", timeout=4)

    def action_launch(self) -> None:
        wiz = self.wizard
        if wiz is None:
            return
        if wiz.step_errors.get("launch") or wiz.launch is None:
            self.goto("launch")
            return
        if self.plan is None:
            wiz.launch.show_result("no plan yet: finish the earlier steps", ok=False)
            return
        wiz.launch.show_result("writing the bundle and starting…", ok=True)
        self._launch_worker(self.plan, self.out_dir, self.run_root)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, description="launching")
    def _launch_worker(self, plan: Plan, out: Path, run_root: Path | None) -> None:
        try:
            services.write_bundle(plan, out)
            source, run_dir = services.start_run(plan.spec, out, run_root)
        except Exception as e:  # noqa: BLE001
            msg = one_line(e) or type(e).__name__
            self.call_from_thread(self._launch_failed, msg)
            return
        self.call_from_thread(self._open_monitor, source, run_dir)

    def _launch_failed(self, message: str) -> None:
        wiz = self.wizard
        if wiz is not None:
            if wiz.launch is not None:
                wiz.launch.show_result(message, ok=False)
            wiz.set_status(f"✗ {message}", error=True)

    def _open_monitor(self, source: Any, run_dir: Path) -> None:
        try:
            from tui.screens.monitor import MonitorScreen
        except ModuleNotFoundError:
            self._launch_failed(f"run started in {run_dir}; the monitor screen is not available")
            return
        if self.wizard is not None and self.wizard.launch is not None:
            self.wizard.launch.show_result(f"run started: {run_dir}", ok=True)
        self.push_screen(MonitorScreen(source, run_dir=run_dir))


def _wizard_commands() -> Any:
    """The palette's provider, imported when the palette first opens (start-up speed)."""
    from tui.commands import WizardCommands

    return WizardCommands


def write_summary(report: Any, out: Path) -> str:
    """One line from the writers' report: what was written, unchanged, backed up."""
    written = list(getattr(report, "written", []))
    unchanged = list(getattr(report, "unchanged", []))
    backed = dict(getattr(report, "backed_up", {}))
    text = f"wrote {len(written)} file(s) to {out.resolve()}"
    if unchanged:
        text += f", {len(unchanged)} unchanged"
    if backed:
        text += f", backed up {len(backed)} edited file(s) as *.bak-*"
    return text


def initial_spec(profile: str | None, config_dir: Path | None) -> Spec:
    """The spec the wizard opens on: ``profile`` if given, else the built-in demo profile,
    else the embedded demo spec."""
    if profile:
        try:
            return services.load_profile_spec(profile, config_dir)
        except services.Unavailable as e:
            raise DtrainError(f"cannot open profile {profile!r}: {e}", field="--profile") from None
    try:
        return services.load_profile_spec(DEFAULT_PROFILE, config_dir)
    except Exception:  # noqa: BLE001 - the embedded default always works
        return demo_spec()


def run_app(profile: str | None = None, config_dir: Path | None = None) -> int:
    """Run the wizard in this terminal; returns the process exit code."""
    # An explicit profile is read now, so a bad name is one line on the terminal, not a screen.
    spec = initial_spec(profile, config_dir) if profile else None
    app = DtrainApp(spec, config_dir=config_dir, profile_name=profile)
    result = app.run()
    # Textual's App.run returns (None) after an unhandled exception, once it has printed the
    # traceback; a crash must never look like success to the shell.
    if app._exception is not None or (app.return_code or 0) != 0:
        return app.return_code or 1
    return int(result or 0)
