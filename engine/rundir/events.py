"""What a launch backend emits and what the monitor consumes: facts about lines and ranks.

Part of the run-directory contract (with run.json's record), so that launch and monitor are
siblings over it. Backends (``engine.launch``) produce these; they know nothing about widgets. Consumers pull them in
batches from an :class:`EventSource` (a reader thread collects lines and hands over a list every
50–250 ms), never one message per line. Fast sources (launch backends, run-directory tails) emit
:class:`LineBatch` (lines of one rank and stream); :class:`LineEvent` is for the odd single
line. Every consumer must handle both (:func:`per_line` flattens, off the hot path).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

STDOUT = "stdout"
STDERR = "stderr"


@dataclass(frozen=True, slots=True)
class LineEvent:
    """One output line. ``rank`` is the global rank, or None when a line can't be attributed
    (launcher chatter, setup output); ``line`` has its launcher prefixes stripped."""

    node: int
    rank: int | None
    stream: str
    line: str
    ts: float = 0.0
    host: str = ""


@dataclass(frozen=True, slots=True)
class LineBatch:
    """Consecutive lines of one rank and stream, in order: what a fast source (a run directory
    being tailed, a pipe reader) emits instead of one :class:`LineEvent` per line, because
    building an object per line caps a monitor at ~400k lines/s of pure overhead."""

    node: int
    rank: int | None
    stream: str
    lines: tuple[str, ...]
    ts: float = 0.0
    host: str = ""


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank's process ended. ``exit_code`` follows subprocess: negative for a signal."""

    node: int
    rank: int
    exit_code: int | None
    ts: float = 0.0
    host: str = ""
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RunStateChanged:
    """The run moved to ``state``: a :class:`engine.rundir.record.RunState` name (kept a plain
    string: a run directory's ``run.json`` may say anything)."""

    state: str
    message: str = ""
    ts: float = 0.0
    failed_ranks: tuple[int, ...] = field(default_factory=tuple)


Event = LineEvent | LineBatch | RankExit | RunStateChanged


def per_line(events: Iterable[Event]) -> list[Event]:
    """``events`` with every :class:`LineBatch` spelled out as one :class:`LineEvent` per line,
    in order: for consumers that want a line at a time (tests, simple printers), not for hot
    paths."""
    out: list[Event] = []
    for ev in events:
        if isinstance(ev, LineBatch):
            out.extend(
                LineEvent(ev.node, ev.rank, ev.stream, line, ev.ts, ev.host) for line in ev.lines
            )
        else:
            out.append(ev)
    return out


class EventSource(Protocol):
    """Anything the monitor can watch: a live launch, a run directory being tailed, a canned list."""

    def start(self) -> None: ...

    def poll(self, timeout: float) -> list[Event]:
        """Return the events that arrived (possibly empty after ``timeout`` seconds)."""
        ...

    def stop(self) -> None:
        """Stop the run (if live) and release resources; idempotent."""
        ...

    @property
    def done(self) -> bool:
        """True once no more events will come."""
        ...


def stop_run(source: EventSource) -> None:
    """Stop the run, not the watching: a source that can (a launch backend, a run directory whose
    launcher polls for the request: a ``request_stop()`` method) asks for it and goes on
    reporting until the run ends; any other source is stopped outright. May block (it runs
    commands or writes files) and may raise :class:`engine.errors.DtrainError`."""
    request = getattr(source, "request_stop", None)
    if request is None:
        source.stop()
    else:
        request()
