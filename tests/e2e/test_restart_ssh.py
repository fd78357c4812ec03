"""The restart policy over the real sshd (tests/e2e/sshd.py): two nodes of two CPU ranks, the
bundle written by dtrain-tui's writers, every process of node 1's ranks SIGKILLed mid-run; the
policy stops every rank, relaunches over SSH, and the ranks resume from the newest complete
checkpoint and finish. Waits on the run's events with deadlines, never a sleep."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch.drill import newest_complete
from engine.launch.errors import LaunchError
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.rundir.record import RunState, read_record
from engine.write.manifest import read_manifest
from tests.e2e.launch_util import rank_pid, wait_no_pids, write_bundle
from tests.e2e.sshd import Sshd, sshd_path, start_many
from tests.e2e.test_launch_ssh import _opts
from tests.e2e.test_shrink import FAIL_AGAIN

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


def test_allow_shrink_over_ssh_goes_on_on_the_other_node(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """``--allow-shrink`` over the real sshd, no spare: node 1's ranks are SIGKILLed once a
    checkpoint is complete, then its script fails at once whenever one exists. The failure
    repeats, so the third attempt runs a bundle re-planned for the first node alone (the global
    batch kept: grad-accum 1 -> 2), shipped over SSH, resumed from the shared checkpoint
    (DCP reshards 4 ranks' state onto 2) and finished."""
    servers, key, kh = cluster
    hosts = [f"127.0.0.1:{s.port}" for s in servers]
    bundle = write_bundle(
        tmp_path / "b", "--hosts", ",".join(hosts), "--backend", "ssh", "--framework", "ddp",
        "--script-arg=--sleep-per-step", "--script-arg=0.2", steps=8, nodes=2,
    )  # fmt: skip
    node1 = bundle / "launch_node1.sh"
    anchor = "mkdir -p logs\n"
    assert anchor in node1.read_text()
    node1.write_text(node1.read_text().replace(anchor, FAIL_AGAIN + anchor, 1))
    opts = _opts(servers, key, kh, tmp_path)
    opts.env = {"DTRAIN_CKPT_EVERY": "2"}
    opts.allow_shrink = True
    run = RestartingRun.for_bundle(
        "ssh", bundle, tmp_path / "run", opts, RestartPolicy(max_restarts=3, backoff_s=0.2)
    )
    ckpt = Path(os.path.expanduser(run.options.env["DTRAIN_CKPT_DIR"]))
    run.start()
    killed: list[int] = []
    first_id = run.current.run_id if run.current else ""
    deadline = time.monotonic() + 300
    while not run.done:
        if time.monotonic() > deadline:
            run.kill()
            run.wait(60)
            pytest.fail(f"run did not end in 300 s: {run.record.reason}")
        run.poll(0.1)
        if not killed and len(run.watches) == 1 and newest_complete(ckpt) is not None:
            for pid in (rank_pid(first_id, r) for r in (2, 3)):
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
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
    assert third.shrunk_from == 2
    assert third.hosts == hosts[:1]
    assert "global batch 8 kept: grad-accum 1 -> 2" in (third.excluded or ""), third.excluded
    assert third.resumed_from_step is not None and third.resumed_from_step >= 2
    assert third.last_step == 8
    shrunk = run.path / third.run_dir / "bundle"
    assert read_manifest(shrunk).nodes == 1
    assert json.loads((shrunk / "plan.json").read_text())["recommended"]["grad_accum"] == 2
    assert wait_no_pids(first_id) == []


@pytest.mark.parametrize("where", ["ckpt", "shared/../ckpt"])
def test_a_checkpoint_dir_the_nodes_do_not_share_is_refused_before_any_rank_starts(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path, where: str
) -> None:
    """A relative DTRAIN_CKPT_DIR resolves in each node's own copy of the bundle: refused in
    one line naming the variable, nothing started, nothing left on the nodes."""
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(tmp_path / "b", "--hosts", hosts, "--backend", "ssh", nodes=2)
    opts = _opts(servers, key, kh, tmp_path)
    opts.env = {"DTRAIN_CKPT_EVERY": "2", "DTRAIN_CKPT_DIR": where}
    run = RestartingRun.for_bundle(
        "ssh", bundle, tmp_path / "run", opts, RestartPolicy(max_restarts=1, backoff_s=0.2)
    )
    with pytest.raises(LaunchError) as e:
        run.start()
    reason = str(e.value)
    assert reason.startswith(f"DTRAIN_CKPT_DIR: checkpoint directory {where!r} is relative"), reason
    assert "nothing was started" in reason and "\n" not in reason, reason
    assert not list((tmp_path / "remote").rglob("launch_node*.sh")), "a node kept its copy"


def test_a_shared_checkpoint_dir_is_proved_and_the_proof_removed(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """Node 0 writes the proof in the shared directory, node 1 reads it back, node 0 removes
    it: the run starts and the directory holds only checkpoints."""
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(tmp_path / "b", "--hosts", hosts, "--backend", "ssh", nodes=2, steps=2)
    shared = tmp_path / "shared ckpt"
    opts = _opts(servers, key, kh, tmp_path)
    opts.env = {"DTRAIN_CKPT_EVERY": "2", "DTRAIN_CKPT_DIR": str(shared)}
    run = RestartingRun.for_bundle("ssh", bundle, tmp_path / "run", opts, RestartPolicy())
    run.start()
    assert run.wait(240), "the run did not end"
    assert run.state == RunState.SUCCEEDED, run.record.reason
    assert not list(shared.glob(".dtrain-reach-*")), sorted(shared.iterdir())
    assert newest_complete(shared) is not None


def test_a_checkpoint_dir_on_each_nodes_own_disk_is_refused_naming_the_node(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """``~/ckpt``: each test node has a home of its own (tests/e2e/sshd.py), as each machine of
    a cluster without a shared home does. Node 0 writes the proof, node 1 cannot read it: the
    run is refused naming node 1, nothing started, and node 0's proof removed."""
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(tmp_path / "b", "--hosts", hosts, "--backend", "ssh", nodes=2)
    opts = _opts(servers, key, kh, tmp_path)
    opts.env = {"DTRAIN_CKPT_EVERY": "2", "DTRAIN_CKPT_DIR": "~/ckpt"}
    run = RestartingRun.for_bundle(
        "ssh", bundle, tmp_path / "run", opts, RestartPolicy(max_restarts=1, backoff_s=0.2)
    )
    with pytest.raises(LaunchError) as e:
        run.start()
    reason = str(e.value)
    assert reason.startswith(
        f"DTRAIN_CKPT_DIR: node 1 (127.0.0.1:{servers[1].port}) cannot see the checkpoint "
        "directory '~/ckpt' that node 0"
    ), reason
    assert "nothing was started" in reason and "\n" not in reason, reason
    assert (servers[0].home / "ckpt").is_dir()
    assert not list((servers[0].home / "ckpt").iterdir()), "the proof was left behind"
    assert not list((tmp_path / "remote").rglob("launch_node*.sh")), "a node kept its copy"
