"""What the monitor knows about each rank: state (starting, running, idle for N s, exited 0,
failed with a code or signal), last step, loss and tokens/s with a short history for the charts,
and flags (errors, possibly hung, straggler).

Fed from the monitor's reader thread in batches (:meth:`MonitorState.apply`), read by the screen
on the UI thread; it is plain data with no locks, so the screen takes a :meth:`snapshot`. Pure:
no Textual, no I/O; every method is total (unknown ranks are created on first sight).
"""

from __future__ import annotations

import math
import signal
import statistics
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from engine.diagnose.flight import TELEMETRY_PREFIX, only_agent_lines
from engine.diagnose.nccl_facts import TransportNotes
from engine.diagnose.transport import TransportReport
from engine.monitor.logparse import (
    BatchFacts,
    ErrorKind,
    StepInfo,
    StepSource,
    StepTracker,
    scan_batch,
)
from engine.monitor.telemetry import Telemetry, hidden_line, parse_telemetry_line
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from engine.rundir.record import FINAL_STATES, RunState

HISTORY = 120
"""Points kept per rank for the loss / throughput charts (one per step line)."""
MAX_ERRORS = 2000
"""Errors kept for the error list; older ones are dropped (the files keep everything)."""


class RankStatus(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"
    """Ended with exit code 0."""
    FAILED = "failed"
    """Ended with a non-zero code, a signal, or was lost."""
    STOPPED = "stopped"
    """Stopped by the user's stop (no exit code of its own): not a failure."""


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One error line. ``line_no`` counts the rank's lines from 0 (node lines: the node's)."""

    rank: int | None
    node: int
    kind: ErrorKind
    text: str
    ts: float
    line_no: int


@dataclass(slots=True)
class RankState:
    rank: int
    node: int = 0
    host: str = ""
    status: RankStatus = RankStatus.STARTING
    exit_code: int | None = None
    reason: str = ""
    lines: int = 0
    last_line_ts: float | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    step_time_s: float | None = None
    mem_gb: float | None = None
    samples_per_s: float | None = None
    lr: float | None = None
    val_loss: float | None = None
    telemetry: Telemetry | None = None
    """The rank agent's latest sample (CPU, memory, the GPU through NVML)."""
    step_source: StepSource | None = None
    """The format of the rank's step lines (the example trainer's, a framework's)."""
    throughput_unit: str = "tokens/s"
    """What ``tps_history`` counts: ``tokens/s``, ``samples/s`` or ``it/s`` (steps a second,
    from a progress bar), whichever the rank's lines give (in that order of preference)."""
    finished: bool = False
    """The trainer printed its ``[dtrain] done`` line."""
    errors: int = 0
    first_error: ErrorRecord | None = None
    hung: bool = False
    straggler: bool = False
    loss_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    tps_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    step_time_history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    """Step times in seconds, one per step line that gives one (the step-time chart)."""
    recent_step_times: deque[float] = field(default_factory=lambda: deque(maxlen=5))

    def label(self, now: float, idle_after_s: float = 10.0) -> str:
        """What the rank table shows: ``running``, ``idle 12s``, ``exited 0``, ``failed 1``,
        ``failed SIGKILL``, ``failed (lost)``."""
        if self.status is RankStatus.EXITED:
            return "exited 0"
        if self.status is RankStatus.FAILED:
            return "failed " + exit_text(self.exit_code)
        if self.status is RankStatus.STOPPED:
            return "stopped"
        if self.status is RankStatus.RUNNING and self.last_line_ts is not None:
            idle = now - self.last_line_ts
            if idle >= idle_after_s:
                return f"idle {int(idle)}s"
        return self.status.value

    @property
    def typical_step_time(self) -> float | None:
        if not self.recent_step_times:
            return None
        return statistics.median(self.recent_step_times)

    def copy(self) -> RankState:
        """A copy safe to hand to another thread (histories copied)."""
        return replace(
            self,
            loss_history=deque(self.loss_history, maxlen=HISTORY),
            tps_history=deque(self.tps_history, maxlen=HISTORY),
            step_time_history=deque(self.step_time_history, maxlen=HISTORY),
            recent_step_times=deque(self.recent_step_times, maxlen=5),
        )


_UNIT_RANK = {"it/s": 0, "samples/s": 1, "tokens/s": 2}


def _throughput(info: StepInfo) -> tuple[float, str] | None:
    """The step's throughput and its unit, the most telling the line gives."""
    if info.tokens_per_s is not None:
        return info.tokens_per_s, "tokens/s"
    if info.samples_per_s is not None:
        return info.samples_per_s, "samples/s"
    if info.step_time_s:  # a progress bar's rate, a loop's step time: steps a second
        return 1.0 / info.step_time_s, "it/s"
    return None


