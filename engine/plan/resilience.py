"""What failures will cost a plan, before the run. The planner calls :func:`resilience` for the
recommended layout; the Plan carries the answer (:class:`engine.plan.result.Resilience`), which
``plan``, ``plan --json``, the wizard's decision step and the bundle (its default checkpoint
interval) read.

The model, each part hand-checkable (tests/engine/test_resilience.py):

- a checkpoint holds the parameters and the optimizer states (the fp32 master copy included),
  in the framework's own bytes a parameter: :func:`engine.plan.memory.model_states` with no
  sharding gives the whole, the layout's memory breakdown what the busiest GPU holds;
- every node writes its share in parallel (PyTorch DCP spreads replicated tensors over the
  ranks; Megatron's distributed checkpoint saves fully parallel), so one save takes
  ``total / nodes / bandwidth``;
- interruptions arrive at a fleet's published rate per GPU-hour (:data:`FLEET_FIGURES`), so the
  run's mean time between them is ``1 / (rate x GPUs)``;
- Young's interval ``sqrt(2 x save x MTBF)`` (Young 1974; Daly 2006 gives it as the first-order
  optimum) minimises the saves plus the lost work;
- goodput, the share of GPU time that trains: ``tau / (tau + save)`` of the time between saves,
  times ``1 - (restart + (tau + save) / 2) / MTBF`` for the work each interruption loses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import PurePosixPath

from engine.plan.dims import ModelDims
from engine.plan.memory import model_states, moments_bf16_apply
from engine.plan.names import CkptStorage, Framework, Offload, Strategy
from engine.plan.result import Layout, Resilience
from engine.plan.specs import Spec

__all__ = [
    "FLEET_FIGURES",
    "PARALLEL_FS_AGGREGATE_GBPS",
    "RESTART_S",
    "STORAGE_GBPS",
    "FleetFigure",
    "checkpoint_bytes",
    "goodput",
    "resilience",
    "shared_ckpt_dir",
    "summary_lines",
    "young_interval_s",
]


@dataclass(frozen=True, slots=True)
class FleetFigure:
    """A published count of unexpected interruptions on a training fleet (tests/data/
    fleet_failures.json holds the same, with the quotes)."""

    name: str
    interruptions: int
    days: float
    gpus: int
    source: str

    @property
    def per_gpu_hour(self) -> float:
        return self.interruptions / (self.days * 24 * self.gpus)


FLEET_FIGURES = (
    FleetFigure(
        name="Llama 3 405B pre-training (16,384 H100)",
        interruptions=419,
        days=54,
        gpus=16384,
        source="Grattafiori et al. 2024, The Llama 3 Herd of Models, §3.3.4: 419 unexpected "
        "interruptions in a 54-day snapshot (466 with the 47 planned ones)",
    ),
    FleetFigure(
        name="OPT-175B's fleet (992 A100)",
        interruptions=105,
        days=60,
        gpus=992,
        source="Zhang et al. 2022, OPT: Open Pre-trained Transformer Language Models, §2.4-2.5: "
        "on 992 80GB A100, hardware failures caused at least 35 manual restarts and an "
        "estimated 70+ automatic ones over the course of 2 months",
    ),
)
"""The fleets the interruption rate comes from, each checked against its source (tests/data/
fleet_failures.json quotes them). The first, the newest and largest, is the plan's rate; the
highest of them, the worst case the plan also prices (:attr:`Resilience.worst_mtbf_s`)."""

RESTART_S = 600.0
"""Seconds from an interruption to training again (detect the failure, stop every rank,
relaunch, load the checkpoint): an assumption of ten minutes, not a measurement."""

STORAGE_GBPS: dict[CkptStorage, tuple[float, str]] = {
    CkptStorage.LOCAL: (
        16.0,
        "local NVMe: one data-centre PCIe 4.0 x4 drive writes 2-4 GB/s sequentially (vendors' "
        "datasheets); 2 GB/s, the low end",
    ),
    CkptStorage.PARALLEL_FS: (
        40.0,
        "parallel file system: a Lustre/GPFS client writes a few GB/s over its fabric link, "
        "less while other nodes write too; 5 GB/s a node, an assumption",
    ),
    CkptStorage.OBJECT: (
        8.0,
        "object storage: about 100 MB/s a connection, more in parallel (AWS's S3 performance "
        "guidelines); 1 GB/s a node with ~10 parallel uploads",
    ),
}
"""Default write bandwidth per node, Gbit/s, for each storage kind, and where it comes from;
``--ckpt-bandwidth-gbps`` replaces it with the user's own."""

