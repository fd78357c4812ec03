"""Tail a run directory as an :class:`engine.rundir.events.EventSource`: what ``dtrain-tui monitor RUN_DIR``
watches, for a run still going (files grow, ``run.json`` changes) or one long finished.

Reads the run-directory contract the launch backends write: ``RUN/run.json`` (through
:func:`engine.rundir.record.read_record`, which bounds what an untrusted file may ask for; the
text in it is made safe for a terminal here), ``RUN/logs/rank<R>.stdout.log``,
``rank<R>.stderr.log`` and ``node<i>.log``. Lines come out as :class:`LineBatch` events (one per
file read, in file order, so no line of a rank is lost or reordered); a rank's exit is
reported only after its files have been drained, so its last lines come before its exit. Pure
I/O on plain files: no threads of its own (the monitor polls it from its reader thread).

What the directory holds when it is opened (a finished run, or a live one reopened) is replayed
in the order it was written: the chunks ``logs/order.idx`` lists (:mod:`engine.rundir.files`),
ranks and streams interleaved as they were appended; then the files are followed as they grow.
What the index does not cover (an older run has none; a crash may leave it shorter than the
logs) comes after, file by file, in :func:`replay_order`. The index is checked, never trusted:
each record must name a log of the directory read by the rules below, start where that log's
last indexed chunk ended and end inside the file; the first that does not (or a line that is no
record) ends the indexed replay, with one line saying so, and the files are read on from there.
The index is read a block at a time: memory stays bounded whatever its size.

A run directory may come from someone else: a log that is a symlink, or leads out of the run
directory (``logs`` itself a symlink), or is not a regular file, is not read; one line says so
(``[dtrain-tui] logs/rank0.stdout.log: is a symlink; not read``). A log truncated while followed
is read again from its start; one renamed away (rotated) is read to its end, then the new file of
that name is followed from its start.
"""

from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from engine.errors import DtrainError
from engine.fsio import open_regular
from engine.monitor.textsafe import safe_line
from engine.rundir.events import STDERR, STDOUT, Event, LineBatch, RankExit, RunStateChanged
from engine.rundir.files import ORDER_INDEX
from engine.rundir.record import RUN_JSON, AttemptRecord, RunRecord, RunState, read_record
from engine.write.manifest import MAX_NODES, MAX_RANKS

LOGS = "logs"
_FILE_RE = re.compile(r"^(?:rank(\d+)\.(stdout|stderr)|node(\d+))\.log$")
ALIVE_CHECK_S = 0.5
"""How often a run still going has its launcher's pid checked (a killed one writes nothing)."""
MAX_LINE_BYTES = 64 << 10
"""A longer line is shown cut: its first 64 KiB and ``… [cut N bytes]`` (the file keeps it all)."""
NO_LAUNCHER_QUIET_S = 30.0
"""A run not over whose run.json names no launcher, and where nothing changed for this long, is
taken as ended: no process this machine can see will ever finish it."""
NOTE = "[dtrain-tui] "
"""How a line of the monitor's own (a file not read) starts."""
INDEX_BLOCK = 64 << 10
"""How much of ``logs/order.idx`` is read at a time (the index is streamed, never held)."""
MAX_RECORD = 128
"""The longest index record taken (a log's name and two numbers are far shorter)."""
RECORD_COST = 64
"""Bytes of a poll's budget one index record counts for, so an index of tiny chunks still
gives a short poll."""


@dataclass(slots=True)
class _Tail:
    path: Path
    rank: int | None
    node: int
    stream: str
    fh: BinaryIO | None = None
    refused: bool = False
    """Not a regular file of the run directory: said once, never read."""
    rest: bytes = b""
    cut: int = 0
    """Bytes of the unfinished line in ``rest`` dropped past MAX_LINE_BYTES."""

    def keep(self, rest: bytes) -> None:
        """Hold ``rest`` (a line still without its newline), cut to MAX_LINE_BYTES."""
        if len(rest) > MAX_LINE_BYTES:
            self.cut += len(rest) - MAX_LINE_BYTES
            rest = rest[:MAX_LINE_BYTES]
        self.rest = rest


