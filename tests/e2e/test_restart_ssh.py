"""The restart policy over the real sshd (tests/e2e/sshd.py): two nodes of two CPU ranks, the
bundle written by dtrain-tui's writers, every process of node 1's ranks SIGKILLed mid-run; the
policy stops every rank, relaunches over SSH, and the ranks resume from the newest complete
checkpoint and finish. Waits on the run's events with deadlines, never a sleep."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch.drill import newest_complete
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.rundir.record import RunState, read_record
from tests.e2e.launch_util import rank_pid, wait_no_pids, write_bundle
from tests.e2e.sshd import Sshd, sshd_path, start_many
from tests.e2e.test_launch_ssh import _opts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Sshd], Path, Path]]:
    servers, key, kh = start_many(tmp_path_factory.mktemp("sshd"), 2)
    yield servers, key, kh
    for s in servers:
        s.stop()


def test_node_killed_over_ssh_is_restarted_and_resumes(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(
        tmp_path / "b", "--hosts", hosts, "--backend", "ssh",
        "--script-arg=--sleep-per-step", "--script-arg=0.2", steps=10, nodes=2,
    )  # fmt: skip
    opts = _opts(servers, key, kh, tmp_path)
    opts.env = {"DTRAIN_CKPT_EVERY": "2"}
    run = RestartingRun.for_bundle(
        "ssh", bundle, tmp_path / "run", opts, RestartPolicy(max_restarts=1, backoff_s=0.2)
    )
    ckpt = Path(os.path.expanduser(run.options.env["DTRAIN_CKPT_DIR"]))
    run.start()
    killed: list[int] = []
    newest: list[int | None] = []
    first_id = run.current.run_id if run.current else ""
    deadline = time.monotonic() + 300
    while not run.done:
        assert time.monotonic() < deadline, run.record.reason
        run.poll(0.1)
        w = run.watches[-1]
        if not killed and (w.last_step or 0) >= 4 and newest_complete(ckpt) is not None:
            pids = [rank_pid(first_id, r) for r in (2, 3)]
            for pid in pids:
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        if killed and len(run.watches) == 2 and not newest:
            newest.append(newest_complete(ckpt))
    assert killed
    assert run.state == RunState.SUCCEEDED, run.record.reason
    rec = read_record(run.path)
    first, second = rec.attempts
    assert first.state == RunState.FAILED and first.failed_node == 1, first
    assert second.state == RunState.SUCCEEDED
    assert second.resumed_from_step is not None and second.resumed_from_step == newest[0]
    assert second.hosts == [f"127.0.0.1:{s.port}" for s in servers]
    assert wait_no_pids(first_id) == []
