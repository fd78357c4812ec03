"""The fault policy of a run: its timings, and who is to blame when it ends badly.

Called by the supervision of every launch backend (:mod:`engine.launch.supervise`); the SSH
backend's remote shell uses :data:`STOP_GRACE_S` too. Pure decisions on a node's state, no I/O.

The first rank that exits non-zero, a node whose connection drops, a run silent for
``hang_timeout_s`` (once a rank started; until then ``start_timeout_s`` since the nodes started), or a run directory that cannot be written (disk full) ends the run ``failed``,
naming rank, node and host, and every other node is stopped; a user's stop ends it ``stopped``;
it is ``succeeded`` only when every rank exited 0.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.launch.torchrun_output import FailureTable, describe_exit
from engine.rundir.record import RankRecord

STOP_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping a node."""
SUPERVISE_INTERVAL_S = 0.1
"""How often the supervisor looks at every node."""
LINGER_S = 5.0
"""Seconds a node's output may stay open after its script ended (a leftover child holds it)."""
STALL_S = 2.0
"""A gap between two supervisor ticks (every SUPERVISE_INTERVAL_S) longer than this means the
launcher itself was not running: stopped (Ctrl-Z, SIGSTOP), a paused VM, a suspended machine.
The gap is not counted as the ranks' silence (:class:`HangClock`)."""
DEFAULT_START_TIMEOUT_S = 600.0
"""``--start-timeout``'s default: until a rank's first sign of life the run is starting, not
hanging (on a loaded machine importing torch and the rendezvous may be silent for minutes); a run
no rank started in this long is still ended."""


@dataclass
class NodeState:
    """What the supervisor knows of one node."""

    node: int
    host: str
    exit_code: int | None = None
    finished: bool = False
    lost: str = ""
    """Why the node was lost (connection dropped), or empty."""
    open_streams: int = 0
    exited_at: float | None = None
    """When its script was first seen ended while its output was still open (monotonic)."""
    table: FailureTable = field(default_factory=FailureTable)


def rank_exit(st: NodeState, rank: int, killed_by_us: bool) -> tuple[int | None, str]:
    """(exit code or None, reason) of ``rank`` on the finished node ``st``: 0 for all when the
    node exited 0, else the failure table's code, else unknown with why."""
    if st.exit_code == 0:
        return 0, ""
    if rank in st.table.rank_exits:
        return st.table.rank_exits[rank], ""
    if st.lost:
        return None, st.lost
    return None, "stopped" if killed_by_us else f"node exited with {describe_exit(st.exit_code)}"


def node_failure(st: NodeState) -> tuple[int | None, str]:
    """(rank to blame or None, reason) for a node that exited non-zero on its own."""
    root = st.table.first_failed()
    if root is not None:
        code = st.table.rank_exits.get(root)
        return root, f"rank {root} on node {st.node} ({st.host}) exited with {describe_exit(code)}"
    return (
        None,
        f"node {st.node} ({st.host}) launch script exited with {describe_exit(st.exit_code)}",
    )


def first_bad_rank(ranks: list[RankRecord]) -> tuple[int, int, str] | None:
    """(rank, node, reason) of the first rank that did not exit 0 once every node ended, or
    None when every rank did."""
    for r in ranks:
        if r.exit_code != 0:
            return r.rank, r.node_rank, f"rank {r.rank} exited with {describe_exit(r.exit_code)}"
    return None


def hang_reason(silent_s: float, hang_timeout_s: float) -> str | None:
    """The failure of a run no rank printed anything in for too long, or None."""
    if silent_s > hang_timeout_s:
        return (
            f"hang: no output from any rank for {silent_s:.0f}s (--hang-timeout {hang_timeout_s:g})"
        )
    return None


class HangClock:
    """How long the ranks have been silent, on the launcher's own clock: the supervisor's
    :meth:`tick` credits any gap longer than :data:`STALL_S` between two ticks (the launcher was
    stopped while the ranks went on: their output waited in the pipes, unread), and a hang is
    declared only on two ticks in a row, so the readers get a tick to deliver what they read
    after a continue.

    Until a rank printed its first line (:attr:`alive`) the run is starting: the limit is the
    start timeout counted from :meth:`restart` (the nodes started), not the hang timeout; the
    hang timer starts at that first line.

    ``time.monotonic`` (CLOCK_MONOTONIC) is used, not CLOCK_BOOTTIME: it does not advance while
    the machine is suspended, which is no silence of the ranks either; a stopped process or a
    paused VM's clock jump is what the tick gap catches. Stream readers call :meth:`activity`
    (a float store, safe from any thread); the supervisor alone calls :meth:`tick` and
    :meth:`overdue`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._last = now
        self._tick = now
        self._began = now
        self._suspect = False
        self.alive = False
        """A rank printed a line: the start timeout is over, the hang timer runs."""
        self.credited_s = 0.0
        """Seconds of launcher stalls not counted as silence."""

    def activity(self, rank_line: bool = True) -> None:
        """Output arrived (``rank_line``: from a rank, not only the launcher's chatter)."""
        self._last = self._clock()
        if rank_line:
            self.alive = True

    def restart(self) -> None:
        """Start counting afresh (the nodes just started; a job began to wait in a queue)."""
        self._last = self._tick = self._began = self._clock()
        self._suspect = False

    def tick(self) -> None:
        """Once per supervisor round, before :meth:`overdue`."""
        now = self._clock()
        gap, self._tick = now - self._tick, now
        if gap > STALL_S:
            # Never past now: a reader may have seen output after the continue already.
            self._last = min(self._last + gap, now)
            self._began = min(self._began + gap, now)
            self.credited_s += gap
            self._suspect = False

    def silent_s(self) -> float:
        return max(0.0, self._clock() - self._last)

    def starting_s(self) -> float:
        """Seconds since the nodes started, launcher stalls not counted."""
        return max(0.0, self._clock() - self._began)

    def overdue(
        self,
        timeout_s: float,
        nodes_running: bool = True,
        *,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    ) -> str | None:
        """The run's hang reason after ``timeout_s`` of silence (before any rank's first line:
        ``start_timeout_s`` since the start), or None. ``nodes_running``: some node's launch
        script still runs (once every script ended the run is ending, not hanging)."""
        if self.alive:
            waited, limit = self.silent_s(), timeout_s
        else:
            waited, limit = self.starting_s(), start_timeout_s
        if not nodes_running or waited <= limit:
            self._suspect = False
            return None
        if not self._suspect:  # one more tick: let the readers deliver what is in the pipes
            self._suspect = True
            return None
        if not self.alive:
            return (
                f"hang: no rank's script printed anything in {waited:.0f}s since the start "
                f"(--start-timeout {start_timeout_s:g})"
            )
        return hang_reason(waited, timeout_s)


def dir_error_text(e: OSError) -> str:
    """``run directory full (No space left on device: /path)``: the run's final reason."""
    what = e.strerror or str(e)
    where = f": {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"run directory full ({what}{where})"
    return f"cannot write the run directory ({what}{where})"
