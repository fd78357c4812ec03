"""Calibration: efficiency factors measured on a real cluster, which later plans for that cluster
use in place of the catalog's figures.

A :class:`Calibration` belongs to a cluster (a GPU type and a network tier) and holds two
multipliers and an offset:

- ``compute`` multiplies the catalog's :attr:`GpuType.gemm_efficiency
  <engine.plan.catalog.GpuType.gemm_efficiency>`: the compute rate the run achieved against the
  rate the time model assumed (on a CPU rank, whose figures are nominal, it multiplies the rank's
  peak and memory bandwidth instead: :data:`NOMINAL_COMPUTE_RANGE`);
- ``network`` multiplies :attr:`NetworkType.efficiency
  <engine.plan.catalog.NetworkType.efficiency>`: the inter-node bus bandwidth a preflight
  measured against the bandwidth the time model assumed;
- ``memory_overhead_gib``: the run's measured peak memory less the plan's prediction, taken off
  the memory a layout may use.

The planner applies it where it resolves the hardware (:func:`apply_gpu`, :func:`apply_network`
from :mod:`engine.plan.planner` and :mod:`engine.plan.context`) when the spec carries one for the
same GPU (``Spec.calibration``). :mod:`engine.monitor.calibrate` fits one from a run directory with
the pure helpers here (:func:`steady_step_time`, :func:`solve_compute`, :func:`network_factor`);
``profiles.calibrations`` stores them by name. Of the planner it imports only the catalog
(``engine.plan.specs`` imports this module).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.errors import DtrainError
from engine.plan.catalog import CPU_KEY, GpuType, NetworkType

GIB: Final = 1024**3
COMPUTE_RANGE: Final = (0.02, 2.0)
"""Bounds of the compute factor. Below 1/50 the run was bound by something the time model does
not have (data loading, a sleep, a debugger), not by slower math; above 2 the modelled GEMMs
would run past the hardware's peak on every GPU in the catalog (the applied efficiency is capped
at 1 in any case)."""
NOMINAL_COMPUTE_RANGE: Final = (0.01, 100.0)
"""Bounds of the compute factor on a device whose figures are nominal (a CPU rank: its catalog
rates stand for no particular processor): a laptop core and a many-core server lie two orders of
magnitude apart, and there is no peak to cap them at."""
NETWORK_RANGE: Final = (0.05, 2.0)
"""Bounds of the network factor (the applied efficiency is capped at 1: bus bandwidth cannot
beat the line rate)."""
MAX_EFFICIENCY: Final = 1.0
"""Neither a GEMM nor a link runs faster than its peak, whatever a factor says."""
WARMUP_FRACTION: Final = 0.1
"""Share of a run's first steps left out as warm-up (allocator, kernel autotuning, first
collectives), at least :data:`MIN_WARMUP_STEPS`."""
MIN_WARMUP_STEPS: Final = 2
MIN_STEPS: Final = 5
"""Steps after warm-up a calibration needs: a median of fewer is noise."""


class CalibrationError(DtrainError):
    """A run cannot be calibrated from (no step lines, too few steps, another plan, a factor out
    of range); the message names the run and the fix."""


class CalibrationSource(BaseModel):
    """Where a calibration's figures come from: the run, when, and what was measured."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run: str
    """The run's name (its directory's name)."""
    run_dir: str
    """The run directory, as given to ``calibrate``."""
    date: str
    """When the calibration was fitted (UTC, ISO 8601)."""
    layout: str = ""
    """The layout the run trained, described (``DDP (ddp) dp=2``)."""
    world_size: int = Field(default=1, ge=1)
    measured: list[str] = Field(default_factory=list)
    """What was measured: ``step time``, ``peak memory``, ``inter-node bus bandwidth``."""
    steps: int = Field(default=0, ge=0)
    """Steps the median step time is taken over (after warm-up)."""
    warmup_steps: int = Field(default=0, ge=0)
    measured_step_time_s: float = Field(default=0.0, ge=0)
    """Median step time of the slowest rank, after warm-up."""
    predicted_step_time_s: float = Field(default=0.0, ge=0)
    """The plan's step time for the run's layout before calibration."""
    calibrated_step_time_s: float = Field(default=0.0, ge=0)
    """The same with the fitted factors."""
    measured_tokens_per_s: float = Field(default=0.0, ge=0)
    """Median tokens per second of all ranks together."""
    measured_peak_mem_gib: float | None = None
    """Peak memory of the fullest rank (GPU: ``torch.cuda.max_memory_allocated``; CPU ranks:
    the process's peak RSS)."""
    predicted_mem_gib: float | None = None
    preflight: str | None = None
    """The preflight run directory the network factor came from."""
    measured_busbw_gbps: float | None = None
    """Inter-node all-reduce bus bandwidth the preflight measured, GB/s (nccl-tests' busbw)."""


