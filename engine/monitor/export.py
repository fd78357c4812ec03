"""``dtrain-tui monitor RUN --export csv|json``: a run's per-step series per rank and its
telemetry samples, as text, read from the rank logs (``RUN/logs/rank<R>.{stdout,stderr}.log``).

Steps: every step record any format gives (:func:`engine.monitor.logparse.parse_steps`, made
whole by :class:`~engine.monitor.logparse.StepTracker`): rank, step, the line's own time where it
gives one, loss, learning rate, throughput and its unit (tokens/s, else samples/s, else it/s from
the step time), step time, memory (GB), the format. Telemetry: each ``[dtrain] telemetry`` sample
of the rank agent (CPU use, RSS, CUDA peak, the GPU's NVML readings). JSON is
``{"steps": [...], "telemetry": [...]}``; CSV is one table with a ``kind`` column (``step`` or
``telemetry``) and the union of the columns. Pure but for reading the logs; a log it cannot read
is a :class:`~engine.errors.DtrainError` naming it.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import DtrainError
from engine.fsio import open_regular
from engine.monitor.logparse import STEP_GATE, StepInfo, StepTracker, parse_steps
from engine.monitor.telemetry import TELEMETRY_PREFIX, Telemetry, parse_telemetry_line

FORMATS = ("csv", "json")
MAX_LOG_BYTES = 512 * 1024**2
"""A rank log larger than this is read up to here (as calibrate does)."""
STEP_COLUMNS = (
    "rank",
    "step",
    "time",
    "loss",
    "lr",
    "throughput",
    "unit",
    "step_time_s",
    "mem_gb",
    "source",
)
TELEMETRY_COLUMNS = (
    "rank",
    "node",
    "host",
    "time",
    "cpu_pct",
    "rss_bytes",
    "cuda_peak_bytes",
    "gpu",
    "util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "temp_c",
    "sm_clock_mhz",
    "throttle",
)
_GATES = tuple(g.encode() for g in (*STEP_GATE, TELEMETRY_PREFIX))


@dataclass
class RunSeries:
    steps: list[dict[str, Any]] = field(default_factory=list)
    telemetry: list[dict[str, Any]] = field(default_factory=list)


def _throughput(info: StepInfo) -> tuple[float | None, str]:
    if info.tokens_per_s is not None:
        return info.tokens_per_s, "tokens/s"
    if info.samples_per_s is not None:
        return info.samples_per_s, "samples/s"
    if info.step_time_s:
        return 1.0 / info.step_time_s, "it/s"
    return None, ""


def step_row(rank: int, info: StepInfo) -> dict[str, Any]:
    tp, unit = _throughput(info)
    return {
        "rank": rank,
        "step": info.step,
        "time": info.ts,
        "loss": info.loss,
        "lr": info.lr,
        "throughput": tp,
        "unit": unit,
        "step_time_s": info.step_time_s,
        "mem_gb": info.mem_gb,
        "source": info.source.value,
    }


def telemetry_row(t: Telemetry) -> dict[str, Any]:
    g = t.gpu
    return {
        "rank": t.rank,
        "node": t.node,
        "host": t.host,
        "time": t.time,
        "cpu_pct": t.cpu_pct,
        "rss_bytes": t.rss_bytes,
        "cuda_peak_bytes": t.cuda_peak_bytes,
        "gpu": g.index if g is not None else None,
        "util_pct": g.util_pct if g is not None else None,
        "mem_used_bytes": g.mem_used_bytes if g is not None else None,
        "mem_total_bytes": g.mem_total_bytes if g is not None else None,
        "power_w": g.power_w if g is not None else None,
        "temp_c": g.temp_c if g is not None else None,
        "sm_clock_mhz": g.sm_clock_mhz if g is not None else None,
        "throttle": ",".join(g.throttle) if g is not None else None,
    }


def _rank_logs(run_dir: Path) -> list[tuple[int, Path]]:
    logs = run_dir / "logs"
    out = []
    for path in sorted(logs.glob("rank*.std*.log")) if logs.is_dir() else []:
        stem = path.name.split(".", 1)[0].removeprefix("rank")
        if stem.isdigit():
            out.append((int(stem), path))
    return sorted(out, key=lambda x: x[0])  # stable: stdout before stderr within a rank


def read_series(run_dir: Path) -> RunSeries:
    """Every rank's step records and telemetry samples, rank by rank, in log order."""
    run_dir = Path(run_dir)
    if not (run_dir / "logs").is_dir():
        raise DtrainError(
            f"{run_dir} has no logs/ directory; pass a run directory written by launch",
            field="RUN_DIR",
        )
    out = RunSeries()
    trackers: dict[int, StepTracker] = {}
    for rank, path in _rank_logs(run_dir):
        try:
            fd = open_regular(path, within=run_dir, label=str(path))
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_LOG_BYTES)
        except OSError as e:
            raise DtrainError(f"cannot read {path}: {e.strerror}", field="RUN_DIR") from None
        tracker = trackers.setdefault(rank, StepTracker())
        for raw in data.splitlines():  # also at each \r: a tqdm bar's updates
            if not any(g in raw for g in _GATES):
                continue
            line = raw.decode("utf-8", "replace")
            sample = parse_telemetry_line(line)
            if sample is not None:
                out.telemetry.append(telemetry_row(sample))
                continue
            for found in parse_steps(line):
                info = tracker.resolve(found)
                if info is not None and info.step is not None:
                    out.steps.append(step_row(rank, info))
    return out


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return repr(v)
    return str(v)


def export_text(series: RunSeries, fmt: str) -> str:
    """The series as ``csv`` or ``json`` text."""
    if fmt == "json":
        return json.dumps({"steps": series.steps, "telemetry": series.telemetry}, indent=1) + "\n"
    if fmt != "csv":
        raise DtrainError(f"--export {fmt!r}: use csv or json", field="--export")
    columns = ["kind", *dict.fromkeys((*STEP_COLUMNS, *TELEMETRY_COLUMNS))]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for kind, rows in (("step", series.steps), ("telemetry", series.telemetry)):
        for row in rows:
            w.writerow([kind, *(_cell(row.get(c)) for c in columns[1:])])
    return buf.getvalue()


__all__ = ["FORMATS", "RunSeries", "export_text", "read_series"]
