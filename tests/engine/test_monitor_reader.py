"""engine.monitor.reader without Textual: batching (every line once, in order, bounded),
back-off until the consumer took the last batch, heartbeats, stopping, a source that cannot
start, and the interpreter tuning put back. Every wait has a deadline; nothing sleeps to
synchronise."""

from __future__ import annotations

import gc
import queue
import sys
import threading

import pytest

from engine.monitor.reader import (
    SOURCE_PENDING_BYTES,
    SWITCH_INTERVAL_S,
    Batch,
    BatchReader,
    FirehoseTuning,
)
from engine.monitor.state import MonitorState, RankStatus
from engine.monitor.tail import ListSource
from engine.rundir.events import (
    Event,
    LineBatch,
    LineEvent,
    RankExit,
    RunStateChanged,
    stop_run,
)

DEADLINE_S = 10.0
CLOCK = 1_700_000_000.0


class Harness:
    """A reader on a thread, with the consumer's side: batches land in a queue, ``finish`` sets
    an event. ``auto_take``: the consumer takes each batch at once (else the test does)."""

    def __init__(self, source: object, *, auto_take: bool = True, **kw: object) -> None:
        self.batches: queue.Queue[Batch] = queue.Queue()
        self.finished: list[tuple[str, str]] = []
        self.finished_event = threading.Event()
        self.stop = threading.Event()
        self.auto_take = auto_take
        self.reader = BatchReader(
            source,  # type: ignore[arg-type]
            MonitorState(2),
            deliver=self._deliver,
            finish=self._finish,
            stop=self.stop,
            clock=lambda: CLOCK,
            **kw,  # type: ignore[arg-type]
        )
        self.thread = threading.Thread(target=self.reader.run, daemon=True)

    def _deliver(self, batch: Batch) -> None:
        self.batches.put(batch)
        if self.auto_take:
            self.reader.taken()

    def _finish(self, state: str, message: str) -> None:
        self.finished.append((state, message))
        self.finished_event.set()

    def start(self) -> Harness:
        self.thread.start()
        return self

    def next_batch(self) -> Batch:
        return self.batches.get(timeout=DEADLINE_S)

    def drain(self) -> list[Batch]:
        out: list[Batch] = []
        while True:
            try:
                out.append(self.batches.get_nowait())
            except queue.Empty:
                return out

    def wait_finished(self) -> None:
        assert self.finished_event.wait(DEADLINE_S), "the reader never finished"
        self.thread.join(DEADLINE_S)
        assert not self.thread.is_alive()


class Endless:
    """A live source that never ends: each poll brings one line of rank 0 (``seq=N``)."""

    def __init__(self) -> None:
        self.polls = 0
        self.polled = threading.Condition()
        self.max_pending_bytes = 2 << 20

    def start(self) -> None:
        return None

    def poll(self, timeout: float) -> list[Event]:
        with self.polled:
            self.polls += 1
            n = self.polls
            self.polled.notify_all()
        return [LineEvent(0, 0, "stdout", f"seq={n}")]

    def wait_polls(self, n: int) -> None:
        with self.polled:
            assert self.polled.wait_for(lambda: self.polls >= n, DEADLINE_S), self.polls

    def stop(self) -> None:
        return None

    @property
    def done(self) -> bool:
        return False


@pytest.fixture
def endless() -> Endless:
    return Endless()


def run_events() -> list[list[Event]]:
    """Two ranks on one node, single lines and batches mixed, NCCL lines, a launcher line."""
    return [
        [RunStateChanged("running", "", CLOCK)],
        [
            LineEvent(0, 0, "stdout", "r0 a"),
            LineEvent(0, 0, "stdout", "h:1:1 [0] NCCL INFO Init COMPLETE"),
            LineEvent(0, 1, "stdout", "r1 a"),
        ],
        [LineBatch(0, None, "stdout", ("launcher up",)), LineBatch(0, 1, "stderr", ("r1 b",))],
        [LineEvent(0, 0, "stdout", "r0 b")],
        [RankExit(0, 0, 0), RankExit(0, 1, 0), RunStateChanged("succeeded", "done", CLOCK)],
    ]


def test_every_line_once_in_order_then_finish() -> None:
    h = Harness(ListSource(run_events())).start()
    h.wait_finished()
    batches = h.drain()
    assert batches, "no batch delivered"
    ranks: dict[int, list[str]] = {}
    for b in batches:
        for r, lines in b.lines.items():
            ranks.setdefault(r, []).extend(lines)
    assert ranks == {0: ["r0 a", "h:1:1 [0] NCCL INFO Init COMPLETE", "r0 b"], 1: ["r1 a", "r1 b"]}
    node = [chunk for b in batches for chunk in b.nodes.get(0, [])]
    assert (None, ("launcher up",)) in node
    assert [c for b in batches for c in b.nccl] == [(0, ["h:1:1 [0] NCCL INFO Init COMPLETE"])]
    assert sum(b.count for b in batches) == 6
    assert h.finished == [("succeeded", "done")]
    last = batches[-1].snapshot
    assert {r: st.status for r, st in last.ranks.items()} == {
        0: RankStatus.EXITED,
        1: RankStatus.EXITED,
    }
    assert h.reader.nccl_summary.init_complete == 1  # the NCCL pane's headline is fed


