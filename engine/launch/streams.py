"""The bottom layer of every launch backend: the run's shared state and its output streams.

:class:`StreamingRun` holds what every layer above uses (bundle, options, run directory, nodes,
the event queue) and pumps each byte stream a backend hands over (:meth:`_add_stream`) on a
thread of its own: lines are split per rank (:mod:`engine.launch.torchrun_output`), written to
the run directory (flushed) and only then queued as events, so a crash loses nothing a consumer
saw. :mod:`engine.launch.supervise` builds on it; :class:`engine.launch.base.LaunchBackend` is
the public template on top.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.errors import DtrainError
from engine.launch.options import LaunchOptions
from engine.launch.policy import HangClock, NodeState
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
from engine.rundir.files import RunDir, new_run_dir
from engine.rundir.record import RunState
from engine.write.manifest import BundleManifest, read_manifest

MAX_PENDING_BYTES = 2 << 20
"""Output queued for the consumer (bytes since its last poll) above which a stream reader
pauses, for at most PENDING_WAIT_S per read."""
PENDING_WAIT_S = 0.25
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LaunchError(DtrainError):
    """A launch could not start or went wrong; the message names node and host."""


class StreamingRun:
    """A run's state and the readers of its nodes' output."""

    name = "base"
    max_pending_bytes = MAX_PENDING_BYTES

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
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
        self._events: list[Event] = []
        self._pending_bytes = 0
        """Bytes of lines queued since the consumer's last poll."""
        self._cond = threading.Condition()
        self._nodes: list[NodeState] = []
        self._state = RunState.STARTING
        self._final = threading.Event()
        self._finishing = False
        self._stop_requested = False
        self._stop_reason = ""
        self._stopper: threading.Thread | None = None
        self.force = threading.Event()
        """Set by ``kill()``: stopping SIGKILLs at once instead of waiting out the grace."""
        self._dir_error: OSError | None = None
        """The first error writing the run directory (a full disk); ends the run ``failed``."""
        self._failure: tuple[int | None, int | None, str] | None = None  # (rank, node, reason)
        self._hang = HangClock()
        """The ranks' silence (the hang timeout), on the launcher's own clock."""
        self._threads: list[threading.Thread] = []
        self._transport = TransportWatch(self.run, self.bundle_dir, self.name)
        """The NCCL transport check; run.json's ``transport`` entry."""
        self._reader = threading.local()
        """Each stream reader's own state: ``partial``, the rank lines torchrun's tee has given
        only in part so far (:func:`engine.launch.torchrun_output.group_runs`)."""

    # ------------------------------------------------------------------ hooks

    def _split(self, node: int, raw: bytes) -> tuple[int, int | None, bytes]:
        """(node, global rank or None, line without launcher prefixes) for one raw line.
        A subclass overriding this gets the per-line path (slower, for exotic prefixes)."""
        return split_tee(node, self.manifest.gpus_per_node, raw)

    def _control_line(self, node: int, stream: str, line: bytes) -> bool:
        """Hook: consume a backend control line (not logged); True when consumed. Sees the lines
        without a torchrun rank prefix (and every line when ``_split`` is overridden)."""
        return False

    def _node_lost(self, node: int, reason: str) -> None:
        """A subclass reports a node it can no longer reach."""
        st = self._nodes[node]
        if not st.lost:
            st.lost = reason

    # ------------------------------------------------------------------ streams

    def _add_stream(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        """Pump ``read()`` (bytes, b"" at EOF) on a thread: split lines, attribute ranks, write the
        run dir, then queue the events."""
        self._nodes[node].open_streams += 1
        t = threading.Thread(
            target=self._pump,
            args=(node, stream, read),
            name=f"dtrain-n{node}-{stream}",
            daemon=True,
        )
        self._threads.append(t)
        t.start()

    def _pump(self, node: int, stream: str, read: Callable[[], bytes]) -> None:
        tail = b""
        self._reader.partial = {}
        try:
            while True:
                try:
                    chunk = read()
                except Exception as e:  # noqa: BLE001 - a dropped connection ends this stream
                    self._node_lost(node, f"connection lost: {e}")
                    chunk = b""
                if not chunk:
                    if tail:
                        self._ingest(node, stream, tail + b"\n")
                    self._flush_partial(stream)
                    break
                cut = chunk.rfind(b"\n") + 1
                if not cut:
                    tail += chunk
                    continue
                whole = chunk[:cut]  # the whole chunk (no copy) when it ends with a newline
                self._ingest(node, stream, tail + whole if tail else whole)
                tail = chunk[cut:]
        finally:
            with self._cond:
                self._nodes[node].open_streams -= 1

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
        groups = self._group(node, stream, text)
        if "NCCL" in text or "AF_INET" in text:
            self._transport.feed(groups, [st.host for st in self._nodes])
        if "Watchdog caught" in text or "Timed out waiting" in text:  # frdump.TIMEOUT_GATE
            from engine.launch.frdump import note_timeout

            note_timeout(self, groups)  # a collective timed out: the supervisor diagnoses it
        self._deliver(stream, groups, ts, dirty, len(data))

    def _partial(self) -> dict[int, dict[int, str]]:
        """This reader's partial rank lines, by node and local rank."""
        partial: dict[int, dict[int, str]] | None = getattr(self._reader, "partial", None)
        if partial is None:
            partial = self._reader.partial = {}
        return partial

    def _flush_partial(self, stream: str) -> None:
        """The stream ended: a rank line still waiting for its end (the rank died mid-line) is
        delivered as it is."""
        partial = self._partial()
        gpn = self.manifest.gpus_per_node
        groups: Groups = {
            (n, n * gpn + local): [text]
            for n, lines in sorted(partial.items())
            for local, text in sorted(lines.items())
        }
        partial.clear()
        if groups:
            size = sum(len(t) for lines in groups.values() for t in lines)
            self._deliver(stream, groups, time.time(), True, size)

    def _deliver(self, stream: str, groups: Groups, ts: float, dirty: bool, size: int) -> None:
        """Write each rank's lines to its log (one flushed call), then queue one
        :class:`LineBatch` per rank; ``size``: the bytes they came from (the consumer's
        backlog)."""
        hosts = [st.host for st in self._nodes]
        events: list[Event] = []
        for (n, rank), lines in groups.items():
            if self._dir_error is None:
                lines.append("")
                data = "\n".join(lines).encode("utf-8", "surrogateescape")
                lines.pop()
                try:
                    self.run.append(n, rank, stream, data)
                except OSError as e:
                    # The supervisor ends the run; this reader goes on draining the pipe (so no
                    # rank blocks on it) and the consumer still gets the lines.
                    self._dir_failed(e)
            if dirty:
                lines = [shown(x) for x in lines]
            if size > MAX_SHOWN_LINE:  # a line this long can only come in a chunk this big
                lines = cut_long(lines)  # shown cut; the log above has it whole
            events.append(LineBatch(n, rank, stream, tuple(lines), ts, hosts[n]))
        self._hang.activity(any(rank is not None for _, rank in groups))
        with self._cond:
            self._events.extend(events)
            self._pending_bytes += size
            self._cond.notify_all()
            if self._pending_bytes > self.max_pending_bytes:
                # The consumer is behind (a busy screen): stop reading for a moment, as a
                # terminal does, instead of taking the GIL from it and piling up memory. The
                # ranks block on their pipe meanwhile; the wait is bounded, so a consumer that
                # does not poll only slows this down.
                self._cond.wait_for(
                    lambda: self._pending_bytes <= self.max_pending_bytes or self._final.is_set(),
                    PENDING_WAIT_S,
                )

    def _group(self, node: int, stream: str, text: str) -> Groups:
        """{(node, rank): lines} for ``text``: per run of one rank's lines (the hot path, hundreds
        of thousands of lines a second), or line by line through an overridden ``_split``."""
        cls = type(self)
        ctrl = self._control_line if cls._control_line is not StreamingRun._control_line else None
        if cls._split is not StreamingRun._split:
            return self._group_per_line(node, stream, text, ctrl)

        def untagged(run: str) -> list[str]:
            lines = run.split("\n")
            if lines[-1] == "":
                lines.pop()
            return self._keep_untagged(node, stream, lines, ctrl)

        partial = self._partial().setdefault(node, {})
        return group_runs(text, node, self.manifest.gpus_per_node, untagged, partial)

    def _keep_untagged(
        self,
        node: int,
        stream: str,
        lines: list[str],
        ctrl: Callable[[int, str, bytes], bool] | None,
    ) -> list[str]:
        """The node's own lines to keep: control lines are consumed, torchrun's failure table
        is followed."""
        kept: list[str] = []
        table = self._nodes[node].table
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            table.scan(raw)
            kept.append(line)
        return kept

    def _group_per_line(
        self,
        node: int,
        stream: str,
        text: str,
        ctrl: Callable[[int, str, bytes], bool] | None,
    ) -> Groups:
        groups: Groups = {}
        lines = text.split("\n")
        lines.pop()  # text ends with a newline
        gpn = self.manifest.gpus_per_node
        partial = self._partial()
        for line in lines:
            raw = line.encode("utf-8", "surrogateescape")
            if ctrl is not None and ctrl(node, stream, raw):
                continue
            n, rank, body = self._split(node, raw)
            if rank is None:
                self._nodes[n].table.scan(body)
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

    def _dir_failed(self, e: OSError) -> None:
        """A write to the run directory failed: remember the first error for the supervisor."""
        with self._cond:
            if self._dir_error is None:
                self._dir_error = e

    def _emit(self, ev: Event) -> None:
        self._emit_many([ev])

    def _emit_many(self, evs: list[Event]) -> None:
        if not evs:
            return
        with self._cond:
            self._events.extend(evs)
            self._cond.notify_all()
