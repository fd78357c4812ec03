"""Writing the bundle and launching it: the wizard app's ``^s`` and ``^l`` (with the list of
what a write would replace, confirmed by pressing again), the monitor of the launched run, and
Open run… for a past or running one. :class:`RunningApp` is the base of
:class:`tui.app.DtrainApp` (and itself built on :class:`tui.planning.PlanningApp`); launches go
through an injectable backend factory, so tests hand it a canned backend. Writing and launching
run in thread workers and report back in messages (``tui/messages.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work

from engine.errors import one_line
from engine.plan.specs import Spec
from tui import services
from tui.messages import (
    BundleWriteFailed,
    BundleWriteNeedsConfirm,
    BundleWritten,
    LaunchFailed,
    RunStarted,
)
from tui.planning import PlanningApp
from tui.session import Step, WizardSession

if TYPE_CHECKING:
    from engine.plan.result import Plan
    from engine.rundir.events import EventSource
    from engine.write import WriteReport

BackendFactory = Callable[[Spec, Path, Path | None], "tuple[EventSource, Path]"]
"""``(spec, bundle_dir, run_root) -> (backend, run_dir)``, as :func:`tui.services.start_run`:
a launch backend for the written bundle, not started yet (the monitor starts and watches it)."""


def unfit_reason(plan: Plan) -> str:
    """Why a plan that does not fit is not launched, and what to change: one line."""
    need = plan.recommended.memory_per_gpu.total / 1024**3
    have = (plan.usable_bytes + plan.headroom_bytes) / 1024**3
    return (
        f"the plan does not fit: it needs {need:.1f} GiB per GPU of {have:.1f} GiB; "
        "use more or larger GPUs, a smaller model or batch (see 5 Decision)"
    )


class RunningApp(PlanningApp):
    """Writes and launches the session's plan; ``backend_factory`` makes the backend a
    launch runs."""

    def __init__(
        self, session: WizardSession, plan_delay_s: float, backend_factory: BackendFactory
    ) -> None:
        super().__init__(session, plan_delay_s)
        self.backend_factory = backend_factory
        self._write_confirm: tuple[int, str] | None = None
        """The write the user was shown and may confirm with a second ^s (generation, dir)."""

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
            self.post_message(BundleWriteFailed(one_line(e)))
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

    # --- launching ----------------------------------------------------------------------------
    def goto(self, step: Step) -> None:
        """Open ``step`` (from the command palette or any other screen)."""
        self.call_later(self._goto, step)

    async def _goto(self, step: Step) -> None:
        wiz = self.wizard
        if wiz is not None:
            while len(self.screen_stack) > 1 and self.screen is not wiz:
                self.pop_screen()
            await wiz.go(step)

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
        if not self.plan.recommended.fits:
            wiz.show_result(Step.LAUNCH, "not started: " + unfit_reason(self.plan), ok=False)
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
            self.post_message(LaunchFailed(one_line(e)))
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