def _cut_text(line: bytes, cut: int) -> str:
    """One line, its first MAX_LINE_BYTES and a marker when it was longer."""
    if len(line) > MAX_LINE_BYTES:
        cut += len(line) - MAX_LINE_BYTES
        line = line[:MAX_LINE_BYTES]
    text = line.decode("utf-8", "replace")
    if not cut:
        return text
    return f"{text.rstrip(chr(0xFFFD))}… [cut {cut} bytes]"


def _decode_lines(chunk: bytes, first_cut: int) -> list[str]:
    """``chunk`` (complete lines, without the last newline) as text lines, long ones cut."""
    if not first_cut and len(chunk) <= MAX_LINE_BYTES:
        return chunk.decode("utf-8", "replace").split("\n")
    return [_cut_text(x, first_cut if i == 0 else 0) for i, x in enumerate(chunk.split(b"\n"))]


@dataclass(slots=True)
class _RunInfo:
    """What the tail needs of a :class:`RunRecord`, by rank, its text made safe to show."""

    record: RunRecord = field(default_factory=RunRecord)
    state: RunState = RunState.STARTING
    reason: str = ""
    failed: tuple[int, ...] = ()
    rank_node: dict[int, int] = field(default_factory=dict)
    rank_host: dict[int, str] = field(default_factory=dict)
    rank_reason: dict[int, str] = field(default_factory=dict)
    """Why a rank ended, as the launcher put it ("stopped" for a user's stop)."""
    exits: dict[int, int | None] = field(default_factory=dict)
    """Ranks whose exit is known (an exit code, or the run is over)."""


def _run_info(rec: RunRecord) -> _RunInfo:
    info = _RunInfo(record=rec, state=rec.state, reason=safe_line(rec.reason))
    info.failed = () if rec.failed_rank is None else (rec.failed_rank,)
    for r in rec.ranks:
        info.rank_node[r.rank] = r.node_rank
        info.rank_host[r.rank] = safe_line(r.host)
        if r.reason:
            info.rank_reason[r.rank] = safe_line(r.reason)
        if r.exit_code is not None or rec.state.final:
            info.exits[r.rank] = r.exit_code
    return info


def replay_order(logs: Path, names: list[str]) -> list[str]:
    """``names`` (files of ``logs``) in the order what ``order.idx`` does not cover of them is
    replayed (all of an older run's, which has no index): the file last written longest ago
    first (mtime), so a rank's Traceback (its stderr, written as it died)
    comes after the steps its stdout printed before, and torchrun's summary (the node log)
    after both. At the same mtime: by rank, stdout before stderr, node logs after ranks.

    Only an approximation: the files themselves hold no time or sequence per line, so the
    lines of two files are not interleaved (each file comes whole, in its own order); a live
    run's files, read as they grow, come in the order they were written to within a poll."""

    def key(name: str) -> tuple[int, int, int, int]:
        m = _FILE_RE.match(name)
        try:
            mtime = os.lstat(logs / name).st_mtime_ns
        except OSError:
            mtime = 0
        if m is None or m[1] is None:
            return (mtime, 1, int(m[3]) if m is not None else 0, 0)
        return (mtime, 0, int(m[1]), 1 if m[2] == "stderr" else 0)

    return sorted(names, key=key)


class _BadRecord(ValueError):
    """An index line that is not ``<log name> <offset> <nbytes>``."""


