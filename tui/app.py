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
from tui.messages import (
    BundleWriteFailed,
    BundleWriteNeedsConfirm,
    BundleWritten,
    LaunchFailed,
    RunStarted,
    StepValidated,
)
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
        self._write_confirm: tuple[int, str] | None = None
        """The write the user was shown and may confirm with a second ^s (generation, dir)."""
        self._starts_on_demo = spec is None and profile_name is None
        """Opened on the built-in local CPU demo (no spec, no profile given)."""
        self._saved_spec: Spec | None = spec
        """The spec as loaded or last saved: the header says "unsaved changes" when the
        session's differs (None: the session's first spec, read after the first frame)."""

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

    # --- the header ---------------------------------------------------------------------------
    @property
    def unsaved(self) -> bool:
        """The spec differs from the loaded (or last saved) profile's, or from the start."""
        if self._saved_spec is None:
            self._saved_spec = self.session.spec
        return self.session.spec != self._saved_spec

    def header_text(self) -> str:
        """The header's second line: the loaded profile and whether the spec has unsaved
        changes; on the untouched demo, how to run it."""
        dirty = self.unsaved
        if self.profile_name:
            text = f"profile {self.profile_name}"
        elif self._starts_on_demo:
            text = "local CPU demo" if dirty else "local CPU demo — Ctrl+L runs it"
        else:
            text = "no profile"
        if dirty:
            text += " · ● unsaved changes (Ctrl+O saves)"
        return text

    def update_header(self) -> None:
        wiz = self.wizard
        if wiz is not None:
            wiz.sub_title = self.header_text()

    def on_step_validated(self, message: StepValidated) -> None:
        super().on_step_validated(message)
        self.update_header()

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
        self.push_screen(screen, lambda profile: self._profile_chosen(profile, screen.current))

    def _profile_chosen(self, profile: Profile | None, current: str | None = None) -> None:
        """The profiles dialog closed: with the profile loaded or saved, or None (closed; a
        rename or delete in it may still have changed the current profile's name)."""
        if profile is None:
            self.profile_name = current
            self.update_header()
            return
        self.profile_name = profile.name or None
        self._saved_spec = profile.spec
        if profile.spec != self.spec:
            self.load_spec(profile.spec)
        self.update_header()

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
        # A second ^s confirms what the first one listed, for the same plan and directory.
        token = self._write_token()
        confirmed = self._write_confirm == token
        self._write_confirm = None
        self._write_worker(self.plan, self.session.out_dir, confirmed, token)

    def _write_token(self) -> tuple[int, str]:
        return (self.session.generation, str(self.session.out_dir.expanduser().absolute()))

    @work(thread=True, exclusive=True, group="write", exit_on_error=False, description="writing")
    def _write_worker(self, plan: Plan, out: Path, confirmed: bool, token: tuple[int, str]) -> None:
        try:
            if not confirmed:
                # Nothing already on disk is replaced or deleted before the user saw the list.
                files = services.render_bundle(plan)
                preview = services.preview_write(files, out)
                if preview.touches_existing:
                    self.post_message(
                        BundleWriteNeedsConfirm(
                            out, preview.lines(), bool(preview.conflicts), token
                        )
                    )
                    return
            report = services.write_bundle(plan, out, force=confirmed)
        except Exception as e:  # noqa: BLE001
            self.post_message(BundleWriteFailed(one_line(e) or type(e).__name__))
            return
        self.post_message(BundleWritten(out, write_summary(report, out)))

    def on_bundle_write_needs_confirm(self, message: BundleWriteNeedsConfirm) -> None:
        self._write_confirm = message.token
        where = message.out.expanduser().absolute()
        head = f"Writing to {where} would change files already there:"
        if message.conflicts:
            head = f"{where}: some files are yours (edited or not written by dtrain-tui):"
        text = "\n".join([head, *(f"  · {line}" for line in message.lines)])
        text += "\npress ^s again to write; change anything to cancel"
        if self.wizard is not None:
            self.wizard.show_result(Step.CONFIGS, text, ok=not message.conflicts, confirm=True)
        self.notify(
            "\n".join(message.lines) + "\npress ^s again to write",
            title="Confirm the write",
            severity="warning",
            timeout=6,
        )

    def on_bundle_written(self, message: BundleWritten) -> None:
        self._write_result(message.summary, ok=True)

    def on_bundle_write_failed(self, message: BundleWriteFailed) -> None:
        text = message.message
        if "force" in text:
            # The writers refused to replace files the user edited (since the list was
            # shown): a second ^s backs them up.
            self._write_confirm = self._write_token()
            text += " · press ^s again to back those files up and write"
        self._write_result(text, ok=False)

    def _write_result(self, text: str, *, ok: bool) -> None:
        if self.wizard is not None:
            self.wizard.show_result(Step.CONFIGS, text, ok=ok)
        self.notify(text, severity="information" if ok else "error", timeout=4)

    async def action_edit_file(self) -> None:
        """The configs step's "edit in $EDITOR" (from the palette): on its highlighted file."""
        await self._configs_action("edit")

    async def action_copy_command(self) -> None:
        """The configs step's "copy the launch command" (from the palette)."""
        await self._configs_action("copy_command")

    async def _configs_action(self, action: str) -> None:
        wiz = self.wizard
        if wiz is None:
            return
        if wiz.current != Step.CONFIGS:
            while len(self.screen_stack) > 1 and self.screen is not wiz:
                self.pop_screen()
            if not await wiz.go(Step.CONFIGS):
                return
        pane = wiz.pane(Step.CONFIGS)
        if pane is not None:
            await pane.run_action(action)

    # --- launching ----------------------------------------------------------------------------
    def action_launch(self) -> None:
        wiz = self.wizard
        if wiz is None:
            return
        if self.session.errors(Step.LAUNCH) or wiz.pane(Step.LAUNCH) is None:
            # The first Ctrl+L shows where and how the run starts; the second starts it.
            self.goto(Step.LAUNCH)
            self.call_later(self._launch_hint)
            return
        if self.plan is None:
            wiz.show_result(Step.LAUNCH, "no plan yet: finish the earlier steps", ok=False)
            return
        wiz.show_launch_progress("writing the bundle and starting…")
        # Like ^s: what the write would replace or remove is listed first; ^l again goes ahead.
        token = self._write_token()
        confirmed = self._launch_confirm == token
        self._launch_confirm = None
        self._launch_worker(
            self.plan, self.session.out_dir, self.session.run_root, confirmed, token
        )

    def _launch_hint(self) -> None:
        wiz = self.wizard
        if wiz is not None and wiz.current == Step.LAUNCH:
            wiz.show_launch_progress("ready: check the summary, then Ctrl+L again starts the run")

    _launch_confirm: tuple[int, str] | None = None
    """The launch whose rewrite of the bundle the user was shown (generation, directory)."""

    @work(thread=True, exclusive=True, group="launch", exit_on_error=False, description="launching")
    def _launch_worker(
        self,
        plan: Plan,
        out: Path,
        run_root: Path | None,
        confirmed: bool = False,
        token: tuple[int, str] | None = None,
    ) -> None:
        try:
            if not confirmed:
                preview = services.preview_write(services.render_bundle(plan), out)
                if preview.touches_existing:
                    self._launch_confirm = token  # read by the next ^l, on the UI thread
                    self.post_message(
                        LaunchFailed(
                            f"launching rewrites {out.expanduser().absolute()}: "
                            + "; ".join(preview.lines())
                            + " · press ^l again to write and start"
                        )
                    )
                    return
            services.write_bundle(plan, out, force=confirmed)
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
        screen = MonitorScreen(message.source, run_dir=message.run_dir, can_go_back=True)
        self._keep_monitor(screen)
        self.push_screen(screen)

    # --- the monitor: back to the wizard, open a run (tui/screens/monitor.py, open_run.py) -----
    live_monitor: Any = None
    """The monitor of the run launched from here (a MonitorScreen): installed, so going back to
    the wizard keeps it reading the run, and Open run… (ctrl+g) shows it again as it was."""

    def _keep_monitor(self, screen: Any) -> None:
        old = self.live_monitor
        if old is not None and old not in self.screen_stack:
            self.uninstall_screen(old)
            old.remove()  # its reader stops; that run goes on (its launcher owns it)
        self.live_monitor = screen
        self.install_screen(screen, name=f"monitor-{id(screen)}")

    def action_open_run(self) -> None:
        """Open run…: pick a past or running run under the runs directory; watch it."""
        from engine.rundir.files import default_runs_root
        from tui.screens.open_run import OpenRunScreen

        root = self.session.run_root or default_runs_root()
        self.push_screen(OpenRunScreen(root), self._open_run)

    def _open_run(self, run_dir: Path | None) -> None:
        from engine.errors import DtrainError
        from engine.monitor.tail import RunDirSource
        from tui.screens.monitor import MonitorScreen

        if run_dir is None:
            return
        live = self.live_monitor
        if live is not None and live.run_dir is not None and live.run_dir == run_dir:
            if live not in self.screen_stack:
                self.push_screen(live)
            return
        source = RunDirSource(run_dir)
        try:
            source.start()
        except DtrainError as e:
            self.notify(e.message, severity="error")
            return
        self.push_screen(
            MonitorScreen(
                source,
                run_dir,
                world_size=source.world_size,
                can_go_back=True,
                stop_source_on_exit=True,  # stops the tailing only: the run is its launcher's
            )
        )


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
    if report.removed:
        text += f", removed {', '.join(report.removed)} (no longer used)"
    if report.kept:
        text += f", kept your edited {', '.join(report.kept)}"
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