def _record_step(st: RankState, info: StepInfo, *, summary: bool) -> None:
    """Account for one resolved step record. ``summary``: the line named no step (a log dict
    or a summary of the run): its figures are shown, its throughput is no chart point."""
    st.step = info.step
    # A bare tqdm bar is what many frameworks draw beside their own lines (the HF Trainer's log
    # dicts, Accelerate's loops): it never hides the framework already seen for the rank, whichever
    # of the two streams a replay reads last.
    if info.source is not StepSource.TQDM or st.step_source is None:
        st.step_source = info.source
    if info.total is not None:
        st.total_steps = info.total
    if info.loss is not None:
        st.loss = info.loss
        st.loss_history.append(info.loss)
    if info.lr is not None:
        st.lr = info.lr
    if info.val_loss is not None:
        st.val_loss = info.val_loss
    if info.mem_gb is not None:
        st.mem_gb = info.mem_gb
    t = info.step_time_s
    if t is not None and math.isfinite(t) and t > 0:
        st.step_time_s = t
        st.recent_step_times.append(t)
        st.step_time_history.append(t)
    if info.tokens_per_s is not None:
        st.tokens_per_s = info.tokens_per_s
    if info.samples_per_s is not None:
        st.samples_per_s = info.samples_per_s
    tp = None if summary else _throughput(info)
    if tp is None:
        return
    value, unit = tp
    if unit != st.throughput_unit:
        if st.tps_history and _UNIT_RANK[unit] < _UNIT_RANK[st.throughput_unit]:
            return  # a rank whose lines give tokens/s is not charted in steps a second
        st.tps_history.clear()
        st.throughput_unit = unit
    st.tps_history.append(value)


