"""The supervisor of a running run: a collaborator of every launch backend.

:class:`Supervisor` takes the run's state (:class:`engine.launch.run_state.RunContext`) and its
node driver (:class:`engine.launch.driver.NodeDriver`) and runs the supervision thread (every
:data:`SUPERVISE_INTERVAL_S`): it takes a stop asked through the run directory, notices a node's
end (the driver's ``node_exit``), records each rank's exit, applies the fault policy
(:mod:`engine.launch.policy`: first failure, lost node, hang, a rank that never started, full
disk end the run ``failed`` and stop every other node), asks for a diagnosis
(:mod:`engine.launch.diagnosis`) and writes the final state once. It also owns stopping:
``request_stop`` (the grace period) and ``kill`` (SIGKILL at once). The facade
:class:`engine.launch.base.LaunchBackend` delegates to it.
"""

from __future__ import annotations

import contextlib
import threading
import time

from engine.launch.diagnosis import diagnose_failed_run, diagnose_safely, timeout_why
from engine.launch.driver import NodeDriver
from engine.launch.policy import (
    LINGER_S,
    STOP_GRACE_S,
    SUPERVISE_INTERVAL_S,
    NodeState,
    blame_unstarted,
    dir_error_text,
    first_bad_rank,
    node_failure,
    rank_exit,
)
from engine.launch.run_state import RunContext
from engine.launch.threads import start_whole
from engine.rundir.events import STDERR, LineEvent, RankExit, RunStateChanged
from engine.rundir.launcher import take_stop_request
from engine.rundir.record import RunState


