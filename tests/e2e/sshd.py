"""Real OpenSSH servers on 127.0.0.1 for the SSH backend's tests and benchmark.

Each :class:`Sshd` has its own temporary host key, a client key in its authorized_keys and a
free port (bound to 0 first, never a fixed one). ``make system-deps`` installs openssh-server;
:func:`sshd_path` returns None when it is missing so callers can skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def sshd_path() -> str | None:
    for cand in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> Path:
    """An ed25519 key pair at ``path`` / ``path.pub`` (no passphrase)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "dtrain-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


class Sshd:
    """One sshd on 127.0.0.1:<free port>, accepting ``client_key`` (a path to a private key)."""

    def __init__(self, workdir: Path, client_key: Path, name: str = "sshd") -> None:
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.host_key = keygen(self.dir / "host_ed25519")
        self.client_key = client_key
        # Each "node" gets a home of its own (like a fresh cluster account): the login shell
        # then reads no ~/.bashrc of this machine's user, and "~" on the node is this directory.
        self.home = self.dir / "home"
        self.home.mkdir(exist_ok=True)
        auth = self.dir / "authorized_keys"
        auth.write_text(f'environment="HOME={self.home}" ' + Path(f"{client_key}.pub").read_text())
        auth.chmod(0o600)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host_pub(self) -> str:
        """``type base64`` of the host key."""
        parts = Path(f"{self.host_key}.pub").read_text().split()
        return f"{parts[0]} {parts[1]}"

    def known_hosts_line(self) -> str:
        return f"[127.0.0.1]:{self.port} {self.host_pub}\n"

    def start(self) -> Sshd:
        exe = sshd_path()
        assert exe, "sshd is not installed (make system-deps)"
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation dir
        for _attempt in range(5):
            self.port = _free_port()
            cfg = self.dir / "sshd_config"
            cfg.write_text(
                f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\n"
                f"AuthorizedKeysFile {self.dir / 'authorized_keys'}\nPidFile {self.dir / 'sshd.pid'}\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nMaxStartups 100\n"
                "MaxSessions 50\nSubsystem sftp internal-sftp\nLogLevel ERROR\n"
                "PermitUserEnvironment yes\n"
            )
            self.proc = subprocess.Popen(
                [exe, "-D", "-e", "-f", str(cfg)],
                stdout=subprocess.DEVNULL,
                stderr=open(self.dir / "sshd.log", "ab"),  # noqa: SIM115
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return self
                time.sleep(0.05)
            self.stop()  # port taken meanwhile: try another
        raise RuntimeError(f"sshd did not start: {(self.dir / 'sshd.log').read_text()[-500:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


def start_many(workdir: Path, n: int) -> tuple[list[Sshd], Path, Path]:
    """``n`` servers sharing one client key; returns (servers, client key, known_hosts file)."""
    client = keygen(workdir / "client_ed25519")
    servers = [Sshd(workdir, client, f"sshd{i}").start() for i in range(n)]
    kh = workdir / "known_hosts"
    kh.write_text("".join(s.known_hosts_line() for s in servers))
    return servers, client, kh
