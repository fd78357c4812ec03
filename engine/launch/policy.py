"""The fault policy of a run: its timings, and who is to blame when it ends badly.

Called by the supervision of every launch backend (:mod:`engine.launch.supervise`); the SSH
backend's remote shell uses :data:`STOP_GRACE_S` too. Pure decisions on a node's state, no I/O.

The first rank that exits non-zero, a node whose connection drops, a run silent for
``hang_timeout_s``, or a run directory that cannot be written (disk full) ends the run ``failed``,
naming rank, node and host, and every other node is stopped; a user's stop ends it ``stopped``;
it is ``succeeded`` only when every rank exited 0.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field

from engine.launch.torchrun_output import FailureTable, describe_exit
from engine.rundir.record import RankRecord

STOP_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping a node."""
SUPERVISE_INTERVAL_S = 0.1
"""How often the supervisor looks at every node."""
LINGER_S = 5.0
"""Seconds a node's output may stay open after its script ended (a leftover child holds it)."""


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


def dir_error_text(e: OSError) -> str:
    """``run directory full (No space left on device: /path)``: the run's final reason."""
    what = e.strerror or str(e)
    where = f": {e.filename}" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"run directory full ({what}{where})"
    return f"cannot write the run directory ({what}{where})"
