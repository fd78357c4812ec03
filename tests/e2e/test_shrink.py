"""``--allow-shrink`` for real: a 2-node x 1-rank local bundle of the example trainer (DDP over
gloo on CPU) whose node 1 fails every time: its rank is SIGKILLed once a checkpoint is complete,
then its script exits 1 at once. The failure repeats, no spare is left, so the restart policy
re-plans the bundle for 1 node keeping the global batch (grad-accum 1 -> 2), writes it into the
third attempt's directory and launches it; that attempt resumes from the shared checkpoint
(step > 0, resharded by DCP) and succeeds. run.json and ``monitor --follow`` say so. Nothing
sleeps to wait: the run's events are polled with a timeout and every wait has a deadline."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli import main
from cli.monitor_cmd import follow_attempts
from engine.launch.drill import newest_complete, rank_pid
from engine.launch.options import LaunchOptions
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.rundir.record import RunState, read_record
from engine.write.manifest import read_manifest
from tests.e2e.launch_util import REPO

pytestmark = pytest.mark.slow

STEPS = 8
EVERY = 2
DEADLINE = 300.0
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]
FAIL_AGAIN = (
    'if compgen -G "$DTRAIN_CKPT_DIR/step_*/COMPLETE" > /dev/null; then\n'
    '  echo "test: node 1 fails again" >&2; exit 1\n'
    "fi\n"
)
SHRINK_LINE = (
    "node 1 left out: its failure repeated; no spare; continuing on 1 node, "
    "global batch 8 kept: grad-accum 1 -> 2"
)


def _bundle(out: Path, *args: str, gpus: int = 1) -> Path:
    argv = ["write", *TINY, *args, "--gpus-per-node", str(gpus), "--nodes", "2", "--seq-len", "32"]
    argv += ["--global-batch", "8", "--steps", str(STEPS), "--out", str(out)]
    argv += ["--script-arg=--sleep-per-step", "--script-arg=0.15"]
    assert main(argv) == 0
    node1 = out / "launch_node1.sh"
    text = node1.read_text()
    anchor = "mkdir -p logs\n"
    assert anchor in text
    # Node 1 fails at once whenever a checkpoint is complete: from the second attempt on.
    node1.write_text(text.replace(anchor, FAIL_AGAIN + anchor, 1))
    return out


@pytest.mark.parametrize("framework,gpus", [("ddp", 1), ("fsdp", 2)])
def test_a_node_that_keeps_failing_is_left_out_and_the_run_goes_on(
    framework: str, gpus: int, tmp_path: Path
) -> None:
    """DDP 2x1 -> 1x1; FSDP 2x2 -> 1x2 (FSDP plans need 2 ranks); node 1's first rank killed."""
    b = _bundle(tmp_path / "bundle", "--framework", framework, gpus=gpus)
    opts = LaunchOptions(
        hang_timeout_s=120, env={"DTRAIN_CKPT_EVERY": str(EVERY)}, allow_shrink=True
    )
    policy = RestartPolicy(max_restarts=3, backoff_s=0.2)
    run = RestartingRun.for_bundle("local", b, tmp_path / "run", opts, policy)
    ckpt_dir = Path(run.options.env["DTRAIN_CKPT_DIR"])
    killed: list[int] = []
    said: list[str] = []
    run.start()
    end = time.monotonic() + DEADLINE
    while not run.done:
        if time.monotonic() > end:
            run.kill()
            run.wait(60)
            pytest.fail(f"run did not end in {DEADLINE}s: {run.record.reason}")
        for ev in run.poll(0.1):
            line = getattr(ev, "line", "")
            if line.startswith("[restart] "):
                said.append(line)
        # The first attempt's rank 1 (node 1) is killed once a checkpoint is complete.
        if not killed and len(run.watches) == 1 and run.current is not None:
            if newest_complete(ckpt_dir) is not None:
                pid = rank_pid(run.current.run_id, gpus)
                if pid is not None:
                    killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
    assert killed, "the kill never landed"
    assert run.state == RunState.SUCCEEDED, run.record.reason
    rec = read_record(run.path)
    assert [a.state for a in rec.attempts] == [
        RunState.FAILED,
        RunState.FAILED,
        RunState.SUCCEEDED,
    ], rec.attempts
    first, second, third = rec.attempts
    assert first.failed_node == 1 and second.failed_node == 1, (first, second)
    assert (first.nodes, second.nodes, third.nodes) == (2, 2, 1)
    assert first.shrunk_from is None and second.shrunk_from is None
    assert third.shrunk_from == 2 and third.excluded == SHRINK_LINE
    assert third.resumed_from_step is not None and third.resumed_from_step >= EVERY
    assert third.last_step == STEPS
    # The third attempt ran the shrunk bundle, written into its own directory.
    shrunk = run.path / third.run_dir / "bundle"
    assert read_manifest(shrunk).nodes == 1
    assert read_manifest(shrunk).framework == framework
    assert json.loads((shrunk / "plan.json").read_text())["recommended"]["grad_accum"] == 2
    assert any(SHRINK_LINE in x for x in said), said
    data = json.loads((run.path / "run.json").read_text())
    assert data["attempts"][2]["shrunk_from"] == 2 and data["attempts"][2]["nodes"] == 1
    out = io.StringIO()
    assert follow_attempts(run.path, out) == 0
    text = out.getvalue()
    assert f"[attempt 3] succeeded on localhost, resumed from step {third.resumed_from_step}" in (
        text
    ), text
    assert SHRINK_LINE in text, text


def test_launch_allow_shrink_goes_on_without_the_node(tmp_path: Path) -> None:
    """``launch --max-restarts 2 --allow-shrink``, node 1's script exiting 1 every time: the
    third attempt runs on 1 node and succeeds; the command says the shrink, as does
    ``monitor --follow``."""
    b = _bundle(tmp_path / "bundle")
    node1 = b / "launch_node1.sh"
    node1.write_text(node1.read_text().replace(FAIL_AGAIN, "exit 1\n", 1))
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "cli", "launch", str(b), "--max-restarts", "2"]
    cmd += ["--allow-shrink", "--run-dir", str(run_dir)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=DEADLINE, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[restart] attempt 2 failed: " in p.stdout + p.stderr
    assert SHRINK_LINE in p.stdout + p.stderr
    rec = read_record(run_dir)
    assert [a.nodes for a in rec.attempts] == [2, 2, 1]
    assert rec.attempts[-1].shrunk_from == 2 and rec.state == RunState.SUCCEEDED
    m = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(run_dir), "--follow"],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=REPO,
    )
    assert m.returncode == 0, m.stdout + m.stderr
    assert f"[attempt 3] succeeded on localhost, started afresh; {SHRINK_LINE}" in m.stdout
