"""``dtrain-tui`` with no subcommand: the wizard. ``cli.main`` calls :func:`run_app`.

:class:`DtrainApp` holds one :class:`~tui.session.WizardSession` (the spec being edited, the plan
and bundle computed from it, where the user is); each step edits one part of it. Planning is the
job of its base, :class:`~tui.planning.PlanningApp`; here are the app-wide actions: write the
bundle, launch it (through an injectable backend factory, so tests hand it a canned backend),
profiles, help, theme. Nothing here imports torch, deepspeed or sky; the engine modules that
need them are imported when the user asks for what needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.screen import Screen

from engine.errors import one_line
from engine.plan.specs import Spec, demo_spec
from tui import services
from tui.messages import BundleWriteFailed, BundleWritten, LaunchFailed, RunStarted
from tui.planning import PLAN_DELAY_S, PlanningApp
from tui.session import Step, WizardSession

if TYPE_CHECKING:
    from engine.monitor.events import EventSource
    from engine.plan.result import Plan
    from engine.write import WriteReport
    from profiles.schema import Profile

DEFAULT_PROFILE = "local-cpu-demo"
"""The built-in profile the wizard opens on when no ``--profile`` is given."""

BackendFactory = Callable[[Spec, Path, Path | None], "tuple[EventSource, Path]"]
"""``(spec, bundle_dir, run_root) -> (backend, run_dir)``, as :func:`tui.services.start_run`:
a launch backend for the written bundle, not started yet (the monitor starts and watches it)."""


class DtrainApp(PlanningApp):
    """The wizard. ``spec`` is the starting spec (None: the built-in default profile, else the
    embedded demo); ``out_dir`` where the bundle is written; ``run_root`` where launched runs
    keep their logs; ``backend_factory`` makes the backend a launch runs."""

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
        backend_factory: BackendFactory = services.start_run,
    ) -> None:
        session = WizardSession(
            spec,
            lambda: initial_spec(None, config_dir),
            out_dir=out_dir if out_dir is not None else Path("dtrain-bundle"),
            run_root=run_root,
            show_timings=show_timings,
        )
        super().__init__(session, plan_delay_s)
        self.config_dir = config_dir
        self.profile_name = profile_name
        self.backend_factory = backend_factory
        self._force_next_write = False
        if profile_name:
            self.sub_title = f"profile {profile_name}"

    # What tests, the benchmark and the profiles dialog read.
    @property
    def spec(self) -> Spec:
        return self.session.spec

    @property
    def plan(self) -> Plan | None:
        return self.session.plan

    @property
    def bundle(self) -> dict[str, str]:
        return self.session.bundle

    def get_default_screen(self) -> Screen[Any]:
        from tui.screens.wizard import WizardScreen

        return WizardScreen(self.session)

    # --- moving, help, theme, profiles --------------------------------------------------------
    def goto(self, step: Step) -> None:
        """Open ``step`` (from the command palette or any other screen)."""
        self.call_later(self._goto, step)

    async def _goto(self, step: Step) -> None:
        wiz = self.wizard
        if wiz is not None:
            while len(self.screen_stack) > 1 and self.screen is not wiz:
                self.pop_screen()
            await wiz.go(step)

    def action_replan(self) -> None:
        self.replan()

    def action_toggle_dark(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_profiles(self) -> None:
        from profiles.store import ProfileStore
        from tui.screens.profiles import ProfilesScreen

        screen = ProfilesScreen(
            ProfileStore(self.config_dir), spec=self.spec, current=self.profile_name
        )
        self.push_screen(screen, self._profile_chosen)

    def _profile_chosen(self, profile: Profile | None) -> None:
        if profile is None:
            return
        self.profile_name = profile.name or None
        self.sub_title = f"profile {self.profile_name}" if self.profile_name else ""
        if profile.spec != self.spec:
            self.load_spec(profile.spec)

    def load_spec(self, spec: Spec) -> None:
        """Replace the whole spec (a loaded profile) and refill every step from it."""
        self.session.spec = spec
        wiz = self.wizard
        if wiz is None:
            return
        wiz.reload_steps()
        self.replan()

    # --- writing ------------------------------------------------------------------------------
    def action_write_bundle(self) -> None:
        if self.plan is None:
            self._write_result("nothing to write yet: the plan is not ready", ok=False)
            return
        force, self._force_next_write = self._force_next_write, False
        self._write_worker(self.plan, self.session.out_dir, force)

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
        if self.wizard is not None:
            self.wizard.show_result(Step.CONFIGS, text, ok=ok)
        self.notify(text, severity="information" if ok else "error", timeout=4)

    # --- launching ----------------------------------------------------------------------------
    def action_launch(self) -> None:
        wiz = self.wizard
        if wiz is None:
            return
        if self.session.errors(Step.LAUNCH) or wiz.pane(Step.LAUNCH) is None:
            self.goto(Step.LAUNCH)
            return
        if self.plan is None:
            wiz.show_result(Step.LAUNCH, "no plan yet: finish the earlier steps", ok=False)
            return
        wiz.show_launch_progress("writing the bundle and starting…")
        self._launch_worker(self.plan, self.session.out_dir, self.session.run_root)

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, description="launching")
    def _launch_worker(self, plan: Plan, out: Path, run_root: Path | None) -> None:
        try:
            services.write_bundle(plan, out)
            source, run_dir = self.backend_factory(plan.spec, out, run_root)
        except Exception as e:  # noqa: BLE001
            self.post_message(LaunchFailed(one_line(e) or type(e).__name__))
            return
        self.post_message(RunStarted(source, run_dir))

    def on_launch_failed(self, message: LaunchFailed) -> None:
        if self.wizard is not None:
            self.wizard.show_result(Step.LAUNCH, message.message, ok=False)

    def on_run_started(self, message: RunStarted) -> None:
        from tui.screens.monitor import MonitorScreen

        if self.wizard is not None:
            self.wizard.show_launch_progress(f"run started: {message.run_dir}")
        self.push_screen(MonitorScreen(message.source, run_dir=message.run_dir))


def _wizard_commands() -> Any:
    """The palette's provider, imported when the palette first opens (start-up speed)."""
    from tui.commands import WizardCommands

    return WizardCommands


def write_summary(report: WriteReport, out: Path) -> str:
    """One line from the writers' report: what was written, unchanged, backed up."""
    text = f"wrote {len(report.written)} file(s) to {out.resolve()}"
    if report.unchanged:
        text += f", {len(report.unchanged)} unchanged"
    if report.backed_up:
        text += f", backed up {len(report.backed_up)} edited file(s) as *.bak-*"
    return text


def initial_spec(profile: str | None, config_dir: Path | None) -> Spec:
    """The spec the wizard opens on: ``profile`` if given, else the built-in demo profile,
    else the embedded demo spec."""
    if profile:
        return services.load_profile_spec(profile, config_dir)
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
