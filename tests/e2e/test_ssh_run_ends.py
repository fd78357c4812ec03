"""Runs over SSH always end: whatever happens to the launcher (SIGKILL, SIGTERM, SIGHUP, Ctrl-C
twice), no process of the run is left on any node. The launcher is the real CLI
(``python -m cli launch``) in a subprocess, the nodes two real sshd on 127.0.0.1.

Also here: the remote cleanup matches the run id as a whole string, run ids never hold control
characters, ``launch.ssh_user`` is used, and a bundle written without hosts gets node 0's
address as MASTER_ADDR."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch import LaunchError, LaunchOptions
from engine.launch.ssh import SshBackend
from engine.launch.ssh_remote import SWEEP_FN
from engine.plan.specs import Host, LaunchSpec
from engine.rundir.files import read_run
from tests.e2e.launch_util import (
    REPO,
    collect,
    free_port,
    make_bundle,
    run_pids,
    wait_no_pids,
    write_bundle,
)
from tests.e2e.sshd import Sshd, sshd_path, start_many

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)"),
]

# Each node's script ignores SIGTERM (as do the children it forks: an ignored signal stays
# ignored across exec) and leaves its process group and its session: only a SIGKILL sweep by
# DTRAIN_RUN_ID ends all of it.
STUBBORN = (
    "#!/usr/bin/env bash\ntrap '' TERM\nsetsid sleep 300 &\nsleep 300 &\n"
    "echo '[default0]:up'\nwait\n"
)
PER_NODE = 3  # the script, setsid sleep, sleep


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Sshd], Path, Path]]:
    work = tmp_path_factory.mktemp("sshd")
    servers, key, kh = start_many(work, 2)
    yield servers, key, kh
    for s in servers:
        s.stop()


def _ssh_flags(servers: list[Sshd], key: Path, kh: Path, tmp: Path) -> list[str]:
    setup = f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH"
    return [
        "--backend", "ssh",
        "--hosts", ",".join(f"root@127.0.0.1:{s.port}" for s in servers),
        "--identity", str(key),
        "--known-hosts", str(kh),
        "--remote-workdir", str(tmp / "remote"),
        "--remote-setup", setup,
        "--master-port", str(free_port()),
    ]  # fmt: skip


class Launcher:
    """``python -m cli launch ...`` in a subprocess; its stdout read on a thread."""

    def __init__(self, argv: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.err = run_dir.parent / f"{run_dir.name}.stderr"
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "launch", *argv, "--run-dir", str(run_dir)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=open(self.err, "wb"),  # noqa: SIM115 - closed with the process
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<EOF>")
            self._cond.notify_all()

    def wait_lines(self, text: str, count: int, timeout: float = 60) -> None:
        with self._cond:
            ok = self._cond.wait_for(
                lambda: sum(text in x for x in self.lines) >= count or "<EOF>" in self.lines,
                timeout,
            )
            assert ok and sum(text in x for x in self.lines) >= count, self.report()

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def report(self) -> str:
        return f"stdout: {self.lines[-20:]}\nstderr: {self.stderr()[-2000:]}"

    def run_id(self) -> str:
        return str(read_run(self.run_dir)["run_id"])


def _wait_for(cond: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(cond())  # type: ignore[operator]


def _start_stubborn(cluster: tuple[list[Sshd], Path, Path], tmp_path: Path) -> tuple[Launcher, str]:
    servers, key, kh = cluster
    b = make_bundle(tmp_path / "fake", nodes=2, steps=1)
    for i in range(2):
        (b / f"launch_node{i}.sh").write_text(STUBBORN)
    la = Launcher([str(b), *_ssh_flags(servers, key, kh, tmp_path)], tmp_path / "run")
    la.wait_lines("[rank 0] up", 1)
    la.wait_lines("[rank 2] up", 1)
    rid = la.run_id()
    # "up" is printed after the sleeps were forked, but they may not have exec'd yet.
    assert _wait_for(lambda: len(run_pids(rid)) >= 2 * PER_NODE, 10), run_pids(rid)
    return la, rid


def test_sigkill_of_the_launcher_leaves_no_process_on_any_node(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """Nothing of the launcher runs after SIGKILL: each node's watcher sees its connection close
    and stops the script's group and every process tagged with the run id, SIGKILL last."""
    la, rid = _start_stubborn(cluster, tmp_path)
    la.proc.kill()
    la.proc.wait(10)
    assert wait_no_pids(rid, timeout=20) == [], la.report()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_of_the_launcher_stops_the_run(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path, sig: signal.Signals
) -> None:
    la, rid = _start_stubborn(cluster, tmp_path)
    la.proc.send_signal(sig)
    la.proc.wait(30)
    assert wait_no_pids(rid, timeout=20) == [], la.report()
    # Handled as a stop (cli/launch_cmd.py): the run directory says so.
    assert read_run(la.run_dir)["state"] != "running", la.report()