def test_lines_that_arrive_within_an_interval_come_as_one_batch() -> None:
    h = Harness(ListSource(run_events()), batch_interval=60.0, heartbeat_s=60.0).start()
    h.wait_finished()
    batches = h.drain()
    assert len(batches) == 1 and batches[0].count == 6


def test_a_batch_keeps_at_most_four_panes_worth_but_counts_every_line() -> None:
    lines = tuple(f"line {i}" for i in range(50))
    src = ListSource([[LineBatch(0, 0, "stdout", lines)], [RunStateChanged("succeeded")]])
    h = Harness(src, max_lines=3, batch_interval=60.0, heartbeat_s=60.0).start()
    h.wait_finished()
    (batch,) = h.drain()
    assert batch.lines[0] == list(lines[-12:]) and batch.count == 50
    assert batch.snapshot.ranks[0].lines == 50  # the state saw every line


def test_backs_off_until_the_consumer_took_the_last_batch(endless: Endless) -> None:
    h = Harness(endless, auto_take=False, batch_interval=0.0, heartbeat_s=60.0).start()
    try:
        first = h.next_batch()
        assert first.count >= 1
        polls = endless.polls
        # Not taken: the reader polls once more at most (the lines it holds), then waits and
        # leaves new lines with the source.
        with pytest.raises(queue.Empty):
            h.batches.get(timeout=0.3)
        assert endless.polls <= polls + 1
        h.reader.taken()
        second = h.next_batch()
        seqs = [int(x.split("=")[1]) for x in second.lines[0]]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # in order, none lost
        assert seqs[0] == int(first.lines[0][-1].split("=")[1]) + 1
    finally:
        h.stop.set()
        h.reader.taken()
        h.thread.join(DEADLINE_S)
    assert not h.thread.is_alive() and h.finished == []


def test_heartbeat_batches_come_without_lines() -> None:
    class Silent(Endless):
        def poll(self, timeout: float) -> list[Event]:
            super().poll(timeout)
            return []

    h = Harness(Silent(), heartbeat_s=0.05).start()
    try:
        beat = h.next_batch()
        assert beat.count == 0 and beat.lines == {} and set(beat.snapshot.ranks) == {0, 1}
    finally:
        h.stop.set()
        h.thread.join(DEADLINE_S)


def test_stop_ends_the_thread_without_finish(endless: Endless) -> None:
    h = Harness(endless).start()
    endless.wait_polls(3)
    h.stop.set()
    h.thread.join(DEADLINE_S)
    assert not h.thread.is_alive() and h.finished == []


def test_a_launch_backend_is_told_to_queue_less(endless: Endless) -> None:
    h = Harness(endless).start()
    endless.wait_polls(1)
    h.stop.set()
    h.thread.join(DEADLINE_S)
    assert endless.max_pending_bytes == SOURCE_PENDING_BYTES


def test_a_source_that_cannot_start_finishes_failed_in_one_line() -> None:
    class Broken(Endless):
        def start(self) -> None:
            raise OSError("connection refused")

    h = Harness(Broken()).start()
    h.wait_finished()
    assert h.finished == [("failed", "could not start: connection refused")]
    assert h.drain() == []


def test_firehose_tuning_is_put_back() -> None:
    gc_before, switch_before = gc.get_threshold(), sys.getswitchinterval()
    tuning = FirehoseTuning()
    tuning.apply()
    try:
        assert gc.get_threshold()[0] >= 50_000
        assert sys.getswitchinterval() <= SWITCH_INTERVAL_S
    finally:
        tuning.restore()
    assert gc.get_threshold() == gc_before and sys.getswitchinterval() == switch_before


def test_stop_run_asks_a_source_that_can_and_stops_one_that_cannot() -> None:
    class Asks(Endless):
        def __init__(self) -> None:
            super().__init__()
            self.asked = self.stopped = False

        def request_stop(self) -> None:
            self.asked = True

        def stop(self) -> None:
            self.stopped = True

    asks = Asks()
    stop_run(asks)  # type: ignore[arg-type]
    assert asks.asked and not asks.stopped  # the watching goes on: the run end is shown
    plain = ListSource([[LineEvent(0, 0, "stdout", "x")]])
    stop_run(plain)
    assert plain.done
