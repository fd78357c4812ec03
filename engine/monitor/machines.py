"""The machines under a run, judged: one row per rank (its GPU through NVML, or its process's CPU
use and resident memory on a CPU rank), grouped by node, and the flags a person opens nvitop
for: a GPU that is hot, throttled, or far below its peers, named ("GPU 3 on node 1: throttled
(HW slowdown)").

Read by the monitor's GPU panel (:mod:`tui.widgets.gpu_panel`) and by ``monitor --follow``
(:mod:`cli.monitor_cmd`) from the rank states (:class:`engine.monitor.state.RankState`: the rank
agent's latest telemetry sample, the SLOW flag). Pure: values in, values out.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from engine.monitor.state import RankState

HOT_C = 85.0
"""A GPU at or above this temperature (°C) is flagged hot: data-centre GPUs start to slow their
clocks for heat a few degrees above it."""
SLOW_PEER_FRACTION = 0.5
"""A GPU busy less than this fraction of its node's median utilisation is flagged as far below
its peers (a rank waiting on the others, or a GPU running slow)."""
IDLE_UTIL_FLOOR = 10.0
"""Utilisation comparisons need a busy node: below this median (%) nothing is below its peers
(start-up, evaluation, a checkpoint save)."""
BENIGN_THROTTLE = frozenset({"idle", "app_clocks", "display_clocks", "sync_boost"})
"""NVML throttle reasons that are no slowdown: an idle GPU, clocks the application or the
display set, boost synchronised across GPUs."""
THROTTLE_NAMES = {
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "sw_thermal": "SW thermal slowdown",
    "hw_thermal": "HW thermal slowdown",
    "hw_power_brake": "HW power brake",
}
"""How a throttle reason reads in a flag."""


class FlagKind(StrEnum):
    HOT = "hot"
    THROTTLED = "throttled"
    SLOW = "slow"
    """Far below its peers: low utilisation against the node's median, or the SLOW step time."""
    ECC = "ecc"
    """Uncorrected ECC or XID errors."""


@dataclass(frozen=True, slots=True)
class MachineFlag:
    rank: int
    node: int
    kind: FlagKind
    text: str
    """The whole sentence: ``GPU 3 on node 1: throttled (HW slowdown)``."""


@dataclass(frozen=True, slots=True)
class MachineRow:
    """One rank's machine, as the GPU panel shows it. A CPU rank has ``gpu`` False and only
    ``cpu_pct`` / ``rss_bytes``; any reading may be None (not reported, no sample yet)."""

    rank: int
    node: int
    name: str
    """``GPU 3`` (its NVML index), ``GPU of rank 5`` (a UUID), or ``CPU rank 2``."""
    gpu: bool
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    throttle: tuple[str, ...] = ()
    """The reasons that slow the clocks (benign ones left out)."""
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    peak_bytes: int | None = None
    """torch's peak allocated CUDA memory (None: not reported)."""
    flags: tuple[MachineFlag, ...] = ()

    @property
    def sampled(self) -> bool:
        """The rank's agent has sent a sample."""
        return self.gpu or self.cpu_pct is not None or self.rss_bytes is not None


@dataclass(frozen=True, slots=True)
class NodeMachines:
    node: int
    host: str
    rows: tuple[MachineRow, ...]


def _name(st: RankState) -> tuple[str, bool]:
    tel = st.telemetry
    gpu = tel.gpu if tel is not None else None
    if gpu is None:
        return f"CPU rank {st.rank}", False
    if gpu.index.isdigit():
        return f"GPU {gpu.index}", True
    return f"GPU of rank {st.rank}", True