PARALLEL_FS_AGGREGATE_GBPS = 16_000.0
"""What a parallel file system takes from all nodes together, Gbit/s, when its per-node
default is used: 2 TB/s, the sustained throughput of the Tectonic cluster Llama 3 checkpointed
to (Grattafiori et al. 2024, §3.3.1: 2 TB/s sustained, 7 TB/s peak)."""


def checkpoint_bytes(dims: ModelDims, spec: Spec, lay: Layout) -> tuple[int, int]:
    """(bytes the busiest GPU holds of a checkpoint, bytes of the whole checkpoint): the
    parameters and optimizer states the memory model counts, without the gradients."""
    strategy = Strategy.FSDP_FULL if lay.framework == Framework.FSDP else lay.strategy
    whole = model_states(
        float(dims.params_total),
        1,
        framework=lay.framework,
        strategy=strategy,
        zero_stage=lay.zero_stage,
        precision=lay.precision,
        optimizer=spec.training.optimizer,
        offload=Offload.NONE,
        moments_bf16=moments_bf16_apply(lay),
    )
    total = int(whole.params + whole.optimizer)
    mem = lay.memory_per_gpu
    # What lives on the host is saved too: ZeRO-Offload's states (counted there, not in the
    # optimizer's share) or Megatron's states between steps (counted in both); never the
    # offloaded activations.
    on_host = mem.cpu_bytes - mem.host_activations
    per_gpu = min(total, mem.params + max(mem.optimizer, on_host))
    return per_gpu, total


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    """Young's checkpoint interval: ``sqrt(2 x save x MTBF)``."""
    return math.sqrt(2 * save_s * mtbf_s)


