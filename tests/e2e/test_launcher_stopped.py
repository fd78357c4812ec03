"""A launcher that was stopped (Ctrl-Z then ``fg``, a paused VM, ``kill -STOP``) for longer than
``--hang-timeout`` while its ranks finished does not end the run ``failed: hang``: the time it
was stopped is not the ranks' silence. Real torchrun over gloo on CPU, the launcher
SIGSTOPped until every process of the run is gone (and at least the hang timeout has passed),
then SIGCONT: the run ends ``succeeded``. ``benchmarks/launcher_stopped.py`` runs 10 trials."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.launch.reaper import kill_run_processes
from tests.e2e.launch_util import make_bundle, run_pids

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HANG_S = 4.0
"""The hang timeout of each trial: the launcher stays stopped longer than this."""


def stopped_launcher_trial(tmp: Path, hang_s: float = HANG_S, timeout: float = 240.0) -> str:
    """One launch whose launcher is stopped, after the ranks' first line, until the run's every
    process ended and ``hang_s`` + 1 seconds passed, then continued. Returns run.json's
    ``state: reason``."""
    bundle = make_bundle(tmp / "b", steps=4)
    run = tmp / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "launch", str(bundle), "--run-dir", str(run)]
        + ["--hang-timeout", str(hang_s)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    err: list[str] = []
    threading.Thread(target=lambda: err.extend(proc.stderr or ()), daemon=True).start()
    run_id = ""
    try:
        deadline = time.monotonic() + timeout
        for line in proc.stdout:  # the ranks' first sign of life on the launcher's output
            if line.startswith("[rank "):
                break
            assert time.monotonic() < deadline, "no rank line in time"
        else:
            raise AssertionError(f"launcher ended before any rank line: {''.join(err)}")
        threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the rest
        run_id = str(json.loads((run / "run.json").read_text())["run_id"])
        os.kill(proc.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # The stimulus: stopped while the ranks finish, and longer than the hang timeout.
            while run_pids(run_id) or time.monotonic() - stopped_at < hang_s + 1:
                assert time.monotonic() < deadline, f"the run's processes: {run_pids(run_id)}"
                time.sleep(0.1)  # polling the process table (the launcher is stopped)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait(10)
        if run_id:
            kill_run_processes(run_id)
    info = json.loads((run / "run.json").read_text())
    return f"{info['state']}: {info['reason']}"


def test_a_launcher_stopped_longer_than_the_hang_timeout_ends_the_run_done(
    tmp_path: Path,
) -> None:
    for i in range(3):
        got = stopped_launcher_trial(tmp_path / f"t{i}")
        assert got == "succeeded: all 2 ranks exited 0", f"trial {i}: {got}"
