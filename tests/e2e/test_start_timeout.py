"""Start-up is not a hang, for real: a rank that never starts fails the run after
``--start-timeout``, named with its node's last line, while the hang timeout (far longer) never
comes into it; every process of the run is gone afterwards.

Two local runs: real torchrun on 2 CPU ranks where rank 1 blocks before the rank agent (a
``sitecustomize`` on its PYTHONPATH waits forever when ``LOCAL_RANK`` is 1) while rank 0's agent
prints telemetry; and ``dtrain-tui launch --start-timeout`` on a plain bash node script whose
rank 1 never prints (no torch: the flag end to end, in a second). Waits are deadlines on states,
never fixed sleeps."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, free_port, make_bundle, wait_no_pids

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
START_S = 15.0
"""Long enough for torchrun and rank 0's agent to start on a loaded machine (its first line came
2 s after the launch on two busy cores: 7x that); far below the hang timeout, so only the start
timeout can end the run. The test waits this long: no longer than it needs."""
BLOCK_RANK_1 = (
    "import os, threading\n"
    "if os.environ.get('LOCAL_RANK') == '1':\n"
    "    threading.Event().wait()  # never reaches the rank agent, prints nothing\n"
)


def test_a_rank_blocked_before_the_agent_never_starts(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_RANK_1)
    bundle = make_bundle(tmp_path / "b", steps=2)
    env = {"PYTHONPATH": str(site), "DTRAIN_TELEMETRY_S": "0.5"}
    options = LaunchOptions(
        hang_timeout_s=600, start_timeout_s=START_S, env=env, master_port=free_port()
    )
    backend = LocalBackend(bundle, tmp_path / "run", options)
    t0 = time.monotonic()
    backend.start()
    collect(backend, timeout=START_S + 120)
    took = time.monotonic() - t0
    info = read_run(tmp_path / "run")
    reason = str(info["reason"])
    assert info["state"] == "failed", info
    assert reason.startswith(f"rank 1 never started in {START_S:g} s (--start-timeout); "), reason
    assert "last line from node 0 (localhost): " in reason, reason
    assert info["failed_rank"] == 1, info
    assert START_S <= took < START_S + 90, took
    assert wait_no_pids(backend.run_id) == []


# Rank 0 prints and goes on running; rank 1 never prints; torchrun's own line comes last.
SILENT_RANK_1 = (
    "echo '[default0]:hello from rank 0'\n"
    "echo 'torchrun: waiting for the workers'\n"
    "exec sleep 300\n"
)


def test_launch_start_timeout_names_the_rank_and_the_node_s_last_line(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", steps=1)
    (bundle / "launch_node0.sh").write_text("#!/usr/bin/env bash\nset -u\n" + SILENT_RANK_1)
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "cli", "launch", str(bundle), "--run-dir", str(run)]
    argv += ["--start-timeout", "1", "--quiet"]
    got = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    want = (
        "rank 1 never started in 1 s (--start-timeout); "
        "last line from node 0 (localhost): torchrun: waiting for the workers"
    )
    assert got.returncode != 0, got
    assert want in got.stderr, got.stderr
    info = read_run(run)
    assert info["state"] == "failed" and info["reason"] == want, info
    assert wait_no_pids(str(info["run_id"])) == []