def goodput(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """Share of GPU time that trains with a save every ``interval_s`` of work: the saves take
    ``save_s / (interval_s + save_s)`` and each interruption loses half a period and the
    restart. In [0, 1]."""
    period = interval_s + save_s
    if period <= 0:
        return 0.0
    lost = (restart_s + period / 2) / mtbf_s if mtbf_s > 0 else 1.0
    return max(0.0, min(1.0, interval_s / period * (1 - lost)))


def _storage(spec: Spec) -> CkptStorage:
    tr = spec.training
    if tr.ckpt_storage is not None:
        return tr.ckpt_storage
    return CkptStorage.PARALLEL_FS if spec.hardware.nodes > 1 else CkptStorage.LOCAL


def resilience(dims: ModelDims, spec: Spec, lay: Layout, world: int, nodes: int) -> Resilience:
    """What failures will cost ``lay`` on ``world`` GPUs over ``nodes`` nodes."""
    tr = spec.training
    per_gpu, total = checkpoint_bytes(dims, spec, lay)
    storage = _storage(spec)
    default_gbps, source = STORAGE_GBPS[storage]
    gbps = tr.ckpt_bandwidth_gbps or default_gbps
    if tr.ckpt_bandwidth_gbps:
        source = "--ckpt-bandwidth-gbps"
    save_s = total / max(1, nodes) / (gbps * 1e9 / 8)
    if storage == CkptStorage.PARALLEL_FS and not tr.ckpt_bandwidth_gbps:
        save_s = max(save_s, total / (PARALLEL_FS_AGGREGATE_GBPS * 1e9 / 8))
    fleet = FLEET_FIGURES[0]
    rate = fleet.per_gpu_hour
    mtbf_s = 3600.0 / (rate * max(1, world))
    interval_s = young_interval_s(save_s, mtbf_s)
    step = lay.step_time_s if lay.step_time_s > 0 else 1.0
    interval_steps = max(1, round(interval_s / step))
    note = None
    if tr.ckpt_every is not None:
        every = tr.ckpt_every
    elif nodes > 1 and not shared_ckpt_dir(spec):
        every = 0
        note = (
            f"no checkpoints by default on {nodes} nodes: the bundle's checkpoints/ is each "
            "node's own; --ckpt-dir /an/absolute/path every node reaches (or --ckpt-shared) "
            f"saves every {interval_steps} steps"
        )
    else:
        every = interval_steps
    if every > 0:
        work_s, save = every * step, save_s
    else:
        # No checkpoints: an interruption loses the run so far, half of it on average.
        hours = lay.gpu_hours / world if lay.gpu_hours else None
        work_s, save = (hours * 3600 if hours else tr.steps * step), 0.0
    lost = RESTART_S + (work_s + save) / 2
    worst = max(FLEET_FIGURES, key=lambda f: f.per_gpu_hour)
    worst_mtbf_s = 3600.0 / (worst.per_gpu_hour * max(1, world))
    return Resilience(
        ckpt_bytes_per_gpu=per_gpu,
        ckpt_bytes_total=total,
        storage=storage.value,
        bandwidth_gbps=gbps,
        bandwidth_source=source,
        save_s=save_s,
        failures_per_gpu_hour=rate,
        failure_source=fleet.source,
        mtbf_s=mtbf_s,
        restart_s=RESTART_S,
        interval_s=interval_s,
        interval_steps=interval_steps,
        every=every,
        lost_per_failure_s=lost,
        goodput=goodput(work_s, save, RESTART_S, mtbf_s),
        expected_interruptions=None if lay.gpu_hours is None else rate * lay.gpu_hours,
        worst_source=worst.name,
        worst_mtbf_s=worst_mtbf_s,
        worst_goodput=goodput(work_s, save, RESTART_S, worst_mtbf_s),
        note=note,
    )


def shared_ckpt_dir(spec: Spec) -> bool:
    """Whether every node reaches the spec's checkpoint directory: an absolute
    ``training.ckpt_dir`` (taken as shared storage), or the user's word (``ckpt_shared``)."""
    tr = spec.training
    return bool(tr.ckpt_shared) or bool(tr.ckpt_dir and PurePosixPath(tr.ckpt_dir).is_absolute())


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n / 1e3:.3g} kB"


def _duration(s: float) -> str:
    if s >= 2 * 86400:
        return f"{s / 86400:.3g} days"
    if s >= 2 * 3600:
        return f"{s / 3600:.3g} h"
    if s >= 120:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def _share(x: float) -> str:
    return f"{x:.3%}" if x > 0.999 else f"{x:.1%}"


def summary_lines(res: Resilience) -> list[str]:
    """The plan's "what failures cost" lines (``plan`` and the wizard's decision step)."""
    every = (
        f"every {res.every} steps" if res.every else "none: an interruption loses the run so far"
    )
    best = f"Young/Daly's sqrt(2 x save x MTBF) = {_duration(res.interval_s)}"
    lines = [
        f"checkpoint: {_size(res.ckpt_bytes_per_gpu)} per GPU, {_size(res.ckpt_bytes_total)} "
        f"in all; one save {_duration(res.save_s)} at {res.bandwidth_gbps:g} Gbit/s a node "
        f"({res.storage})",
        f"interruptions: one every {_duration(res.mtbf_s)} at "
        f"{res.failures_per_gpu_hour:.3g} per GPU-hour (Llama 3's fleet)"
        + (
            ""
            if res.expected_interruptions is None
            else f", about {res.expected_interruptions:.3g} over the run"
        ),
        f"checkpoint {every} ({best}, {res.interval_steps} steps); goodput "
        f"{_share(res.goodput)}, {_duration(res.lost_per_failure_s)} lost per interruption "
        f"with a {_duration(res.restart_s)} restart",
    ]
    if res.worst_mtbf_s is not None and res.worst_goodput is not None and res.worst_source:
        lines.append(
            f"at the worst published rate, {res.worst_source}: "
            f"{res.mtbf_s / res.worst_mtbf_s:.2g}x as often, one every "
            f"{_duration(res.worst_mtbf_s)}, goodput {_share(res.worst_goodput)}"
        )
    if res.note:
        lines.append(res.note)
    return lines
