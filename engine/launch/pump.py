"""The output pump of a run: reads each byte stream a driver hands over, on a thread of its own,
and turns it into events.

:class:`OutputPump` splits lines per rank (:mod:`engine.launch.torchrun_output`: torchrun's tee
prefixes, or a driver's own ``split`` such as SkyPilot's node prefixes), writes them to the run
directory (flushed) and only then queues them as events, so a crash loses nothing a consumer saw.
It also feeds the NCCL transport check and remembers the first collective-timeout line for the
supervisor. It knows nothing of how the streams were started or when the run ends: the launch
backend (:mod:`engine.launch.base`) owns one and hands it the run's ``ended`` event.

A line that never ends (a rank printing without a newline) is not held in memory: past
:data:`MAX_PENDING_LINE` bytes its bytes go straight to the rank's log as they come, and only the
part the consumer is shown (:data:`engine.launch.torchrun_output.MAX_SHOWN_LINE`) is kept.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine.launch.frdump import find_timeout_line
from engine.launch.policy import HangClock, NodeState, only_agent
from engine.launch.torchrun_output import (
    MAX_SHOWN_LINE,
    Groups,
    close_pieces,
    cut_long,
    group_runs,
    shown,
    split_tee,
)
from engine.launch.transport_watch import TransportWatch
from engine.rundir.events import Event, LineBatch
from engine.rundir.files import RunDir

MAX_PENDING_BYTES = 2 << 20
"""Output queued for the consumer (bytes since its last poll) above which a stream reader
pauses, for at most PENDING_WAIT_S per read."""
PENDING_WAIT_S = 0.25
MAX_PENDING_LINE = 4 * MAX_SHOWN_LINE
"""Bytes of one unfinished line a reader holds; past it the line is a :class:`_LongLine`: written
to the log as it comes, its first :data:`_HEAD_BYTES` kept for the shown, cut line. Four times
the shown cap: the shown characters may take up to four bytes each."""
_HEAD_BYTES = 4 * MAX_SHOWN_LINE

Split = Callable[[int, bytes], tuple[int, int | None, bytes]]
"""(node, global rank or None, line without launcher prefixes) for one raw line of a node."""
ControlLine = Callable[[int, str, bytes], bool]
"""Consumes a driver's control line (not logged): True when consumed."""


@dataclass(slots=True)
class _LongLine:
    """A line past :data:`MAX_PENDING_LINE` still waiting for its newline."""

    node: int
    rank: int | None
    ts: float
    head: bytearray = field(default_factory=bytearray)
    size: int = 0
    """Bytes of the line (without prefix) written so far."""


