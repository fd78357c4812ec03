"""The candidate search: every valid layout of the world size (TP, PP, CP, DP, EP degrees,
strategy, ZeRO stage, offload, recompute, micro-batch) that respects the forced settings, with
its memory estimated; the step time is estimated only for those that fit, when they are ranked.
Called by :func:`engine.plan.planner.plan`; the flowchart walk (:mod:`engine.plan.flowchart`)
and the alternatives (:mod:`engine.plan.annotate`) pick from what it returns.

The search is bounded (a few thousand candidates at most) so ``dtrain-tui plan --json`` stays
well under half a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from engine.plan.context import PlanContext
from engine.plan.memory import LayoutDraft, estimate_memory
from engine.plan.perf import Estimate, estimate_time
from engine.plan.result import Layout, MemoryBreakdown
from engine.plan.specs import Offload, PPSchedule, Recompute, Strategy
from engine.plan.strategies import (
    FRAMEWORK_OF,
    OFFLOADS_OF,
    SIMPLICITY,
    STRATEGIES_OF,
    ZERO_STAGE_OF,
)

# Sequences at least this long bring context parallelism into the search (seed doc 000: "very
# long sequences → CP"); each CP rank keeps at least MIN_CP_CHUNK tokens.
LONG_SEQUENCE = 32_768
MIN_CP_CHUNK = 4_096
MAX_TP = 8


@dataclass(slots=True)
class Candidate:
    """One searched layout: its draft, its memory, whether it fits, and (once ranked) its time."""

    draft: LayoutDraft
    mem: MemoryBreakdown
    fits: bool
    est: Estimate | None = None

    @property
    def time(self) -> float:
        return self.est.step_time_s if self.est else math.inf

    def to_layout(self, rejected: str | None = None, notes: list[str] | None = None) -> Layout:
        """The candidate as the Plan shows it (zeros where the time was never estimated)."""
        d = self.draft
        e = self.est
        return Layout(
            strategy=d.strategy,
            framework=d.framework,
            tp=d.tp,
            pp=d.pp,
            dp=d.dp,
            cp=d.cp,
            ep=d.ep,
            zero_stage=d.zero_stage,
            offload=d.offload,
            micro_batch=d.micro_batch,
            grad_accum=d.grad_accum,
            global_batch=d.global_batch,
            recompute=d.recompute,
            sequence_parallel=d.sequence_parallel,
            precision=d.precision,
            pp_schedule=d.pp_schedule,
            virtual_stages=d.virtual_stages,
            memory_per_gpu=self.mem,
            fits=self.fits,
            step_time_s=e.step_time_s if e else 0.0,
            tokens_per_s=e.tokens_per_s if e else 0.0,
            mfu=e.mfu if e else 0.0,
            compute_time_s=e.compute_time_s if e else 0.0,
            comm_time_s=e.comm_time_s if e else 0.0,
            bubble_fraction=e.bubble_fraction if e else 0.0,
            scaling_efficiency=e.scaling_efficiency if e else 1.0,
            gpu_hours=e.gpu_hours if e else None,
            cost_usd=e.cost_usd if e else None,
            rejected_because=rejected,
            notes=notes or [],
        )


class Degrees(NamedTuple):
    """Parallel degrees whose product ``tp * pp * cp * dp`` is the world size (EP splits the
    experts over ``dp * cp``)."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --------------------------------------------------------------------------------------------
# What each axis may take


def _tp_degrees(ctx: PlanContext) -> list[int]:
    lay = ctx.spec.layout
    dims = ctx.dims
    if lay.tp is not None:
        return [lay.tp]
    return [
        t
        for t in divisors(ctx.gpn)
        if t <= MAX_TP
        and dims.heads % t == 0
        and (dims.kv_heads % t == 0 or t % dims.kv_heads == 0)
    ]


def _pp_degrees(ctx: PlanContext) -> list[int]:
    if ctx.spec.layout.pp is not None:
        return [ctx.spec.layout.pp]
    return [p for p in divisors(ctx.world) if p <= ctx.dims.layers and p <= 64]


