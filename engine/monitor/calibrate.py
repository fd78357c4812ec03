"""Fit a :class:`~engine.plan.calibration.Calibration` from a run directory: what ``dtrain-tui
calibrate RUN_DIR`` and the monitor's "calibrate from this run" call.

It reads the run's plan (``RUN/plan.json``, the bundle's), the step lines every rank printed
(``RUN/logs/rank<R>.{stdout,stderr}.log``: the example trainer's ``[dtrain] step=N/TOTAL
loss=... tokens_per_s=... step_time_s=... mem_gb=...``, or the progress lines of the Hugging Face
Trainer, Lightning, torchtitan, Megatron-LM, DeepSpeed or a nanoGPT-style loop: see
:func:`engine.monitor.logparse.parse_steps`)
and, when given, a preflight's ``preflight.json`` (``measured.inter_node_busbw_gbps``). The
network factor comes from the preflight (1.0 without one); the compute factor is then the one
with which the planner's step time for the run's own layout equals the measured median step
time (the planner is asked, not a formula, so the fit follows whatever the time model holds);
the memory overhead is the measured peak less the predicted one.

Pure but for reading files; raises :class:`~engine.plan.calibration.CalibrationError` (one line
naming the run and the fix) for a run it cannot use.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.errors import DtrainError, validation_messages
from engine.fsio import JSON_LIMIT, open_regular, read_regular_text
from engine.monitor.logparse import STEP_GATE, StepInfo, StepTracker, parse_steps
from engine.plan.annotate import describe
from engine.plan.calibration import (
    GIB,
    Calibration,
    CalibrationError,
    CalibrationSource,
    compute_range,
    network_factor,
    solve_compute,
    steady_step_time,
)
from engine.plan.catalog import GpuType, get_gpu, get_network
from engine.plan.planner import plan
from engine.plan.result import Layout, Plan
from engine.plan.specs import LayoutSpec, Spec

PREFLIGHT_JSON = "preflight.json"
_FORCED_FIELDS = (
    "strategy",
    "framework",
    "tp",
    "pp",
    "dp",
    "cp",
    "ep",
    "zero_stage",
    "offload",
    "sequence_parallel",
    "micro_batch",
    "recompute",
    "virtual_stages",
)
"""The layout fields a run's plan.json records that re-planning it forces."""
_STEP_GATE = tuple(g.encode() for g in STEP_GATE)
"""Substrings one of which every step line holds (any format's), as bytes."""
_MAX_LOG_BYTES = 512 * 1024**2
"""A rank log larger than this is read up to here: step lines of a long run are many."""


@dataclass
class RunSteps:
    """What a run's step lines say, per step."""

    times: dict[int, dict[int, float]] = field(default_factory=dict)
    """step -> rank -> step_time_s."""
    tokens: dict[int, dict[int, float]] = field(default_factory=dict)
    """step -> rank -> tokens_per_s."""
    peak_mem_gb: float = 0.0
    ranks: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class CalibrationResult:
    """A fitted calibration and the figures ``calibrate`` prints."""

    calibration: Calibration
    before: Plan
    """The run's layout planned with the catalog's figures."""
    after: Plan
    """The same with the calibration."""


def read_steps(run_dir: Path) -> RunSteps:
    """Every step line of every rank's logs (later lines of a step win: a restarted run)."""
    out = RunSteps()
    trackers: dict[int, StepTracker] = {}
    logs = Path(run_dir) / "logs"
    for path in sorted(logs.glob("rank*.std*.log")) if logs.is_dir() else []:
        stem = path.name.split(".", 1)[0].removeprefix("rank")
        if not stem.isdigit():
            continue
        rank = int(stem)
        try:
            fd = open_regular(path, within=run_dir, label=str(path))
            with os.fdopen(fd, "rb") as f:
                data = f.read(_MAX_LOG_BYTES)
        except DtrainError as e:
            raise CalibrationError(e.message, field="RUN_DIR") from None
        except OSError as e:
            raise CalibrationError(f"cannot read {path}: {e.strerror}", field="RUN_DIR") from None
        tracker = trackers.setdefault(rank, StepTracker())
        for raw in data.splitlines():  # also at each \r: a tqdm bar's updates
            if not any(g in raw for g in _STEP_GATE):
                continue
            for found in parse_steps(raw.decode("utf-8", "replace")):
                info = tracker.resolve(found)
                if info is not None and info.step is not None:
                    _add_step(out, rank, info.step, info)
    return out


def _add_step(out: RunSteps, rank: int, step: int, info: StepInfo) -> None:
    """Account for one of ``rank``'s step records (one without a step time only for memory)."""
    if info.mem_gb is not None and math.isfinite(info.mem_gb):
        out.peak_mem_gb = max(out.peak_mem_gb, info.mem_gb)
    t = info.step_time_s
    if t is None or not (math.isfinite(t) and t > 0 and step >= 0):
        return
    out.times.setdefault(step, {})[rank] = t
    tps = info.tokens_per_s
    if tps is not None and math.isfinite(tps) and tps >= 0:
        out.tokens.setdefault(step, {})[rank] = tps
    out.ranks.add(rank)


