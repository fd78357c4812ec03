"""A daemon a run starts with ``setsid env -i …`` (a session of its own, no DTRAIN_RUN_ID to find
it by, its parent gone) does not outlive the run: each local node, and each SSH node (the reaper
goes in the bundle's tar), runs under a child subreaper that takes such orphans and stops them
once the node script ended, and says so. Real bash, real torchrun whose rank 0 starts the
daemon, real sshd."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.launch import LaunchBackend, LaunchOptions, make_backend
from engine.launch.local import LocalBackend
from engine.plan.specs import Host
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, free_port, make_bundle, write_bundle
from tests.e2e.slurm_cluster import SlurmCluster, slurm_cluster
from tests.e2e.sshd import sshd_path, start_many

pytestmark = pytest.mark.slow
__all__ = ["slurm_cluster"]  # the fixture, used by name

DAEMON = (
    'setsid env -i sh -c \'echo $$ > "$0"; exec sleep 300\' "$PIDFILE" '
    "</dev/null >/dev/null 2>&1 &\n"
)
RANK_SCRIPT = f"""import os, subprocess, time
if os.environ["RANK"] == "0":
    subprocess.run({DAEMON!r}, shell=True, check=True)
    while not os.path.exists(os.environ["PIDFILE"]):
        time.sleep(0.01)  # the daemon writes its pid at once
print("started", flush=True)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _run(
    bundle: Path, tmp_path: Path, make: Callable[[LaunchOptions], LaunchBackend] | None = None
) -> tuple[int, list[str]]:
    pidfile = tmp_path / "daemon.pid"
    options = LaunchOptions(hang_timeout_s=120, env={"PIDFILE": str(pidfile)})
    backend = (make or (lambda o: LocalBackend(bundle, tmp_path / "run", o)))(options)
    backend.start()
    events = collect(backend, timeout=180)
    pid = int(pidfile.read_text())
    try:
        assert read_run(tmp_path / "run")["state"] == "succeeded"
        assert not _alive(pid), f"the daemon (pid {pid}) outlived the run"
    finally:
        if _alive(pid):
            os.kill(pid, 9)
    return pid, [getattr(e, "line", "") for e in events]


def test_a_setsid_env_i_daemon_of_the_node_script_is_stopped(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", steps=1)
    (bundle / "launch_node0.sh").write_text(
        "#!/usr/bin/env bash\nset -eu\n" + DAEMON + 'until [ -s "$PIDFILE" ]; do :; done\n'
    )
    pid, lines = _run(bundle, tmp_path)
    assert any(f"pid {pid}" in x and "left behind" in x for x in lines), lines


def test_a_daemon_a_torchrun_rank_started_is_stopped(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / "train.py").write_text(RANK_SCRIPT)  # no torch import: quick
    pid, lines = _run(bundle, tmp_path)
    assert any(f"pid {pid}" in x and "left behind" in x for x in lines), lines


@pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)")
def test_a_setsid_env_i_daemon_on_an_ssh_node_is_stopped(tmp_path: Path) -> None:
    (tmp_path / "sshd").mkdir()
    (server,), key, kh = start_many(tmp_path / "sshd", 1)
    try:
        bundle = make_bundle(tmp_path / "b", steps=1)
        (bundle / "launch_node0.sh").write_text(
            "#!/usr/bin/env bash\nset -eu\n" + DAEMON + 'until [ -s "$PIDFILE" ]; do :; done\n'
        )

        def ssh(options: LaunchOptions) -> LaunchBackend:
            options.hosts = [Host.parse(f"127.0.0.1:{server.port}")]
            options.identity_file, options.known_hosts = key, kh
            options.remote_workdir = str(tmp_path / "remote")
            # The "remote" node's python3 is this checkout's (the reaper needs only python3).
            venv = shlex.quote(str(Path(sys.executable).parent))
            options.remote_setup = f"export PATH={venv}:$PATH"
            return make_backend("ssh", bundle, tmp_path / "run", options)

        pid, lines = _run(bundle, tmp_path, ssh)
        assert any(f"pid {pid}" in x and "left behind" in x for x in lines), lines
    finally:
        server.stop()


def test_a_setsid_env_i_daemon_of_a_slurm_task_is_stopped(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    # The sbatch script's srun line runs each task's script under the reaper the launcher put
    # in the run's bundle.
    bundle = write_bundle(tmp_path / "b", nodes=1, steps=1)
    (bundle / "launch_node0.sh").write_text(
        "#!/usr/bin/env bash\nset -eu\n" + DAEMON + 'until [ -s "$PIDFILE" ]; do :; done\n'
    )

    def slurm(options: LaunchOptions) -> LaunchBackend:
        options.master_port = free_port()
        return make_backend("slurm", bundle, tmp_path / "run", options)

    pid, lines = _run(bundle, tmp_path, slurm)
    assert any(f"pid {pid}" in x and "left behind" in x for x in lines), lines