def test_ctrl_c_twice_leaves_no_process_on_any_node(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    la, rid = _start_stubborn(cluster, tmp_path)
    la.proc.send_signal(signal.SIGINT)
    assert _wait_for(lambda: "stopping every rank" in la.stderr(), 10), la.report()
    la.proc.send_signal(signal.SIGINT)
    la.proc.wait(30)
    assert wait_no_pids(rid, timeout=20) == [], la.report()
    assert read_run(la.run_dir)["state"] != "running", la.report()


def test_backend_kill_escalates_to_sigkill_at_once(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """``kill()`` (a second Ctrl-C) ends a stop in progress at once, without its grace."""
    servers, key, kh = cluster
    b = make_bundle(tmp_path / "fake", nodes=2, steps=1)
    for i in range(2):
        (b / f"launch_node{i}.sh").write_text(STUBBORN)
    opts = LaunchOptions(
        hosts=[Host.parse(f"127.0.0.1:{s.port}") for s in servers],
        identity_file=key,
        known_hosts=kh,
        remote_workdir=str(tmp_path / "remote"),
    )
    backend = SshBackend(b, tmp_path / "run", opts)
    backend.start()
    assert _wait_for(lambda: len(run_pids(backend.run_id)) >= 2 * PER_NODE, 20)
    stopper = threading.Thread(target=backend.stop, daemon=True)
    stopper.start()
    # The SIGTERMs went out (ignored): the stop now waits out its grace period.
    assert _wait_for(lambda: backend.driver.killed == {0, 1}, 10)
    t0 = time.monotonic()
    backend.kill()
    assert wait_no_pids(backend.run_id, timeout=10) == []
    assert time.monotonic() - t0 < 3.0
    stopper.join(30)
    collect(backend, timeout=30)
    assert backend.state == "stopped"


# ---------------------------------------------------------------- run ids (issue 10, point 9)


def _sweep(rid: str, sig: str = "KILL") -> None:
    script = f"RID={shlex.quote(rid)}\nNODE=0\n{SWEEP_FN}\ndtrain_sweep {sig}\ntrue\n"
    subprocess.run(["bash", "-c", script], check=True, timeout=30)


def test_remote_sweep_matches_the_run_id_as_a_whole_string(tmp_path: Path) -> None:
    """The cleanup on a node kills exactly the processes whose DTRAIN_RUN_ID is the run id: not
    one whose id a regular expression would match (``.``), nor one named by a second line."""
    env = dict(os.environ)
    victims = {
        name: subprocess.Popen(
            ["sleep", "120"], env={**env, "DTRAIN_RUN_ID": name, "DTRAIN_NODE": "0"}
        )
        for name in ("runX1-7", "victim", "run.1-7")
    }
    node1 = subprocess.Popen(
        ["sleep", "120"], env={**env, "DTRAIN_RUN_ID": "run.1-7", "DTRAIN_NODE": "1"}
    )
    try:
        _sweep("run.1-7\nDTRAIN_RUN_ID=victim")  # a newline: once two grep patterns
        _sweep("run.1-7", sig="0")
        _sweep("run.1-7x")
        assert victims["runX1-7"].poll() is None  # "." is not a wildcard
        assert victims["victim"].poll() is None
        assert victims["run.1-7"].poll() is None
        _sweep("run.1-7")
        assert victims["run.1-7"].wait(10) == -signal.SIGKILL
        assert victims["runX1-7"].poll() is None and victims["victim"].poll() is None
        assert node1.poll() is None  # the same run's node 1 on this machine: not node 0's
    finally:
        for p in [*victims.values(), node1]:
            p.kill()
            p.wait(10)


def test_run_dir_with_a_control_character_is_refused(tmp_path: Path) -> None:
    b = make_bundle(tmp_path / "b", nodes=2, steps=1)
    for bad in ("run\nDTRAIN_RUN_ID=x", "run\x1b[2J", "tab\there", "del\x7f"):
        with pytest.raises(LaunchError) as ei:
            SshBackend(b, tmp_path / bad, LaunchOptions())
        assert ei.value.field == "--run-dir" and "\n" not in str(ei.value)
        assert not (tmp_path / bad).exists()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "launch", str(b), "--run-dir", str(tmp_path / "a\nb")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "--run-dir" in err[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "a\nb").exists()


# ---------------------------------------------------------------- launch.ssh_user (point 7)


def test_profile_ssh_user_is_used_for_hosts_without_a_user(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    from cli import build_parser
    from cli.launch_cmd import _options

    args = build_parser().parse_args(["launch"])
    assert _options(args, [], LaunchSpec(ssh_user="ubuntu")).ssh_user == "ubuntu"

    servers, key, kh = cluster
    b = make_bundle(tmp_path / "b", nodes=2, steps=1)
    for i in range(2):
        (b / f"launch_node{i}.sh").write_text('#!/usr/bin/env bash\necho "[default0]:$USER"\n')
    opts = LaunchOptions(
        hosts=[Host.parse(f"127.0.0.1:{s.port}") for s in servers],
        identity_file=key,
        known_hosts=kh,
        remote_workdir=str(tmp_path / "remote"),
        ssh_user="dtrain-nobody",
    )
    with pytest.raises(LaunchError) as ei:
        SshBackend(b, tmp_path / "r1", opts).start()
    assert "authentication failed as dtrain-nobody" in str(ei.value)
    # A user in the host itself wins over the profile's.
    opts.hosts = [Host.parse(f"root@127.0.0.1:{s.port}") for s in servers]
    backend = SshBackend(b, tmp_path / "r2", opts)
    backend.start()
    collect(backend, timeout=60)
    assert backend.state == "succeeded", read_run(tmp_path / "r2")["reason"]


# ---------------------------------------------------------------- MASTER_ADDR (point 6)


def test_bundle_written_without_hosts_gets_node_0_as_master_addr(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """``write --nodes 2`` without ``--hosts``, then ``launch --backend ssh --hosts h0,h1``: the
    backend knows node 0 and hands its address to every node."""
    servers, key, kh = cluster
    bundle = write_bundle(tmp_path / "b", steps=2, nodes=2)
    assert json.loads((bundle / "bundle.json").read_text())["hosts"] == []
    la = Launcher([str(bundle), *_ssh_flags(servers, key, kh, tmp_path)], tmp_path / "run")
    try:
        code = la.proc.wait(240)
    finally:
        if la.proc.poll() is None:
            la.proc.kill()
    info = read_run(tmp_path / "run")
    assert code == 0 and info["state"] == "succeeded", la.report()
    cmd = (tmp_path / "run" / "commands" / "node1.txt").read_text()
    assert "export MASTER_ADDR=127.0.0.1;" in cmd


def test_master_addr_the_user_chose_is_kept(tmp_path: Path) -> None:
    b = write_bundle(
        tmp_path / "b", "--hosts", "h0,h1", "--master-addr", "10.0.0.9", steps=1, nodes=2
    )
    other = LaunchOptions(hosts=[Host.parse("g0"), Host.parse("g1")])
    assert SshBackend(b, tmp_path / "r1", other).master_addr() is None
    same = write_bundle(tmp_path / "b2", "--hosts", "h0,h1", steps=1, nodes=2)
    assert SshBackend(same, tmp_path / "r2", other).master_addr() == "g0"
    opts = LaunchOptions(hosts=[Host.parse("h0"), Host.parse("h1")])
    assert SshBackend(same, tmp_path / "r3", opts).master_addr() is None
    env = LaunchOptions(hosts=other.hosts, env={"MASTER_ADDR": "10.1.1.1"})
    assert SshBackend(same, tmp_path / "r4", env).master_addr() is None