def read_run_plan(run_dir: Path) -> tuple[Spec, dict[str, Any]]:
    """The run's spec and its recommended layout (as recorded) from ``RUN/plan.json`` (or the
    bundle's copy)."""
    run_dir = Path(run_dir)
    path = next(
        # lexists: one that is there but no regular file is refused by name below, not missed
        (
            p
            for p in (run_dir / "plan.json", run_dir / "bundle" / "plan.json")
            if os.path.lexists(p)
        ),
        None,
    )
    if path is None:
        raise CalibrationError(
            f"{run_dir} has no plan.json; pass a run directory written by `dtrain-tui launch`",
            field="RUN_DIR",
        )
    try:
        data = json.loads(read_regular_text(path, JSON_LIMIT, within=run_dir, label=str(path)))
    except DtrainError as e:
        raise CalibrationError(e.message, field="RUN_DIR") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CalibrationError(f"{path} is not a readable plan: {e}", field="RUN_DIR") from None
    rec = data.get("recommended") if isinstance(data, dict) else None
    spec_data = data.get("spec") if isinstance(data, dict) else None
    if not isinstance(rec, dict) or not isinstance(spec_data, dict):
        raise CalibrationError(
            f"{path} has no 'spec' and 'recommended' layout (a bundle written by hand?); "
            "calibrate from a run of a bundle `dtrain-tui write` or `launch` wrote",
            field="RUN_DIR",
        )
    try:
        spec = Spec.model_validate({k: v for k, v in spec_data.items() if k != "calibration"})
    except ValidationError as e:
        raise CalibrationError(
            f"{path}: " + "; ".join(validation_messages(e, "spec")), field="RUN_DIR"
        ) from None
    return spec, rec


