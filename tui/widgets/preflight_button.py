"""The Launch step's "Preflight" button: writes the bundle, runs its preflight (all-reduce busbw,
node pairs, GEMM per GPU) on the chosen backend in a thread worker, and shows the verdict in the
step's result line. The full tables are in ``RUN/preflight.json`` and ``dtrain-tui preflight``.

It handles its own press (the step only yields it), so the step's code stays as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets import Button

from tui.lifecycle import torn_down


class PreflightButton(Button):
    """Runs the bundle's preflight; the Launch step shows the outcome."""

    def __init__(self) -> None:
        super().__init__("Preflight", id="preflight", compact=True)

    def _step(self) -> Any:
        from tui.screens.launch import LaunchStep

        return self.query_ancestor(LaunchStep)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        step = self._step()
        session = step.session
        if step.check() or session.plan is None:
            step.show_result("preflight: finish the steps first (no valid plan yet)", ok=False)
            return
        step.show_result("preflight: writing the bundle and measuring…", ok=True)
        self.disabled = True
        plan, out, root = session.plan, Path(session.out_dir), session.run_root
        self.run_worker(
            lambda: self._run(plan, out, root),
            thread=True,
            exclusive=True,
            group="preflight",
            description="preflight",
            exit_on_error=False,
        )

    def _run(self, plan: Any, out: Path, root: Path | None) -> None:
        from engine.diagnose.preflight import verdict_line
        from engine.errors import one_line
        from engine.launch.options import LaunchOptions
        from engine.launch.preflight import run_preflight
        from engine.rundir.files import new_run_dir
        from engine.write.common import run_name
        from tui import services

        try:
            services.write_bundle(plan, out)
            launch = plan.spec.launch
            kind = launch.backend.value
            options = LaunchOptions.from_spec(launch)
            if kind in ("local", "slurm"):
                options.hosts = []
            run_dir = new_run_dir(f"{run_name(plan)}-preflight", root)
            backend, report = run_preflight(kind, out, run_dir, options)
            text, ok = f"{verdict_line(report)} ({backend.run.path})", report.verdict == "ok"
        except Exception as e:  # noqa: BLE001 - any failure is one line on the step
            text, ok = f"preflight: {one_line(e) or type(e).__name__}", False
        self.app.call_from_thread(self._done, text, ok)

    def _done(self, text: str, ok: bool) -> None:
        if torn_down(self):
            return  # the step went away while the preflight ran (its report is in the run dir)
        self.disabled = False
        self._step().show_result(text, ok=ok)
