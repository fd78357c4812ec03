"""The fault policy of a run: its timings, and who is to blame when it ends badly.

Called by the supervision of every launch backend (:mod:`engine.launch.supervise`); the SSH
backend's remote shell uses :data:`STOP_GRACE_S` too. Pure decisions on a node's state, no I/O.

The first rank that exits non-zero, a node whose connection drops, a run silent for
``hang_timeout_s`` (once a rank started; until then ``start_timeout_s`` since the nodes started),
ranks that never started in ``start_timeout_s`` while others did (:class:`RankStarts`), or a run directory that cannot be written (disk full) ends the run ``failed``,
naming rank, node and host, and every other node is stopped; a user's stop ends it ``stopped``;
it is ``succeeded`` only when every rank exited 0.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from engine.diagnose.flight import FR_PREFIX, TELEMETRY_PREFIX
from engine.launch.torchrun_output import FailureTable, describe_exit, shown
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

LAST_LINE_CHARS = 200
"""Characters of a node's last line kept (:class:`RankStarts`) and shown in a start failure."""
NODES_NAMED = 4
"""Nodes whose last line a start failure quotes; the others are counted."""
RANGES_NAMED = 8
"""Rank ranges a start failure spells out (``ranks 0-7, 9, 12-15``); the rest is ``…``."""
TELEMETRY_ENV = "DTRAIN_TELEMETRY_S"
"""The rank agent's telemetry interval (``engine.trainer.agent.TELEMETRY_ENV``; 0: off)."""


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


def agent_line(line: str) -> bool:
    """The rank agent's own line (telemetry, a Flight Recorder dump): it proves the rank's
    process runs the agent, not that its script makes progress."""
    return TELEMETRY_PREFIX in line or FR_PREFIX in line


def only_agent(lines: Iterable[str]) -> bool:
    """Every line is the agent's (stops at the first other line: O(1) for a normal batch)."""
    return all(agent_line(line) for line in lines)


def telemetry_off(*envs: Mapping[str, str]) -> bool:
    """Some environment the ranks get turns the agent's telemetry off (``DTRAIN_TELEMETRY_S``
    0 or less). Then a rank whose script prints only on rank 0 shows no sign of life at all."""
    for env in envs:
        value = env.get(TELEMETRY_ENV)
        if value is None:
            continue
        try:
            if float(value) <= 0:
                return True
        except ValueError:
            continue  # the agent refuses it and exits: the rank's exit fails the run
    return False


def safe_text(text: str, limit: int = LAST_LINE_CHARS) -> str:
    """``text`` for a terminal and one line: invalid UTF-8 as U+FFFD, every control or other
    unprintable character (an escape sequence's ESC) a space, at most ``limit`` characters."""
    cut = len(text) > limit
    out = "".join(c if c.isprintable() else " " for c in shown(text[:limit])).strip()
    return out[: limit - 1] + "…" if cut else out


def rank_ranges(ranks: Sequence[int], limit: int = RANGES_NAMED) -> str:
    """``0-7, 9, 12-15`` for sorted ``ranks``; past ``limit`` ranges, ``…``."""
    runs: list[tuple[int, int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], r)
        else:
            runs.append((r, r))
    text = [f"{a}-{b}" if b > a else str(a) for a, b in runs[:limit]]
    return ", ".join(text) + (", …" if len(runs) > limit else "")


class RankStarts:
    """Which ranks showed a sign of life (a first line of any kind, the agent's too), and each
    node's last line. Bounded: one byte per rank, two lines of at most :data:`LAST_LINE_CHARS`
    per node. The stream readers call :meth:`seen` (plain stores, safe from any thread); the
    supervisor reads."""

    def __init__(self, nodes: int, gpus_per_node: int) -> None:
        self.gpus_per_node = gpus_per_node
        self._started = bytearray(nodes * gpus_per_node)
        self._last = [""] * nodes
        """Each node's last line that is not the agent's (its torchrun's or a rank's)."""
        self._last_agent = [""] * nodes
        self._printed = bytearray(nodes)

    def seen(self, node: int, rank: int | None, lines: Sequence[str]) -> None:
        """``lines`` arrived from ``rank`` (None: the node's own) on ``node``."""
        if rank is not None and 0 <= rank < len(self._started):
            self._started[rank] = 1
        if not lines or not 0 <= node < len(self._last):
            return
        self._printed[node] = 1
        for line in reversed(lines):
            if not agent_line(line):
                self._last[node] = line[: LAST_LINE_CHARS + 1]
                return
        self._last_agent[node] = lines[-1][: LAST_LINE_CHARS + 1]

    def all_started(self) -> bool:
        return self._started.find(0) < 0

    def never_started(self) -> list[int]:
        """The ranks not seen yet, in order."""
        if self.all_started():
            return []
        return [r for r, seen in enumerate(self._started) if not seen]

    def node_said(self, node: int, host: str) -> str:
        """``last line from node 1 (host): …``, or ``node 1 (host) printed nothing``."""
        if not 0 <= node < len(self._last) or not self._printed[node]:
            return f"node {node} ({host}) printed nothing"
        line = self._last[node] or self._last_agent[node]
        return f"last line from node {node} ({host}): {safe_text(line)}"


