"""One interface for every way of starting a run (local torchrun, SSH, SkyPilot).

:class:`LaunchBackend` implements :class:`engine.rundir.events.EventSource`. Its public
``start`` / ``poll`` / ``stop`` / ``kill`` add what every backend needs around the subclass's
``_start`` / ``_kill_node`` / ``_node_exit`` (as SkyPilot's own backends wrap ``_provision`` /
``_execute``): timing, turning any failure into one :class:`LaunchError` line, the run directory
and its record, and the final state. Subclasses only start nodes and hand over their byte
streams; they know nothing of widgets. Beneath it: :mod:`engine.launch.streams` (the run's state),
which owns the run's :class:`engine.launch.pump.OutputPump` (a collaborator, testable alone:
readers, per-rank splitting, run-directory writes, the event queue),
:mod:`engine.launch.supervise` (supervision and the fault policy of :mod:`engine.launch.policy`),
:mod:`engine.launch.torchrun_output` (torchrun's prefixes and failure table).

``stop()`` / ``request_stop()`` (Ctrl-C, SIGTERM, SIGHUP, or ``RUN/stop.request`` written by a
monitor) end a run ``stopped``, and ``kill()`` (a second Ctrl-C) cuts the grace period short.
run.json names the launcher (pid and start time), so a reader can tell a run whose launcher was
killed outright from one still going.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from abc import abstractmethod
from types import FrameType
from typing import NoReturn

from engine.errors import DtrainError
from engine.launch.options import LaunchOptions
from engine.launch.policy import STOP_GRACE_S, NodeState
from engine.launch.streams import LaunchError
from engine.launch.supervise import SupervisedRun
from engine.rundir.events import Event, RunStateChanged
from engine.rundir.files import iso
from engine.rundir.launcher import launcher_record
from engine.rundir.record import RankRecord, RunRecord, RunState

__all__ = ["LaunchBackend", "LaunchError", "LaunchOptions"]


class LaunchBackend(SupervisedRun):
    """Abstract launch backend. Use: ``start()``, then ``poll()`` until ``done``; ``stop()``."""

    start_time_s: float | None = None
    """Seconds ``start()`` took (connect + upload + start on every node)."""
    _supervisor: threading.Thread | None = None

    # ------------------------------------------------------------------ public API

    @property
    def hosts(self) -> list[str]:
        """Display name of each node's host, in node-rank order."""
        return [str(h) for h in self.options.hosts] or ["localhost"] * self.manifest.nodes

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def stopping(self) -> str:
        """Why the run is being stopped (a user's stop), or "" while it is not."""
        return self._stop_reason

    @property
    def done(self) -> bool:
        return self._final.is_set() and self.pump.empty()

    def start(self) -> None:
        """Create the run directory and start every node (all or nothing); a failure ends the
        run ``failed`` and is raised as one :class:`LaunchError` line."""
        t0 = time.monotonic()
        m = self.manifest
        hosts = self.hosts
        if len(hosts) != m.nodes:
            raise LaunchError(
                f"{len(hosts)} host(s) given for a {m.nodes}-node bundle; pass one host per node",
                field="--hosts",
            )
        try:
            self.run.create(self.bundle_dir)
            self._nodes[:] = [NodeState(node=i, host=hosts[i]) for i in range(m.nodes)]
            self.run.begin(self._first_record(hosts))
            self._emit(
                RunStateChanged(
                    RunState.STARTING,
                    f"starting {m.world_size} ranks on {m.nodes} node(s)",
                    time.time(),
                )
            )
            self._start()
        except BaseException as e:
            if self.run.record.run_id == self.run_id:  # begun: run.json is this run's
                self._start_failed(e)
            # Not begun: nothing started, nothing of this run to record (a run.json there is
            # another run's). A refusal of the run directory (it exists, it is not writable)
            # is said as it is; an interrupt ends it.
            if isinstance(e, KeyboardInterrupt):
                self._state = RunState.STOPPED
                self._final.set()
            raise
        try:
            self.start_time_s = time.monotonic() - t0
            self._hang.restart()
            self._record(state=RunState.RUNNING)
            self._state = RunState.RUNNING
            self._emit(
                RunStateChanged(
                    RunState.RUNNING, f"started in {self.start_time_s:.2f}s", time.time()
                )
            )
        finally:
            # The nodes run: an interrupt landing here (Ctrl-C just after the start) must not
            # leave them unwatched, with nothing to notice their exits or end a stop.
            self.supervise()

    def supervise(self) -> None:
        """Watch the started nodes (exits, hangs, a stop's end) on a thread of its own: the last
        thing :meth:`start` does. A caller that caught an interrupt out of ``start()`` while the
        run was not undone calls it again (an interrupt can land before the thread starts).
        Idempotent; nothing to watch before the nodes started or after the run ended."""
        with self._cond:
            if self._final.is_set() or not self._nodes:
                return
            if self._supervisor is None:
                self._supervisor = threading.Thread(
                    target=self._supervise, name="dtrain-supervise", daemon=True
                )
            thread = self._supervisor
        if thread.ident is None:  # made but not started: the interrupt came in between
            with contextlib.suppress(RuntimeError):  # started meanwhile: once is enough
                start_whole(thread)

    def _first_record(self, hosts: list[str]) -> RunRecord:
        m = self.manifest
        return RunRecord(
            name=m.name,
            run_id=self.run_id,
            backend=self.name,
            state=RunState.STARTING,
            started_at=iso(time.time()),
            nodes=m.nodes,
            gpus_per_node=m.gpus_per_node,
            world_size=m.world_size,
            dist_backend=m.dist_backend,
            framework=m.framework,
            hosts=hosts,
            ranks=[
                RankRecord(rank=n * m.gpus_per_node + lr, node_rank=n, local_rank=lr, host=hosts[n])
                for n in range(m.nodes)
                for lr in range(m.gpus_per_node)
            ],
            launcher=launcher_record(),
        )

    def _start_failed(self, e: BaseException) -> NoReturn:
        """Undo a half-done start, end the run, and raise (always)."""
        self._teardown_after_failed_start()
        if isinstance(e, KeyboardInterrupt):
            self._stop_requested = True
            self._finish(RunState.STOPPED, "stopped by the user while starting")
            raise e
        msg = str(e) if isinstance(e, DtrainError) else f"{type(e).__name__}: {e}"
        self._finish(RunState.FAILED, msg)
        if isinstance(e, LaunchError):
            raise e
        if isinstance(e, DtrainError):
            raise LaunchError(e.message, field=e.field) from None
        raise LaunchError(msg) from None

    def poll(self, timeout: float) -> list[Event]:
        return self.pump.take(timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM to each process group, SIGKILL after a grace period) and end
        the run ``stopped`` unless it already ended; returns once it ended. Idempotent."""
        if self._final.is_set() or not self._nodes:
            return
        self.request_stop()
        self._final.wait(2 * STOP_GRACE_S + 20)

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node (as :meth:`stop`) on a thread of its own and return at once;
        the run ends ``stopped`` with ``reason``. Idempotent: the first reason stays."""
        with self._cond:
            if self._final.is_set() or not self._nodes or self._stopper is not None:
                return
            self._stop_requested = True
            self._stop_reason = reason
            self._stopper = threading.Thread(
                target=self._stop_all, args=(reason,), name="dtrain-stop", daemon=True
            )
        self._stopper.start()

    def kill(self, reason: str = "stopped by the user") -> None:
        """Escalate a stop: SIGKILL everything of the run now, without the grace period (a
        second Ctrl-C). Returns at once; the run still ends ``stopped`` once every node is gone,
        and is never abandoned. Idempotent."""
        self.request_stop(reason)
        self.force.set()
        for st in self._nodes:
            if not st.finished:
                threading.Thread(
                    target=self._safe_kill_now, args=(st.node,), name="dtrain-kill", daemon=True
                ).start()

    def _stop_all(self, reason: str) -> None:
        self._kill_all(reason)
        self._final.wait(STOP_GRACE_S + 10)
        if not self._final.is_set():
            self._finish(RunState.STOPPED, reason)

    def wait(self, timeout: float | None = None) -> RunState:
        """Block until the run ends; returns the final state."""
        self._final.wait(timeout)
        return self._state

    def exit_code(self) -> int:
        """0 only when every rank exited 0."""
        return 0 if self._state == RunState.SUCCEEDED else 1

    def node_env(self) -> dict[str, str]:
        """Environment every node's script gets (besides the bundle's nccl.env)."""
        env = dict(self.options.env)
        env["DTRAIN_RUN_ID"] = self.run_id
        env["PYTHONUNBUFFERED"] = "1"
        if self.options.nccl_debug:
            env["NCCL_DEBUG"] = self.options.nccl_debug
        if self.options.nccl_debug_subsys:
            env["NCCL_DEBUG_SUBSYS"] = self.options.nccl_debug_subsys
        if self.options.master_port:
            env["MASTER_PORT"] = str(self.options.master_port)
        return env

    # ------------------------------------------------------------------ for subclasses

    @abstractmethod
    def _start(self) -> None:
        """Start every node (all or nothing); call :meth:`_add_stream` for each output stream."""

    def _teardown_after_failed_start(self) -> None:
        """Undo a half-done start (kill what was started, close connections)."""
        return None


def start_whole(thread: threading.Thread) -> None:
    """``thread.start()`` that a Ctrl-C cannot cut in two. An interrupt raised inside
    ``Thread.start`` (while it waits for the new thread to begin) leaves a thread that runs but
    is not known to have started: starting it again then runs a second copy of it, and one of
    the two dies on CPython's bookkeeping with a traceback. On the main thread SIGINT is held
    while the thread starts and delivered to its handler as soon as it has."""
    if threading.current_thread() is not threading.main_thread():
        thread.start()  # signals are handled on the main thread only
        return
    held: list[tuple[int, FrameType | None]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        thread.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    if not held:
        return
    if callable(previous):
        previous(*held[0])
    elif previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)