class OutputPump:
    """Reader threads, the line splitting, the run-directory writes and the event queue of one
    run. Thread-safe: :meth:`emit` and :meth:`take` may be called from any thread."""

    def __init__(
        self,
        run: RunDir,
        nodes: Sequence[NodeState],
        gpus_per_node: int,
        *,
        ended: threading.Event,
        hang: HangClock | None = None,
        transport: TransportWatch | None = None,
        split: Split | None = None,
        control: ControlLine | None = None,
        on_dir_error: Callable[[OSError], None] | None = None,
    ) -> None:
        """``nodes``: the run's nodes (a list the backend fills when it starts; the pump counts
        their open streams, scans their failure tables and marks a dropped one lost); ``ended``:
        set once the run ended (a paused reader stops waiting); ``split``: a driver's own line
        splitting (the per-line path), else torchrun's tee prefixes (the fast path)."""
        self.run = run
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.ended = ended
        self.hang = hang or HangClock()
        self.transport = transport
        self.split = split
        self.on_dir_error = on_dir_error
        self.max_pending_bytes = MAX_PENDING_BYTES
        self.timeout_line: tuple[int, int | None, str] | None = None
        """The run's first collective-timeout line: (node, rank, line), for the supervisor."""
        self.cond = threading.Condition()
        """Guards the queue and the nodes' open-stream counts."""
        self._events: list[Event] = []
        self._pending_bytes = 0
        """Bytes of lines queued since the consumer's last :meth:`take`."""
        self._threads: list[threading.Thread] = []
        self.splitter = RankSplitter(nodes, gpus_per_node, split=split, control=control)
        self._dir_failed = False

    # ------------------------------------------------------------------ public API

    def use_lines(self, split: Split | None, control: ControlLine | None) -> None:
        """A driver's own line splitting (the per-line path) and control lines, set before the
        first stream is added."""
        self.split = split
        self.splitter.split = split
        self.splitter.control = control

    def add_stream(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        """Pump ``read()`` (bytes, b"" at EOF) on a thread: split lines, attribute ranks, write the
        run dir, then queue the events."""
        with self.cond:
            self.nodes[node].open_streams += 1
        t = threading.Thread(
            target=self._pump,
            args=(node, stream, read),
            name=f"dtrain-n{node}-{stream}",
            daemon=True,
        )
        self._threads.append(t)
        t.start()

    def open_streams(self, node: int) -> int:
        """Streams of ``node`` not yet at their end."""
        with self.cond:
            return self.nodes[node].open_streams

    def join(self, timeout: float) -> None:
        """Wait for every reader (each at most ``timeout`` seconds)."""
        for t in self._threads:
            t.join(timeout)

    def emit(self, *events: Event) -> None:
        """Queue events of the launcher's own (a state change, a rank's exit, a line)."""
        if not events:
            return
        with self.cond:
            self._events.extend(events)
            self.cond.notify_all()

    def take(self, timeout: float) -> list[Event]:
        """The events queued so far; waits up to ``timeout`` for one unless the run ended."""
        with self.cond:
            if not self._events and not self.ended.is_set():
                self.cond.wait(timeout)
            out, self._events = self._events, []
            if self._pending_bytes:
                self._pending_bytes = 0
                self.cond.notify_all()
            return out

    def empty(self) -> bool:
        with self.cond:
            return not self._events

    def wake(self) -> None:
        """Wake every waiter (the run ended)."""
        with self.cond:
            self.cond.notify_all()

    # ------------------------------------------------------------------ a reader

    def _pump(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        tail = b""
        long: _LongLine | None = None
        self.splitter.reset()
        try:
            while True:
                try:
                    chunk = read()
                except Exception as e:  # noqa: BLE001 - a dropped connection ends this stream
                    st = self.nodes[node]
                    st.lost = st.lost or f"connection lost: {e}"
                    chunk = b""
                if not chunk:
                    if long is not None:
                        self._end_long(long, stream, b"")
                    elif tail:
                        self._ingest(node, stream, tail + b"\n")
                    self._flush_partial(stream)
                    break
                cut = chunk.rfind(b"\n") + 1
                if long is not None:
                    if not cut:
                        self._grow_long(long, stream, chunk)
                        continue
                    first = chunk.index(b"\n") + 1
                    self._end_long(long, stream, chunk[:first])
                    long = None
                    if first < cut:
                        self._ingest(node, stream, chunk[first:cut])
                    tail = chunk[cut:]
                elif not cut:
                    tail += chunk
                else:
                    whole = chunk[:cut]  # the whole chunk (no copy) when it ends with a newline
                    self._ingest(node, stream, tail + whole if tail else whole)
                    tail = chunk[cut:]
                if len(tail) > MAX_PENDING_LINE:
                    long = self._start_long(node, stream, tail)
                    tail = b""
        finally:
            with self.cond:
                self.nodes[node].open_streams -= 1

    def _ingest(self, node: int, stream: str, data: bytes) -> None:
        """Handle ``data`` (whole lines, each ending in a newline) read from one stream: write
        every rank's lines to its log with one call (flushed), then emit one
        :class:`LineBatch` per (rank, stream), so no line reaches a consumer before the run
        directory has it. The chunk is decoded once; each rank's file gets its lines back
        encoded, exact (invalid UTF-8 round-trips through ``surrogateescape``)."""
        ts = time.time()
        if not data.endswith(b"\n"):
            data += b"\n"
        try:
            text = data.decode("utf-8")
            dirty = False
        except UnicodeDecodeError:
            text = data.decode("utf-8", "surrogateescape")
            dirty = True
        if "\r" in text:
            text = text.replace("\r\n", "\n")  # a CR before the newline is not part of a line
        groups = self.splitter.group(node, stream, text)
        if self.transport is not None and ("NCCL" in text or "AF_INET" in text):
            self.transport.feed(groups, [st.host for st in self.nodes])
        if self.timeout_line is None and ("Watchdog caught" in text or "Timed out waiting" in text):
            # frdump.TIMEOUT_GATE: a collective timed out, the supervisor diagnoses it
            self.timeout_line = find_timeout_line(groups)
        self._deliver(stream, groups, ts, dirty, len(data))

    def _flush_partial(self, stream: str) -> None:
        """The stream ended: a rank line still waiting for its end (the rank died mid-line) is
        delivered as it is."""
        partial = self.splitter.partial()
        gpn = self.gpus_per_node
        groups: Groups = {
            (n, n * gpn + local): [text]
            for n, lines in sorted(partial.items())
            for local, text in sorted(lines.items())
        }
        partial.clear()
        if groups:
            size = sum(len(t) for lines in groups.values() for t in lines)
            self._deliver(stream, groups, time.time(), True, size)

    # ------------------------------------------------------------------ a line without end

    def _start_long(self, node: int, stream: str, data: bytes) -> _LongLine:
        split = self.split or self._split_tee
        n, rank, body = split(node, data)
        long = _LongLine(n, rank, time.time())
        self._grow_long(long, stream, body)
        return long

    def _split_tee(self, node: int, raw: bytes) -> tuple[int, int | None, bytes]:
        return split_tee(node, self.gpus_per_node, raw)

    def _grow_long(self, long: _LongLine, stream: str, data: bytes) -> None:
        self._write(long.node, long.rank, stream, data)
        if len(long.head) < _HEAD_BYTES:
            long.head += data[: _HEAD_BYTES - len(long.head)]
        long.size += len(data)
        self.hang.activity(long.rank is not None)
        if self.hang.starts is not None:
            self.hang.starts.seen(long.node, long.rank, ())

    def _end_long(self, long: _LongLine, stream: str, end: bytes) -> None:
        """The line's last bytes (with their newline; b"" at the stream's end): written, and the
        line delivered cut at the shown cap, as a line that came whole is."""
        body = end[:-1] if end.endswith(b"\n") else end
        if body.endswith(b"\r"):
            body = body[:-1]
        self._grow_long(long, stream, body)
        self._write(long.node, long.rank, stream, b"\n")
        head = shown(long.head.decode("utf-8", "surrogateescape"))[:MAX_SHOWN_LINE]
        cut = long.size - len(head.encode("utf-8", "surrogateescape"))
        line = f"{head}… [{cut} bytes cut]" if cut > 0 else head
        host = self.nodes[long.node].host
        if self.hang.starts is not None:
            self.hang.starts.seen(long.node, long.rank, (line,))
        self._queue([LineBatch(long.node, long.rank, stream, (line,), long.ts, host)], long.size)

    def _write(self, node: int, rank: int | None, stream: str, data: bytes) -> None:
        if self._dir_failed:
            return
        try:
            self.run.append(node, rank, stream, data)
        except OSError as e:
            # The supervisor ends the run; this reader goes on draining the pipe (so no rank
            # blocks on it) and the consumer still gets the lines.
            self._dir_failed = True
            if self.on_dir_error is not None:
                self.on_dir_error(e)

    # ------------------------------------------------------------------ lines to events

    def _deliver(self, stream: str, groups: Groups, ts: float, dirty: bool, size: int) -> None:
        """Write each rank's lines to its log (one flushed call), then queue one
        :class:`LineBatch` per rank; ``size``: the bytes they came from (the consumer's
        backlog)."""
        hosts = [st.host for st in self.nodes]
        events: list[Event] = []
        for (n, rank), lines in groups.items():
            lines.append("")
            self._write(n, rank, stream, "\n".join(lines).encode("utf-8", "surrogateescape"))
            lines.pop()
            if dirty:
                lines = [shown(x) for x in lines]
            if size > MAX_SHOWN_LINE:  # a line this long can only come in a chunk this big
                lines = cut_long(lines)  # shown cut; the log above has it whole
            events.append(LineBatch(n, rank, stream, tuple(lines), ts, hosts[n]))
        # The rank agent's lines (telemetry, a dump) are its own clock speaking, not the script:
        # no progress for the hang timer, but a sign that the rank's process started.
        starts = self.hang.starts
        live = False
        rank_live = False
        for (n, rank), lines in groups.items():
            if starts is not None:
                starts.seen(n, rank, lines)
            if not only_agent(lines):
                live = True
                rank_live = rank_live or rank is not None
        if live:
            self.hang.activity(rank_live)
        self._queue(events, size)

    def _queue(self, events: list[Event], size: int) -> None:
        with self.cond:
            self._events.extend(events)
            self._pending_bytes += size
            self.cond.notify_all()
            if self._pending_bytes > self.max_pending_bytes:
                # The consumer is behind (a busy screen): stop reading for a moment, as a
                # terminal does, instead of taking the GIL from it and piling up memory. The
                # ranks block on their pipe meanwhile; the wait is bounded, so a consumer that
                # does not poll only slows this down.
                self.cond.wait_for(
                    lambda: self._pending_bytes <= self.max_pending_bytes or self.ended.is_set(),
                    PENDING_WAIT_S,
                )


class RankSplitter:
    """Splits a node's lines per rank: torchrun's tee prefixes (runs of one rank's lines, the
    hot path) or a driver's own ``split`` line by line; consumes a driver's control lines and
    feeds torchrun's failure table. Each reader thread keeps its own partial lines."""

    def __init__(
        self,
        nodes: Sequence[NodeState],
        gpus_per_node: int,
        *,
        split: Split | None = None,
        control: ControlLine | None = None,
    ) -> None:
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.split = split
        self.control = control
        self._reader = threading.local()
        """Each stream reader's own state: ``partial``, the rank lines torchrun's tee has given
        only in part so far (:func:`engine.launch.torchrun_output.group_runs`)."""

    def reset(self) -> None:
        """A new reader thread starts: no partial lines yet."""
        self._reader.partial = {}

    def partial(self) -> dict[int, dict[int, str]]:
        """This reader's partial rank lines, by node and local rank."""
        partial: dict[int, dict[int, str]] | None = getattr(self._reader, "partial", None)
        if partial is None:
            partial = self._reader.partial = {}
        return partial

    def group(self, node: int, stream: str, text: str) -> Groups:
        """{(node, rank): lines} for ``text``: per run of one rank's lines (the hot path, hundreds
        of thousands of lines a second), or line by line through a driver's ``split``."""
        if self.split is not None:
            return self._group_per_line(node, stream, text)

        def untagged(run: str) -> list[str]:
            lines = run.split("\n")
            if lines[-1] == "":
                lines.pop()
            return self._keep_untagged(node, stream, lines)

        partial = self.partial().setdefault(node, {})
        return group_runs(text, node, self.gpus_per_node, untagged, partial)

    def _keep_untagged(self, node: int, stream: str, lines: list[str]) -> list[str]:
        """The node's own lines to keep: control lines are consumed, torchrun's failure table
        is followed."""
        kept: list[str] = []
        table = self.nodes[node].table
        ctrl = self.control
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            table.scan(raw)
            kept.append(line)
        return kept

    def _group_per_line(self, node: int, stream: str, text: str) -> Groups:
        assert self.split is not None
        groups: Groups = {}
        lines = text.split("\n")
        lines.pop()  # text ends with a newline
        gpn = self.gpus_per_node
        partial = self.partial()
        ctrl = self.control
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            n, rank, body = self.split(node, raw)
            if rank is None:
                self.nodes[n].table.scan(body)
            out = body.decode("utf-8", "surrogateescape")
            if rank is not None and (partial.get(n) or "[default" in out):
                # A partial line torchrun spliced (see group_runs): filed by its pieces' ranks.
                local, out = close_pieces(out, rank - n * gpn, partial.setdefault(n, {}), gpn)
                rank = n * gpn + local
            lst = groups.get((n, rank))
            if lst is None:
                groups[(n, rank)] = lst = []
            lst.append(out)
        return groups
