"""Local backend: run every node's launch script on this machine (a multi-node bundle becomes a
local multi-node simulation over 127.0.0.1).

Each node script runs from the run directory's copy of the bundle, in its own session
(``start_new_session``) so ``stop`` can signal the whole tree. torchrun starts its ranks in
sessions of their own, so stopping is: SIGTERM to the script's process group (torchrun forwards
it to its ranks), SIGKILL after a grace period, then SIGKILL to any process still carrying this
run's ``DTRAIN_RUN_ID`` in its environment (found through /proc): nothing of the run survives.
After ``kill()`` (a second Ctrl-C) the grace period is cut short: SIGKILL at once.

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
from engine.launch.base import LaunchBackend
from engine.launch.driver import DumpReach
from engine.launch.guard import ReaperGuard
from engine.launch.options import LaunchOptions
from engine.launch.policy import STOP_GRACE_S
from engine.launch.pump import ControlLine, Split
from engine.launch.reaper import kill_run_processes, node_of, pids_with_env
from engine.launch.run_state import LaunchError, RunContext
from engine.rundir.events import STDERR, STDOUT

__all__ = [
    "LocalBackend",
    "LocalDriver",
    "find_torchrun",
    "free_port",
    "kill_run_processes",
    "pids_with_env",
]

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


class LocalDriver:
    """Starts, signals and reaps the node scripts of a run on this machine."""

    dump_reach: DumpReach = DumpReach.EACH_NODE
    split: Split | None = None
    control: ControlLine | None = None

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self._procs: list[subprocess.Popen[bytes]] = []
        self._reaper = ReaperGuard()

    def hosts(self) -> list[str]:
        return ["localhost"] * self.ctx.manifest.nodes

    def start_nodes(self) -> None:
        ctx = self.ctx
        env = os.environ.copy()
        env.update(ctx.node_env())
        env.setdefault("TORCHRUN", find_torchrun())
        if "TORCHRUN" in os.environ:
            env["TORCHRUN"] = os.environ["TORCHRUN"]
        env["MASTER_ADDR"] = "127.0.0.1"
        if not ctx.options.master_port:
            env["MASTER_PORT"] = str(free_port())
        # The venv's bin first so `python`/`torchrun` in a script are this installation's.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        self._reaper.start(ctx.run_id, ctx.run.path)
        shown = {
            k: env[k]
            for k in sorted(set(ctx.node_env()) | {"MASTER_ADDR", "MASTER_PORT", "TORCHRUN"})
        }
        for i, script in enumerate(ctx.manifest.node_scripts):
            self._start_node(i, script, env, shown)

    def _start_node(self, i: int, script: str, env: dict[str, str], shown: dict[str, str]) -> None:
        run = self.ctx.run
        if not (run.bundle / script).is_file():
            raise LaunchError(f"node {i}: {script} is missing from the bundle", field="bundle")
        argv = ["bash", script]
        run.write_command(
            i,
            f"cd {shlex.quote(str(run.bundle))} && env "
            + " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
            + " "
            + shlex.join(argv),
        )
        proc = subprocess.Popen(
            # Under a child subreaper: what the script leaves behind is stopped at its end.
            [sys.executable, "-I", reaper.__file__, "--node", *argv],
            cwd=run.bundle,
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
            self.ctx.add_stream(i, stream, functools.partial(os.read, fd, READ_BYTES))

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        code = self._procs[node].poll()
        return code is not None, code

    def kill_node(self, node: int, reason: str) -> None:
        proc = self._procs[node]
        force = self.ctx.force
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                if force.wait(0.05):  # a second Ctrl-C: no more grace
                    break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        # Ranks live in sessions of their own: catch anything of this run still alive.
        self._sweep_node(node)

    def ask_dumps(self, node: int | None) -> int:
        """The dump request to the node's ranks (:mod:`engine.launch.frdump`); how many were
        asked."""
        from engine.launch.frdump import signal_local

        if node is None:
            return sum(signal_local(self.ctx.run_id, n) for n in range(self.ctx.manifest.nodes))
        return signal_local(self.ctx.run_id, node)

    def kill_node_now(self, node: int) -> None:
        proc = self._procs[node]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._sweep_node(node)

    def _left(self, node: int) -> list[int]:
        run_id = self.ctx.run_id
        return [p for p in pids_with_env("DTRAIN_RUN_ID", run_id) if node_of(p) in (node, None)]

    def _sweep_node(self, node: int) -> None:
        force = self.ctx.force
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and not force.is_set():
            left = self._left(node)
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
            force.wait(0.2)  # polling the process table; a kill() ends the wait
        # SIGKILL until none is left (a dying process may still fork), within a bound.
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            left = self._left(node)
            if not left:
                return
            for pid in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)  # polling the process table until it is empty

    def teardown_after_failed_start(self) -> None:
        for i in range(len(self._procs)):
            self.kill_node(i, "start failed")
        kill_run_processes(self.ctx.run_id)
        self._reaper.done()

    def close(self) -> None:
        for p in self._procs:
            for pipe in (p.stdout, p.stderr):
                if pipe is not None:
                    pipe.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(1)
        kill_run_processes(self.ctx.run_id)
        self._reaper.done()


class LocalBackend(LaunchBackend):
    """torchrun on this machine, one launch script per node."""

    name = "local"

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        ctx = RunContext(bundle_dir, run_dir, options, backend=self.name)
        self.driver: LocalDriver = LocalDriver(ctx)
        super().__init__(ctx, self.driver)