def never_started_reason(
    starts: RankStarts, nodes: Sequence[NodeState], start_timeout_s: float
) -> str | None:
    """``rank 5 never started in 600 s (--start-timeout); last line from node 1 (host): …``,
    or None when every rank started."""
    missing = starts.never_started()
    if not missing:
        return None
    who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {rank_ranges(missing)}"
    gpn = starts.gpus_per_node
    bad = sorted({r // gpn for r in missing})
    hosts = {st.node: st.host for st in nodes}
    said = [starts.node_said(n, hosts.get(n, "?")) for n in bad[:NODES_NAMED]]
    if len(bad) > NODES_NAMED:
        said.append(f"{len(bad) - NODES_NAMED} more nodes")
    return f"{who} never started in {start_timeout_s:g} s (--start-timeout); " + "; ".join(said)


def blame_unstarted(
    missing: Sequence[int], gpus_per_node: int, nodes: int
) -> tuple[int | None, int | None]:
    """(rank, node) a start failure names: the one rank, the one node its ranks are on (not
    when every node's ranks are missing: then none is to blame more than another)."""
    if not missing:
        return None, None
    on = {r // gpus_per_node for r in missing}
    node = next(iter(on)) if len(on) == 1 and nodes > 1 else None
    return (missing[0] if len(missing) == 1 else None), node


class HangClock:
    """How long the ranks have been silent, on the launcher's own clock: the supervisor's
    :meth:`tick` credits any gap longer than :data:`STALL_S` between two ticks (the launcher was
    stopped while the ranks went on: their output waited in the pipes, unread), and a hang is
    declared only on two ticks in a row, so the readers get a tick to deliver what they read
    after a continue.

    Until a rank printed its first line (:attr:`alive`) the run is starting: the limit is the
    start timeout counted from :meth:`restart` (the nodes started), not the hang timeout; the
    hang timer starts at that first line. With :attr:`starts`, the start timeout also holds
    for each rank: past it, ranks that never showed a sign of life fail the run, whatever the
    others did.

    ``time.monotonic`` (CLOCK_MONOTONIC) is used, not CLOCK_BOOTTIME: it does not advance while
    the machine is suspended, which is no silence of the ranks either; a stopped process or a
    paused VM's clock jump is what the tick gap catches. Stream readers call :meth:`activity`
    (a float store, safe from any thread); the supervisor alone calls :meth:`tick` and
    :meth:`overdue`."""

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, starts: RankStarts | None = None
    ) -> None:
        self._clock = clock
        self.starts = starts
        """Each rank's first sign of life (the stream readers feed it), or None."""
        self.unstarted: list[int] = []
        """The ranks the last reason :meth:`overdue` gave names as never started."""
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
        nodes: Sequence[NodeState] | None = None,
    ) -> str | None:
        """The run's hang reason after ``timeout_s`` of silence (before any rank's first line:
        ``start_timeout_s`` since the start), or None. ``nodes_running``: some node's launch
        script still runs (once every script ended the run is ending, not hanging).
        ``nodes``: the run's nodes, to hold each rank to ``start_timeout_s`` (with
        :attr:`starts`); None: only the run as a whole."""
        reason = self._reason(timeout_s, start_timeout_s, nodes)
        if not nodes_running or reason is None:
            self._suspect = False
            return None
        if not self._suspect:  # one more tick: let the readers deliver what is in the pipes
            self._suspect = True
            return None
        return reason

    def _reason(
        self, timeout_s: float, start_timeout_s: float, nodes: Sequence[NodeState] | None
    ) -> str | None:
        self.unstarted = []
        starting = self.starting_s()
        late = starting > start_timeout_s
        if late and nodes is not None and self.starts is not None:
            why = never_started_reason(self.starts, nodes, start_timeout_s)
            if why is not None:
                self.unstarted = self.starts.never_started()
                return why
        if not self.alive:
            if not late:
                return None
            return (
                f"hang: no rank's script printed anything in {starting:.0f}s since the start "
                f"(--start-timeout {start_timeout_s:g})"
            )
        return hang_reason(self.silent_s(), timeout_s)


def dir_error_text(e: OSError) -> str:
    """``run directory full (No space left on device: /path)``: the run's final reason."""
    what = e.strerror or str(e)
    where = f": {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"run directory full ({what}{where})"
    return f"cannot write the run directory ({what}{where})"
