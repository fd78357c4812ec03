"""The Slurm backend against a real two-node Slurm on this host (:mod:`tests.e2e.slurm_cluster`):
slurmctld and ``slurmd -N n1`` / ``-N n2`` on 127.0.0.1, torchrun over gloo on CPU.

Each run is torch's start-up on two cores, so cases are combined: the successful run is driven
through the CLI exactly as the README shows (``write`` → ``launch --backend slurm`` →
``monitor --follow``)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch import LaunchError, LaunchOptions, make_backend
from engine.launch.slurm import SlurmBackend
from engine.launch.slurm_cli import allocation_hosts, show_job
from engine.plan.specs import Host
from engine.rundir.events import LineEvent, per_line
from engine.rundir.files import read_run
from tests.e2e.launch_util import (
    collect,
    free_port,
    rank_pid,
    run_pids,
    wait_no_pids,
    write_bundle,
)
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.e2e.sshd import Sshd, keygen, sshd_path

pytestmark = pytest.mark.slow
__all__ = ["slurm_cluster"]  # the fixture, used by name

STEP_RE = re.compile(r"^\[dtrain\] step=(\d+)/(\d+) ")
REPO = Path(__file__).resolve().parents[2]


def _backend(bundle: Path, run: Path, **kw: object) -> SlurmBackend:
    opts = LaunchOptions(master_port=free_port(), hang_timeout_s=240)
    b = make_backend("slurm", bundle, run, opts, **kw)  # type: ignore[arg-type]
    assert isinstance(b, SlurmBackend)
    return b


def _wait_for(
    backend: SlurmBackend, pred: object, what: str, timeout: float = 180.0
) -> list[object]:
    """Poll events until ``pred(events)`` holds (the run must not end first)."""
    events: list[object] = []
    deadline = time.monotonic() + timeout
    while not pred(events):  # type: ignore[operator]
        assert not backend.done, f"run ended before {what}: {read_run(backend.run.path)}"
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        events.extend(per_line(backend.poll(0.2)))
    return events


def _stepping(ranks: set[int]) -> object:
    def pred(events: list[object]) -> bool:
        seen = {e.rank for e in events if isinstance(e, LineEvent) and STEP_RE.match(e.line)}
        return ranks <= seen

    return pred


def _job_gone(cluster: SlurmCluster, job_id: str, timeout: float = 60.0) -> str:
    """The job's final state once squeue no longer lists it as active."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = show_job(job_id)
        if job is None or job.final:
            return job.state if job else "GONE"
        time.sleep(0.2)  # polling slurmctld
    raise AssertionError(f"job {job_id} still active: {cluster.run('squeue').stdout}")


