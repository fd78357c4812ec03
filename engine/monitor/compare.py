"""Plan against measured: the step time, peak memory per GPU and MFU the run's plan promised
(``RUN/plan.json``), against what the ranks measure, with a stated margin; past it, the line
offers to calibrate ("step 1.80 s vs 1.20 s planned (+50 %) ... : press k to calibrate").

Read by the monitor (:mod:`tui.widgets.plan_line`) and ``monitor --follow``. Measured figures
come from the rank states: the median of the ranks' typical step times; the peak memory the
ranks report (torch's peak allocated CUDA memory from the agent, else the step lines' own
``mem_gb``); MFU is the plan's MFU scaled by planned / measured step time (the same model,
batch and GPUs do the same FLOPs a step, so MFU goes as one over the step time). Pure but for
:func:`read_plan_figures`, which never raises: a plan it cannot read is no comparison.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.errors import DtrainError
from engine.fsio import JSON_LIMIT, read_regular_text
from engine.monitor.state import RankState

MARGIN = 0.15
"""Measured and planned agree when within 15 % of each other (the calibration's purpose is to
close gaps larger than the time model's usual error)."""
GIB = 1024**3
CALIBRATE_KEY = "k"
"""The monitor's calibrate key (``c`` shows and hides the NCCL pane)."""


@dataclass(frozen=True, slots=True)
class PlanFigures:
    """What plan.json's recommended layout promises (None: not recorded)."""

    step_time_s: float | None = None
    mem_bytes: int | None = None
    """Memory per GPU, the plan's total."""
    mfu: float | None = None
    """Model FLOPs utilisation, 0..1."""


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    """``step``, ``peak mem`` or ``MFU``."""
    measured: float
    planned: float
    text: str
    """``1.80 s vs 1.20 s planned (+50 %)``."""

    @property
    def delta(self) -> float:
        """(measured - planned) / planned."""
        return (self.measured - self.planned) / self.planned

    @property
    def off(self) -> bool:
        return abs(self.delta) > MARGIN


@dataclass(frozen=True, slots=True)
class PlanVsMeasured:
    figures: tuple[Figure, ...]

    @property
    def disagrees(self) -> bool:
        """Some figure is off by more than :data:`MARGIN`: calibrating would help."""
        return any(f.off for f in self.figures)

    def line(self, offer: str = f"press {CALIBRATE_KEY} to calibrate") -> str:
        """``plan vs measured (±15 %): step 1.80 s vs 1.20 s planned (+50 %), ...``, ending in
        ``offer`` when calibrating would help (the TUI's key; in text, the command)."""
        body = ", ".join(f"{f.name} {f.text}" for f in self.figures)
        head = f"plan vs measured (±{100 * MARGIN:.0f} %): {body}"
        if self.disagrees:
            return f"{head}: {offer}"
        return f"{head}: within the margin"


def _num(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f > 0 else None


def plan_figures(data: object) -> PlanFigures | None:
    """The figures of a plan.json object (None: no recommended layout in it)."""
    rec = data.get("recommended") if isinstance(data, dict) else None
    if not isinstance(rec, dict):
        return None
    mem = rec.get("memory_per_gpu")
    total = _num(mem.get("total")) if isinstance(mem, dict) else None
    figures = PlanFigures(
        step_time_s=_num(rec.get("step_time_s")),
        mem_bytes=int(total) if total is not None else None,
        mfu=_num(rec.get("mfu")),
    )
    return figures if figures != PlanFigures() else None


def read_plan_figures(run_dir: Path | None) -> PlanFigures | None:
    """The plan's figures from ``RUN/plan.json`` (or the bundle's copy); None when there is no
    readable plan (a run written by hand, a damaged file): the monitor then compares nothing."""
    if run_dir is None:
        return None
    for path in (Path(run_dir) / "plan.json", Path(run_dir) / "bundle" / "plan.json"):
        try:
            text = read_regular_text(path, JSON_LIMIT, within=run_dir, label=str(path))
            return plan_figures(json.loads(text))
        except FileNotFoundError:
            continue
        except (DtrainError, OSError, UnicodeDecodeError, ValueError, RecursionError):
            return None
    return None


@dataclass(frozen=True, slots=True)
class Measured:
    step_time_s: float | None
    peak_bytes: int | None


def measured(ranks: Mapping[int, RankState]) -> Measured:
    """The run's median step time (over ranks' typical ones) and its largest peak memory."""
    times = [t for st in ranks.values() if (t := st.typical_step_time) is not None]
    peaks = [
        st.telemetry.cuda_peak_bytes
        for st in ranks.values()
        if st.telemetry is not None and st.telemetry.cuda_peak_bytes
    ]
    if not peaks:  # no CUDA sample: the step lines' own peak (GB, 10^9 bytes)
        peaks = [int(st.mem_gb * 1e9) for st in ranks.values() if st.mem_gb]
    return Measured(
        step_time_s=statistics.median(times) if times else None,
        peak_bytes=max(peaks) if peaks else None,
    )


def _pct(delta: float) -> str:
    """``+50 %``, ``-7 %``."""
    return f"{100 * delta:+.0f} %"


def compare(plan: PlanFigures | None, ranks: Mapping[int, RankState]) -> PlanVsMeasured | None:
    """Plan against measured, figure by figure; None until something can be compared."""
    if plan is None:
        return None
    m = measured(ranks)
    out: list[Figure] = []
    if plan.step_time_s and m.step_time_s:
        d = (m.step_time_s - plan.step_time_s) / plan.step_time_s
        text = f"{m.step_time_s:.2f} s vs {plan.step_time_s:.2f} s planned ({_pct(d)})"
        out.append(Figure("step", m.step_time_s, plan.step_time_s, text))
    if plan.mem_bytes and m.peak_bytes:
        got, want = m.peak_bytes / GIB, plan.mem_bytes / GIB
        d = (got - want) / want
        text = f"{got:.1f} GiB vs {want:.1f} GiB planned ({_pct(d)})"
        out.append(Figure("peak mem", got, want, text))
    if plan.mfu and plan.step_time_s and m.step_time_s:
        mfu = plan.mfu * plan.step_time_s / m.step_time_s
        d = (mfu - plan.mfu) / plan.mfu
        text = f"{100 * mfu:.0f} % vs {100 * plan.mfu:.0f} % planned ({_pct(d)})"
        out.append(Figure("MFU", mfu, plan.mfu, text))
    return PlanVsMeasured(tuple(out)) if out else None


__all__ = [
    "MARGIN",
    "Figure",
    "Measured",
    "PlanFigures",
    "PlanVsMeasured",
    "compare",
    "measured",
    "plan_figures",
    "read_plan_figures",
]
