"""Launching from the wizard with an injected backend: no torchrun, no processes. The app is
given a backend factory that returns a canned event source (two ranks print a few lines and
exit 0); Ctrl+L writes the bundle, calls the factory and opens the monitor on what it returned."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.plan.specs import Spec, demo_spec
from engine.rundir.events import Event, LineBatch, RankExit, RunStateChanged
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp

LINES = {r: (f"hello from rank {r}", f"[dtrain] step=1/1 loss={2.5 + r:.4f}") for r in (0, 1)}


class CannedBackend:
    """What a launch backend looks like to the monitor (an ``EventSource``), with no process
    behind it: one batch of events per poll once started."""

    def __init__(self) -> None:
        self.batches: list[list[Event]] = [
            [RunStateChanged("running", "started")],
            [LineBatch(0, r, "stdout", LINES[r]) for r in LINES],
            [RankExit(0, r, 0) for r in LINES],
            [RunStateChanged("succeeded", "all ranks exited 0")],
        ]
        self.started = False
        self.stopped = False

    def start(self) -> None:
        self.started = True

    def poll(self, timeout: float) -> list[Event]:
        return self.batches.pop(0) if self.started and self.batches else []

    def stop(self) -> None:
        self.stopped = True

    @property
    def done(self) -> bool:
        return self.stopped or (self.started and not self.batches)


def test_ctrl_l_runs_the_injected_backend_and_the_monitor_shows_its_lines(tmp_path: Path) -> None:
    asyncio.run(_launch(tmp_path))


async def _launch(tmp_path: Path) -> None:
    from tui.screens.monitor import MonitorScreen

    backend = CannedBackend()
    calls: list[tuple[Spec, Path, Path | None]] = []

    def factory(spec: Spec, bundle_dir: Path, run_root: Path | None) -> tuple[CannedBackend, Path]:
        calls.append((spec, bundle_dir, run_root))
        assert (bundle_dir / "bundle.json").exists()  # the bundle is written first
        return backend, tmp_path / "runs" / "canned"

    out, runs = tmp_path / "bundle", tmp_path / "runs"
    app = DtrainApp(
        demo_spec(), out_dir=out, run_root=runs, plan_delay_s=0.05, backend_factory=factory
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(*["ctrl+n"] * 6)
        await at_step(pilot, "launch")
        await settle(pilot)
        await pilot.press("ctrl+l")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor screen")
        monitor = app.screen
        assert isinstance(monitor, MonitorScreen)
        await until(pilot, lambda: monitor.finished is not None, "the run never finished")
        assert monitor.finished == "succeeded"
        for r, lines in LINES.items():
            assert monitor.pane_lines(f"r{r}")[-len(lines) :] == list(lines)
    assert len(calls) == 1
    spec, bundle_dir, run_root = calls[0]
    assert spec == app.spec and bundle_dir == out and run_root == runs
    assert backend.started and not backend.stopped  # leaving the monitor never stops a run
