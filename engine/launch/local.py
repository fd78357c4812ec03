"""Local backend: run every node's launch script on this machine (a multi-node bundle becomes a
local multi-node simulation over 127.0.0.1).

Each node script runs from the run directory's copy of the bundle, in its own session
(``start_new_session``) so ``stop`` can signal the whole tree. torchrun starts its ranks in
sessions of their own, so stopping is: SIGTERM to the script's process group (torchrun forwards
it to its ranks), SIGKILL after a grace period, then SIGKILL to any process still carrying this
run's ``DTRAIN_RUN_ID`` in its environment (found through /proc): nothing of the run survives.
After :meth:`LaunchBackend.kill` (a second Ctrl-C) the grace period is cut short: SIGKILL at once.

Before any node starts, a reaper process (:mod:`engine.launch.reaper`) is started holding a pipe
from this launcher: if the launcher is killed outright (SIGKILL, where no handler runs), the pipe
closes and the reaper does the same sweep, and marks run.json "launcher died".
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.launch import reaper
from engine.launch.base import LaunchBackend, LaunchError
from engine.launch.guard import ReaperGuard
from engine.launch.options import LaunchOptions
from engine.launch.policy import STOP_GRACE_S
from engine.launch.reaper import kill_run_processes, node_of, pids_with_env
from engine.rundir.events import STDERR, STDOUT

__all__ = ["LocalBackend", "find_torchrun", "free_port", "kill_run_processes", "pids_with_env"]

# Bytes asked of a node's pipe per read, and the pipe size asked for (Linux; unprivileged
# processes may go up to /proc/sys/fs/pipe-max-size, 1 MiB by default). Under a firehose a big
# pipe means fewer, bigger reads: the reader's cost per line falls and ranks block less. A read
# is a quarter of the pipe: one read's processing holds the GIL in pieces of a few ms at most
# (a consumer such as the monitor's UI thread waits on it), and the pipe still buffers the rest.
READ_BYTES = 256 << 10
PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def _grow_pipe(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_BYTES)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (bind port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_torchrun() -> str:
    """torchrun next to this Python (the venv's), else on PATH."""
    cand = Path(sys.executable).with_name("torchrun")
    if cand.exists():
        return str(cand)
    return shutil.which("torchrun") or "torchrun"


class LocalBackend(LaunchBackend):
    """torchrun on this machine, one launch script per node."""

    name = "local"

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        super().__init__(bundle_dir, run_dir, options)
        self._procs: list[subprocess.Popen[bytes]] = []
        self._reaper = ReaperGuard()

    @property
    def hosts(self) -> list[str]:
        return ["localhost"] * self.manifest.nodes

    def _start(self) -> None:
        m = self.manifest
        env = os.environ.copy()
        env.update(self.node_env())
        env.setdefault("TORCHRUN", find_torchrun())
        if "TORCHRUN" in os.environ:
            env["TORCHRUN"] = os.environ["TORCHRUN"]
        env["MASTER_ADDR"] = "127.0.0.1"
        if not self.options.master_port:
            env["MASTER_PORT"] = str(free_port())
        # The venv's bin first so `python`/`torchrun` in a script are this installation's.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self._reaper.start(self.run_id, self.run.path)
        shown = {
            k: env[k]
            for k in sorted(set(self.node_env()) | {"MASTER_ADDR", "MASTER_PORT", "TORCHRUN"})
        }
        for i, script in enumerate(m.node_scripts):
            path = self.run.bundle / script
            if not path.is_file():
                raise LaunchError(f"node {i}: {script} is missing from the bundle", field="bundle")
            argv = ["bash", script]
            self.run.write_command(
                i,
                f"cd {shlex.quote(str(self.run.bundle))} && env "
                + " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
                + " "
                + shlex.join(argv),
            )
            proc = subprocess.Popen(
                # Under a child subreaper: what the script leaves behind is stopped at its end.
                [sys.executable, "-I", reaper.__file__, "--node", *argv],
                cwd=self.run.bundle,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            self._procs.append(proc)
            assert proc.stdout is not None and proc.stderr is not None
            for stream, pipe in ((STDOUT, proc.stdout), (STDERR, proc.stderr)):
                fd = pipe.fileno()
                _grow_pipe(fd)
                self._add_stream(i, stream, functools.partial(os.read, fd, READ_BYTES))

    def _node_exit(self, node: int) -> tuple[bool, int | None]:
        code = self._procs[node].poll()
        return code is not None, code

    def _kill_node(self, node: int, reason: str) -> None:
        proc = self._procs[node]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                if self.force.wait(0.05):  # a second Ctrl-C: no more grace
                    break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        # Ranks live in sessions of their own: catch anything of this run still alive.
        self._sweep_node(node)

    def _ask_dumps(self, node: int) -> int:
        """SIGUSR1 to the node's ranks: each prints its Flight Recorder dump
        (:mod:`engine.launch.frdump`); how many were asked."""
        from engine.launch.frdump import signal_local

        return signal_local(self.run_id, node)

    def _kill_node_now(self, node: int) -> None:
        proc = self._procs[node]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._sweep_node(node)

    def _sweep_node(self, node: int) -> None:
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and not self.force.is_set():
            left = [
                p for p in pids_with_env("DTRAIN_RUN_ID", self.run_id) if node_of(p) in (node, None)
            ]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            self.force.wait(0.2)  # polling the process table; a kill() ends the wait
        # SIGKILL until none is left (a dying process may still fork), within a bound.
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            left = [
                p for p in pids_with_env("DTRAIN_RUN_ID", self.run_id) if node_of(p) in (node, None)
            ]
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)  # polling the process table until it is empty

    def _teardown_after_failed_start(self) -> None:
        for i in range(len(self._procs)):
            self._kill_node(i, "start failed")
        kill_run_processes(self.run_id)
        self._reaper.done()

    def _close(self) -> None:
        for p in self._procs:
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        kill_run_processes(self.run_id)
        self._reaper.done()