def test_sbatch_script_is_accepted_and_runs_by_hand(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """``slurm.sbatch`` as a user would use it: ``sbatch --test-only``, then ``sbatch`` from the
    bundle directory, with no dtrain-tui in between."""
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=2)
    env = {
        **slurm_cluster.env,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MASTER_PORT": str(free_port()),
    }
    r = subprocess.run(
        ["sbatch", "--test-only", "slurm.sbatch"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "to start at" in r.stderr, r.stderr
    r = subprocess.run(
        ["sbatch", "--parsable", "slurm.sbatch"],
        cwd=bundle,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    job = r.stdout.strip()
    assert _job_gone(slurm_cluster, job, 180) == "COMPLETED", (
        bundle / f"slurm-{job}.out"
    ).read_text()
    batch = (bundle / f"slurm-{job}.out").read_text()
    assert "rendezvous 127.0.0.1:" in batch and "srun exit code 0" in batch
    for task in (0, 1):
        out = (bundle / "logs" / f"slurm-{job}_{task}.out").read_text()
        for local in (0, 1):
            assert f"[default{local}]:[dtrain] step=2/2" in out, out


def test_cli_write_launch_monitor_two_nodes_four_ranks(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=3)
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launch = subprocess.run(
        [sys.executable, "-m", "cli", "launch", str(bundle), "--backend", "slurm",
         "--run-dir", str(run), "--master-port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    for rank in range(4):
        assert f"[rank {rank}] [dtrain] step=3/3" in launch.stdout, launch.stdout[-3000:]
    assert "run succeeded: all 4 ranks exited 0" in launch.stderr
    rec = read_run(run)
    assert rec["backend"] == "slurm" and rec["state"] == "succeeded"
    assert rec["hosts"] == ["n1", "n2"]
    assert [(r["rank"], r["host"], r["exit_code"]) for r in rec["ranks"]] == [
        (0, "n1", 0), (1, "n1", 0), (2, "n2", 0), (3, "n2", 0)
    ]  # fmt: skip
    for rank in range(4):
        log = (run / "logs" / f"rank{rank}.stdout.log").read_text().splitlines()
        assert [int(m.group(1)) for x in log if (m := STEP_RE.match(x))] == [1, 2, 3]
    slurm = json.loads((run / "slurm.json").read_text())
    assert slurm["state"] == "COMPLETED" and slurm["restarts"] == 0
    assert slurm["hosts"] == ["n1", "n2"]
    follow = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(run), "--follow"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert follow.returncode == 0, follow.stdout[-2000:]
    assert "[rank 3] [dtrain] step=3/3" in follow.stdout
    assert "[run] succeeded" in follow.stdout


def test_sigkill_of_a_rank_fails_the_job_naming_rank_and_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=100_000)
    backend = _backend(bundle, tmp_path / "run")
    backend.start()
    try:
        _wait_for(backend, _stepping({0, 1, 2, 3}), "steps from every rank")
        pid = rank_pid(backend.run_id, 3)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        collect(backend, 120)
    finally:
        backend.stop()
    rec = read_run(backend.run.path)
    assert rec["state"] == "failed", rec
    assert (rec["failed_rank"], rec["failed_node"]) == (3, 1)
    assert "rank 3 on node 1 (n2) exited with signal 9 (SIGKILL)" in rec["reason"]
    assert backend.job_id is not None
    assert _job_gone(slurm_cluster, backend.job_id) == "FAILED"
    assert wait_no_pids(backend.run_id, 30) == []


def test_stop_cancels_the_job_and_leaves_no_process(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=100_000)
    backend = _backend(bundle, tmp_path / "run")
    backend.start()
    _wait_for(backend, _stepping({0, 2}), "steps on both nodes")
    assert run_pids(backend.run_id)  # the ranks run, tagged with the run id
    backend.stop()
    assert backend.state == "stopped", read_run(backend.run.path)
    assert backend.job_id is not None
    assert _job_gone(slurm_cluster, backend.job_id) == "CANCELLED"
    assert wait_no_pids(backend.run_id, 30) == []
    assert read_run(backend.run.path)["reason"] == "stopped by the user"


def _logged_steps(run: Path, ranks: range, timeout: float = 180.0) -> None:
    """Wait until every rank's log in ``run`` holds a step line."""
    deadline = time.monotonic() + timeout
    while True:
        logs = [run / "logs" / f"rank{r}.stdout.log" for r in ranks]
        if all(f.is_file() and "[dtrain] step=" in f.read_text() for f in logs):
            return
        assert time.monotonic() < deadline, f"no steps from ranks {list(ranks)} in {timeout}s"
        time.sleep(0.2)  # polling the run directory


def _kill_once_stepping(
    launcher: subprocess.Popen[bytes], run: Path, cluster: SlurmCluster
) -> None:
    """SIGKILL the launcher once every rank steps; its job must end CANCELLED and no process of
    the run be left."""
    _logged_steps(run, range(4))
    job = json.loads((run / "slurm.json").read_text())["job_id"]
    run_id = read_run(run)["run_id"]
    launcher.kill()
    launcher.wait(10)
    assert _job_gone(cluster, job) == "CANCELLED"
    assert wait_no_pids(run_id, 30) == []


def test_sigkill_of_the_launcher_cancels_the_job(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A launcher killed outright (no handler runs): the reaper cancels the Slurm job, no rank is
    left, and run.json reads "launcher died"."""
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=100_000)
    run = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "cli", "launch", str(bundle), "--backend", "slurm",
         "--run-dir", str(run), "--master-port", str(free_port())],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _kill_once_stepping(launcher, run, slurm_cluster)
        deadline = time.monotonic() + 30
        while read_run(run)["state"] != "failed":
            assert time.monotonic() < deadline, read_run(run)
            time.sleep(0.1)  # polling run.json until the reaper marked it
        assert "launcher died" in read_run(run)["reason"]
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_an_unsatisfiable_job_is_reported_with_slurms_reason(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # Partition "short" allows 1 minute: Slurm accepts the job and keeps it pending forever.
    bundle = write_bundle(
        tmp_path / "b", "--partition", "short", "--time-limit", "10", nodes=2, steps=2
    )
    backend = _backend(bundle, tmp_path / "run")
    backend.start()
    collect(backend, 60)
    rec = read_run(backend.run.path)
    assert rec["state"] == "failed"
    assert "can never start: PartitionTimeLimit" in rec["reason"], rec["reason"]
    assert backend.job_id is not None
    assert _job_gone(slurm_cluster, backend.job_id) == "CANCELLED"


def test_an_unknown_partition_is_one_line_naming_the_field(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=2)
    backend = _backend(bundle, tmp_path / "run", sbatch_args=["--partition=nosuch"])
    with pytest.raises(LaunchError) as err:
        backend.start()
    assert err.value.field == "launch.slurm_partition"
    assert "invalid partition specified: nosuch" in err.value.message
    assert "sinfo lists: debug, short" in err.value.message
    assert read_run(backend.run.path)["state"] == "failed"


def test_hosts_slurm_takes_the_allocations_nodes(slurm_cluster: SlurmCluster) -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); "
        "from engine.launch.slurm_cli import allocation_hosts; print(allocation_hosts())"
    )
    r = slurm_cluster.run("salloc", "-N", "2", sys.executable, "-c", code, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "['127.0.0.1', '127.0.0.1']"
    with pytest.raises(LaunchError) as err:
        allocation_hosts({"PATH": os.environ["PATH"]})
    assert err.value.field == "--hosts" and "SLURM_JOB_NODELIST" in err.value.message


# ---------------------------------------------------------------------- over SSH to a login node


@pytest.fixture
def login_node(tmp_path: Path) -> Iterator[Sshd]:
    """A login "node": a real sshd on 127.0.0.1 in front of the real local Slurm."""
    if sshd_path() is None:
        pytest.skip("sshd is not installed (make system-deps)")
    sshd = Sshd(tmp_path / "login", keygen(tmp_path / "client_ed25519")).start()
    try:
        yield sshd
    finally:
        sshd.stop()


def _login_backend(
    cluster: SlurmCluster, login: Sshd, tmp: Path, bundle: Path, **kw: object
) -> SlurmBackend:
    kh = tmp / "known_hosts"
    kh.write_text(login.known_hosts_line())
    opts = LaunchOptions(
        master_port=free_port(),
        hang_timeout_s=240,
        login_host=Host(host="127.0.0.1", port=login.port),
        identity_file=login.client_key,
        known_hosts=kh,
        ssh_config=tmp / "no-ssh-config",
        remote_workdir=str(tmp / "login-runs"),
        # sshd hands its sessions none of this process's environment: name what sbatch needs.
        env={
            "SLURM_CONF": str(cluster.conf),
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        },
    )
    b = make_backend("slurm", bundle, tmp / "run", opts, **kw)  # type: ignore[arg-type]
    assert isinstance(b, SlurmBackend)
    return b


def test_submitted_over_ssh_to_a_login_node_two_nodes_four_ranks(
    slurm_cluster: SlurmCluster, login_node: Sshd, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=3)
    backend = _login_backend(slurm_cluster, login_node, tmp_path, bundle)
    backend.start()
    try:
        events = collect(backend, 240)
    finally:
        backend.stop()
    rec = read_run(backend.run.path)
    assert rec["state"] == "succeeded", rec
    assert [(r["rank"], r["host"], r["exit_code"]) for r in rec["ranks"]] == [
        (0, "n1", 0), (1, "n1", 0), (2, "n2", 0), (3, "n2", 0)
    ]  # fmt: skip
    steps = {
        (e.node, e.rank, m.group(1))
        for e in events
        if isinstance(e, LineEvent) and (m := STEP_RE.match(e.line))
    }
    assert {(r // 2, r, s) for r in range(4) for s in "123"} <= steps
    for rank in range(4):
        log = (backend.run.path / "logs" / f"rank{rank}.stdout.log").read_text().splitlines()
        assert [int(m.group(1)) for x in log if (m := STEP_RE.match(x))] == [1, 2, 3]
    # The job ran from the copy on the login node; its files came back over SSH only.
    remote = tmp_path / "login-runs" / backend.run_id / "bundle"
    assert backend.job_id is not None
    assert (remote / f"slurm-{backend.job_id}.out").is_file()
    assert not (backend.run.bundle / f"slurm-{backend.job_id}.out").exists()
    cmd = (backend.run.path / "commands" / "node0.txt").read_text()
    assert cmd.startswith(f"ssh -p {login_node.port} 127.0.0.1 'cd {remote} && sbatch"), cmd


def test_stop_over_ssh_cancels_the_job_and_leaves_no_process(
    slurm_cluster: SlurmCluster, login_node: Sshd, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=100_000)
    backend = _login_backend(slurm_cluster, login_node, tmp_path, bundle)
    backend.start()
    _wait_for(backend, _stepping({0, 2}), "steps on both nodes")
    assert run_pids(backend.run_id)
    backend.stop()
    assert backend.state == "stopped", read_run(backend.run.path)
    assert backend.job_id is not None
    assert _job_gone(slurm_cluster, backend.job_id) == "CANCELLED"
    assert wait_no_pids(backend.run_id, 30) == []


def test_a_login_node_refusing_the_key_or_a_misused_option_is_one_line(
    slurm_cluster: SlurmCluster, login_node: Sshd, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=2)
    backend = _login_backend(slurm_cluster, login_node, tmp_path, bundle)
    (tmp_path / "known_hosts").write_text("")  # the login node's key is unknown: refused
    with pytest.raises(LaunchError) as err:
        backend.start()
    assert "login node 127.0.0.1" in err.value.message
    assert "unknown host key" in err.value.message
    assert read_run(backend.run.path)["state"] == "failed"
    r = subprocess.run(
        [sys.executable, "-m", "cli", "launch", str(bundle), "--backend", "local",
         "--login-host", "login1"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode != 0
    assert "--login-host is for --backend slurm, not local" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_launcher_killed_outright_has_its_job_cancelled_on_the_login_node(
    slurm_cluster: SlurmCluster, login_node: Sshd, tmp_path: Path
) -> None:
    """SIGKILL of the launcher drops its SSH connection: the login node cancels the job."""
    bundle = write_bundle(tmp_path / "b", nodes=2, steps=100_000)
    (tmp_path / "known_hosts").write_text(login_node.known_hosts_line())
    run = tmp_path / "run"
    code = f"""
import os, sys, threading
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from engine.launch import LaunchOptions, make_backend
from engine.plan.specs import Host
opts = LaunchOptions(
    master_port={free_port()}, hang_timeout_s=240,
    login_host=Host(host="127.0.0.1", port={login_node.port}),
    identity_file=Path({str(login_node.client_key)!r}),
    known_hosts=Path({str(tmp_path / "known_hosts")!r}),
    ssh_config=Path({str(tmp_path / "no-ssh-config")!r}),
    remote_workdir={str(tmp_path / "login-runs")!r},
    env={{"SLURM_CONF": {str(slurm_cluster.conf)!r},
         "PATH": {f"{Path(sys.executable).parent}:{os.environ['PATH']}"!r}}},
)
b = make_backend("slurm", Path({str(bundle)!r}), Path({str(run)!r}), opts)
b.start()
while True:
    b.poll(1.0)
"""
    launcher = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        _kill_once_stepping(launcher, run, slurm_cluster)
    finally:
        if launcher.poll() is None:
            launcher.kill()