def exit_text(code: int | None) -> str:
    """``1``, ``SIGKILL`` (for -9), ``(lost)`` (for None)."""
    if code is None:
        return "(lost)"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    if code > 128 and code - 128 in {s.value for s in signal.Signals}:
        # A shell reports a child killed by signal N as 128+N.
        return f"{code} ({signal.Signals(code - 128).name})"
    return str(code)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent copy of the state for the UI thread."""

    ranks: dict[int, RankState]
    run_state: str
    run_message: str
    errors: tuple[ErrorRecord, ...]
    total_lines: int
    now: float
    transport: TransportReport | None = None
    """The NCCL transport check (:mod:`engine.diagnose.transport`); None before NCCL said
    anything about its transport."""


class MonitorState:
    """Per-rank state of one run, updated from events.

    ``hang_after_s``: a running rank silent this long while another rank printed within the
    same window is flagged as possibly hung. ``straggler_factor``: a rank whose typical step time
    exceeds this multiple of the other ranks' median is flagged as a straggler.
    """

    def __init__(
        self,
        world_size: int = 0,
        *,
        hang_after_s: float = 60.0,
        straggler_factor: float = 1.5,
    ) -> None:
        self.ranks: dict[int, RankState] = {}
        self.node_lines: dict[int, int] = {}
        self.errors: deque[ErrorRecord] = deque(maxlen=MAX_ERRORS)
        self.run_state: str = RunState.STARTING
        """A :class:`RunState` name (a string: what the source said, known or not)."""
        self.run_message = ""
        self.total_lines = 0
        self.hang_after_s = hang_after_s
        self.straggler_factor = straggler_factor
        self._trackers: dict[int, StepTracker] = {}
        """Per rank: its step records made whole (a framework's line may name no step)."""
        for r in range(world_size):
            self.rank(r)

    def rank(self, rank: int, node: int | None = None, host: str = "") -> RankState:
        st = self.ranks.get(rank)
        if st is None:
            st = self.ranks[rank] = RankState(rank=rank)
        if node is not None:
            st.node = node
        if host and not st.host:
            st.host = host
        return st

    # ---- ingest ------------------------------------------------------------------------

    def ingest_lines(
        self,
        rank: int | None,
        node: int,
        lines: Sequence[str],
        now: float,
        host: str = "",
        facts: BatchFacts | None = None,
    ) -> list[ErrorRecord]:
        """Account for consecutive lines of one rank (or of a node when ``rank`` is None);
        return the errors they hold. ``facts``: :func:`scan_batch` of ``lines``, when the
        caller already has it."""
        if not lines:
            return []
        if facts is None:
            facts = scan_batch(lines)
        if facts.nccl or facts.errors:  # nccl#1837's AF_INET line follows an error line
            self.transport.feed(node, host, lines, len(facts.nccl))
        self.total_lines += len(lines)
        found = facts.errors
        if rank is None:
            base = self.node_lines.get(node, 0)
            self.node_lines[node] = base + len(lines)
            new = [ErrorRecord(None, node, k, lines[i], now, base + i) for i, k in found]
            self.errors.extend(new)
            return new
        st = self.rank(rank, node, host)
        base = st.lines
        st.lines += len(lines)
        # The rank agent's telemetry; never in an all-NCCL batch (the firehose pays nothing).
        hidden: list[int] = []
        """Rows of telemetry lines, which panes leave out: ``line_no`` counts the pane's rows."""
        if len(facts.nccl) < len(lines) and TELEMETRY_PREFIX in "\n".join(lines):
            for i, line in enumerate(lines):
                sample = parse_telemetry_line(line)
                if sample is not None:
                    st.telemetry = sample
                if hidden_line(line):
                    hidden.append(i)
            st.lines -= len(hidden)
            if only_agent_lines(lines):  # the agent's clock, not the script: no sign of life
                return []
        st.last_line_ts = now
        if st.status is RankStatus.STARTING:
            st.status = RankStatus.RUNNING
        if facts.steps:
            tracker = self._trackers.get(rank)
            if tracker is None:
                tracker = self._trackers[rank] = StepTracker()
            for raw in facts.steps:
                info = tracker.resolve(raw)
                if info is not None:
                    _record_step(st, info, summary=raw.step is None)
        if facts.done:
            st.finished = True
        new = [
            ErrorRecord(rank, st.node, k, lines[i], now, base + i - bisect_left(hidden, i))
            for i, k in found
        ]
        if new:
            st.errors += len(new)
            if st.first_error is None:
                st.first_error = new[0]
            self.errors.extend(new)
        return new

    def ingest_exit(self, ev: RankExit) -> None:
        st = self.rank(ev.rank, ev.node, ev.host)
        st.exit_code = ev.exit_code
        st.reason = ev.reason
        if ev.exit_code == 0:
            st.status = RankStatus.EXITED
        elif ev.exit_code is None and ev.reason == "stopped":  # the launcher stopped it
            st.status = RankStatus.STOPPED
        else:
            st.status = RankStatus.FAILED
        st.hung = False

    root_cause: int | None = None
    """The rank the run's end is blamed on (the launcher's failed rank: its FailureTable's
    blame order), None while nothing is blamed. An int read by the UI thread as is."""

    def ingest_run_state(self, ev: RunStateChanged) -> None:
        self.run_state = ev.state
        self.run_message = ev.message
        if ev.failed_ranks:
            self.root_cause = ev.failed_ranks[0]
        for r in ev.failed_ranks:
            st = self.rank(r)
            if st.status not in (RankStatus.EXITED, RankStatus.FAILED, RankStatus.STOPPED):
                st.status = RankStatus.FAILED
        if ev.state in FINAL_STATES:
            for st in self.ranks.values():
                st.hung = False

    def apply(self, events: Iterable[Event], now: float) -> list[ErrorRecord]:
        """Ingest a batch of events (consecutive lines of a rank are taken together)."""
        found: list[ErrorRecord] = []
        pending: list[str] = []
        key: tuple[int | None, int, str] | None = None
        for ev in events:
            if isinstance(ev, LineEvent):
                k = (ev.rank, ev.node, ev.host)
                if k != key and pending and key is not None:
                    found += self.ingest_lines(key[0], key[1], pending, now, key[2])
                    pending = []
                key = k
                pending.append(ev.line)
                continue
            if pending and key is not None:
                found += self.ingest_lines(key[0], key[1], pending, now, key[2])
                pending, key = [], None
            if isinstance(ev, LineBatch):
                found += self.ingest_lines(ev.rank, ev.node, ev.lines, now, ev.host)
            elif isinstance(ev, RankExit):
                self.ingest_exit(ev)
            elif isinstance(ev, RunStateChanged):
                self.ingest_run_state(ev)
        if pending and key is not None:
            found += self.ingest_lines(key[0], key[1], pending, now, key[2])
        return found

    # ---- judgement -----------------------------------------------------------------------

    def evaluate(self, now: float) -> None:
        """Recompute the hung and straggler flags at time ``now``."""
        live = [st for st in self.ranks.values() if st.status is RankStatus.RUNNING]
        recent = {
            st.rank
            for st in live
            if st.last_line_ts is not None and now - st.last_line_ts < self.hang_after_s
        }
        for st in live:
            silent = st.last_line_ts is not None and now - st.last_line_ts >= self.hang_after_s
            st.hung = silent and bool(recent - {st.rank}) and not st.finished
        times = {st.rank: t for st in live if (t := st.typical_step_time) is not None}
        if not live:
            # A finished run (or one replayed from its directory, whose exits come with its
            # lines): judge the step times every rank reported, so SLOW flags stay.
            times = {r: t for r, st in self.ranks.items() if (t := st.typical_step_time)}
        for st in self.ranks.values():
            st.straggler = False
            own = times.get(st.rank)
            others = [t for r, t in times.items() if r != st.rank]
            if own is None or not others:
                continue
            med = statistics.median(others)
            st.straggler = med > 0 and own > self.straggler_factor * med

    # ---- the NCCL transport check -------------------------------------------------------

    transport_dir: Path | None = None
    """A run or bundle directory whose plan.json / nccl.env the transport is judged against
    (read when NCCL first says something about its transport); None: judged without a plan."""
    _transport: TransportNotes | None = None

    @property
    def transport(self) -> TransportNotes:
        """The NCCL transport check, fed by :meth:`ingest_lines`."""
        if self._transport is None:
            self._transport = TransportNotes(source_dir=self.transport_dir)
        return self._transport

    def snapshot(self, now: float) -> Snapshot:
        self.evaluate(now)
        return Snapshot(
            ranks={r: st.copy() for r, st in self.ranks.items()},
            run_state=self.run_state,
            run_message=self.run_message,
            errors=tuple(self.errors),
            transport=self._transport.report() if self._transport is not None else None,
            total_lines=self.total_lines,
            now=now,
        )
