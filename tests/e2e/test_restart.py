"""The restart policy and the fault drill, for real: torchrun, 2 ranks over gloo on CPU, the
shipped trainer through the rank agent. A rank SIGKILLed at a random step is restarted by the
policy (engine/launch/restart.py), resumes from the newest complete checkpoint and ends with the
losses of an uninterrupted run; run.json holds every attempt. ``drill`` passes on the local
bundle and fails, saying why, on a script that never resumes. Nothing sleeps to wait: the run's
events are polled with a timeout and every wait has a deadline."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.monitor_cmd import follow_attempts
from engine.launch.drill import newest_complete, rank_pid, run_drill
from engine.launch.options import LaunchOptions
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.rundir.record import RunState, read_record
from tests.e2e.launch_util import REPO, make_bundle

pytestmark = pytest.mark.slow

STEPS = 8
EVERY = 2
PACE = ["--sleep-per-step", "0.15"]
DEADLINE = 240.0


def _drive(run: RestartingRun, tick: object = None) -> None:
    end = time.monotonic() + DEADLINE
    while not run.done:
        if time.monotonic() > end:
            run.kill()
            run.wait(60)
            pytest.fail(f"run did not end in {DEADLINE}s: {run.record.reason}")
        run.poll(0.1)
        if callable(tick):
            tick()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_bundle(tmp_path_factory.mktemp("b") / "bundle", steps=STEPS, script_args=PACE)


@pytest.fixture(scope="module")
def reference(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    opts = LaunchOptions(hang_timeout_s=120, env={"DTRAIN_RESUME": "never"})
    run = RestartingRun.for_bundle(
        "local", bundle, tmp_path_factory.mktemp("ref") / "run", opts, RestartPolicy()
    )
    run.start()
    _drive(run)
    assert run.state == RunState.SUCCEEDED, run.record.reason
    assert sorted(run.watches[0].losses) == list(range(1, STEPS + 1))
    return run.watches[0].losses


@pytest.mark.parametrize("seed", [11, 23])
def test_killed_rank_is_restarted_and_resumes(
    seed: int, bundle: Path, reference: dict[int, str], tmp_path: Path
) -> None:
    rng = random.Random(seed)
    rank, at = rng.randrange(2), rng.randrange(EVERY + 1, STEPS)
    opts = LaunchOptions(hang_timeout_s=120, env={"DTRAIN_CKPT_EVERY": str(EVERY)})
    run = RestartingRun.for_bundle(
        "local", bundle, tmp_path / "run", opts, RestartPolicy(max_restarts=2, backoff_s=0.2)
    )
    ckpt_dir = Path(run.options.env["DTRAIN_CKPT_DIR"])
    newest: list[int | None] = []
    killed: list[int] = []

    def tick() -> None:
        w = run.watches[-1]
        due = not killed and len(run.watches) == 1 and (w.last_step or 0) >= at
        # Killed once a checkpoint is complete (a loaded machine may still be saving step 2).
        if due and run.current and newest_complete(ckpt_dir) is not None:
            pid = rank_pid(run.current.run_id, rank)
            if pid is not None:
                killed.append(w.last_step or 0)
                os.kill(pid, signal.SIGKILL)
        if killed and len(run.watches) == 2 and not newest:
            newest.append(newest_complete(ckpt_dir))  # the killed attempt is over

    run.start()
    _drive(run, tick)
    assert killed, "the kill never landed"
    assert run.state == RunState.SUCCEEDED, run.record.reason
    rec = read_record(run.path)
    assert [a.state for a in rec.attempts] == [RunState.FAILED, RunState.SUCCEEDED]
    first, second = rec.attempts
    assert f"rank {rank}" in first.cause, first.cause
    assert second.resumed_from_step == newest[0] and newest[0] is not None
    assert second.resumed_from_step >= EVERY
    assert 0 <= second.steps_redone <= EVERY + 1
    assert (run.path / second.run_dir / "run.json").is_file()
    # The resumed attempt trains the same: every loss it printed is the reference's.
    after = run.watches[1].losses
    assert min(after) == second.resumed_from_step + 1
    assert after == {s: reference[s] for s in after}
    assert after[STEPS] == reference[STEPS]
    data = json.loads((run.path / "run.json").read_text())
    assert data["state"] == "succeeded" and len(data["attempts"]) == 2
    # monitor --follow shows both attempts, where the second resumed, and the work lost.
    out = io.StringIO()
    assert follow_attempts(run.path, out) == 0
    text = out.getvalue()
    assert "[attempt 1] failed" in text and f"rank {rank}" in text, text
    assert f"[attempt 2] succeeded on localhost, resumed from step {newest[0]}" in text, text
    assert f"work lost: {second.steps_redone} step(s) redone" in text, text
    assert f"[dtrain] step={STEPS}/{STEPS} loss={reference[STEPS]}" in text


def test_drill_passes_on_the_local_bundle(bundle: Path, tmp_path: Path) -> None:
    said: list[str] = []
    report = run_drill(
        bundle,
        tmp_path,
        kills=1,
        seed=5,
        every=EVERY,
        options=LaunchOptions(hang_timeout_s=120),
        say=said.append,
    )
    assert report.ok, "\n".join(said + report.lines())
    (r,) = report.recoveries
    assert r.resumed_from == r.newest_ckpt
    assert r.detect_s is not None and r.restart_s is not None and r.back_s is not None
    assert report.lines()[-1].startswith("drill passed")


NEVER_RESUMES = """\
import os, sys, time
rank = int(os.environ["RANK"])
for step in range(1, 9):
    print(f"[dtrain] step={step}/8 loss={1.0 / step:.4f} tokens_per_s=1 step_time_s=0.1 mem_gb=0",
          flush=True)
    time.sleep(0.15)
