"""One interface for every way of starting a run (local torchrun, SSH, SkyPilot, Slurm).

:class:`LaunchBackend` implements :class:`engine.rundir.events.EventSource` as a thin facade
(SkyPilot's own ``Backend`` is the model: small public methods that delegate) over three
collaborators, each testable alone:

- the run's state, :class:`engine.launch.run_state.RunContext` (bundle, options, run directory,
  nodes, the first failure), which owns the output pump (:class:`engine.launch.pump.OutputPump`:
  readers, per-rank splitting, run-directory writes, the event queue);
- a node driver (:class:`engine.launch.driver.NodeDriver`, one per backend) that only starts,
  signals and reaps its processes;
- the supervisor (:class:`engine.launch.supervise.Supervisor`): supervision, the fault policy
  of :mod:`engine.launch.policy`, stopping, hangs, diagnosis requests and the final state.

``start`` adds what every backend needs around the driver's ``start_nodes``: timing, the run
directory and its record, turning any failure into one :class:`LaunchError` line. ``stop()`` /
``request_stop()`` (Ctrl-C, SIGTERM, SIGHUP, or ``RUN/stop.request`` written by a monitor) end a
run ``stopped``, and ``kill()`` (a second Ctrl-C) cuts the grace period short. run.json names the
launcher (pid and start time), so a reader can tell a run whose launcher was killed outright
from one still going.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import NoReturn

from engine.errors import DtrainError
from engine.launch.driver import NodeDriver
from engine.launch.options import LaunchOptions
from engine.launch.policy import STOP_GRACE_S, NodeState
from engine.launch.pump import OutputPump
from engine.launch.run_state import LaunchError, RunContext
from engine.launch.supervise import Supervisor
from engine.launch.threads import start_whole
from engine.rundir.events import Event, RunStateChanged
from engine.rundir.files import RunDir, iso
from engine.rundir.launcher import launcher_record
from engine.rundir.record import RankRecord, RunRecord, RunState
from engine.write.manifest import BundleManifest

__all__ = ["LaunchBackend", "LaunchError", "LaunchOptions", "start_whole"]


class LaunchBackend:
    """A launch backend: run state + node driver + supervisor. Use: ``start()``, then
    ``poll()`` until ``done``; ``stop()``."""

    name = "base"

    def __init__(self, ctx: RunContext, driver: NodeDriver) -> None:
        self.ctx = ctx
        self.driver: NodeDriver = driver
        self.supervisor = Supervisor(ctx, driver)
        ctx.use_lines(driver.split, driver.control)
        self.start_time_s: float | None = None
        """Seconds ``start()`` took (connect + upload + start on every node)."""

    # ------------------------------------------------------------------ the run's state

    @property
    def bundle_dir(self) -> Path:
        return self.ctx.bundle_dir

    @property
    def options(self) -> LaunchOptions:
        return self.ctx.options

    @property
    def manifest(self) -> BundleManifest:
        return self.ctx.manifest

    @property
    def run(self) -> RunDir:
        return self.ctx.run

    @property
    def run_id(self) -> str:
        return self.ctx.run_id

    @property
    def pump(self) -> OutputPump:
        return self.ctx.pump

    @property
    def force(self) -> threading.Event:
        """Set by ``kill()``: stopping SIGKILLs at once instead of waiting out the grace."""
        return self.ctx.force

    @property
    def hosts(self) -> list[str]:
        """Display name of each node's host, in node-rank order."""
        return self.driver.hosts()

    @property
    def state(self) -> RunState:
        return self.ctx.state

    @property
    def stopping(self) -> str:
        """Why the run is being stopped (a user's stop), or "" while it is not."""
        return self.ctx.stop_reason

    @property
    def done(self) -> bool:
        return self.ctx.final.is_set() and self.ctx.pump.empty()

    def node_env(self) -> dict[str, str]:
        """Environment every node's script gets (besides the bundle's nccl.env)."""
        return self.ctx.node_env()

    def exit_code(self) -> int:
        """0 only when every rank exited 0."""
        return 0 if self.ctx.state == RunState.SUCCEEDED else 1

    # ------------------------------------------------------------------ the run's life

    def start(self) -> None:
        """Create the run directory and start every node (all or nothing); a failure ends the
        run ``failed`` and is raised as one :class:`LaunchError` line."""
        t0 = time.monotonic()
        ctx, m = self.ctx, self.ctx.manifest
        hosts = self.hosts
        if len(hosts) != m.nodes:
            raise LaunchError(
                f"{len(hosts)} host(s) given for a {m.nodes}-node bundle; pass one host per node",
                field="--hosts",
            )
        try:
            ctx.run.create(ctx.bundle_dir)
            ctx.nodes[:] = [NodeState(node=i, host=hosts[i]) for i in range(m.nodes)]
            ctx.run.begin(self._first_record(hosts))
            ctx.emit(
                RunStateChanged(
                    RunState.STARTING,
                    f"starting {m.world_size} ranks on {m.nodes} node(s)",
                    time.time(),
                )
            )
            self.driver.start_nodes()
        except BaseException as e:
            if ctx.run.record.run_id == ctx.run_id:  # begun: run.json is this run's
                self._start_failed(e)
            # Not begun: nothing started, nothing of this run to record (a run.json there is
            # another run's). A refusal of the run directory (it exists, it is not writable)
            # is said as it is; an interrupt ends it.
            if isinstance(e, KeyboardInterrupt):
                ctx.state = RunState.STOPPED
                ctx.final.set()
            raise
        try:
            self.start_time_s = time.monotonic() - t0
            ctx.hang.restart()
            ctx.record(state=RunState.RUNNING)
            ctx.state = RunState.RUNNING
            ctx.emit(
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
        self.supervisor.supervise()

    def _first_record(self, hosts: list[str]) -> RunRecord:
        m = self.ctx.manifest
        return RunRecord(
            name=m.name,
            run_id=self.ctx.run_id,
            backend=self.ctx.backend,
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
        self.driver.teardown_after_failed_start()
        if isinstance(e, KeyboardInterrupt):
            self.ctx.stop_requested = True
            self.supervisor.finish(RunState.STOPPED, "stopped by the user while starting")
            raise e
        msg = str(e) if isinstance(e, DtrainError) else f"{type(e).__name__}: {e}"
        self.supervisor.finish(RunState.FAILED, msg)
        if isinstance(e, LaunchError):
            raise e
        if isinstance(e, DtrainError):
            raise LaunchError(e.message, field=e.field) from None
        raise LaunchError(msg) from None

    def poll(self, timeout: float) -> list[Event]:
        return self.ctx.pump.take(timeout)

    def stop(self) -> None:
        """Stop every node (SIGTERM to each process group, SIGKILL after a grace period) and end
        the run ``stopped`` unless it already ended; returns once it ended. Idempotent."""
        if self.ctx.final.is_set() or not self.ctx.nodes:
            return
        self.request_stop()
        self.ctx.final.wait(2 * STOP_GRACE_S + 20)

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node (as :meth:`stop`) on a thread of its own and return at once;
        the run ends ``stopped`` with ``reason``. Idempotent: the first reason stays."""
        self.supervisor.request_stop(reason)

    def kill(self, reason: str = "stopped by the user") -> None:
        """Escalate a stop: SIGKILL everything of the run now, without the grace period (a
        second Ctrl-C). Returns at once; the run still ends ``stopped`` once every node is gone,
        and is never abandoned. Idempotent."""
        self.supervisor.kill(reason)

    def wait(self, timeout: float | None = None) -> RunState:
        """Block until the run ends; returns the final state."""
        self.ctx.final.wait(timeout)
        return self.ctx.state
