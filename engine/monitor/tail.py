"""Tail a run directory as an :class:`engine.monitor.events.EventSource`: what ``dtrain-tui monitor RUN_DIR``
watches, for a run still going (files grow, ``run.json`` changes) or one long finished.

Reads the run-directory contract the launch backends write: ``RUN/run.json`` (state, ranks with
node_rank / host / exit_code, failed_rank / reason), ``RUN/logs/rank<R>.stdout.log``,
``rank<R>.stderr.log`` and ``node<i>.log``. Lines come out as :class:`LineBatch` events (one per
file read, in file order, so no line of a rank is lost or reordered); a rank's exit is reported
only after its files have been drained, so its last lines come before its exit. Pure I/O on plain
files: no threads of its own (the monitor polls it from its reader thread).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from engine.errors import DtrainError
from engine.monitor.events import STDERR, STDOUT, Event, LineBatch, RankExit, RunStateChanged
from engine.monitor.textsafe import safe_line
from engine.rundir.launcher import as_read, launcher_gone
from engine.write.manifest import MAX_NODES, MAX_RANKS

RUN_JSON = "run.json"
LOGS = "logs"
_FILE_RE = re.compile(r"^(?:rank(\d+)\.(stdout|stderr)|node(\d+))\.log$")
FINAL_STATES = frozenset({"succeeded", "failed", "stopped"})
ALIVE_CHECK_S = 0.5
"""How often a run still going has its launcher's pid checked (a killed one writes nothing)."""
MAX_LINE_BYTES = 64 << 10
"""A longer line is shown cut: its first 64 KiB and ``… [cut N bytes]`` (the file keeps it all)."""


@dataclass(slots=True)
class _Tail:
    path: Path
    rank: int | None
    node: int
    stream: str
    fh: BinaryIO | None = None
    rest: bytes = b""
    lines: int = 0
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
    state: str = "starting"
    reason: str = ""
    failed: tuple[int, ...] = ()
    world_size: int = 0
    nodes: int = 0
    rank_node: dict[int, int] = field(default_factory=dict)
    rank_host: dict[int, str] = field(default_factory=dict)
    rank_reason: dict[int, str] = field(default_factory=dict)
    """Why a rank ended, as the launcher put it ("stopped" for a user's stop)."""
    exits: dict[int, int | None] = field(default_factory=dict)
    """Ranks whose exit is known (exit_code present in run.json, possibly null)."""
    raw: dict[str, Any] = field(default_factory=dict)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """``RUN/run.json`` as a dict; a missing or unreadable one is a one-line error."""
    path = Path(run_dir) / RUN_JSON
    if not Path(run_dir).is_dir():
        raise DtrainError(f"{run_dir} is not a directory; pass a run directory", field="RUN_DIR")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DtrainError(
            f"{path} not found; pass a run directory written by `dtrain-tui launch`",
            field="RUN_DIR",
        ) from None
    except (OSError, ValueError) as e:
        raise DtrainError(f"{path} is unreadable ({e})", field="RUN_DIR") from None
    except RecursionError:
        raise DtrainError(f"{path} is unreadable (nested too deeply)", field="RUN_DIR") from None
    if not isinstance(data, dict):
        raise DtrainError(f"{path} is not a JSON object", field="RUN_DIR")
    return data


def _bounded(value: int, limit: int, what: str, path: Path | str) -> int:
    """``value`` when 0 <= value < limit, else a one-line error naming the file and field."""
    if not 0 <= value < limit:
        raise DtrainError(
            f"{path}: {what} {value} is out of range (0 to {limit - 1}); "
            "this file was not written by dtrain-tui",
            field="RUN_DIR",
        )
    return value