class _OrderIndex:
    """``logs/order.idx`` read forward, a block at a time, and the replay's place in it: the
    tail whose chunk is being read and its bytes still to read, and where each log's indexed
    chunks end so far (the next record of that log must start there), by the name's bytes."""

    def __init__(self, fd: int) -> None:
        self.fh: BinaryIO = os.fdopen(fd, "rb")
        self.lines: list[bytes] = []
        self.i = 0
        self.partial = b""
        """The block's last bytes, a record still without its newline."""
        self.count = 0
        """Records taken so far."""
        self.tail: _Tail | None = None
        self.left = 0
        self.known: dict[bytes, _Tail] = {}
        """Names already checked: a log of the directory, open and read here."""
        self.ends: dict[bytes, int] = {}
        self.sizes: dict[bytes, int] = {}

    def next(self) -> list[bytes] | None:
        """The next complete record, split in its three fields; None at the index's end (a
        record cut short by a crash, or still being written, is not one). :class:`_BadRecord`
        for a line that is no record."""
        while self.i >= len(self.lines):
            if len(self.partial) > MAX_RECORD:
                raise _BadRecord
            more = self.fh.read(INDEX_BLOCK)
            if not more:
                return None
            self.lines = (self.partial + more).split(b"\n")
            self.partial = self.lines.pop()
            self.i = 0
        line = self.lines[self.i]
        self.i += 1
        self.count += 1
        parts = line.split(b" ")
        if len(line) > MAX_RECORD or len(parts) != 3:
            raise _BadRecord
        return parts

    def close(self) -> None:
        self.fh.close()


