"""The stuck rank named, for real: 2 gloo ranks of the example trainer, one of which never
enters a collective (``--skip-collective-at-step``); the hang timeout fires, the launcher asks
every rank for its Flight Recorder dump, and the diagnosis (run.json, the launch command's
output, ``monitor --follow``) names that rank and the collective; nothing is left running.
Locally, over two sshd "nodes", and through a monitor's diagnose request on a running run."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.diagnose.request import request_diagnosis, wait_diagnosis
from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from engine.launch.ssh import SshBackend
from engine.plan.specs import Host
from engine.rundir.events import LineEvent
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, free_port, make_bundle, wait_no_pids
from tests.e2e.sshd import sshd_path, start_many

HANG_S = 10.0
"""Short, yet longer than a loaded machine's silent start (torch import, rendezvous): the hang
clock runs from the launch, and a timeout before the first collective has nothing to name."""
SKIP = ["--skip-collective-at-step", "3", "--skip-rank", "1", "--steps", "6"]
REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "cli"]


def _names_rank1(summary: str) -> None:
    assert summary.startswith("rank 1 (node 0"), summary
    assert "never entered all_reduce #" in summary, summary
    assert "[1024] float32" in summary and "pg default" in summary, summary
    assert "rank 0 waiting in it" in summary, summary


def test_hang_names_the_rank_that_skipped_the_collective(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", script_args=SKIP)
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run(
        [*CLI, "launch", str(bundle), "--run-dir", str(run), "--hang-timeout", str(HANG_S)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=HANG_S + 90,
    )
    took = time.monotonic() - t0
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    info = read_run(run)
    assert info["state"] == "failed" and info["reason"].startswith("hang: "), info["reason"]
    diag = info["diagnosis"]
    _names_rank1(diag["summary"])
    assert diag["stuck_ranks"] == [1] and diag["no_dump"] == []
    (group,) = diag["groups"]
    assert group["missed"]["op"] == "all_reduce" and group["missed"]["input_sizes"] == [[1024]]
    assert [w["rank"] for w in group["waiting"]] == [0]
    assert "skip_collective" in diag["stacks"]["1"][0]
    # The launch command's own output, and a later `monitor --follow`, both carry the line.
    out = proc.stdout + proc.stderr
    assert f"[dtrain-tui] diagnosis: {diag['summary']}" in out, out[-3000:]
    follow = subprocess.run(
        [*CLI, "monitor", str(run), "--follow"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"[dtrain-tui] diagnosis: {diag['summary']}" in follow.stdout
    # Started (torch import, rendezvous, two steps) + hang timeout + the dumps: well in budget.
    assert took < HANG_S + 30 + 30, took
    run_id = info["run_id"]
    assert wait_no_pids(run_id) == []


def test_diagnose_request_on_a_running_run(tmp_path: Path) -> None:
    """A monitor's "diagnose" (RUN/diagnose.request) on a run that hangs but whose hang
    timeout is far away: the answer comes in run.json, and the run keeps going until stopped."""
    bundle = make_bundle(tmp_path / "b", script_args=SKIP)
    backend = LocalBackend(bundle, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    backend.start()
    events: list[object] = []
    reader = threading.Thread(target=lambda: events.extend(collect(backend, 180)), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        log = tmp_path / "run" / "logs" / "rank1.stderr.log"
        while not (log.exists() and "stalls" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, "rank 1 never reached the skipped collective"
            time.sleep(0.1)  # polling the rank's log for the test hook's line
        # Rank 0 enters the extra all-reduce right after; a diagnosis may catch it before,
        # then rank 0 is not behind either: ask until the answer names rank 1.
        summary = ""
        while "never entered" not in summary:
            assert time.monotonic() < deadline, summary
            asked = request_diagnosis(tmp_path / "run")
            diag = wait_diagnosis(tmp_path / "run", asked, timeout=30)
            assert diag is not None, "the launcher did not answer"
            summary = diag.summary
        _names_rank1(summary)
        assert diag is not None and diag.why == "asked from the monitor"
        assert read_run(tmp_path / "run")["state"] == "running"
    finally:
        backend.stop()
        reader.join(60)
    assert wait_no_pids(backend.run_id) == []


def test_nccl_dump_files_of_a_failed_run_are_diagnosed(tmp_path: Path) -> None:
    """A run that fails after NCCL's watchdog dumped every rank (TORCH_NCCL_DUMP_ON_TIMEOUT,
    files in the bundle's logs/): the launcher diagnoses the files. No GPU here: the node
    script puts real pickled gloo dumps (tests/data/fr/subgroup_rank*.pkl) where NCCL writes
    its own, then exits 1."""
    fr = REPO / "tests" / "data" / "fr"
    bundle = make_bundle(tmp_path / "b", gpus_per_node=3, steps=1)
    copies = "".join(
        f"cp {shlex.quote(str(fr / f'subgroup_rank{r}.pkl'))} logs/nccl_trace_rank_{r}\n"
        for r in range(3)
    )
    (bundle / "launch_node0.sh").write_text(
        f'#!/usr/bin/env bash\ncd "$(dirname "$0")"\nmkdir -p logs\n{copies}exit 1\n'
    )
    backend = LocalBackend(bundle, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    backend.start()
    events = collect(backend, timeout=60)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    diag = info["diagnosis"]
    assert diag["why"] == "a collective timed out (NCCL's dumps)"
    assert diag["summary"] == (
        "rank 2 (node 0, host localhost) never entered broadcast #2 (pg 1 (tp), [16] int64); "
        "rank 1 waiting in it"
    )
    shown = [e.line for e in events if isinstance(e, LineEvent)]
    assert f"[dtrain-tui] diagnosis: {diag['summary']}" in shown


@pytest.mark.slow
@pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)")
def test_two_nodes_over_ssh_name_the_stuck_rank(tmp_path: Path) -> None:
    """Rank 1 alone on node 1 (a real sshd on its own port) skips the collective: the launcher
    asks each node over SSH (a remote kill -USR1 of the run's ranks) and names node and host."""
    (tmp_path / "sshd").mkdir()
    servers, key, kh = start_many(tmp_path / "sshd", 2)
    try:
        bundle = make_bundle(tmp_path / "b", nodes=2, gpus_per_node=1, script_args=SKIP)
        opts = LaunchOptions(
            hosts=[Host.parse(f"127.0.0.1:{s.port}") for s in servers],
            identity_file=key,
            known_hosts=kh,
            remote_workdir=str(tmp_path / "remote"),
            remote_setup=f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
            master_port=free_port(),
            hang_timeout_s=HANG_S,
            connect_timeout_s=10.0,
        )
        backend = SshBackend(bundle, tmp_path / "run", opts)
        t0 = time.monotonic()
        backend.start()
        events = collect(backend, timeout=HANG_S + 120)
        took = time.monotonic() - t0
        info = read_run(tmp_path / "run")
        assert info["state"] == "failed" and info["reason"].startswith("hang: "), info["reason"]
        summary = info["diagnosis"]["summary"]
        host1 = f"127.0.0.1:{servers[1].port}"
        assert summary.startswith(f"rank 1 (node 1, host {host1}) never entered all_reduce #")
        assert "[1024] float32" in summary and "rank 0 waiting in it" in summary, summary
        shown = [e.line for e in events if isinstance(e, LineEvent)]
        assert f"[dtrain-tui] diagnosis: {summary}" in shown
        assert took < HANG_S + 60, took
        assert wait_no_pids(backend.run_id) == []
    finally:
        for srv in servers:
            srv.stop()
