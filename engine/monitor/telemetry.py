"""The rank agent's telemetry lines, read: one :class:`Telemetry` per ``[dtrain] telemetry {json}``.

The agent (``engine/trainer/agent.py``, in every bundle) prints one such line on each rank's
stderr every few seconds: CPU use and resident memory from /proc on every rank, the GPU through
NVML where there is one, torch's peak allocated CUDA memory once the script uses CUDA. The line
reaches the launcher like any other on every backend; :class:`engine.monitor.state.MonitorState`
keeps each rank's latest sample (``RankState.telemetry``). Pure: text in, values out; a line that
is not a whole sample gives None, never an exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.diagnose.flight import TELEMETRY_PREFIX

__all__ = [
    "TELEMETRY_PREFIX",
    "GpuSample",
    "Telemetry",
    "hidden_line",
    "parse_telemetry_line",
    "shown_lines",
]


def hidden_line(line: str) -> bool:
    """True for a telemetry line panes and terminals leave out: the marker with nothing but
    blanks before it (the rank log and the rank states still have it)."""
    at = line.find(TELEMETRY_PREFIX)
    return at >= 0 and not line[:at].strip()


def shown_lines(lines: Sequence[str]) -> Sequence[str]:
    """``lines`` as panes, ``launch`` and ``monitor --follow`` show them: without the agent's
    telemetry (noise every 5 s on every rank), the text before a marker kept (a progress bar's
    unfinished line). ``lines`` itself, not a copy, when none is there: one substring test over
    the joined batch, as :meth:`engine.monitor.state.MonitorState.ingest_lines` does."""
    if not lines or TELEMETRY_PREFIX not in "\n".join(lines):
        return lines
    out: list[str] = []
    for line in lines:
        at = line.find(TELEMETRY_PREFIX)
        if at < 0:
            out.append(line)
        elif line[:at].strip():
            out.append(line[:at].rstrip())
    return out


def _num(v: object) -> float | None:
    """A finite number, or None (JSON gives ints or floats; anything else is no reading)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: object) -> int | None:
    f = _num(v)
    return int(f) if f is not None else None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU reading through NVML; None: the GPU does not report it."""

    index: str = ""
    """The device as the rank sees it (an NVML index or a UUID from CUDA_VISIBLE_DEVICES)."""
    name: str = ""
    util_pct: float | None = None
    """Percent of the last sample period a kernel ran."""
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: int | None = None
    throttle: tuple[str, ...] = ()
    """Why the clocks are held down (``sw_power_cap``, ``hw_thermal``, ...; ``idle`` too)."""
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (volatile count)."""
    xid_total: int | None = None
    """XID errors the agent has seen since it started (None: no XID events on this GPU)."""
    xids: tuple[int, ...] = ()
    """The XID codes seen since the previous sample."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GpuSample:
        thr = d.get("throttle")
        xids = d.get("xids")
        return cls(
            index=str(d.get("index", "")),
            name=str(d.get("name", "")),
            util_pct=_num(d.get("util_pct")),
            mem_used_bytes=_int(d.get("mem_used_bytes")),
            mem_total_bytes=_int(d.get("mem_total_bytes")),
            power_w=_num(d.get("power_w")),
            power_limit_w=_num(d.get("power_limit_w")),
            temp_c=_num(d.get("temp_c")),
            sm_clock_mhz=_int(d.get("sm_clock_mhz")),
            throttle=tuple(str(t) for t in thr) if isinstance(thr, list) else (),
            ecc_uncorrected=_int(d.get("ecc_uncorrected")),
            xid_total=_int(d.get("xid_total")),
            xids=tuple(x for x in map(_int, xids) if x is not None)
            if isinstance(xids, list)
            else (),
        )


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One rank's sample."""

    rank: int
    node: int = 0
    host: str = ""
    time: float = 0.0
    """When the rank took it (wall seconds)."""
    cpu_pct: float | None = None
    """CPU time of the rank's process over the last period, 100 = one core busy."""
    rss_bytes: int | None = None
    """Resident memory of the rank's process."""
    cuda_peak_bytes: int | None = None
    """torch.cuda.max_memory_allocated (None: the script has not used CUDA)."""
    cuda_allocated_bytes: int | None = None
    gpu: GpuSample | None = None
    """None on a CPU rank (no NVML, no GPU)."""


def parse_telemetry_line(line: str) -> Telemetry | None:
    """The sample in one line (launcher prefixes removed or not: text before the marker, such as
    a progress bar's unfinished line, is ignored), or None for any other line."""
    at = line.find(TELEMETRY_PREFIX)
    if at < 0:
        return None
    try:
        body = json.loads(line[at + len(TELEMETRY_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    rank = _int(body.get("rank"))
    if rank is None or rank < 0:
        return None
    gpu = body.get("gpu")
    return Telemetry(
        rank=rank,
        node=_int(body.get("node")) or 0,
        host=str(body.get("host") or ""),
        time=_num(body.get("time")) or 0.0,
        cpu_pct=_num(body.get("cpu_pct")),
        rss_bytes=_int(body.get("rss_bytes")),
        cuda_peak_bytes=_int(body.get("cuda_peak_bytes")),
        cuda_allocated_bytes=_int(body.get("cuda_allocated_bytes")),
        gpu=GpuSample.from_json(gpu) if isinstance(gpu, dict) else None,
    )