class _LogFiles:
    """The run directory's log files, followed: which there are (looked for again every
    ``rescan_s``), what each gave since the last read, a truncated or rotated one read again,
    and one note for each file not read. ``chunk_bytes`` bounds what one file gives to one
    :meth:`drain` and ``poll_bytes`` what all files do."""

    def __init__(self, run_dir: Path, chunk_bytes: int, poll_bytes: int, rescan_s: float) -> None:
        self.run_dir = run_dir
        self.chunk_bytes = chunk_bytes
        self.poll_bytes = poll_bytes
        self.rescan_s = rescan_s
        self._rr = 0
        self._notes: list[str] = []
        self._logs_refused = False
        self._tails: dict[str, _Tail] = {}
        self._last_scan = 0.0
        self._order: _OrderIndex | None = None
        """The index being replayed (see the module docstring); None once it is over."""

    def close(self) -> None:
        self._end_replay()
        for t in self._tails.values():
            if t.fh is not None:
                t.fh.close()
                t.fh = None

    def _note(self, text: str) -> None:
        self._notes.append(NOTE + safe_line(text))

    def take_notes(self) -> list[Event]:
        if not self._notes:
            return []
        notes, self._notes = tuple(self._notes), []
        return [LineBatch(0, None, STDOUT, notes, time.time())]

    def scan(self, info: _RunInfo) -> None:
        self._last_scan = time.monotonic()
        logs = self.run_dir / LOGS
        if self._logs_refused:
            return
        try:
            st = os.lstat(logs)
        except OSError:
            return
        if not stat.S_ISDIR(st.st_mode):
            self._logs_refused = True
            what = "is a symlink" if stat.S_ISLNK(st.st_mode) else "is not a directory"
            self._note(f"{LOGS}: {what}; its files are not read")
            return
        try:
            names = [n for n in os.listdir(logs) if n not in self._tails]
        except OSError:
            return
        for name in replay_order(logs, names):
            m = _FILE_RE.match(name)
            if m is None:
                continue
            if int(m[1] or m[3]) >= (MAX_RANKS if m[1] is not None else MAX_NODES):
                continue  # no run has that many ranks (or nodes): not one of ours
            if m[1] is not None:
                rank = int(m[1])
                node = info.rank_node.get(rank, 0)
                stream = STDERR if m[2] == "stderr" else STDOUT
                self._tails[name] = _Tail(logs / name, rank, node, stream)
            else:
                self._tails[name] = _Tail(logs / name, None, int(m[3]), STDOUT)

    def open_index(self) -> None:
        """Start replaying ``logs/order.idx`` (at the first scan): none there, or one refused
        (a symlink, not a regular file), and the files are read as they are."""
        if self._logs_refused:
            return
        label = f"{LOGS}/{ORDER_INDEX}"
        try:
            fd = open_regular(self.run_dir / LOGS / ORDER_INDEX, within=self.run_dir, label=label)
        except DtrainError as e:
            self._note(f"{e}")
            return
        except OSError:
            return
        self._order = _OrderIndex(fd)

    def _end_replay(self) -> None:
        if self._order is not None:
            self._order.close()
            self._order = None

    def _replay(self, info: _RunInfo) -> list[Event]:
        """The next indexed chunks, up to a poll's budget, as events: consecutive reads of one
        file make one batch. The replay ends at the index's end or its first bad record."""
        order = self._order
        assert order is not None
        events: list[Event] = []
        now = time.time()
        budget = self.poll_bytes
        acc: list[bytes] = []
        acc_tail: _Tail | None = None
        over = False
        while budget > 0:
            if order.left == 0:
                if not self._take_record(order, info):
                    over = True
                    break
                budget -= RECORD_COST
                if budget <= 0:
                    break  # the chunk is read at the next poll
            t = order.tail
            assert t is not None and t.fh is not None
            data = t.fh.read(min(order.left, self.chunk_bytes, budget))
            if not data:  # shrank since it was checked: read on as a followed file is
                over = True
                break
            order.left -= len(data)
            budget -= len(data)
            if acc_tail is not t:
                if acc_tail is not None and (
                    batch := self._lines(acc_tail, b"".join(acc), info, now)
                ):
                    events.append(batch)
                acc, acc_tail = [], t
            acc.append(data)
        if acc_tail is not None and (batch := self._lines(acc_tail, b"".join(acc), info, now)):
            events.append(batch)
        if over:
            self._end_replay()
        return events

    def _take_record(self, order: _OrderIndex, info: _RunInfo) -> bool:
        """The next record as the chunk to read (``order.tail``, ``order.left``); False at the
        index's end or at a record that does not check out (said in one line)."""
        try:
            rec = order.next()
            if rec is None:
                return False
            key, offset, nbytes = rec[0], int(rec[1]), int(rec[2])
        except (_BadRecord, ValueError, OSError):
            self._bad_record(order, "is not an order record")
            return False
        t = order.known.get(key)
        if t is None and (t := self._indexed_tail(key, info)) is None:
            self._bad_record(order, f"names {key.decode('ascii', 'replace')}, not a log read here")
            return False
        end = offset + nbytes
        if nbytes <= 0 or offset != order.ends.get(key, 0):
            why = f"puts {t.path.name} at {offset}, not where its last chunk ended"
        elif end > order.sizes.get(key, -1) and end > self._size(t, key, order):
            why = f"goes past the end of {t.path.name}"
        else:
            order.ends[key] = end
            order.tail, order.left = t, nbytes
            return True
        self._bad_record(order, why)
        return False

    def _indexed_tail(self, key: bytes, info: _RunInfo) -> _Tail | None:
        """The followed log an index record names, opened (a name first met: checked once)."""
        name = key.decode("ascii", "replace")
        if _FILE_RE.match(name) is None:
            return None
        t = self._tails.get(name)
        if t is None:
            self.scan(info)  # a live run's log made since the last look
            t = self._tails.get(name)
        if t is None or t.refused or (t.fh is None and not self._open(t)):
            return None
        assert self._order is not None
        self._order.known[key] = t
        return t

    def _bad_record(self, order: _OrderIndex, why: str) -> None:
        self._note(
            f"{LOGS}/{ORDER_INDEX}: record {order.count} {why}; the rest is replayed file by file"
        )

    @staticmethod
    def _size(t: _Tail, key: bytes, order: _OrderIndex) -> int:
        """``t``'s file's size now (a live run's grows), remembered for the next records."""
        assert t.fh is not None
        try:
            size = os.fstat(t.fh.fileno()).st_size
        except OSError:
            size = -1
        order.sizes[key] = size
        return size

    @staticmethod
    def _lines(t: _Tail, data: bytes, info: _RunInfo, now: float) -> LineBatch | None:
        """``data`` read from ``t``'s file: its whole lines as one batch (none yet: kept)."""
        buf = t.rest + data if t.rest else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            t.keep(buf)
            return None
        lines = _decode_lines(buf[:cut], t.cut)
        t.cut = 0
        t.keep(buf[cut + 1 :])
        if t.rank is not None:
            t.node = info.rank_node.get(t.rank, t.node)
        host = info.rank_host.get(t.rank, "") if t.rank is not None else ""
        return LineBatch(t.node, t.rank, t.stream, tuple(lines), now, host)

    def drain(self, info: _RunInfo) -> tuple[list[Event], bool]:
        """Events for what the files gave, and whether any file gave a byte."""
        if self._order is not None:
            return self._replay(info), True
        rescan = time.monotonic() - self._last_scan >= self.rescan_s
        if rescan:
            self.scan(info)
        events: list[Event] = []
        now = time.time()
        tails = list(self._tails.values())
        # Round-robin start, and a cap per poll, so one poll stays short (the reader posts
        # to the screen between polls) and no rank's file waits behind the others.
        start = self._rr % len(tails) if tails else 0
        self._rr += 1
        budget = self.poll_bytes
        busy = False
        for t in tails[start:] + tails[:start]:
            if budget <= 0:
                break
            if t.refused or (t.fh is None and not self._open(t)):
                continue
            assert t.fh is not None
            data = t.fh.read(min(self.chunk_bytes, max(budget, 4096)))
            if not data:
                if rescan:
                    events += self._reopened(t, info)
                continue
            budget -= len(data)
            busy = True
            if (batch := self._lines(t, data, info, now)) is not None:
                events.append(batch)
        return events, busy

    def _open(self, t: _Tail) -> bool:
        """Open ``t``'s file, a regular file inside the run directory; a refusal is said once."""
        try:
            fd = open_regular(t.path, within=self.run_dir, label=f"{LOGS}/{t.path.name}")
        except DtrainError as e:
            t.refused = True
            self._note(f"{e}")
            return False
        except OSError:
            return False  # not there yet
        t.fh = os.fdopen(fd, "rb")  # kept open while tailing
        return True

    def _reopened(self, t: _Tail, info: _RunInfo) -> list[Event]:
        """At the end of ``t``'s file: start again from 0 when it shrank (truncated), or follow
        the new file of its name when the name now holds another one (rotated). A line without
        its newline so far is shown first, so nothing read is lost."""
        assert t.fh is not None
        try:
            mine = os.fstat(t.fh.fileno())
            pos = t.fh.tell()
        except (OSError, ValueError):
            return []
        try:
            now = os.stat(t.path, follow_symlinks=False)
        except OSError:
            return []  # renamed, the new one not there yet: keep the old one
        rotated = (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)
        if not rotated and mine.st_size >= pos:
            return []
        events = _flush_one(t, info)
        if rotated:
            t.fh.close()
            t.fh = None
            self._open(t)
        else:
            t.fh.seek(0)
        return events

    def flush_rests(self, info: _RunInfo) -> list[Event]:
        """At the end, a last line without its newline is still a line."""
        events: list[Event] = []
        for t in self._tails.values():
            events += _flush_one(t, info)
        return events


