"""The middle layer of every launch backend: supervision of a running run.

:class:`SupervisedRun` runs the supervisor thread (every :data:`SUPERVISE_INTERVAL_S`): it takes
a stop asked through the run directory, notices a node's end (through the backend's
``_node_exit``), records each rank's exit, applies the fault policy (:mod:`engine.launch.policy`:
first failure, lost node, hang, full disk end the run ``failed`` and stop every other node) and
writes the final state once. Subclasses provide ``_node_exit`` and ``_kill_node``; the public
template is :class:`engine.launch.base.LaunchBackend`.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod

from engine.launch.policy import (
    LINGER_S,
    STOP_GRACE_S,
    SUPERVISE_INTERVAL_S,
    NodeState,
    dir_error_text,
    first_bad_rank,
    node_failure,
    rank_exit,
)
from engine.launch.streams import StreamingRun
from engine.rundir.events import STDERR, LineEvent, RankExit, RunStateChanged
from engine.rundir.launcher import take_stop_request
from engine.rundir.record import RunState


class SupervisedRun(StreamingRun, ABC):
    """Node supervision, the fault policy and the final state."""

    # ------------------------------------------------------------------ hooks

    @abstractmethod
    def _kill_node(self, node: int, reason: str) -> None:
        """Stop everything of the run on ``node`` (process group, then leftovers). Idempotent."""

    @abstractmethod
    def _node_exit(self, node: int) -> tuple[bool, int | None]:
        """(finished, exit code) of the node's launch script."""

    def _kill_node_now(self, node: int) -> None:
        """Hook for ``kill()``: SIGKILL everything of the run on ``node`` at once. By default a
        second :meth:`_kill_node` (a subclass's waits should end early once :attr:`force` is
        set)."""
        self._kill_node(node, "killed by the user")

    def _close(self) -> None:
        """Release resources (connections) after the run ended."""
        return None

    # ------------------------------------------------------------------ supervision

    def _supervise(self) -> None:
        try:
            while not self._final.is_set():
                self._hang.tick()  # before any check: a stopped launcher's gap is not silence
                if (
                    not self._stop_requested
                    and self._failure is None
                    and take_stop_request(self.run.path)
                ):
                    self.request_stop("stopped from the monitor")
                if self._dir_error is not None and self._failure is None:
                    self._fail(None, None, dir_error_text(self._dir_error))
                if self.pump.timeout_line is not None:  # a rank's timeout line
                    from engine.launch.frdump import diagnose_timeout

                    diagnose_timeout(self)  # once, before that rank's exit stops the others
                self._check_nodes()
                self._final.wait(SUPERVISE_INTERVAL_S)
        except Exception as e:  # noqa: BLE001 - never leave a run without a final state
            self._fail(None, None, f"internal error while supervising: {type(e).__name__}: {e}")
            self._finish(RunState.FAILED, str(e))

    @abstractmethod
    def request_stop(self, reason: str = "stopped by the user") -> None:
        """Start stopping every node; the run ends ``stopped`` with ``reason``."""

    def _record(
        self,
        *,
        state: RunState | None = None,
        reason: str | None = None,
        failed: tuple[int | None, int | None] | None = None,
        ended_at: float | None = None,
    ) -> None:
        """Update run.json from the supervisor's side: a full disk ends the run, never a
        thread."""
        try:
            self.run.update(state=state, reason=reason, failed=failed, ended_at=ended_at)
        except OSError as e:
            self._dir_failed(e)

    def _check_nodes(self) -> None:
        all_done = True
        scripts_running = False
        # Nodes whose torchrun printed a failure table first, the surest first failure first
        # (FailureTable.blame_order): among nodes ending together, a rank killed by a signal is
        # the cause, not the peer that then lost its connection.
        order = sorted(self._nodes, key=lambda n: (n.table.blame_order(), n.node))
        for st in order:
            if st.finished:
                continue
            finished, code = self._node_exit(st.node)
            scripts_running = scripts_running or not finished
            streams_open = self.pump.open_streams(st.node)
            if st.lost and not finished:
                self._fail(None, st.node, f"node {st.node} ({st.host}): {st.lost}")
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
        if not all_done and self._failure is None and not self._stop_requested:
            from engine.diagnose.request import take_diagnose_request
            from engine.launch.frdump import diagnose_safely

            if take_diagnose_request(self.run.path):  # a monitor's "diagnose"
                diagnose_safely(self, "asked from the monitor")
            hang = self._hang.overdue(self.options.hang_timeout_s, scripts_running)
            if hang is not None:
                diagnose_safely(self, hang)  # name the stuck rank before the ranks are stopped
                self._fail(None, None, hang)
        if all_done:
            if self._failure is not None:
                from engine.launch.frdump import diagnose_failed_run

                diagnose_failed_run(self)  # NCCL's own dumps after a collective timed out
            self._all_done()

    def _all_done(self) -> None:
        """Every node ended: the run's final state."""
        if self._stop_requested and self._failure is None:
            self._finish(RunState.STOPPED, self._stop_reason or "stopped by the user")
        elif self._failure is not None:
            self._finish(RunState.FAILED, self._failure[2])
        else:
            bad = first_bad_rank(self.run.record.ranks)
            if bad is None:
                self._finish(RunState.SUCCEEDED, f"all {self.manifest.world_size} ranks exited 0")
            else:
                self._failure = bad
                self._record(failed=(bad[0], bad[1]))
                self._finish(RunState.FAILED, bad[2])

    def _node_finished(self, st: NodeState) -> None:
        base = st.node * self.manifest.gpus_per_node
        killed_by_us = self._stop_requested or (
            self._failure is not None and self._failure[1] != st.node
        )
        for lr in range(self.manifest.gpus_per_node):
            rank = base + lr
            code, reason = rank_exit(st, rank, killed_by_us)
            try:
                self.run.set_rank_exit(rank, code, reason)
            except OSError as e:
                self._dir_failed(e)
            self._emit(RankExit(st.node, rank, code, time.time(), st.host, reason))
        if st.exit_code != 0 and not killed_by_us and self._failure is None:
            root, why = node_failure(st)
            self._fail(root, st.node, why)

    def _fail(self, rank: int | None, node: int | None, reason: str) -> None:
        if self._failure is not None or self._final.is_set():
            return
        self._failure = (rank, node, reason)
        self._record(failed=(rank, node), reason=reason)
        self._emit(
            LineEvent(
                node if node is not None else 0,
                None,
                STDERR,
                f"[dtrain-tui] {reason}; stopping the other ranks",
                time.time(),
            )
        )
        self._kill_all(reason)

    def _kill_all(self, reason: str) -> None:
        threads = [
            threading.Thread(target=self._safe_kill, args=(st.node, reason), daemon=True)
            for st in self._nodes
            if not st.finished
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(STOP_GRACE_S + 10)

    def _safe_kill_now(self, node: int) -> None:
        try:
            self._kill_node_now(node)
        except Exception as e:  # noqa: BLE001 - report, keep killing the others
            self._say(node, f"could not kill node {node}: {e}")

    def _safe_kill(self, node: int, reason: str) -> None:
        try:
            self._kill_node(node, reason)
        except Exception as e:  # noqa: BLE001 - report, keep stopping the others
            self._say(node, f"could not stop node {node}: {e}")

    def _say(self, node: int, text: str) -> None:
        """A line of dtrain-tui's own among the node's lines."""
        self._emit(LineEvent(node, None, STDERR, f"[dtrain-tui] {text}", time.time()))

    def _finish(self, state: RunState, message: str) -> None:
        with self._cond:
            if self._final.is_set() or self._finishing:
                return
            self._finishing = True
            self._state = state
        self.pump.join(2.0)
        fr = self._failure
        self._record(
            state=state,
            ended_at=time.time(),
            reason=message,
            failed=(fr[0], fr[1]) if fr is not None else None,
        )
        self.run.close()
        try:
            self._close()
        finally:
            failed = (fr[0],) if fr is not None and fr[0] is not None else ()
            self._emit(RunStateChanged(state, message, time.time(), failed))
            self._final.set()
            self.pump.wake()