class Calibration(BaseModel):
    """Efficiency factors for one cluster (a GPU type and a network tier), fitted from a run."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    """The name it is saved under (``calibrations/NAME.json``)."""
    gpu: str
    """Catalog key of the GPU it was measured on (``h100-sxm``); applied only to plans for it."""
    network_tier: str = ""
    """Network tier of the measured cluster (``ib-ndr``); the network factor applies only to
    plans on that tier. Empty: a single-node run, no network factor."""
    compute: float = Field(default=1.0, ge=NOMINAL_COMPUTE_RANGE[0], le=NOMINAL_COMPUTE_RANGE[1])
    """Achieved / modelled compute rate: multiplies the catalog's large-GEMM efficiency, or on a
    CPU rank its nominal peak and memory bandwidth (:func:`apply_gpu`)."""
    network: float = Field(default=1.0, ge=NETWORK_RANGE[0], le=NETWORK_RANGE[1])
    """Multiplies the network tier's efficiency: measured / modelled inter-node bandwidth."""
    memory_overhead_gib: float | None = Field(default=None, ge=-1024, le=1024)
    """Measured peak memory less predicted, GiB per GPU; taken off what a layout may use."""
    source: CalibrationSource

    @model_validator(mode="after")
    def _compute_in_range(self) -> Calibration:
        lo, hi = NOMINAL_COMPUTE_RANGE if self.gpu == CPU_KEY else COMPUTE_RANGE
        if not lo <= self.compute <= hi:
            raise ValueError(f"compute ×{self.compute} on {self.gpu} is outside {lo}-{hi}")
        return self

    def label(self) -> str:
        """``calibrated from run X (compute ×0.62, network ×1.0)``: what plans say."""
        return (
            f"calibrated from run {self.source.run} (compute ×{_factor(self.compute)}, "
            f"network ×{_factor(self.network)})"
        )

    def applies_to(self, gpu_key: str) -> bool:
        """Whether it was measured on ``gpu_key`` (a catalog key)."""
        return self.gpu == gpu_key

    def network_applies(self, tier: str) -> bool:
        return bool(self.network_tier) and self.network_tier == tier


def _factor(x: float) -> str:
    """Two significant figures, at least one decimal (×0.62, ×1.0, ×1.3)."""
    text = f"{x:.2g}"
    return text if "." in text or "e" in text else f"{text}.0"


def base_gemm_efficiency(gpu: GpuType) -> float:
    """The catalog's large-GEMM efficiency of ``gpu``; an entry without one has it derived from
    its MFU, as the time model does (``Hardware.gemm``)."""
    return gpu.gemm_efficiency or min(0.95, gpu.achievable_mfu / 0.6)


def compute_range(gpu: GpuType) -> tuple[float, float]:
    """The compute factors a run on ``gpu`` can be fitted to: on a catalog GPU from
    :data:`COMPUTE_RANGE` up to the factor at which its GEMMs run at peak; on a CPU rank (nominal
    figures) :data:`NOMINAL_COMPUTE_RANGE`."""
    if gpu.is_cpu:
        return NOMINAL_COMPUTE_RANGE
    lo, hi = COMPUTE_RANGE
    return lo, max(lo, min(hi, MAX_EFFICIENCY / base_gemm_efficiency(gpu)))


def apply_gpu(gpu: GpuType, cal: Calibration) -> GpuType:
    """``gpu`` with its large-GEMM efficiency scaled by ``cal.compute`` (at most 1); a CPU rank,
    whose peak is nominal, with its peak rates and memory bandwidth scaled instead."""
    c = cal.compute
    if gpu.is_cpu:
        return dataclasses.replace(
            gpu,
            fp32_tflops=gpu.fp32_tflops * c,
            fp16_tflops=gpu.fp16_tflops * c,
            bf16_tflops=gpu.bf16_tflops * c,
            hbm_gbps=gpu.hbm_gbps * c,
        )
    eff = min(MAX_EFFICIENCY, base_gemm_efficiency(gpu) * c)
    return dataclasses.replace(gpu, gemm_efficiency=eff)


def compute_change(gpu: GpuType, cal: Calibration) -> str:
    """What ``cal``'s compute factor changes on ``gpu``, in words: ``GEMM efficiency 0.74 ->
    0.80``, or on a CPU rank ``nominal peak 0.5 -> 1.6 TFLOPS per rank``."""
    after = apply_gpu(gpu, cal)
    if gpu.is_cpu:
        return f"nominal peak {gpu.fp32_tflops:.3g} -> {after.fp32_tflops:.3g} TFLOPS per rank"
    return f"GEMM efficiency {base_gemm_efficiency(gpu):.2f} -> {after.gemm_efficiency:.3g}"


def apply_network(net: NetworkType, cal: Calibration) -> NetworkType:
    """``net`` with its efficiency scaled by ``cal.network`` (at most 1)."""
    return dataclasses.replace(net, efficiency=min(MAX_EFFICIENCY, net.efficiency * cal.network))