def _flush_one(t: _Tail, info: _RunInfo) -> list[Event]:
    """``t``'s line still without its newline, as a line of its own (none: nothing held)."""
    if not t.rest:
        return []
    text = _cut_text(t.rest, t.cut)
    t.rest, t.cut = b"", 0
    host = info.rank_host.get(t.rank, "") if t.rank is not None else ""
    return [LineBatch(t.node, t.rank, t.stream, (text,), time.time(), host)]


class RunDirSource:
    """An EventSource over a run directory. ``chunk_bytes`` bounds what one file contributes to
    one poll and ``poll_bytes`` what all files do, so a huge finished log streams in steps
    instead of stalling the reader."""

    def __init__(
        self,
        run_dir: Path | str,
        *,
        chunk_bytes: int = 256 << 10,
        poll_bytes: int = 1 << 20,
        rescan_s: float = 0.25,
        idle_sleep_s: float = 0.02,
        no_launcher_quiet_s: float = NO_LAUNCHER_QUIET_S,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.idle_sleep_s = idle_sleep_s
        self.no_launcher_quiet_s = no_launcher_quiet_s
        self._logs = _LogFiles(self.run_dir, chunk_bytes, poll_bytes, rescan_s)
        self._last_change = time.monotonic()
        self._info = _RunInfo()
        self._run_mtime: int = -1
        self._alive_checked = 0.0
        self._reported_exits: set[int] = set()
        self._reported_state = ""
        self._done = False
        self._stopped = False
        self._started = False

    # ---- EventSource ---------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            return
        self._info = _run_info(read_record(self.run_dir))  # a dead launcher's run reads failed
        self._run_mtime = self._mtime()
        self._started = True
        self._logs.scan(self._info)
        self._logs.open_index()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def world_size(self) -> int:
        return self._info.record.world_size

    def request_stop(self) -> None:
        """Ask the run's launcher to stop the run (``RUN/stop.request``); tailing goes on, and
        shows the run end. A run already over, or whose launcher is gone, has nothing to stop:
        a one-line :class:`DtrainError` says so."""
        from engine.rundir.launcher import request_stop

        rec = read_record(self.run_dir)
        if rec.launcher_died:
            raise DtrainError(f"nothing to stop: the {rec.reason}", field="RUN_DIR")
        if rec.state.final:
            raise DtrainError(f"nothing to stop: the run is {rec.state}", field="RUN_DIR")
        try:
            request_stop(self.run_dir)
        except OSError as e:
            raise DtrainError(f"cannot ask the launcher to stop: {e}", field="RUN_DIR") from None

    def stop(self) -> None:
        """Stop tailing (the run itself belongs to its launcher); idempotent."""
        self._stopped = True
        self._done = True
        self._logs.close()

    def poll(self, timeout: float) -> list[Event]:
        if not self._started:
            self.start()
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._done:
            final = self._refresh_run_json()
            events, busy = self._logs.drain(self._info)
            events = self._logs.take_notes() + events  # a file not read is said where it would be
            if busy:
                self._last_change = time.monotonic()
            elif not final and self._orphaned():
                final = True
            # Drained means no file gave a byte: a long line still without its newline gives
            # no event, yet the files are not drained (else the lines after it were lost).
            drained = not busy
            if final and drained:
                events += self._logs.flush_rests(self._info)
            events += self._exits(drained)
            if final and drained:
                events += self._state_event()
                self._done = True
                self.stop()
                return events
            events += self._state_event(only_live=True)
            if events:
                return events
            if time.monotonic() >= deadline:
                return []
            if busy:
                continue
            time.sleep(min(self.idle_sleep_s, max(0.0, deadline - time.monotonic())))
        return []

    # ---- internals -----------------------------------------------------------------------

    def _mtime(self) -> int:
        try:
            return os.stat(self.run_dir / RUN_JSON).st_mtime_ns
        except OSError:
            return -1

    def _refresh_run_json(self) -> bool:
        """Re-read run.json when it changed; True once the run is over."""
        m = self._mtime()
        if m != self._run_mtime:
            self._run_mtime = m
            self._last_change = time.monotonic()
            try:
                self._info = _run_info(read_record(self.run_dir))
            except DtrainError:
                pass  # mid-rename or removed: keep what we knew
        elif not self._info.state.final and time.monotonic() - self._alive_checked >= ALIVE_CHECK_S:
            # A launcher killed outright writes nothing more: ask the process table.
            self._alive_checked = time.monotonic()
            rec = self._info.record.as_read()
            if rec is not self._info.record:
                self._info = _run_info(rec)
        return self._info.state.final

    def _orphaned(self) -> bool:
        """A run not over, with no launcher named, where nothing changed for a long while: end
        it as failed, saying why (else a follower waits forever)."""
        rec = self._info.record
        if rec.launcher is not None or self._info.state.final:
            return False
        quiet = time.monotonic() - self._last_change
        if quiet < self.no_launcher_quiet_s:
            return False
        why = (
            f"run.json names no launcher and nothing changed for {quiet:.0f} s; "
            "no process here will end this run"
        )
        self._info = _run_info(rec.model_copy(update={"state": RunState.FAILED, "reason": why}))
        return True

    def _exits(self, drained: bool) -> list[Event]:
        if not drained:
            return []
        out: list[Event] = []
        for r, code in sorted(self._info.exits.items()):
            if r in self._reported_exits:
                continue
            self._reported_exits.add(r)
            reason = self._info.rank_reason.get(r, "")
            if r in self._info.failed or self._info.record.launcher_died:
                reason = self._info.reason
            node = self._info.rank_node.get(r, 0)
            out.append(
                RankExit(node, r, code, time.time(), self._info.rank_host.get(r, ""), reason)
            )
        return out

    def _state_event(self, *, only_live: bool = False) -> list[Event]:
        state = self._info.state
        if state == self._reported_state or (only_live and state.final):
            return []
        self._reported_state = state
        return [RunStateChanged(state, self._info.reason, time.time(), self._info.failed)]


class ListSource:
    """A canned EventSource: hands out ``events`` in ``batches`` (lists), one per poll. For tests,
    demos and snapshots, where the same events must give the same screen."""

    def __init__(self, batches: list[list[Event]]) -> None:
        self._batches = list(batches)
        self._i = 0
        self._stopped = False

    def start(self) -> None:
        return None

    def poll(self, timeout: float) -> list[Event]:
        if self._i >= len(self._batches) or self._stopped:
            return []
        batch = self._batches[self._i]
        self._i += 1
        return batch

    def stop(self) -> None:
        self._stopped = True

    @property
    def done(self) -> bool:
        return self._stopped or self._i >= len(self._batches)


# ---- attempts of a restarted run (engine/launch/restart.py) -------------------------------


def attempt_line(a: AttemptRecord) -> str:
    """One attempt as ``monitor`` shows it: how it ended, where it resumed, what it cost."""
    where = ",".join(safe_line(h) for h in a.hosts) or "-"
    resumed = (
        f"resumed from step {a.resumed_from_step}"
        if a.resumed_from_step is not None
        else "started afresh"
    )
    cost = f", {a.steps_redone} step(s) redone ({a.lost_s:.1f}s)" if a.steps_redone else ""
    cause = f": {safe_line(a.cause)}" if a.cause else ""
    left = f"; {safe_line(a.excluded)}" if a.excluded else ""
    return f"[attempt {a.attempt}] {a.state} on {where}, {resumed}{cost}{cause}{left}"


def work_lost_line(attempts: list[AttemptRecord]) -> str:
    """The restarts' total cost, in steps redone and seconds."""
    restarts = max(0, len(attempts) - 1)
    steps = sum(a.steps_redone for a in attempts)
    secs = sum(a.lost_s for a in attempts)
    return f"[run] {restarts} restart(s); work lost: {steps} step(s) redone, {secs:.1f}s"


def attempt_dirs(run_dir: Path, record: RunRecord) -> list[Path]:
    """The run directory of each attempt that exists, in order (``RUN/attempts/N``); none for a
    run the restart policy did not start."""
    out: list[Path] = []
    for a in record.attempts:
        rel = Path(a.run_dir)
        if rel.is_absolute() or ".." in rel.parts or not a.run_dir:
            continue
        if (Path(run_dir) / rel).is_dir():
            out.append(Path(run_dir) / rel)
    return out
