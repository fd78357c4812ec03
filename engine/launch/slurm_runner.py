"""Where the Slurm backend's commands run and its output files are read: on this machine (a login
node) or over SSH on a login node (``launch --backend slurm --login-host HOST``).

Called by :class:`engine.launch.slurm.SlurmBackend`, which does the same thing through either
runner: ``run`` a Slurm command (``sbatch``, ``scontrol``, ``scancel``, ``sinfo``) and get a
:class:`subprocess.CompletedProcess`; ``follow`` a file srun writes until the job ended. The SSH
runner connects with :class:`~engine.launch.ssh_connect.SshConnector` (ssh config, the same
host-key rules as the SSH backend), sends the bundle as one tar on an exec channel's stdin (as
the SSH backend does) into a fresh directory under ``--remote-workdir``, follows each file with
``tail -F`` on a channel of its own, and keeps one channel open whose end (this launcher killed,
the connection lost) ``scancel``s the job on the login node. paramiko is imported inside
:mod:`engine.launch.ssh_connect`'s functions only.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from engine.launch.errors import LaunchError
from engine.launch.local import find_torchrun
from engine.launch.options import LaunchOptions
from engine.launch.slurm_cli import CMD_TIMEOUT_S, run_slurm, slurm_env
from engine.launch.ssh_remote import remote_path_expr
from engine.plan.specs import Host

POLL_S = 1.0
"""How long a follower waits for new bytes before looking whether the job ended."""
READ_BYTES = 256 << 10


class Follower(Protocol):
    on_data: Callable[[bytes], None] | None

    def read(self) -> bytes:
        """New bytes of the file; blocks while none; b"" once the job ended and all was read."""
        ...


class SlurmRunner(Protocol):
    """Runs Slurm's commands and reads the job's files, here or on a login node."""

    where: str
    """Where the commands run, for messages: "this machine" or "login node HOST"."""
    notes: list[str]
    """What connecting said for the run's log (an SSH config's choices); after ``connect``."""

    def job_env(self, node_env: Mapping[str, str]) -> dict[str, str]:
        """The environment sbatch runs in (the job inherits it: ``--export=ALL``)."""
        ...

    def connect(self) -> None: ...

    def put_bundle(self, bundle: Path, run_id: str) -> str:
        """The bundle's directory where the job runs from (absolute), copied there if needed."""
        ...

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]: ...

    def follow(self, path: str, ended: threading.Event) -> Follower: ...

    def guard(self, job_id: str, env: Mapping[str, str]) -> None:
        """Cancel ``job_id`` should this launcher vanish (the local runner has the reaper)."""
        ...

    def close(self) -> None: ...


class FileFollower:
    """Reads a local file srun writes while the job runs: returns new bytes as they come, b""
    once the job ended and the file is drained."""

    def __init__(self, path: Path, ended: threading.Event) -> None:
        self.path = path
        self.ended = ended
        self._f: Any = None
        self._last = False
        self.on_data: Callable[[bytes], None] | None = None

    def read(self) -> bytes:
        while True:
            if self._f is None:
                with contextlib.suppress(FileNotFoundError):
                    self._f = self.path.open("rb")
            data = self._f.read(READ_BYTES) if self._f is not None else b""
            if data:
                if self.on_data is not None:
                    self.on_data(data)
                return data
            if self._last:
                if self._f is not None:
                    self._f.close()
                return b""
            if self.ended.is_set():
                self._last = True  # one more read after the end: the file's last bytes
                continue
            self.ended.wait(POLL_S)


class LocalRunner:
    """This machine is the login node: its file system is the compute nodes' too."""

    where = "this machine"

    def __init__(self) -> None:
        self.notes: list[str] = []

    def job_env(self, node_env: Mapping[str, str]) -> dict[str, str]:
        env = slurm_env(node_env)
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        env.setdefault("TORCHRUN", find_torchrun())
        return env

    def connect(self) -> None:
        return None

    def put_bundle(self, bundle: Path, run_id: str) -> str:
        return str(bundle.resolve())  # the job's working directory: never relative

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_slurm(argv, env=env, cwd=cwd)

    def follow(self, path: str, ended: threading.Event) -> Follower:
        return FileFollower(Path(path), ended)

    def guard(self, job_id: str, env: Mapping[str, str]) -> None:
        return None

    def close(self) -> None:
        return None


def remote_bundle_expr(workdir: str, run_id: str) -> str:
    """Shell expression of the run's bundle directory on the login node, under
    ``--remote-workdir``."""
    return remote_path_expr(workdir, str(PurePosixPath(run_id) / "bundle"))


def env_command(argv: Sequence[str], env: Mapping[str, str], cwd: str | None) -> str:
    """``cd CWD && exec env K=V … ARGV``, every word quoted: the login shell's environment plus
    ours (the sshd lets no variable through, so e.g. ``SLURM_CONF`` must be named here)."""
    words = ["exec", "env", *(f"{k}={v}" for k, v in env.items()), *argv]
    cmd = " ".join(shlex.quote(w) for w in words)
    return f"cd {shlex.quote(cwd)} && {cmd}" if cwd else cmd


def bundle_tar(bundle: Path) -> bytes:
    """The bundle as one uncompressed tar (modes kept, no local owner, no ``logs``)."""
    buf = io.BytesIO()

    def unowned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(bundle.iterdir()):
            if path.name != "logs":
                tar.add(path, arcname=path.name, filter=unowned)
    return buf.getvalue()