def _row(st: RankState) -> MachineRow:
    name, is_gpu = _name(st)
    tel = st.telemetry
    if tel is None:
        return MachineRow(st.rank, st.node, name, False)
    g = tel.gpu
    if g is None:
        return MachineRow(
            st.rank, st.node, name, False, cpu_pct=tel.cpu_pct, rss_bytes=tel.rss_bytes
        )
    return MachineRow(
        st.rank,
        st.node,
        name,
        is_gpu,
        util_pct=g.util_pct,
        mem_used_bytes=g.mem_used_bytes,
        mem_total_bytes=g.mem_total_bytes,
        power_w=g.power_w,
        power_limit_w=g.power_limit_w,
        temp_c=g.temp_c,
        throttle=tuple(t for t in g.throttle if t not in BENIGN_THROTTLE),
        cpu_pct=tel.cpu_pct,
        rss_bytes=tel.rss_bytes,
        peak_bytes=tel.cuda_peak_bytes,
    )


def _flags(row: MachineRow, st: RankState, node_median: float | None) -> tuple[MachineFlag, ...]:
    """What is wrong with one rank's machine, worst first."""
    who = f"{row.name} on node {row.node}"
    out: list[MachineFlag] = []

    def flag(kind: FlagKind, what: str) -> None:
        out.append(MachineFlag(row.rank, row.node, kind, f"{who}: {what}"))

    tel = st.telemetry
    g = tel.gpu if tel is not None else None
    if g is not None and ((g.ecc_uncorrected or 0) > 0 or g.xids):
        parts = []
        if g.ecc_uncorrected:
            parts.append(f"{g.ecc_uncorrected} uncorrected ECC error(s)")
        if g.xids:
            parts.append("XID " + ", ".join(str(x) for x in g.xids))
        flag(FlagKind.ECC, "; ".join(parts) + " (drain the node)")
    if row.throttle:
        names = ", ".join(THROTTLE_NAMES.get(t, t.replace("_", " ")) for t in row.throttle)
        flag(FlagKind.THROTTLED, f"throttled ({names})")
    if row.temp_c is not None and row.temp_c >= HOT_C:
        flag(FlagKind.HOT, f"hot ({row.temp_c:.0f} °C, ≥ {HOT_C:.0f})")
    if (
        row.util_pct is not None
        and node_median is not None
        and node_median >= IDLE_UTIL_FLOOR
        and row.util_pct < SLOW_PEER_FRACTION * node_median
    ):
        flag(
            FlagKind.SLOW,
            f"far below its peers ({row.util_pct:.0f} % busy, node median {node_median:.0f} %)",
        )
    elif st.straggler:
        t = st.typical_step_time
        took = f" ({t:.2f} s/step)" if t is not None else ""
        flag(FlagKind.SLOW, f"slow step time{took}, far below its peers")
    return tuple(out)


def machines(ranks: Mapping[int, RankState]) -> list[NodeMachines]:
    """Every rank's row, flagged, grouped by node (nodes and ranks in order)."""
    by_node: dict[int, list[RankState]] = {}
    for r in sorted(ranks):
        st = ranks[r]
        by_node.setdefault(st.node, []).append(st)
    out = []
    for node in sorted(by_node):
        states = by_node[node]
        rows = [_row(st) for st in states]
        utils = [r.util_pct for r in rows if r.util_pct is not None]
        median = statistics.median(utils) if len(utils) > 1 else None
        flagged = tuple(
            _with_flags(row, _flags(row, st, median)) for row, st in zip(rows, states, strict=True)
        )
        hosts = [st.host or (st.telemetry.host if st.telemetry else "") for st in states]
        host = next((h for h in hosts if h), "")
        out.append(NodeMachines(node, host, flagged))
    return out


def _with_flags(row: MachineRow, flags: tuple[MachineFlag, ...]) -> MachineRow:
    if not flags:
        return row
    return replace(row, flags=flags)


def all_flags(nodes: list[NodeMachines]) -> list[MachineFlag]:
    """Every flag of every node, in node and rank order."""
    return [f for n in nodes for row in n.rows for f in row.flags]


__all__ = [
    "HOT_C",
    "SLOW_PEER_FRACTION",
    "FlagKind",
    "MachineFlag",
    "MachineRow",
    "NodeMachines",
    "all_flags",
    "machines",
]
