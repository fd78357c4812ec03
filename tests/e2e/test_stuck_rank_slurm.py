"""The stuck rank named on Slurm, for real: the two-node local Slurm (:mod:`tests.e2e.slurm_cluster`),
gloo ranks of the example trainer, one of which never enters a collective
(``--skip-collective-at-step``). The hang timeout fires, the launcher asks every node for its
ranks' Flight Recorder dumps with one ``srun --overlap`` step inside the job, and run.json's
diagnosis names that rank, its node's allocated name and the collective; the job is cancelled
and nothing of it is left. Once submitted here, once through ``--login-host`` (the srun runs on
the login node over SSH)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from engine.launch import LaunchOptions, make_backend
from engine.launch.frdump import dump_script
from engine.launch.slurm import SlurmBackend, dump_srun
from engine.rundir.events import LineEvent
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, free_port, wait_no_pids, write_bundle
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.e2e.sshd import Sshd
from tests.e2e.test_launch_slurm import _job_gone, _login_backend, login_node

pytestmark = pytest.mark.slow
USER_SCRIPT = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "user_scripts" / "skip_allreduce.py"
)
__all__ = ["login_node", "slurm_cluster"]  # the fixtures, used by name

HANG_S = 10.0
"""As in test_stuck_rank: longer than a loaded machine's silent start (torch import,
rendezvous), short enough to keep the test quick. Slurm's clock starts once the job runs."""


def _skipping(rank: int) -> list[str]:
    """``dtrain-tui write`` options: ``rank`` never enters the extra all-reduce of step 3."""
    return [
        "--script-arg=--skip-collective-at-step",
        "--script-arg=3",
        "--script-arg=--skip-rank",
        f"--script-arg={rank}",
    ]


def _check(
    cluster: SlurmCluster,
    backend: SlurmBackend,
    events: list[object],
    took: float,
    stuck: int,
    stall_line: str = "skips the all-reduce of step 3",
) -> None:
    info = read_run(backend.run.path)
    assert info["state"] == "failed" and info["reason"].startswith("hang: "), info["reason"]
    diag = info["diagnosis"]
    assert diag is not None, info
    summary = diag["summary"]
    node = stuck // backend.manifest.gpus_per_node
    host = ["n1", "n2"][node]
    assert summary.startswith(f"rank {stuck} (node {node}, host {host}) never entered all_reduce #")
    assert "(pg default, [1024] float32)" in summary and "waiting in it" in summary, summary
    assert diag["stuck_ranks"] == [stuck] and diag["no_dump"] == [], diag
    (group,) = diag["groups"]
    assert group["missed"]["op"] == "all_reduce"
    waiting = sorted(w["rank"] for w in group["waiting"])
    assert waiting == [r for r in range(backend.manifest.world_size) if r != stuck], group
    lines = [e for e in events if isinstance(e, LineEvent)]
    assert f"[dtrain-tui] diagnosis: {summary}" in [e.line for e in lines]
    # Only the ranks were signalled: srun passes a SIGUSR1 on to torchrun, which dies of it.
    assert not [e.line for e in lines if "User defined signal" in e.line]
    # Named within the hang timeout + 30 s of the stuck rank's last line (the bound).
    stalled = next(e.ts for e in lines if stall_line in e.line)
    assert diag["at"] - stalled < HANG_S + 30, diag["at"] - stalled
    # Start-up (the job, torch, two steps) + the hang timeout + the dumps + the cancel.
    assert took < HANG_S + 120, took
    assert backend.job_id is not None
    assert _job_gone(cluster, backend.job_id) == "CANCELLED"
    assert cluster.run("squeue", "-h", "-j", backend.job_id).stdout.strip() == ""
    assert wait_no_pids(backend.run_id, 30) == []


def test_dump_srun_runs_the_shared_script_once_per_node() -> None:
    """The srun asks each node for its own ranks: its script is the SSH backend's, numbered by
    the task's SLURM_NODEID (nothing to run: the command line only)."""
    argv = dump_srun("42", 2, "run-1")
    assert argv[:6] == [
        "srun",
        "--overlap",
        "--jobid=42",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--quiet",
    ]
    assert argv[6:8] == ["bash", "-c"]
    assert argv[8] == dump_script("run-1", None, node_var="SLURM_NODEID")
    assert '"SLURM_NODEID=$NODE"' in argv[8] and "SLURM_NODEID:-none" in argv[8]


def test_hung_slurm_job_names_the_stuck_rank(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """Two nodes of two ranks; rank 2 (node 1, n2) skips the collective."""
    bundle = write_bundle(tmp_path / "b", *_skipping(2), nodes=2, steps=6)
    opts = LaunchOptions(master_port=free_port(), hang_timeout_s=HANG_S)
    backend = make_backend("slurm", bundle, tmp_path / "run", opts)
    assert isinstance(backend, SlurmBackend)
    t0 = time.monotonic()
    backend.start()
    try:
        events = collect(backend, timeout=HANG_S + 180)
    finally:
        backend.stop()
    _check(slurm_cluster, backend, events, time.monotonic() - t0, stuck=2)


def test_hung_slurm_job_of_a_user_script_names_the_stuck_rank(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A user's own script (no dtrain-tui code in it, its own SIGUSR1 handler), written with
    ``--script``: its ranks start through the bundle's rank agent, which answers the one srun
    step's request. Two nodes of two ranks; rank 2 (node 1, n2) never joins the all-reduce."""
    args = ["--steps", "6", "--skip-at", "3", "--skip-rank", "2"]
    bundle = write_bundle(
        tmp_path / "b",
        "--script",
        USER_SCRIPT.name,
        *(f"--script-arg={a}" for a in args),
        nodes=2,
        steps=6,
    )
    shutil.copy(USER_SCRIPT, bundle / USER_SCRIPT.name)
    opts = LaunchOptions(
        master_port=free_port(), hang_timeout_s=HANG_S, env={"DTRAIN_TELEMETRY_S": "1"}
    )
    backend = make_backend("slurm", bundle, tmp_path / "run", opts)
    assert isinstance(backend, SlurmBackend)
    t0 = time.monotonic()
    backend.start()
    try:
        events = collect(backend, timeout=HANG_S + 180)
    finally:
        backend.stop()
    took = time.monotonic() - t0
    _check(slurm_cluster, backend, events, took, stuck=2, stall_line="waits for its data")
    stacks = read_run(backend.run.path)["diagnosis"]["stacks"]
    assert "wait_for_data_that_never_comes" in stacks["2"][0], stacks


def test_hung_slurm_job_over_a_login_node_names_the_stuck_rank(
    slurm_cluster: SlurmCluster, login_node: Sshd, tmp_path: Path
) -> None:
    """``--login-host``: the srun that asks for the dumps runs on the login node over SSH.
    One rank per node; rank 1 (node 1, n2) skips the collective."""
    bundle = write_bundle(tmp_path / "b", *_skipping(1), "--gpus-per-node", "1", nodes=2, steps=6)
    backend = _login_backend(slurm_cluster, login_node, tmp_path, bundle)
    backend.options.hang_timeout_s = HANG_S
    t0 = time.monotonic()
    backend.start()
    try:
        events = collect(backend, timeout=HANG_S + 180)
    finally:
        backend.stop()
    _check(slurm_cluster, backend, events, time.monotonic() - t0, stuck=1)
