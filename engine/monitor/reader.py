"""The monitor's batching reader: drains an :class:`~engine.rundir.events.EventSource` on a
thread of its own, folds the events into the rank states, and hands the lines over in batches.

Called by the monitor screen (``tui.screens.monitor``), which runs :meth:`BatchReader.run` in a
thread worker and passes a ``deliver`` callback that posts its message; tests drive it with plain
threads. No Textual: everything the UI needs arrives through the two callbacks.

What it promises, for a firehose (64 ranks printing NCCL INFO at once):

* one :class:`Batch` per ``batch_interval`` (50-250 ms) while lines flow, and a heartbeat batch
  (fresh rank states, no lines) at least every ``heartbeat_s`` otherwise;
* back-off: a new batch only once the consumer said it took the previous one
  (:meth:`BatchReader.taken`); meanwhile new lines stay with the source, so a busy UI makes
  batches bigger, never a queue longer;
* bounded batches: at most ``4 * max_lines`` lines per rank, and as many chunks per node and
  for the NCCL pane (the panes keep ``max_lines``; the rank states see every line);
* ``finish(state, message)`` exactly once when the source is done and the last batch was handed
  over, or when the source cannot start; nothing after :attr:`BatchReader.stop` is set.

:class:`FirehoseTuning` holds the interpreter settings (GC, GIL hand-over) the reader and the
UI thread need to share two cores under such a firehose; the screen applies them while open.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.errors import one_line
from engine.monitor.logparse import NcclSummary, scan_batch
from engine.monitor.state import MonitorState, Snapshot
from engine.monitor.telemetry import shown_lines
from engine.rundir.events import Event, EventSource, LineBatch, LineEvent
from engine.rundir.record import RunState

Chunks = list[tuple[int | None, Sequence[str]]]
"""(rank or None, lines) chunks in arrival order: what node and NCCL panes take."""

HEARTBEAT_S = 1.0
"""Longest gap between two batches (the default): rank states (idle, hung) age even when no
line comes."""
POLL_TIMEOUT_S = 0.02
"""How long one poll of the source may block."""
IDLE_SLEEP_S = 0.005
"""Pause after a poll that brought nothing (a source whose poll does not block)."""
BACK_OFF_S = 0.05
"""Longest wait at a time for the consumer to take the last batch (the stop event is checked
in between)."""
SOURCE_PENDING_BYTES = 128 << 10
"""Output a launch backend may queue for the monitor before its readers wait for a poll (at
most one read's worth goes on while the screen paints; its default is megabytes)."""
GC_GEN0_THRESHOLD = 50_000
"""While the monitor is open: a firehose allocates (a launch backend's per-line events), and
CPython's default (a collection every 700 allocations, walking every widget and buffer) cost
more than half the throughput and stalled key presses for hundreds of ms. The start-up objects
are frozen out of collection and young collections run 70x less often; restored on close."""
SWITCH_INTERVAL_S = 0.001
"""GIL hand-over interval while the monitor is open (CPython's default is 5 ms): the reader
thread is CPU-bound under a firehose, and each of the few event-loop hops a key press takes
waits up to one interval for the GIL."""


@dataclass(frozen=True, slots=True)
class Batch:
    """What arrived since the last batch: ``lines`` per rank, ``nodes`` per node (every line,
    as chunks tagged with their rank), ``nccl`` the chunks for the NCCL pane, ``count`` the lines
    in all (before any cap), and the rank states after them."""

    lines: dict[int, list[str]]
    nodes: dict[int, Chunks]
    nccl: Chunks
    snapshot: Snapshot
    count: int


@dataclass(slots=True)
class _Pending:
    """The batch being collected on the reader thread."""

    lines: dict[int, list[str]] = field(default_factory=dict)
    nodes: dict[int, Chunks] = field(default_factory=dict)
    nccl: Chunks = field(default_factory=list)
    count: int = 0


class BatchReader:
    """Read ``source`` until it is done or :attr:`stop` is set (see the module docstring).

    ``state`` is owned by the reader thread while :meth:`run` runs; the consumer reads the
    snapshots that come with each batch. ``clock`` (wall seconds) dates lines and snapshots.
    """

    def __init__(
        self,
        source: EventSource,
        state: MonitorState,
        *,
        deliver: Callable[[Batch], None],
        finish: Callable[[str, str], None],
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        max_lines: int = 5000,
        batch_interval: float = 0.1,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.source = source
        self.state = state
        self.deliver = deliver
        self.finish = finish
        self.stop = stop if stop is not None else threading.Event()
        """Set it (from any thread) to end :meth:`run`; no ``finish`` comes then."""
        self.clock = clock
        self.cap = max_lines * 4
        """Lines a batch keeps per rank, chunks per node and for the NCCL pane (``max_lines``:
        what a pane keeps)."""
        self.batch_interval = batch_interval
        self.heartbeat_s = heartbeat_s
        self.nccl_summary = NcclSummary()
        """Fed on the reader thread; the consumer reads its headline."""
        self._ready = threading.Event()
        self._ready.set()

    def taken(self) -> None:
        """The consumer has taken the last batch in: the next one may come. Thread-safe."""
        self._ready.set()

    def run(self) -> None:
        """The reader thread's body: returns once the source is done (after ``finish``), when
        it cannot start (after ``finish``), or once ``stop`` is set."""
        source, state, ready = self.source, self.state, self._ready
        try:
            source.start()
        except Exception as e:  # noqa: BLE001 - shown to the user as one line
            self.finish(RunState.FAILED, f"could not start: {one_line(e)}")
            return
        if getattr(source, "max_pending_bytes", 0) > SOURCE_PENDING_BYTES:
            # A launch backend's readers pause once this much output waits for our next poll:
            # while the screen paints (and this thread waits for it) they soon stop taking the
            # GIL from the UI thread, instead of reading on for megabytes.
            source.max_pending_bytes = SOURCE_PENDING_BYTES  # type: ignore[attr-defined]
        pending = _Pending()
        last_post = time.monotonic()
        last_state_post = last_post
        changed = False
        while not self.stop.is_set():
            if changed and not ready.is_set():
                # The screen is still taking in the last batch: leave new lines with the source
                # (its own reader keeps them) instead of competing with the UI thread for the
                # GIL; key presses are answered sooner and the next batch is bigger.
                ready.wait(BACK_OFF_S)
                continue
            done = source.done
            events = [] if done else source.poll(POLL_TIMEOUT_S)
            if events:
                changed = True
                self._collect(events, pending)
                time.sleep(0)  # let the UI thread take the GIL between reads
            now_m = time.monotonic()
            due = now_m - last_post >= self.batch_interval
            heartbeat = now_m - last_state_post >= self.heartbeat_s
            if ready.is_set() and ((changed and due) or heartbeat or (done and changed)):
                self._hand_over(pending)
                pending, changed = _Pending(), False
                last_post = last_state_post = now_m
            elif done and not changed:
                self.finish(state.run_state, state.run_message)
                return
            elif not events:
                time.sleep(IDLE_SLEEP_S)

    def _hand_over(self, pending: _Pending) -> None:
        if len(pending.nccl) > self.cap:
            del pending.nccl[: -self.cap]  # chunks: bounded while the screen is busy
        self._ready.clear()
        snap = self.state.snapshot(self.clock())
        self.deliver(Batch(pending.lines, pending.nodes, pending.nccl, snap, pending.count))

    def _collect(self, events: list[Event], pending: _Pending) -> None:
        """Fold ``events`` into ``pending`` and the rank states. Consecutive lines of one rank
        are scanned together, once."""
        now = self.clock()
        run: list[str] = []
        key: tuple[int | None, int, str] | None = None
        for ev in events:
            if isinstance(ev, LineEvent):
                k = (ev.rank, ev.node, ev.host)
                if k != key:
                    if run and key is not None:
                        self._take(pending, key[0], key[1], key[2], run, now)
                    run, key = [], k
                run.append(ev.line)
                continue
            if run and key is not None:
                self._take(pending, key[0], key[1], key[2], run, now)
                run, key = [], None
            if isinstance(ev, LineBatch):
                self._take(pending, ev.rank, ev.node, ev.host, ev.lines, now)
            else:
                self.state.apply([ev], now)
        if run and key is not None:
            self._take(pending, key[0], key[1], key[2], run, now)

    def _take(
        self,
        pending: _Pending,
        rank: int | None,
        node: int,
        host: str,
        batch: Sequence[str],
        now: float,
    ) -> None:
        """Consecutive lines of one rank (or of a node): into the state, the rank's and the
        node's pending lines, and the NCCL pane's when they are NCCL's."""
        cap = self.cap
        facts = scan_batch(batch)
        self.state.ingest_lines(rank, node, batch, now, host, facts)
        pending.count += len(batch)
        if len(facts.nccl) < len(batch):  # an all-NCCL batch (the firehose) holds no telemetry
            batch = shown_lines(batch)  # the agent's telemetry: in the state, on disk, not in panes
        if not batch:
            return
        if rank is not None:
            lst = pending.lines.get(rank)
            if lst is None:
                lst = pending.lines[rank] = []
            lst.extend(batch)
            if len(lst) > cap:
                del lst[:-cap]
        chunks = pending.nodes.get(node)
        if chunks is None:
            chunks = pending.nodes[node] = []
        chunks.append((rank, batch))
        if len(chunks) > cap:
            del chunks[:-cap]  # chunks: bounded while the screen is busy
        if facts.nccl:
            pending.nccl.append((rank, facts.nccl))
            self.nccl_summary.feed_batch(facts.nccl)


class FirehoseTuning:
    """The interpreter settings a firehose needs (:data:`GC_GEN0_THRESHOLD`,
    :data:`SWITCH_INTERVAL_S`): :meth:`apply` while the monitor is open, :meth:`restore` after."""

    def __init__(self) -> None:
        self._gc_saved: tuple[int, ...] = gc.get_threshold()
        self._switch_saved = sys.getswitchinterval()

    def apply(self) -> None:
        self._gc_saved = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(max(GC_GEN0_THRESHOLD, self._gc_saved[0]), *self._gc_saved[1:])
        self._switch_saved = sys.getswitchinterval()
        sys.setswitchinterval(min(self._switch_saved, SWITCH_INTERVAL_S))

    def restore(self) -> None:
        gc.set_threshold(*self._gc_saved)
        gc.unfreeze()
        sys.setswitchinterval(self._switch_saved)