def _run_info(data: dict[str, Any], path: Path | str = RUN_JSON) -> _RunInfo:
    info = _RunInfo(raw=data)
    info.state = safe_line(str(data.get("state") or "running"))
    info.reason = safe_line(str(data.get("reason") or data.get("failed_reason") or ""))
    failed = data.get("failed_rank")
    if isinstance(failed, int):
        info.failed = (failed,)
    elif isinstance(failed, list):
        info.failed = tuple(r for r in failed if isinstance(r, int))
    ranks = data.get("ranks") or []
    if isinstance(ranks, list) and len(ranks) > MAX_RANKS:
        _bounded(len(ranks), MAX_RANKS + 1, "ranks: length", path)
    for entry in ranks if isinstance(ranks, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("rank"), int):
            continue
        r = _bounded(int(entry["rank"]), MAX_RANKS, "ranks: rank", path)
        node = entry.get("node_rank", entry.get("node", 0))
        if isinstance(node, int):
            info.rank_node[r] = _bounded(node, MAX_NODES, "ranks: node_rank", path)
        else:
            info.rank_node[r] = 0
        info.rank_host[r] = safe_line(str(entry.get("host") or ""))
        if entry.get("reason"):
            info.rank_reason[r] = safe_line(str(entry["reason"]))
        if "exit_code" in entry and (entry["exit_code"] is not None or info.state in FINAL_STATES):
            code = entry["exit_code"]
            info.exits[r] = int(code) if isinstance(code, int) else None
    ws = data.get("world_size")
    info.world_size = int(ws) if isinstance(ws, int) else len(info.rank_node)
    _bounded(info.world_size, MAX_RANKS + 1, "world_size", path)
    nodes = data.get("nodes")
    if isinstance(nodes, int):
        info.nodes = nodes
    elif isinstance(nodes, list):
        info.nodes = len(nodes)
    _bounded(info.nodes, MAX_NODES + 1, "nodes", path)
    return info


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
    ) -> None:
        self.run_dir = Path(run_dir)
        self.chunk_bytes = chunk_bytes
        self.poll_bytes = poll_bytes
        self._rr = 0
        self.rescan_s = rescan_s
        self.idle_sleep_s = idle_sleep_s
        self._tails: dict[str, _Tail] = {}
        self._info = _RunInfo()
        self._run_mtime: int = -1
        self._last_scan = 0.0
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
        data = as_read(read_run_json(self.run_dir))  # a dead launcher's run reads failed
        self._info = _run_info(data, self.run_dir / RUN_JSON)
        self._run_mtime = self._mtime()
        self._started = True
        self._scan()

    @property
    def done(self) -> bool:
        return self._done

    @property
    def world_size(self) -> int:
        return self._info.world_size

    @property
    def info(self) -> dict[str, Any]:
        """The last ``run.json`` read."""
        return self._info.raw

    def rank_nodes(self) -> dict[int, int]:
        return dict(self._info.rank_node)

    def request_stop(self) -> None:
        """Ask the run's launcher to stop the run (``RUN/stop.request``); tailing goes on, and
        shows the run end. A run already over, or whose launcher is gone, has nothing to stop:
        a one-line :class:`DtrainError` says so."""
        from engine.rundir.launcher import request_stop

        data = as_read(read_run_json(self.run_dir))
        if data.get("launcher_died"):
            raise DtrainError(f"nothing to stop: the {data.get('reason')}", field="RUN_DIR")
        if data.get("state") in FINAL_STATES:
            raise DtrainError(f"nothing to stop: the run is {data.get('state')}", field="RUN_DIR")
        try:
            request_stop(self.run_dir)
        except OSError as e:
            raise DtrainError(f"cannot ask the launcher to stop: {e}", field="RUN_DIR") from None

    def stop(self) -> None:
        """Stop tailing (the run itself belongs to its launcher); idempotent."""
        self._stopped = True
        self._done = True
        for t in self._tails.values():
            if t.fh is not None:
                t.fh.close()
                t.fh = None

    def poll(self, timeout: float) -> list[Event]:
        if not self._started:
            self.start()
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._done:
            final = self._refresh_run_json()
            events, busy = self._drain()
            # Drained means no file gave a byte: a long line still without its newline gives
            # no event, yet the files are not drained (else the lines after it were lost).
            drained = not busy
            if final and drained:
                events += self._flush_rests()
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
            try:
                data = as_read(read_run_json(self.run_dir))
                self._info = _run_info(data, self.run_dir / RUN_JSON)
            except DtrainError:
                pass  # mid-rename or removed: keep what we knew
        elif (
            self._info.state not in FINAL_STATES
            and time.monotonic() - self._alive_checked >= ALIVE_CHECK_S
        ):
            # A launcher killed outright writes nothing more: ask the process table.
            self._alive_checked = time.monotonic()
            if launcher_gone(self._info.raw):
                self._info = _run_info(as_read(self._info.raw), self.run_dir / RUN_JSON)
        return self._info.state in FINAL_STATES

    def _scan(self) -> None:
        self._last_scan = time.monotonic()
        logs = self.run_dir / LOGS
        try:
            names = sorted(os.listdir(logs))
        except OSError:
            return
        for name in names:
            if name in self._tails:
                continue
            m = _FILE_RE.match(name)
            if m is None:
                continue
            if int(m[1] or m[3]) >= (MAX_RANKS if m[1] is not None else MAX_NODES):
                continue  # no run has that many ranks (or nodes): not one of ours
            if m[1] is not None:
                rank = int(m[1])
                node = self._info.rank_node.get(rank, 0)
                stream = STDERR if m[2] == "stderr" else STDOUT
                self._tails[name] = _Tail(logs / name, rank, node, stream)
            else:
                self._tails[name] = _Tail(logs / name, None, int(m[3]), STDOUT)

    def _drain(self) -> tuple[list[Event], bool]:
        """Events for what the files gave, and whether any file gave a byte."""
        if time.monotonic() - self._last_scan >= self.rescan_s:
            self._scan()
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
            if t.fh is None:
                try:
                    t.fh = open(t.path, "rb")  # kept open while tailing
                except OSError:
                    continue
            data = t.fh.read(min(self.chunk_bytes, max(budget, 4096)))
            if not data:
                continue
            budget -= len(data)
            busy = True
            buf = t.rest + data if t.rest else data
            cut = buf.rfind(b"\n")
            if cut < 0:
                t.keep(buf)
                continue
            lines = _decode_lines(buf[:cut], t.cut)
            t.cut = 0
            t.keep(buf[cut + 1 :])
            if t.rank is not None:
                t.node = self._info.rank_node.get(t.rank, t.node)
            host = self._info.rank_host.get(t.rank, "") if t.rank is not None else ""
            t.lines += len(lines)
            events.append(LineBatch(t.node, t.rank, t.stream, tuple(lines), now, host))
        return events, busy

    def _flush_rests(self) -> list[Event]:
        """At the end, a last line without its newline is still a line."""
        events: list[Event] = []
        for t in self._tails.values():
            if t.rest:
                text = _cut_text(t.rest, t.cut)
                t.rest, t.cut = b"", 0
                t.lines += 1
                events.append(LineBatch(t.node, t.rank, t.stream, (text,), time.time()))
        return events

    def _exits(self, drained: bool) -> list[Event]:
        if not drained:
            return []
        out: list[Event] = []
        for r, code in sorted(self._info.exits.items()):
            if r in self._reported_exits:
                continue
            self._reported_exits.add(r)
            reason = self._info.rank_reason.get(r, "")
            if r in self._info.failed or self._info.raw.get("launcher_died"):
                reason = self._info.reason
            node = self._info.rank_node.get(r, 0)
            out.append(
                RankExit(node, r, code, time.time(), self._info.rank_host.get(r, ""), reason)
            )
        return out

    def _state_event(self, *, only_live: bool = False) -> list[Event]:
        state = self._info.state
        if state == self._reported_state or (only_live and state in FINAL_STATES):
            return []
        self._reported_state = state
        return [RunStateChanged(state, self._info.reason, time.time(), self._info.failed)]

    def lines_read(self) -> dict[str, int]:
        """Lines delivered per file name (for tests and benchmarks)."""
        return {name: t.lines for name, t in self._tails.items()}


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
