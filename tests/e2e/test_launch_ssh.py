"""SSH backend against real OpenSSH servers on 127.0.0.1 (two ports = two nodes)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.launch import LaunchError, LaunchOptions
from engine.launch.ssh import HostKeyError, SshBackend
from engine.plan.specs import Host
from engine.rundir.events import LineEvent, per_line
from engine.rundir.files import read_run
from engine.write.slurm import NODE_REAPER
from tests.e2e.launch_util import (
    collect,
    free_port,
    make_bundle,
    rank_pid,
    run_pids,
    wait_no_pids,
    write_bundle,
)
from tests.e2e.sshd import Sshd, keygen, sshd_path, start_many

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sshd_path() is None, reason="sshd not installed (make system-deps)"),
]

VENV_BIN = Path(os.environ.get("VIRTUAL_ENV", "")) / "bin"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Sshd], Path, Path]]:
    work = tmp_path_factory.mktemp("sshd")
    servers, key, kh = start_many(work, 2)
    yield servers, key, kh
    for s in servers:
        s.stop()


def _opts(servers: list[Sshd], key: Path, kh: Path, tmp: Path, **kw: object) -> LaunchOptions:
    import sys

    base: dict[str, object] = {
        "hosts": [Host.parse(f"127.0.0.1:{s.port}") for s in servers],
        "identity_file": key,
        "known_hosts": kh,
        "remote_workdir": str(tmp / "remote"),
        # The "remote" nodes use this checkout's venv (torchrun, torch).
        "remote_setup": f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
        "master_port": free_port(),
        "hang_timeout_s": 120.0,
        "connect_timeout_s": 10.0,
    }
    base.update(kw)
    return LaunchOptions(**base)  # type: ignore[arg-type]


def _fake_two_node_bundle(tmp: Path, body: str) -> Path:
    """Two nodes whose scripts are plain bash (no torch): cheap connection/fault cases."""
    b = make_bundle(tmp / "fake", nodes=2, steps=1)
    for i in range(2):
        (b / f"launch_node{i}.sh").write_text("#!/usr/bin/env bash\n" + body)
    return b


def test_two_nodes_two_ranks_each_over_ssh(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(tmp_path / "b", "--hosts", hosts, "--backend", "ssh", steps=3, nodes=2)
    backend = SshBackend(bundle, tmp_path / "run", _opts(servers, key, kh, tmp_path))
    backend.start()
    events = collect(backend)

    info = read_run(tmp_path / "run")
    assert backend.state == "succeeded", info["reason"]
    by_rank: dict[int, list[LineEvent]] = {}
    for e in events:
        if isinstance(e, LineEvent) and e.rank is not None:
            by_rank.setdefault(e.rank, []).append(e)
    assert sorted(by_rank) == [0, 1, 2, 3]
    for r, evs in by_rank.items():
        assert {e.node for e in evs} == {r // 2}
        assert {e.host for e in evs} == {f"127.0.0.1:{servers[r // 2].port}"}
        steps = [e.line for e in evs if e.line.startswith("[dtrain] step=")]
        assert [s.split()[1] for s in steps] == ["step=1/3", "step=2/3", "step=3/3"]
        disk = (tmp_path / "run" / "logs" / f"rank{r}.stdout.log").read_text().splitlines()
        assert disk == [e.line for e in evs if e.stream == "stdout"]
    # The rank agent's telemetry may come first (its first sample is taken at start-up).
    first = next(e.line for e in by_rank[0] if not e.line.startswith("[dtrain] telemetry"))
    assert "world_size=4" in first
    assert [(r["rank"], r["node_rank"], r["exit_code"]) for r in info["ranks"]] == [
        (0, 0, 0), (1, 0, 0), (2, 1, 0), (3, 1, 0)
    ]  # fmt: skip
    assert info["hosts"] == [f"127.0.0.1:{s.port}" for s in servers]
    cmd = (tmp_path / "run" / "commands" / "node1.txt").read_text()
    assert cmd.startswith("exec setsid -w bash -c ") and "launch_node1.sh" in cmd
    # The wrapper's control line is consumed, never shown or logged.
    assert not any(isinstance(e, LineEvent) and "@@dtrain" in e.line for e in events)
    assert wait_no_pids(backend.run_id) == []


def test_sigkill_a_rank_on_node_1_fails_naming_it_and_cleans_every_node(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
    bundle = write_bundle(
        tmp_path / "b", "--hosts", hosts, "--script-arg=--sleep-per-step", "--script-arg=0.3",
        steps=200, nodes=2,
    )  # fmt: skip
    backend = SshBackend(bundle, tmp_path / "run", _opts(servers, key, kh, tmp_path))
    backend.start()
    seen: list[object] = []
    deadline = time.monotonic() + 120
    while not any(isinstance(e, LineEvent) and e.rank == 3 and "step=2/" in e.line for e in seen):
        assert time.monotonic() < deadline and not backend.done
        seen.extend(per_line(backend.poll(0.2)))
    pid = rank_pid(backend.run_id, 3)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    collect(backend, timeout=60)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    assert info["failed_rank"] == 3 and info["failed_node"] == 1
    assert f"rank 3 on node 1 (127.0.0.1:{servers[1].port})" in info["reason"]
    assert "SIGKILL" in info["reason"]
    assert {r["rank"]: r["exit_code"] for r in info["ranks"]}[3] == -9
    assert wait_no_pids(backend.run_id) == []


def test_connection_drop_fails_the_run_and_the_node_cleans_itself_up(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    b = _fake_two_node_bundle(
        tmp_path, "setsid sleep 300 &\nsleep 300 &\necho '[default0]:up'\nwait\n"
    )
    backend = SshBackend(b, tmp_path / "run", _opts(servers, key, kh, tmp_path))
    backend.start()
    got: list[object] = []
    while sum(isinstance(e, LineEvent) and e.line == "up" for e in got) < 2:
        got.extend(per_line(backend.poll(0.2)))
    # "up" comes after both sleeps were forked (exec may still be under way).
    deadline = time.monotonic() + 10
    while len(run_pids(backend.run_id)) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(run_pids(backend.run_id)) >= 6  # per node: the script, setsid sleep, sleep
    # The network to node 1 goes away: its TCP connection is cut under paramiko.
    backend.driver.clients[1].get_transport().sock.shutdown(2)
    collect(backend, timeout=60)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    assert info["failed_node"] == 1 and "connection lost" in info["reason"], info["reason"]
    assert f"node 1 (127.0.0.1:{servers[1].port})" in info["reason"]
    assert wait_no_pids(backend.run_id, timeout=15) == []


def test_host_keys_unknown_refused_accepted_on_consent_changed_always_refused(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, _ = cluster
    b = _fake_two_node_bundle(tmp_path, "echo '[default0]:ok'\n")
    empty = tmp_path / "kh_empty"
    empty.write_text("")
    with pytest.raises(HostKeyError) as ei:
        SshBackend(b, tmp_path / "r1", _opts(servers, key, empty, tmp_path)).start()
    msg = str(ei.value)
    assert "unknown host key" in msg and "SHA256:" in msg and "--accept-new-host-keys" in msg
    assert f"node 0 (127.0.0.1:{servers[0].port})" in msg
    assert [k[1] for k in ei.value.keys] == ["unknown", "unknown"]
    # The fingerprint shown is OpenSSH's own (ssh-keygen -lf).
    real = subprocess.run(
        ["ssh-keygen", "-lf", f"{servers[0].host_key}.pub"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert ei.value.keys[0][3] == real and real in msg
    assert read_run(tmp_path / "r1")["state"] == "failed"
    assert not (tmp_path / "remote").exists()  # nothing uploaded, nothing started

    ok = SshBackend(
        b, tmp_path / "r2", _opts(servers, key, empty, tmp_path, accept_new_host_keys=True)
    )
    ok.start()
    collect(ok)
    assert ok.state == "succeeded"
    recorded = empty.read_text()
    for s in servers:
        assert f"[127.0.0.1]:{s.port} {s.host_pub}" in recorded

    other = keygen(tmp_path / "otherhost")
    bad = tmp_path / "kh_changed"
    wrong_pub = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    bad.write_text(f"[127.0.0.1]:{servers[1].port} {wrong_pub}\n" + servers[0].known_hosts_line())
    with pytest.raises(HostKeyError) as ei:
        SshBackend(
            b, tmp_path / "r3", _opts(servers, key, bad, tmp_path, accept_new_host_keys=True)
        ).start()
    msg = str(ei.value)
    assert "CHANGED" in msg and f"node 1 (127.0.0.1:{servers[1].port})" in msg
    assert bad.read_text().count("\n") == 2  # the known_hosts file is left as it was


def test_wrong_key_file_and_unreachable_node_name_the_node_and_start_nothing(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    b = _fake_two_node_bundle(tmp_path, "echo '[default0]:ok'\nsleep 300\n")
    wrong = keygen(tmp_path / "wrong_key")
    with pytest.raises(LaunchError) as ei:
        SshBackend(b, tmp_path / "r1", _opts(servers, wrong, kh, tmp_path)).start()
    msg = str(ei.value)
    assert f"node 1 (127.0.0.1:{servers[1].port}): authentication failed" in msg
    assert str(wrong) in msg and "--identity" in msg
    assert "nothing was started" in msg

    dead = free_port()  # nobody listens there
    opts = _opts(servers, key, kh, tmp_path)
    opts.hosts = [opts.hosts[0], Host.parse(f"127.0.0.1:{dead}")]
    with pytest.raises(LaunchError) as ei:
        SshBackend(b, tmp_path / "r2", opts).start()
    assert f"node 1 (127.0.0.1:{dead}): cannot connect" in str(ei.value)
    # Node 0 was ready (connected, bundle uploaded): what it received is removed again.
    assert [p for p in (tmp_path / "remote").rglob("*") if p.is_file()] == []


def test_a_silent_port_is_named_as_not_sshd(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    # A port that accepts TCP but never speaks SSH (a wrong port, a firewall's tarpit).
    import socket

    servers, key, kh = cluster
    b = _fake_two_node_bundle(tmp_path, "echo '[default0]:ok'\nsleep 300\n")
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        port = silent.getsockname()[1]
        opts = _opts(servers, key, kh, tmp_path, connect_timeout_s=1.0)
        opts.hosts = [opts.hosts[0], Host.parse(f"127.0.0.1:{port}")]
        with pytest.raises(LaunchError) as ei:
            SshBackend(b, tmp_path / "r", opts).start()
    msg = str(ei.value)
    assert f"node 1 (127.0.0.1:{port}): 127.0.0.1:{port} accepted the connection" in msg
    assert "no SSH banner within 1s" in msg and "is sshd listening" in msg


def test_hostile_values_never_reach_a_shell_unquoted(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    evil = "x $(touch PWNED1) `touch PWNED2`; touch PWNED3 'q\" \\"
    b = _fake_two_node_bundle(tmp_path, 'echo "[default0]:$EVIL"\necho "[default1]:$PWD"\n')
    workdir = tmp_path / f"remote {evil}"
    opts = _opts(servers, key, kh, tmp_path, remote_workdir=str(workdir), env={"EVIL": evil})
    backend = SshBackend(b, tmp_path / "run", opts)
    backend.start()
    events = collect(backend)
    assert backend.state == "succeeded", read_run(tmp_path / "run")["reason"]
    lines = [e.line for e in events if isinstance(e, LineEvent) and e.rank in (0, 2)]
    assert lines == [evil, evil]
    pwds = [e.line for e in events if isinstance(e, LineEvent) and e.rank in (1, 3)]
    assert all(p.startswith(str(workdir) + "/") for p in pwds)
    for root in (tmp_path, Path.home(), Path("/tmp")):
        assert not list(root.glob("PWNED*"))
    # Hosts are validated before anything runs: a hostile host is one clear error.
    with pytest.raises(ValueError, match="is not a host"):
        Host.parse("127.0.0.1;touch PWNED4")


def test_bundle_arrives_on_stdin_under_the_remote_home(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """``~/runs`` is under each node's own $HOME; the bundle is unpacked there from the one exec
    channel (no SFTP, no tar file left behind), with its files and modes intact."""
    servers, key, kh = cluster
    b = _fake_two_node_bundle(tmp_path, 'echo "[default0]:$PWD"\nls -l launch_node0.sh >&2\n')
    (b / "data.bin").write_bytes(bytes(range(256)) * 64)  # binary, and past one SSH packet
    backend = SshBackend(
        b, tmp_path / "run", _opts(servers, key, kh, tmp_path, remote_workdir="~/runs")
    )
    backend.start()
    events = collect(backend)
    assert backend.state == "succeeded", read_run(tmp_path / "run")["reason"]
    pwds = {e.rank: e.line for e in events if isinstance(e, LineEvent) and e.rank in (0, 2)}
    want = [str(s.home / "runs" / backend.run_id / f"node{i}") for i, s in enumerate(servers)]
    assert [pwds[0], pwds[2]] == want
    for d in want:
        assert sorted(p.name for p in Path(d).iterdir()) == sorted(  # and the node reaper
            [NODE_REAPER, *(p.name for p in b.iterdir() if p.name != "logs")]
        )
        assert (Path(d) / "data.bin").read_bytes() == (b / "data.bin").read_bytes()
        assert os.access(Path(d) / "launch_node0.sh", os.X_OK) == os.access(
            b / "launch_node0.sh", os.X_OK
        )
    cmd = (tmp_path / "run" / "commands" / "node0.txt").read_text()
    assert '"$HOME"/' in cmd and "head -c " in cmd
    assert wait_no_pids(backend.run_id) == []


def test_ssh_config_alias_and_proxy_jump(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host trainer-1\n  HostName 127.0.0.1\n  Port {servers[1].port}\n  User root\n"
        f"  IdentityFile {key}\n  ProxyJump bastion,hop2\n"
        f"Host hop2\n  HostName 127.0.0.1\n  Port {servers[1].port}\n  IdentityFile {key}\n"
        f"Host bastion\n  HostName 127.0.0.1\n  Port {servers[0].port}\n  IdentityFile {key}\n"
    )
    b = make_bundle(tmp_path / "b", nodes=1, steps=1)
    (b / "launch_node0.sh").write_text('#!/usr/bin/env bash\necho "[default0]:via $(whoami)"\n')
    opts = _opts(servers, key, kh, tmp_path, identity_file=None, ssh_config=cfg)
    opts.hosts = [Host.parse("trainer-1")]
    backend = SshBackend(b, tmp_path / "run", opts)
    backend.start()
    events = collect(backend)
    assert backend.state == "succeeded", read_run(tmp_path / "run")["reason"]
    assert [e.line for e in events if isinstance(e, LineEvent) and e.rank == 0] == ["via root"]
    # bastion, hop2 through it, the node through both
    assert len(backend.driver.connector.clients) == 3


def test_remote_setup_failing_on_one_node_starts_nothing_anywhere(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    servers, key, kh = cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    b = _fake_two_node_bundle(tmp_path, f"touch {marks}/started-$$\n")
    # Fails on node 1 only: sshd puts the server port in SSH_CONNECTION's 4th field.
    setup = f'[ "$(echo $SSH_CONNECTION | cut -d" " -f4)" != {servers[1].port} ]'
    backend = SshBackend(b, tmp_path / "run", _opts(servers, key, kh, tmp_path, remote_setup=setup))
    with pytest.raises(LaunchError) as ei:
        backend.start()
    assert f"node 1 (127.0.0.1:{servers[1].port}): --remote-setup failed" in str(ei.value)
    # Node 0 was ready and waiting for "go": the failed start closed its stdin and waited for
    # its wrapper to exit, which it did as "start cancelled" (99), without running the script.
    chan0 = backend.driver.channels[0]
    assert chan0.status_event.wait(10) and chan0.exit_status == 99
    assert list(marks.iterdir()) == []
    assert read_run(tmp_path / "run")["state"] == "failed"
    assert wait_no_pids(backend.run_id) == []


def test_a_remote_setup_past_the_start_timeout_names_the_node_and_starts_nothing(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path
) -> None:
    """Unpacking and --remote-setup are start-up: held to --start-timeout (not --hang-timeout)."""
    servers, key, kh = cluster
    marks = tmp_path / "marks"
    marks.mkdir()
    b = _fake_two_node_bundle(tmp_path, f"touch {marks}/started-$$\n")
    slow = f'[ "$(echo $SSH_CONNECTION | cut -d" " -f4)" != {servers[1].port} ] || sleep 600'
    opts = _opts(
        servers, key, kh, tmp_path, remote_setup=slow, start_timeout_s=3.0, connect_timeout_s=2.0
    )
    backend = SshBackend(b, tmp_path / "run", opts)
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        backend.start()
    assert f"node 1 (127.0.0.1:{servers[1].port}): not ready after 3s" in str(ei.value)
    assert "--start-timeout" in str(ei.value)
    assert time.monotonic() - t0 < 60  # not the hang timeout's 120 s
    assert list(marks.iterdir()) == []
    assert read_run(tmp_path / "run")["state"] == "failed"
    assert wait_no_pids(backend.run_id) == []


def test_key_from_ssh_agent_only(
    cluster: tuple[list[Sshd], Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No key file given: the key lives in a real ssh-agent and is never read from disk by us."""
    servers, key, kh = cluster
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh keys to fall back on
        b = _fake_two_node_bundle(tmp_path, "echo '[default0]:agent ok'\n")
        backend = SshBackend(
            b, tmp_path / "run", _opts(servers, key, kh, tmp_path, identity_file=None)
        )
        backend.start()
        events = collect(backend)
        assert backend.state == "succeeded", read_run(tmp_path / "run")["reason"]
        assert [e.line for e in events if isinstance(e, LineEvent) and e.rank in (0, 2)] == [
            "agent ok",
            "agent ok",
        ]
    finally:
        agent.terminate()
        agent.wait(5)