def _cp_degrees(ctx: PlanContext) -> list[int]:
    seq = ctx.spec.training.seq_len
    if ctx.spec.layout.cp is not None:
        return [ctx.spec.layout.cp]
    if seq < LONG_SEQUENCE:
        return [1]
    cps = [c for c in (1, 2, 4, 8, 16, 32) if seq % c == 0 and seq // c >= MIN_CP_CHUNK]
    # Keep the search bounded: no split, and the three smallest that bring a chunk to <= 32K.
    enough = [c for c in cps if seq // c <= LONG_SEQUENCE]
    return sorted({1, *enough[:3]} & set(cps)) if enough else cps


def _ep_degrees(ctx: PlanContext, dp: int, cp: int) -> list[int]:
    dims = ctx.dims
    if ctx.spec.layout.ep is not None:
        return [ctx.spec.layout.ep]
    if not dims.is_moe:
        return [1]
    fit = [e for e in divisors(dims.num_experts) if (dp * cp) % e == 0]
    in_node = [e for e in fit if e <= ctx.gpn]
    # Bounded: none, 2, the largest inside a node, and the largest overall.
    return sorted({1, *(e for e in fit if e == 2), in_node[-1], fit[-1]})


def _degrees(ctx: PlanContext) -> Iterator[Degrees]:
    """Degrees that multiply to the world size and respect the model and the forced settings."""
    w = ctx.world
    tps = _tp_degrees(ctx)
    pps = _pp_degrees(ctx)
    cps = _cp_degrees(ctx)
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if w % (tp * pp * cp):
                    continue
                dp = w // (tp * pp * cp)
                if ctx.spec.layout.dp is not None and dp != ctx.spec.layout.dp:
                    continue
                for ep in _ep_degrees(ctx, dp, cp):
                    yield Degrees(tp, pp, cp, dp, ep)


def _strategies(ctx: PlanContext, g: Degrees) -> list[Strategy]:
    """The strategies that can run degrees ``g`` under the forced settings."""
    lay = ctx.spec.layout
    if lay.strategy is not None:
        chosen: tuple[Strategy, ...] = (lay.strategy,)
    elif lay.framework is not None:
        chosen = STRATEGIES_OF[lay.framework]
    else:
        chosen = tuple(Strategy)
    out: list[Strategy] = []
    for s in chosen:
        if (lay.offload or Offload.NONE) not in OFFLOADS_OF[s]:
            continue
        if s == Strategy.THREE_D:
            if ctx.gpu.is_cpu and lay.strategy is None and lay.framework is None:
                continue  # Megatron needs CUDA
            if g.tp == 1 and g.pp == 1 and lay.strategy is None and lay.framework is None:
                continue
            out.append(s)
            continue
        if g.tp > 1 or g.pp > 1:
            continue
        if g.cp > 1 and s not in (Strategy.FSDP_FULL,):
            continue  # CP runs under Megatron or FSDP2 (torchtitan)
        if g.ep > 1 and s not in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3):
            continue  # EP: DeepSpeed-MoE or Megatron
        if s == Strategy.FSDP_HYBRID and ctx.nodes == 1:
            continue
        if lay.zero_stage is not None and ZERO_STAGE_OF[s] != lay.zero_stage:
            continue
        if (
            g.dp == 1
            and s not in (Strategy.DDP, Strategy.ZERO2, Strategy.ZERO3)
            and lay.strategy is None
        ):
            continue
        out.append(s)
    return out


def _zero_stages(ctx: PlanContext, s: Strategy, g: Degrees) -> list[int]:
    if s != Strategy.THREE_D:
        return [ZERO_STAGE_OF[s]]
    if ctx.spec.layout.zero_stage is not None:
        return [ctx.spec.layout.zero_stage]
    # The distributed optimizer only matters with data parallelism.
    return [1, 0] if g.dp * g.cp > 1 else [0]


def _offloads(ctx: PlanContext, s: Strategy) -> list[Offload]:
    forced = ctx.spec.layout.offload
    if forced is not None:
        return [forced]
    if ctx.gpu.is_cpu:
        return [Offload.NONE]  # CPU ranks: there is nothing to offload to
    return list(OFFLOADS_OF[s])


def _recomputes(ctx: PlanContext) -> list[Recompute]:
    forced = ctx.spec.layout.recompute or ctx.spec.training.recompute
    if forced is not None:
        return [forced]
    if ctx.flash:
        # FlashAttention never stores the score matrix: selective equals none in memory.
        return [Recompute.NONE, Recompute.FULL]
    return [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL]


def _micro_batches(per_replica: int, forced: int | None) -> list[int]:
    if forced is not None:
        return [forced]
    out = [b for b in (1, 2, 4, 8, 16, 32) if b <= per_replica and per_replica % b == 0]
    return out or [1]


# --------------------------------------------------------------------------------------------
# Enumeration


def candidates(ctx: PlanContext) -> list[Candidate]:
    """Every valid layout with its memory, in search order (empty when the forced settings
    leave none). Micro-batches go smallest first, up to the first that does not fit: a larger
    one needs more memory still."""
    spec = ctx.spec
    lay = spec.layout
    training = spec.training
    forced_mb = lay.micro_batch or training.micro_batch
    sched = PPSchedule.INTERLEAVED if (lay.virtual_stages or 1) > 1 else PPSchedule.ONE_F_ONE_B
    out: list[Candidate] = []
    for g in _degrees(ctx):
        per_replica = max(1, training.global_batch // g.dp)
        mbs = _micro_batches(per_replica, forced_mb)
        sp = lay.sequence_parallel if lay.sequence_parallel is not None else g.tp > 1
        for s, z, off, rc in _settings(ctx, g):
            for mb in mbs:
                d = LayoutDraft(
                    strategy=s,
                    framework=lay.framework or FRAMEWORK_OF[s],
                    tp=g.tp,
                    pp=g.pp,
                    dp=g.dp,
                    cp=g.cp,
                    ep=g.ep,
                    zero_stage=z,
                    offload=off,
                    micro_batch=mb,
                    grad_accum=max(1, math.ceil(per_replica / mb)),
                    recompute=rc,
                    sequence_parallel=sp,
                    precision=ctx.precision,
                    pp_schedule=sched,
                    virtual_stages=lay.virtual_stages or 1,
                )
                mem = estimate_memory(
                    ctx.dims,
                    d,
                    seq_len=training.seq_len,
                    optimizer=training.optimizer,
                    flash=ctx.flash,
                    gpus_per_node=ctx.gpn,
                )
                fits = mem.total <= ctx.usable and (mem.cpu_bytes * ctx.gpn <= ctx.cpu_usable)
                out.append(Candidate(d, mem, fits))
                if not fits:
                    break
    return out


def _settings(ctx: PlanContext, g: Degrees) -> Iterator[tuple[Strategy, int, Offload, Recompute]]:
    """(strategy, ZeRO stage, offload, recompute) combinations that can run degrees ``g``."""
    for s in _strategies(ctx, g):
        for z in _zero_stages(ctx, s, g):
            for off in _offloads(ctx, s):
                for rc in _recomputes(ctx):
                    yield s, z, off, rc


# --------------------------------------------------------------------------------------------
# Ranking


def evaluate(ctx: PlanContext, c: Candidate) -> Candidate:
    """``c`` with its step time estimated (once)."""
    if c.est is None:
        c.est = estimate_time(
            ctx.dims,
            c.draft,
            ctx.hw,
            seq_len=ctx.spec.training.seq_len,
            tokens_budget=ctx.spec.training.tokens,
        )
    return c


def _rank_key(c: Candidate) -> tuple[float, int, int, int]:
    d = c.draft
    offload = 0 if d.offload == Offload.NONE else 1
    return (round(c.time, 4), offload, SIMPLICITY[d.strategy], -d.micro_batch)


def best(ctx: PlanContext, cands: list[Candidate]) -> Candidate | None:
    """The fastest of ``cands`` that fits (ties: no offload, simpler, larger micro-batch)."""
    fitting = [evaluate(ctx, c) for c in cands if c.fits]
    if not fitting:
        return None
    return min(fitting, key=_rank_key)


def smallest(cands: list[Candidate]) -> Candidate:
    """The leanest of ``cands`` in GPU memory (ties: simpler)."""
    return min(cands, key=lambda c: (c.mem.total, SIMPLICITY[c.draft.strategy]))