def calibrated_usable(cal: Calibration | None, gpu: GpuType, usable: int) -> int:
    """Memory a layout may use on ``gpu`` (``usable`` bytes by the catalog's reserves) less the
    calibration's measured overhead, when it was measured on this GPU: a layout whose predicted
    total fits this figure would have fitted at the run's measured peak. Never below 0 nor
    above the device's memory."""
    if cal is None or cal.memory_overhead_gib is None or not cal.applies_to(gpu.key):
        return usable
    return max(0, min(gpu.memory_bytes, usable - int(cal.memory_overhead_gib * GIB)))


def network_factor(
    measured_busbw_gbps: float, nominal_gbit_per_node: float, efficiency: float
) -> float:
    """The network factor from a measured inter-node all-reduce bus bandwidth (GB/s, nccl-tests'
    ``busbw``, which for a ring across nodes is bounded by one node's NICs together) against the
    modelled per-node bandwidth (``nominal × efficiency``, Gbit/s → GB/s). Raises
    :class:`CalibrationError` outside :data:`NETWORK_RANGE`."""
    modelled = nominal_gbit_per_node / 8 * efficiency
    if not (measured_busbw_gbps > 0 and math.isfinite(measured_busbw_gbps)):
        raise CalibrationError(
            f"measured.inter_node_busbw_gbps is {measured_busbw_gbps}; "
            "rerun the preflight across at least two nodes",
            field="--preflight",
        )
    factor = measured_busbw_gbps / modelled
    lo, hi = NETWORK_RANGE
    if not lo <= factor <= hi:
        raise CalibrationError(
            f"the preflight measured {measured_busbw_gbps:.3g} GB/s between nodes where the model "
            f"assumes {modelled:.3g} GB/s (×{factor:.3g}, outside {lo}-{hi}); check --network / "
            "--bandwidth-gbps of the run's spec",
            field="--preflight",
        )
    return factor


def warmup_steps(n: int) -> int:
    """Steps left out at the start of a run of ``n`` steps."""
    return max(MIN_WARMUP_STEPS, int(n * WARMUP_FRACTION))


def min_run_steps() -> int:
    """The fewest steps a run needs for :data:`MIN_STEPS` after its warm-up."""
    n = MIN_STEPS
    while n - warmup_steps(n) < MIN_STEPS:
        n += 1
    return n


def steady_step_time(per_step: Mapping[int, Sequence[float]], run: str) -> tuple[float, int, int]:
    """(median step time, steps used, warm-up steps left out) of a run whose step ``n`` took
    ``per_step[n]`` seconds on each rank that reported it. A step lasts as long as its slowest
    rank (the ranks meet in the gradient reduction). Raises :class:`CalibrationError` when fewer
    than :data:`MIN_STEPS` remain after warm-up."""
    if not per_step:
        raise CalibrationError(
            f"run {run} has no step lines with a step time (the example trainer's '[dtrain] "
            "step=N/TOTAL loss=... step_time_s=...', or the progress lines of the Hugging Face "
            "Trainer, Lightning, torchtitan, Megatron-LM, DeepSpeed or nanoGPT); train with one "
            "of them or print the trainer's line from your script",
            field="RUN_DIR",
        )
    order = sorted(per_step)
    skip = warmup_steps(len(order))
    kept = [max(per_step[s]) for s in order[skip:]]
    if len(kept) < MIN_STEPS:
        raise CalibrationError(
            f"run {run} has {len(order)} step(s), {len(kept)} after {skip} warm-up step(s); "
            f"calibrate needs a run of at least {min_run_steps()} steps: run more steps (--steps)",
            field="RUN_DIR",
        )
    return statistics.median(kept), len(kept), skip


def solve_compute(
    predict: Callable[[float], float],
    measured_s: float,
    run: str,
    *,
    span: tuple[float, float] = COMPUTE_RANGE,
) -> float:
    """The compute factor ``c`` with ``predict(c) == measured_s``: bisection in log space over
    ``span`` (:func:`compute_range` of the run's GPU), ``predict`` falling as ``c`` grows. Raises
    :class:`CalibrationError` when the measurement lies outside what the span can explain."""
    lo, hi = span
    hi = max(lo, hi)
    slowest, fastest = predict(lo), predict(hi)
    if measured_s > slowest:
        raise CalibrationError(
            f"run {run} took {measured_s:.4g} s a step, slower than the plan's {slowest:.4g} s "
            f"even with its compute rate ×{lo}; the run is bound by something the model does not "
            "have (data loading, a sleep, logging); calibrate from a run of the training alone",
            field="RUN_DIR",
        )
    if measured_s < fastest:
        raise CalibrationError(
            f"run {run} took {measured_s:.4g} s a step, faster than the plan's {fastest:.4g} s "
            "even at the hardware's peak; the run did less work than its plan (another model, "
            "batch or sequence length?): calibrate from a run of this plan",
            field="RUN_DIR",
        )
    a, b = math.log(lo), math.log(hi)
    for _ in range(60):
        mid = (a + b) / 2
        if predict(math.exp(mid)) > measured_s:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)
