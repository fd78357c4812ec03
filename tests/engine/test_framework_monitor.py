"""Any training script gets the monitor: a user's script (tests/data/framework_logs/
fake_trainer.py: plain Python printing one framework's own progress lines, no torch, no dtrain-tui
code) runs as two ranks into a run directory; the monitor's run-directory reader and rank state
show its steps, loss and throughput and flag the slow rank, and ``calibrate`` fits from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.fsio import atomic_write_text
from engine.monitor.calibrate import calibrate_run
from engine.monitor.logparse import StepSource
from engine.monitor.state import MonitorState
from engine.monitor.tail import RunDirSource
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec
from engine.write.plan_json import plan_json

FAKE = Path(__file__).resolve().parents[1] / "data" / "framework_logs" / "fake_trainer.py"
TINY = Spec(
    model=ModelSpec(layers=2, hidden=64, heads=4, vocab=256),
    hardware=HardwareSpec(gpu="cpu", gpus_per_node=2),
    training=TrainingSpec(seq_len=32, global_batch=4),
)
# framework -> (the source of its last step line, the throughput unit charted, log interval)
CASES = {
    "hf_trainer": (StepSource.HF_TRAINER, "it/s", 1),  # its final dict comes last
    "accelerate": (StepSource.TQDM, "it/s", 1),
    "lightning": (StepSource.LIGHTNING, "it/s", 1),
    "torchtitan": (StepSource.TORCHTITAN, "tokens/s", 10),  # step time from its timestamps
    "megatron": (StepSource.MEGATRON, "samples/s", 1),
    "deepspeed": (StepSource.DEEPSPEED, "samples/s", 1),
    "nanogpt": (StepSource.NANOGPT, "it/s", 1),
}
LOGGED = 12


def make_run(root: Path, framework: str, every: int, step_time: float) -> Path:
    """Two ranks of the fake script (rank 1 twice as slow) with their output in the run's logs,
    a plan.json, and a finished run.json: what a launch leaves."""
    run = root / "run"
    logs = run / "logs"
    logs.mkdir(parents=True)
    (run / "plan.json").write_text(plan_json(plan(TINY)))
    for rank in (0, 1):
        with (
            (logs / f"rank{rank}.stdout.log").open("wb") as out,
            (logs / f"rank{rank}.stderr.log").open("wb") as err,
        ):
            argv = [FAKE, framework, "--steps", LOGGED * every, "--every", every]
            subprocess.run(
                [sys.executable, *map(str, argv), "--step-time", str(step_time)],
                env={**os.environ, "RANK": str(rank)},
                stdout=out,
                stderr=err,
                check=True,
                timeout=120,
            )
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "exit_code": 0} for r in (0, 1)]
    info = {"state": "succeeded", "world_size": 2, "nodes": 1, "ranks": ranks}
    atomic_write_text(run / "run.json", json.dumps(info))
    return run


def monitor(run: Path) -> MonitorState:
    """The run directory read to its end by the monitor's reader, into a rank state."""
    src = RunDirSource(run)
    state = MonitorState(2)
    deadline = time.monotonic() + 60
    while not src.done and time.monotonic() < deadline:
        state.apply(src.poll(0.05), time.monotonic())
    assert src.done, "the run directory was not read to its end"
    return state


@pytest.mark.parametrize("framework", sorted(CASES))
def test_framework_run_through_monitor_and_calibrate(framework: str, tmp_path: Path) -> None:
    source, unit, every = CASES[framework]
    predicted = plan(TINY).recommended.step_time_s
    run = make_run(tmp_path, framework, every, 8 * predicted)
    state = monitor(run)
    snap = state.snapshot(time.monotonic())
    last = LOGGED * every
    for r in (0, 1):
        st = snap.ranks[r]
        assert st.step == last and st.step_source is source, (r, st.step, st.step_source)
        assert st.loss == pytest.approx(10 / (1 + 0.1 * last), rel=1e-3)
        assert len(st.loss_history) == LOGGED
        assert st.throughput_unit == unit and len(st.tps_history) >= LOGGED - 1
        want = 8 * predicted * (2 if r == 1 else 1)
        assert st.typical_step_time == pytest.approx(want, rel=0.05)
    assert snap.ranks[1].straggler and not snap.ranks[0].straggler
    if unit == "tokens/s":
        assert snap.ranks[0].tokens_per_s == pytest.approx(2048 / (8 * predicted), rel=0.01)
    # calibrate reads the same logs: the step lasts as long as the slow rank's.
    src = calibrate_run(run, name=framework).calibration.source
    assert src.measured_step_time_s == pytest.approx(16 * predicted, rel=0.05)
    assert src.steps + src.warmup_steps >= LOGGED - 1