class SshFollower:
    """Follows a file on the login node: ``tail -F`` on a channel of its own while the job runs;
    once it ended, the bytes not seen yet (``tail -c +N``), then b""."""

    def __init__(self, runner: SshRunner, path: str, ended: threading.Event) -> None:
        self.runner = runner
        self.path = path
        self.ended = ended
        self.on_data: Callable[[bytes], None] | None = None
        self._chan: Any = None
        self._seen = 0
        self._done = False

    def _got(self, data: bytes) -> bytes:
        self._seen += len(data)
        if data and self.on_data is not None:
            self.on_data(data)
        return data

    def read(self) -> bytes:
        while not self._done:
            if self.ended.is_set():
                # The job is over: the file is complete; fetch what tail had not sent yet.
                self._done = True
                if self._chan is not None:
                    self._chan.close()
                rc, rest, _ = self.runner.exec(
                    f"tail -c +{self._seen + 1} -- {shlex.quote(self.path)} 2>/dev/null"
                )
                if rest:
                    return self._got(rest)
                break
            if self._chan is None:
                self._chan = self.runner.open(
                    f"exec tail -n +1 -F -- {shlex.quote(self.path)} 2>/dev/null"
                )
                self._chan.settimeout(POLL_S)
            try:
                data = self._chan.recv(READ_BYTES)
            except TimeoutError:  # socket.timeout: nothing new within POLL_S
                continue
            if data:
                return self._got(data)
            self.ended.wait(POLL_S)  # tail ended (connection lost): wait for the job's end
        return b""


class SshRunner:
    """A login node over SSH: one connection, one exec channel per command or followed file."""

    def __init__(self, options: LaunchOptions, login: Host) -> None:
        from engine.launch.ssh_connect import SshConnector

        self.options = options
        self.login = login
        self.where = f"login node {login}"
        self.notes: list[str] = []
        """What the user should know (a host key accepted), for the run's log."""
        self._ssh = SshConnector(options)
        self._client: Any = None
        self._guard: Any = None

    def job_env(self, node_env: Mapping[str, str]) -> dict[str, str]:
        return dict(node_env)  # the login node's own environment, plus ours

    def connect(self) -> None:
        cfg = self._ssh.ssh_config()
        t = self._ssh.target(0, self.login, cfg)
        t.label = self.where
        self._ssh.prepare([t])
        self._client = self._ssh.connect(t, cfg)
        self._ssh.clients.append(self._client)
        self.notes.extend(self._ssh.notes)

    def open(self, cmd: str) -> Any:
        """A channel running ``cmd`` on the login node."""
        try:
            chan = self._client.get_transport().open_session()
            chan.exec_command(cmd)
        except Exception as e:  # noqa: BLE001
            raise LaunchError(f"{self.where}: connection lost: {e}", field="ssh") from None
        return chan

    def exec(
        self, cmd: str, stdin: bytes = b"", timeout: float = CMD_TIMEOUT_S
    ) -> tuple[int, bytes, bytes]:
        """Run ``cmd`` to its end: (exit status, stdout, stderr)."""
        chan = self.open(cmd)
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            chan.settimeout(0.2)
            while not (chan.exit_status_ready() and not chan.recv_ready()):
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{self.where}: {cmd.split()[0]} did not answer within {timeout:.0f}s",
                        field="ssh",
                    )
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(READ_BYTES)
                try:
                    data = chan.recv(READ_BYTES)
                except TimeoutError:
                    continue
                if not data:  # end of output: the exit status follows
                    chan.status_event.wait(0.05)
                out += data
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(READ_BYTES)
            return int(chan.recv_exit_status()), bytes(out), bytes(err)
        finally:
            chan.close()

    def put_bundle(self, bundle: Path, run_id: str) -> str:
        d = remote_bundle_expr(self.options.remote_workdir, run_id)
        cmd = f'set -e; d={d}; mkdir -p -- "$d"; cd -- "$d"; tar -xf -; mkdir -p logs; pwd'
        rc, out, err = self.exec(cmd, stdin=bundle_tar(bundle), timeout=120)
        if rc != 0:
            why = err.decode("utf-8", "replace").strip() or f"exit status {rc}"
            raise LaunchError(
                f"{self.where}: cannot unpack the bundle under {self.options.remote_workdir}: "
                f"{why}",
                field="--remote-workdir",
            )
        return out.decode().strip().splitlines()[-1]

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        rc, out, err = self.exec(env_command(argv, env or {}, cwd))
        if rc == 127:
            raise LaunchError(
                f"{argv[0]} not found on {self.where}: is it a Slurm login node? (its PATH can be "
                "set with --env PATH=...)",
                field="--login-host",
            )
        return subprocess.CompletedProcess(
            list(argv), rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )

    def follow(self, path: str, ended: threading.Event) -> Follower:
        return SshFollower(self, path, ended)

    def guard(self, job_id: str, env: Mapping[str, str]) -> None:
        # sshd closes this command's stdin when the connection ends, however it ends: then
        # the job is cancelled (a finished job is left alone by scancel).
        self._guard = self.open(
            "cat >/dev/null; " + env_command(["scancel", job_id], env, None) + " 2>/dev/null"
        )

    def close(self) -> None:
        self._ssh.close()