"""


def test_drill_fails_on_a_script_that_never_resumes(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(NEVER_RESUMES)
    b = make_bundle(tmp_path / "bundle", script=script)
    cmd = [sys.executable, "-m", "cli", "drill", str(b), "--kills", "1", "--seed", "1"]
    cmd += ["--every", "2", "--run-dir", str(tmp_path / "work")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, cwd=REPO)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "did not resume" in p.stderr and "restart from step 1" in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("drill FAILED"), p.stderr
    assert "Traceback" not in p.stderr


FAILS_ONCE = """\
import os, sys, time
from pathlib import Path
mark = Path(os.environ["DTRAIN_CKPT_DIR"]) / f"failed-once-{os.environ['RANK']}"
mark.parent.mkdir(parents=True, exist_ok=True)
print("[dtrain] step=1/2 loss=1.0 tokens_per_s=1 step_time_s=0.1 mem_gb=0", flush=True)
if os.environ["RANK"] == "1" and not mark.exists():
    mark.write_text("x")
    sys.exit(3)
print("[dtrain] step=2/2 loss=0.5 tokens_per_s=1 step_time_s=0.1 mem_gb=0", flush=True)
"""


def test_launch_max_restarts_relaunches_and_monitor_shows_attempts(tmp_path: Path) -> None:
    """``launch --max-restarts 1``: the first attempt's rank 1 exits 3, the policy relaunches
    (the checkpoint directory every attempt shares is where the script keeps its mark), the
    second succeeds; ``monitor --follow`` prints both attempts and the work lost."""
    script = tmp_path / "once.py"
    script.write_text(FAILS_ONCE)
    b = make_bundle(tmp_path / "bundle", script=script)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli", "launch", str(b), "--max-restarts", "1"]
    p = subprocess.run(
        [*cmd, "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[restart] attempt 1 failed: rank 1" in p.stdout + p.stderr
    rec = read_record(run_dir)
    assert [a.state for a in rec.attempts] == [RunState.FAILED, RunState.SUCCEEDED]
    assert rec.state == RunState.SUCCEEDED
    m = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(run_dir), "--follow"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=REPO,
    )
    assert m.returncode == 0, m.stdout + m.stderr
    assert "[attempt 1] failed on localhost, started afresh" in m.stdout, m.stdout
    assert "[attempt 2] succeeded" in m.stdout and "1 restart(s); work lost" in m.stdout
