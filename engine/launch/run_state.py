"""The state of one launched run, shared by the collaborators of a launch backend.

:class:`RunContext` holds what the facade (:class:`engine.launch.base.LaunchBackend`), the
supervisor (:class:`engine.launch.supervise.Supervisor`) and a node driver
(:mod:`engine.launch.driver`) all read: bundle, options, manifest, run directory, run id, the
nodes, the run's one lock and its end, the first failure, the hang clock, and the output pump
(:class:`engine.launch.pump.OutputPump`) a driver hands its byte streams to
(:meth:`RunContext.add_stream`). It also offers the few callbacks every driver needs (a line of
dtrain-tui's own, a lost node, a full disk), so a driver gets them passed in, not inherited.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from engine.launch.errors import LaunchError
from engine.launch.options import LaunchOptions
from engine.launch.policy import TELEMETRY_ENV, HangClock, NodeState, RankStarts, telemetry_off
from engine.launch.pump import ControlLine, OutputPump, Split
from engine.launch.transport_watch import TransportWatch
from engine.rundir.events import STDERR, Event, LineEvent
from engine.rundir.files import RunDir, new_run_dir
from engine.rundir.record import RunState
from engine.write.manifest import BundleManifest, read_manifest

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")

__all__ = ["Failure", "LaunchError", "RunContext"]

Failure = tuple[int | None, int | None, str]
"""(rank, node, reason) of the run's first failure."""


class RunContext:
    """One run's shared state. Thread-safe where it says so: :meth:`emit`, :meth:`say`,
    :meth:`add_stream` and :meth:`dir_failed` may be called from any thread; the fields the
    supervisor decides on (:attr:`failure`, :attr:`stop_requested`, :attr:`state`) change under
    :attr:`cond` or on the supervisor's own thread."""

    def __init__(
        self,
        bundle_dir: Path,
        run_dir: Path | None,
        options: LaunchOptions | None,
        *,
        backend: str,
    ) -> None:
        self.backend = backend
        """The backend's name (run.json's ``backend``, the transport check's expectation)."""
        self.bundle_dir = Path(bundle_dir)
        self.options = options or LaunchOptions()
        self.manifest: BundleManifest = read_manifest(self.bundle_dir)
        self.run = RunDir(run_dir or new_run_dir(self.manifest.name))
        # The run id tags every process of the run (DTRAIN_RUN_ID) and is matched by the
        # cleanup on every node: no control character (a newline once split it into two
        # patterns there) may get into it from the run directory's name.
        if _CONTROL_RE.search(self.run.path.name):
            raise LaunchError(
                f"{self.run.path.name!r}: a run directory name may not hold control characters",
                field="--run-dir",
            )
        self.run_id = f"{self.run.path.name}-{int(time.time() * 1000) % 10**8}"
        self.cond = threading.Condition()
        """The run's one lock: the state, a stop's start, the first full-disk error."""
        self.nodes: list[NodeState] = []
        """The run's nodes, filled in place when it starts (the pump shares the list)."""
        self.state = RunState.STARTING
        self.final = threading.Event()
        """Set once the run's final state was written."""
        self.force = threading.Event()
        """Set by ``kill()``: stopping SIGKILLs at once instead of waiting out the grace."""
        self.stop_requested = False
        self.stop_reason = ""
        self.failure: Failure | None = None
        self.dir_error: OSError | None = None
        """The first error writing the run directory (a full disk); ends the run ``failed``."""
        m = self.manifest
        self.hang = HangClock(starts=RankStarts(m.nodes, m.gpus_per_node))
        """The ranks' silence (the hang timeout) and first signs of life, on the launcher's
        own clock."""
        self.rank_starts = self._rank_starts_known()
        """Every rank shows a sign of life (the agent's telemetry) when it starts, so each
        rank is held to the start timeout (:meth:`HangClock.overdue`'s ``nodes``)."""
        self.pump = OutputPump(
            self.run,
            self.nodes,
            self.manifest.gpus_per_node,
            ended=self.final,
            hang=self.hang,
            transport=TransportWatch(self.run, self.bundle_dir, backend),
            on_dir_error=self.dir_failed,
        )
        """Reads the nodes' streams into the run directory and the event queue."""

    def _rank_starts_known(self) -> bool:
        """Each rank's start can be told: the bundle runs every rank through the rank agent
        (``dtrain_agent.py``) and no environment the ranks get turns its telemetry off. With
        telemetry off, a script printing only on rank 0 gives no sign of life of the others:
        they would be taken for ranks that never started."""
        if not (self.bundle_dir / "dtrain_agent.py").is_file():
            return False
        bundle = self._bundle_env()
        envs: list[Mapping[str, str]] = [self.options.env]
        if bundle is not None:
            envs.append({TELEMETRY_ENV: bundle})
        if self.backend == "local":  # the ranks inherit this process's environment
            envs.append(os.environ)
        return not telemetry_off(*envs)

    def _bundle_env(self) -> str | None:
        """``DTRAIN_TELEMETRY_S`` as the bundle's nccl.env (sourced by every node script, the
        spec's launch.env included) sets it, or None."""
        try:
            text = (self.bundle_dir / "nccl.env").read_text(errors="replace")
        except OSError:
            return None
        value = None
        for line in text.splitlines():
            if line.startswith(f"{TELEMETRY_ENV}="):
                try:
                    words = shlex.split(line.split("=", 1)[1])
                except ValueError:
                    continue
                value = words[0] if words else ""
        return value

    def use_lines(self, split: Split | None, control: ControlLine | None) -> None:
        """A driver's own line splitting and control lines (before any stream is added)."""
        self.pump.use_lines(split, control)

    # ------------------------------------------------------------------ for drivers

    def add_stream(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        """Hand a node's byte stream (``read()``: bytes, b"" at EOF) to the pump."""
        self.pump.add_stream(node, stream, read)

    def node_lost(self, node: int, reason: str) -> None:
        """A node that can no longer be reached (the first reason stays)."""
        st = self.nodes[node]
        if not st.lost:
            st.lost = reason

    def emit(self, ev: Event) -> None:
        """Queue an event of the launcher's own."""
        self.pump.emit(ev)

    def say(self, node: int, text: str) -> None:
        """A line of dtrain-tui's own among the node's lines."""
        self.emit(LineEvent(node, None, STDERR, f"[dtrain-tui] {text}", time.time()))

    def note(self, text: str) -> None:
        """A line of dtrain-tui's own written to node 0's log before the run's output."""
        self.run.append(0, None, STDERR, f"[dtrain-tui] {text}\n".encode())

    def dir_failed(self, e: OSError) -> None:
        """A write to the run directory failed: remember the first error for the supervisor."""
        with self.cond:
            if self.dir_error is None:
                self.dir_error = e

    def record(
        self,
        *,
        state: RunState | None = None,
        reason: str | None = None,
        failed: tuple[int | None, int | None] | None = None,
        ended_at: float | None = None,
    ) -> None:
        """Update run.json from the launcher's side: a full disk ends the run, never a
        thread."""
        try:
            self.run.update(state=state, reason=reason, failed=failed, ended_at=ended_at)
        except OSError as e:
            self.dir_failed(e)

    def given_hosts(self) -> list[str]:
        """The hosts the options name, else ``localhost`` for every node."""
        return [str(h) for h in self.options.hosts] or ["localhost"] * self.manifest.nodes

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