class Supervisor:
    """Node supervision, the fault policy, stopping and the final state of one run."""

    def __init__(self, ctx: RunContext, driver: NodeDriver) -> None:
        self.ctx = ctx
        self.driver = driver
        self.timeout_diagnosed = False
        """A rank's collective-timeout line was diagnosed (once a run)."""
        self._thread: threading.Thread | None = None
        self._stopper: threading.Thread | None = None
        self._finishing = False

    # ------------------------------------------------------------------ the thread

    def supervise(self) -> None:
        """Watch the started nodes on a thread of its own. Idempotent; nothing to watch before
        the nodes started or after the run ended. Safe to call again after an interrupt landed
        between making the thread and starting it."""
        ctx = self.ctx
        with ctx.cond:
            if ctx.final.is_set() or not ctx.nodes:
                return
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._supervise, name="dtrain-supervise", daemon=True
                )
            thread = self._thread
        if thread.ident is None:  # made but not started: the interrupt came in between
            with contextlib.suppress(RuntimeError):  # started meanwhile: once is enough
                start_whole(thread)

    @property
    def watching(self) -> bool:
        """The supervision thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def _supervise(self) -> None:
        ctx = self.ctx
        try:
            while not ctx.final.is_set():
                ctx.hang.tick()  # before any check: a stopped launcher's gap is not silence
                if (
                    not ctx.stop_requested
                    and ctx.failure is None
                    and take_stop_request(ctx.run.path)
                ):
                    self.request_stop("stopped from the monitor")
                if ctx.dir_error is not None and ctx.failure is None:
                    self.fail(None, None, dir_error_text(ctx.dir_error))
                if ctx.pump.timeout_line is not None:  # a rank's timeout line
                    self._diagnose_timeout()  # once, before that rank's exit stops the others
                self.check_nodes()
                ctx.final.wait(SUPERVISE_INTERVAL_S)
        except Exception as e:  # noqa: BLE001 - never leave a run without a final state
            self.fail(None, None, f"internal error while supervising: {type(e).__name__}: {e}")
            self.finish(RunState.FAILED, str(e))

    def _diagnose_timeout(self) -> None:
        """Once per run, while it is neither failing nor stopping: a rank printed a collective
        timeout, so ask every rank for its dump as a hang would."""
        seen = self.ctx.pump.timeout_line
        if seen is None or self.timeout_diagnosed:
            return
        self.timeout_diagnosed = True
        if self.ctx.failure is not None or self.ctx.stop_requested:
            return
        diagnose_safely(self.ctx, self.driver, timeout_why(seen))

    # ------------------------------------------------------------------ one pass

    def check_nodes(self) -> None:
        """One look at every node: their ends, a hang, a diagnosis asked for, the run's end."""
        ctx = self.ctx
        all_done = True
        scripts_running = False
        # Nodes whose torchrun printed a failure table first, the surest first failure first
        # (FailureTable.blame_order): among nodes ending together, a rank killed by a signal is
        # the cause, not the peer that then lost its connection.
        order = sorted(ctx.nodes, key=lambda n: (n.table.blame_order(), n.node))
        for st in order:
            if st.finished:
                continue
            finished, code = self.driver.node_exit(st.node)
            scripts_running = scripts_running or not finished
            streams_open = ctx.pump.open_streams(st.node)
            if st.lost and not finished:
                self.fail(None, st.node, f"node {st.node} ({st.host}): {st.lost}")
                finished, code = True, None
            if finished and streams_open > 0 and not st.lost:
                # The script ended but something it left behind still holds its output open:
                # give the pipes a moment to drain, then clean up what was left.
                if st.exited_at is None:
                    st.exited_at = time.monotonic()
                if time.monotonic() - st.exited_at > LINGER_S:
                    self._safe_kill(st.node, "the node script ended; stopping what it left behind")
                    streams_open = 0
            if not finished or (streams_open > 0 and not st.lost):
                all_done = False
                continue
            st.finished, st.exit_code = True, code
            self._node_finished(st)
        if not all_done and ctx.failure is None and not ctx.stop_requested:
            from engine.diagnose.request import take_diagnose_request

            if take_diagnose_request(ctx.run.path):  # a monitor's "diagnose"
                diagnose_safely(ctx, self.driver, "asked from the monitor")
            hang = ctx.hang.overdue(
                ctx.options.hang_timeout_s,
                scripts_running,
                start_timeout_s=ctx.options.start_timeout_s,
                nodes=ctx.nodes if ctx.rank_starts else None,
            )
            if hang is not None:
                diagnose_safely(ctx, self.driver, hang)  # name the stuck rank before the stop
                rank, node = blame_unstarted(
                    ctx.hang.unstarted, ctx.manifest.gpus_per_node, len(ctx.nodes)
                )
                self.fail(rank, node, hang)
        if all_done:
            if ctx.failure is not None:
                diagnose_failed_run(ctx, self.driver)  # NCCL's own dumps after a timeout
            self._all_done()

    def _all_done(self) -> None:
        """Every node ended: the run's final state."""
        ctx = self.ctx
        if ctx.stop_requested and ctx.failure is None:
            self.finish(RunState.STOPPED, ctx.stop_reason or "stopped by the user")
        elif ctx.failure is not None:
            self.finish(RunState.FAILED, ctx.failure[2])
        else:
            bad = first_bad_rank(ctx.run.record.ranks)
            if bad is None:
                self.finish(RunState.SUCCEEDED, f"all {ctx.manifest.world_size} ranks exited 0")
            else:
                ctx.failure = bad
                ctx.record(failed=(bad[0], bad[1]))
                self.finish(RunState.FAILED, bad[2])

    def _node_finished(self, st: NodeState) -> None:
        ctx = self.ctx
        gpus = ctx.manifest.gpus_per_node
        killed_by_us = ctx.stop_requested or (ctx.failure is not None and ctx.failure[1] != st.node)
        for lr in range(gpus):
            rank = st.node * gpus + lr
            code, reason = rank_exit(st, rank, killed_by_us)
            try:
                ctx.run.set_rank_exit(rank, code, reason)
            except OSError as e:
                ctx.dir_failed(e)
            ctx.emit(RankExit(st.node, rank, code, time.time(), st.host, reason))
        if st.exit_code != 0 and not killed_by_us and ctx.failure is None:
            root, why = node_failure(st)
            self.fail(root, st.node, why)

    # ------------------------------------------------------------------ failing and stopping

    def fail(self, rank: int | None, node: int | None, reason: str) -> None:
        """The run's first failure: record it and stop every other node (later ones are
        ignored)."""
        ctx = self.ctx
        if ctx.failure is not None or ctx.final.is_set():
            return
        ctx.failure = (rank, node, reason)
        ctx.record(failed=(rank, node), reason=reason)
        ctx.emit(
            LineEvent(
                node if node is not None else 0,
                None,
                STDERR,
                f"[dtrain-tui] {reason}; stopping the other ranks",
                time.time(),
            )
        )
        self._kill_all(reason)

    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node on a thread of its own and return at once; the run ends
        ``stopped`` with ``reason``. Idempotent: the first reason stays."""
        ctx = self.ctx
        with ctx.cond:
            if ctx.final.is_set() or not ctx.nodes or self._stopper is not None:
                return
            ctx.stop_requested = True
            ctx.stop_reason = reason
            self._stopper = threading.Thread(
                target=self._stop_all, args=(reason,), name="dtrain-stop", daemon=True
            )
        self._stopper.start()

    def kill(self, reason: str = "stopped by the user") -> None:
        """Escalate a stop: SIGKILL everything of the run now, without the grace period."""
        self.request_stop(reason)
        self.ctx.force.set()
        for st in self.ctx.nodes:
            if not st.finished:
                threading.Thread(
                    target=self._safe_kill_now, args=(st.node,), name="dtrain-kill", daemon=True
                ).start()

    def _stop_all(self, reason: str) -> None:
        self._kill_all(reason)
        self.ctx.final.wait(STOP_GRACE_S + 10)
        if not self.ctx.final.is_set():
            self.finish(RunState.STOPPED, reason)

    def _kill_all(self, reason: str) -> None:
        threads = [
            threading.Thread(target=self._safe_kill, args=(st.node, reason), daemon=True)
            for st in self.ctx.nodes
            if not st.finished
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_GRACE_S + 10)

    def _safe_kill_now(self, node: int) -> None:
        try:
            self.driver.kill_node_now(node)
        except Exception as e:  # noqa: BLE001 - report, keep killing the others
            self.ctx.say(node, f"could not kill node {node}: {e}")

    def _safe_kill(self, node: int, reason: str) -> None:
        try:
            self.driver.kill_node(node, reason)
        except Exception as e:  # noqa: BLE001 - report, keep stopping the others
            self.ctx.say(node, f"could not stop node {node}: {e}")

    # ------------------------------------------------------------------ the end

    def finish(self, state: RunState, message: str) -> None:
        """Write the final state once: drain the readers, close the run directory and the
        driver, then the last event."""
        ctx = self.ctx
        with ctx.cond:
            if ctx.final.is_set() or self._finishing:
                return
            self._finishing = True
            ctx.state = state
        ctx.pump.join(2.0)
        fr = ctx.failure
        ctx.record(
            state=state,
            ended_at=time.time(),
            reason=message,
            failed=(fr[0], fr[1]) if fr is not None else None,
        )
        ctx.run.close()
        try:
            self.driver.close()
        finally:
            failed = (fr[0],) if fr is not None and fr[0] is not None else ()
            ctx.emit(RunStateChanged(state, message, time.time(), failed))
            ctx.final.set()
            ctx.pump.wake()
