"""The calibration round trip, for real: a local 2-rank CPU run (torchrun, gloo, the shipped
trainer), then ``dtrain-tui calibrate RUN_DIR`` and ``dtrain-tui plan --calibration NAME --json``
as subprocesses of ``python -m cli``; the re-plan names the calibration, and its step time is
within 25 % of the median the test itself reads from the rank logs (the catalog's figures were
further off: the figures are printed)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from engine.plan.calibration import warmup_steps
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec
from profiles.store import ProfileStore
from tests.e2e.launch_util import REPO, free_port

pytestmark = pytest.mark.slow

STEPS = 12
SPEC = [
    "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu",
    "--gpus-per-node", "2", "--seq-len", "32", "--global-batch", "4",
]  # fmt: skip
STEP_RE = re.compile(r"\[dtrain\] step=(\d+)/\d+ .* step_time_s=(\S+) ")


def cli(cfg: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DTRAIN_CONFIG_DIR": str(cfg)}
    return subprocess.run(
        [sys.executable, "-m", "cli", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def measured_median(run: Path) -> float:
    """The slowest rank's step time per step, median after the warm-up steps (read here, not
    taken from calibrate's output)."""
    per_step: dict[int, float] = {}
    for log in (run / "logs").glob("rank*.stdout.log"):
        for m in STEP_RE.finditer(log.read_text()):
            n, t = int(m[1]), float(m[2])
            per_step[n] = max(per_step.get(n, 0.0), t)
    steps = sorted(per_step)
    assert len(steps) == STEPS, steps
    return statistics.median(per_step[s] for s in steps[warmup_steps(len(steps)) :])


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real local run both tests read (a run directory is only read by calibrate)."""
    run = tmp_path_factory.mktemp("calibrate") / "run"
    port = str(free_port())
    launched = cli(
        run.parent / "cfg", "launch", *SPEC, "--steps", str(STEPS), "--master-port", port,
        "--run-dir", str(run), "--quiet", timeout=180,
    )  # fmt: skip
    assert launched.returncode == 0, launched.stderr
    return run


def test_run_calibrate_replan(real_run: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    run = real_run
    ProfileStore(cfg).save_spec(
        "local-cpu",
        Spec(
            model=ModelSpec(layers=2, hidden=64, heads=4, vocab=256),
            hardware=HardwareSpec(gpu="cpu", gpus_per_node=2),
            training=TrainingSpec(seq_len=32, global_batch=4),
        ),
    )
    measured = measured_median(run)

    done = cli(cfg, "calibrate", str(run), "--name", "local-cpu-run", "--profile", "local-cpu")
    assert done.returncode == 0, done.stderr
    assert "compute  ×" in done.stdout and "Step time  measured" in done.stdout
    saved = json.loads((cfg / "calibrations" / "local-cpu-run.json").read_text())
    assert saved["gpu"] == "cpu" and saved["source"]["run"] == "run"
    assert saved["source"]["steps"] == STEPS - warmup_steps(STEPS)

    before = json.loads(cli(cfg, "plan", *SPEC, "--json").stdout)
    planned = cli(cfg, "plan", *SPEC, "--calibration", "local-cpu-run", "--json")
    assert planned.returncode == 0, planned.stderr
    after = json.loads(planned.stdout)
    label = "calibrated from run run (compute ×"
    assert after["calibration"]["name"] == "local-cpu-run"
    assert any(label in p["answer"] for p in after["path"]), after["path"]
    assert before["calibration"] is None
    t_before = before["recommended"]["step_time_s"]
    t_after = after["recommended"]["step_time_s"]
    print(f"measured {measured:.4g} s, predicted before {t_before:.4g} s, after {t_after:.4g} s")
    assert abs(t_after - measured) <= 0.25 * measured
    assert abs(t_after - measured) <= abs(t_before - measured) + 0.01 * measured

    # The profile now names it: a plan from the profile uses it without --calibration, and the
    # text says so.
    text = cli(cfg, "plan", "--profile", "local-cpu")
    assert text.returncode == 0, text.stderr
    assert "Estimates calibrated from run run (compute ×" in text.stdout

    # Never replaced silently.
    again = cli(cfg, "calibrate", str(run), "--name", "local-cpu-run")
    assert again.returncode == 2
    assert again.stderr.count("\n") == 1 and "--force" in again.stderr


def test_monitor_offers_and_saves_a_calibration(
    real_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor on the finished run says ``k`` calibrates; ``k`` saves one named after the
    run, in the config dir, and says so."""
    from engine.monitor.tail import RunDirSource
    from tui.screens.calibrate_offer import end_of_run_hint
    from tui.screens.monitor import MonitorApp

    cfg = tmp_path / "cfg"
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(cfg))
    source = RunDirSource(real_run)

    async def go() -> list[str]:
        app = MonitorApp(source, real_run, world_size=source.world_size)
        async with app.run_test(size=(120, 40)) as pilot:

            def notes() -> list[str]:
                return [str(n.message) for n in app._notifications]

            async def until(what: str) -> None:
                for _ in range(600):  # 30 s
                    if any(what in n for n in notes()):
                        return
                    await pilot.pause(0.05)
                raise AssertionError(f"no notification with {what!r}: {notes()}")

            await until(end_of_run_hint("succeeded"))
            await pilot.press("k")
            await until("Saved calibration 'run'")
            return notes()

    found = asyncio.run(go())
    saved = json.loads((cfg / "calibrations" / "run.json").read_text())
    assert saved["source"]["run_dir"] == str(real_run)
    (line,) = [n for n in found if n.startswith("Saved calibration")]
    assert "--calibration run" in line