def read_preflight(where: Path) -> float | None:
    """``measured.inter_node_busbw_gbps`` of a preflight (its run directory or the
    preflight.json itself); None when it measured no inter-node figure (one node)."""
    path = Path(where)
    if path.is_dir():
        path = path / PREFLIGHT_JSON
    try:
        data = json.loads(read_regular_text(path, JSON_LIMIT, label=str(path), follow=True))
    except DtrainError as e:
        raise CalibrationError(e.message, field="--preflight") from None
    except FileNotFoundError:
        raise CalibrationError(
            f"{path} not found; pass the run directory `dtrain-tui preflight` wrote",
            field="--preflight",
        ) from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CalibrationError(f"{path} is not readable JSON: {e}", field="--preflight") from None
    measured = data.get("measured") if isinstance(data, dict) else None
    value = measured.get("inter_node_busbw_gbps") if isinstance(measured, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CalibrationError(
            f"{path}: measured.inter_node_busbw_gbps is {value!r}, not a number",
            field="--preflight",
        )
    return float(value)


def _forced(spec: Spec, rec: dict[str, Any], run: str) -> Spec:
    """``spec`` with the run's layout forced, so re-planning it estimates that layout."""
    given = {k: rec[k] for k in _FORCED_FIELDS if rec.get(k) is not None}
    try:
        layout = LayoutSpec.model_validate(given)
    except ValidationError as e:
        raise CalibrationError(
            f"run {run}'s plan.json records a layout this dtrain-tui cannot read: "
            + "; ".join(validation_messages(e, "recommended")),
            field="RUN_DIR",
        ) from None
    return spec.model_copy(update={"layout": layout, "calibration": None})


def _same_layout(a: Layout, rec: dict[str, Any]) -> bool:
    """Whether re-planning reproduced the layout plan.json records (its degrees and its split
    of the global batch)."""
    mine = a.to_json_dict()
    keys = ("strategy", "framework", "tp", "pp", "dp", "cp", "ep", "micro_batch", "grad_accum")
    return all(rec.get(k, mine[k]) == mine[k] for k in keys)


def calibrate_run(
    run_dir: Path,
    *,
    name: str | None = None,
    preflight: Path | None = None,
    expect_gpu: str | None = None,
    now: datetime | None = None,
) -> CalibrationResult:
    """Fit a calibration from ``run_dir``. ``expect_gpu``: the GPU of the cluster it is for (a
    profile's); a run planned for another is refused."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CalibrationError(
            f"{run_dir} is not a directory; pass a run directory", field="RUN_DIR"
        )
    run = run_dir.resolve().name
    spec, rec = read_run_plan(run_dir)
    gpu = _run_gpu(spec, run, expect_gpu)
    steps = read_steps(run_dir)
    _check_ranks(steps, spec.hardware.world_size, run)
    measured, used, skipped = steady_step_time(
        {s: list(r.values()) for s, r in steps.times.items()}, run
    )
    forced = _forced(spec, rec, run)
    before = _replan(forced, rec, run)

    busbw = read_preflight(preflight) if preflight is not None else None
    factor_net, tier = _network_fit(spec, busbw)
    mem_gib = steps.peak_mem_gb * 1e9 / GIB if steps.peak_mem_gb > 0 else None
    predicted_gib = before.recommended.memory_per_gpu.total / GIB
    measured_what = ["step time"]
    if busbw is not None:
        measured_what.append("inter-node bus bandwidth")
    if mem_gib is not None:
        measured_what.append("peak memory")
    stamp = (now or datetime.now(UTC)).astimezone(UTC).replace(microsecond=0)
    tok = [sum(r.values()) for s, r in sorted(steps.tokens.items())[skipped:]]
    source = CalibrationSource(
        run=run,
        run_dir=str(run_dir),
        date=stamp.isoformat().replace("+00:00", "Z"),
        layout=describe(before.recommended),
        world_size=spec.hardware.world_size,
        measured=measured_what,
        steps=used,
        warmup_steps=skipped,
        measured_step_time_s=measured,
        predicted_step_time_s=before.recommended.step_time_s,
        measured_tokens_per_s=statistics.median(tok) if tok else 0.0,
        measured_peak_mem_gib=None if mem_gib is None else round(mem_gib, 4),
        predicted_mem_gib=round(predicted_gib, 4),
        preflight=None if preflight is None else str(preflight),
        measured_busbw_gbps=busbw,
    )
    base = Calibration(
        name=name or run,
        gpu=gpu.key,
        network_tier=tier,
        network=factor_net,
        memory_overhead_gib=None if mem_gib is None else round(mem_gib - predicted_gib, 4),
        source=source,
    )
    return _fit_compute(base, forced, before, measured, run, gpu)


def _run_gpu(spec: Spec, run: str, expect_gpu: str | None) -> GpuType:
    """The GPU the run was planned for; refused when it is not ``expect_gpu``."""
    try:
        gpu = get_gpu(spec.hardware.gpu)
    except ValueError as e:
        raise CalibrationError(f"run {run}'s plan: {e}", field="RUN_DIR") from None
    try:
        expected = None if expect_gpu is None else get_gpu(expect_gpu).key
    except ValueError as e:
        raise CalibrationError(str(e), field="--profile") from None
    if expected is not None and expected != gpu.key:
        raise CalibrationError(
            f"run {run} was planned for {gpu.key}, not {expected}; calibrate a profile from a "
            "run on its own cluster",
            field="--profile",
        )
    return gpu


def _network_fit(spec: Spec, busbw: float | None) -> tuple[float, str]:
    """The network factor a preflight's measured ``busbw`` gives (1.0 without one) and the tier
    it is for ('' for a one-node run measured by none)."""
    net = get_network(spec.network.tier)
    factor = 1.0
    if busbw is not None:
        nominal = spec.network.bandwidth_gbps or net.gbps_per_node
        factor = network_factor(busbw, nominal, net.efficiency)
    tier = spec.network.tier.value if (spec.hardware.nodes > 1 or busbw is not None) else ""
    return factor, tier


def _check_ranks(steps: RunSteps, world: int, run: str) -> None:
    """Refuse logs of more ranks than the run's plan has (they are another plan's)."""
    if steps.ranks and max(steps.ranks) >= world:
        raise CalibrationError(
            f"run {run}'s logs have rank {max(steps.ranks)} but its plan.json is for {world} "
            "rank(s): the logs belong to another plan; calibrate from a run launched from its "
            "own bundle",
            field="RUN_DIR",
        )


def _replan(forced: Spec, rec: dict[str, Any], run: str) -> Plan:
    """The run's layout planned again with the catalog's figures; it must be the one recorded."""
    try:
        before = plan(forced)
    except DtrainError as e:
        raise CalibrationError(
            f"run {run}'s layout cannot be planned by this dtrain-tui ({e}); calibrate from a "
            "run written by this version",
            field="RUN_DIR",
        ) from None
    if not _same_layout(before.recommended, rec):
        raise CalibrationError(
            f"run {run}'s plan.json records {rec.get('strategy')} with degrees this dtrain-tui "
            f"plans as {describe(before.recommended)}: a different plan; calibrate from a run "
            "written by this version",
            field="RUN_DIR",
        )
    return before


def _fit_compute(
    base: Calibration, forced: Spec, before: Plan, measured: float, run: str, gpu: GpuType
) -> CalibrationResult:
    """``base`` with the compute factor at which the planner's step time is ``measured``."""

    def predict(c: float) -> float:
        cal = base.model_copy(update={"compute": c, "memory_overhead_gib": None})
        return plan(forced.model_copy(update={"calibration": cal})).recommended.step_time_s

    compute = solve_compute(predict, measured, run, span=compute_range(gpu))
    cal = Calibration.model_validate({**base.model_dump(), "compute": round(compute, 4)})
    after = plan(forced.model_copy(update={"calibration": cal}))
    cal = cal.model_copy(
        update={
            "source": base.source.model_copy(
                update={"calibrated_step_time_s": after.recommended.step_time_s}
            )
        }
    )
    return CalibrationResult(calibration=cal, before=before, after=after)
