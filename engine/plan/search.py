"""The candidate search: every valid layout of the world size (TP, PP, CP, DP, EP degrees,
pipeline shape, strategy, ZeRO stage, offload, recompute, micro-batch) that respects the forced
settings and trains the global batch exactly (``micro_batch x grad_accum x dp``), with its memory
estimated; the step time is estimated only for those that fit, when they are ranked, and only
where a lower bound (:func:`floor`) leaves them among the fastest. All candidates of one search
share one global batch, so ranking by step time is ranking by time per token. Called by :func:`engine.plan.planner.plan` and :mod:`engine.plan.batch` (at other batches);
the flowchart walk (:mod:`engine.plan.flowchart`) and the alternatives
(:mod:`engine.plan.annotate`) pick from what it returns.

Pipeline shapes are Megatron's: an even split, lighter first/last stages
(``--decoder-first/last-pipeline-num-layers``) and interleaved schedules (virtual stages), as
:mod:`engine.plan.stages` lists them. Expert parallelism takes every divisor of the experts that
divides ``dp x cp``. The search is bounded (a few thousand candidates at most) so
``dtrain-tui plan --json`` stays well under half a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from engine.plan.context import PlanContext
from engine.plan.frameworks import a2a_overlap_applies, cp_splits_heads
from engine.plan.memory import (
    LayoutDraft,
    MemoryFixed,
    breakdown_at,
    estimate_memory,
    memory_fixed,
    total_at,
)
from engine.plan.names import (
    CpComm,
    Framework,
    MoeDispatcher,
    Offload,
    Optimizer,
    PPSchedule,
    Recompute,
    Strategy,
)
from engine.plan.perf import Estimate, MicroBatch, estimate_time, micro_batch_time, step_floor
from engine.plan.result import Layout, MemoryBreakdown
from engine.plan.specs import Spec
from engine.plan.stages import accounted_splits, stage_layers, uneven_splits, virtual_options
from engine.plan.strategies import (
    FRAMEWORK_OF,
    OFFLOADS_OF,
    SIMPLICITY,
    STRATEGIES_OF,
    ZERO_STAGE_OF,
)

# Sequences at least this long bring context parallelism into the search (dtrain-tui's flowchart: "very
# long sequences → CP"); each CP rank keeps at least MIN_CP_CHUNK tokens.
LONG_SEQUENCE = 32_768
# A layout replaces a simpler (or the flowchart's preferred) one only when it is at least this much
# faster per token: the flowchart's choice is easier to run and to debug.
CLEARLY_FASTER = 0.15
MIN_CP_CHUNK = 4_096
MAX_TP = 8


@dataclass(slots=True)
class Candidate:
    """One searched layout: its draft, its memory, whether it fits, and (once ranked) its time."""

    draft: LayoutDraft
    mem: MemoryBreakdown
    fits: bool
    est: Estimate | None = None
    mb: MicroBatch | None = None
    """Its micro-batch's time, once :func:`floor` or :func:`evaluate` has worked it out."""

    @property
    def time(self) -> float:
        return self.est.step_time_s if self.est else math.inf

    @property
    def time_per_sequence(self) -> float:
        """Step time per sequence trained: what ranks layouts (equal to ranking by step time
        inside one search, where every candidate trains the same batch)."""
        e = self.est  # self.time, inlined: rankings read this tens of thousands of times
        return (e.step_time_s if e else math.inf) / self.draft.global_batch

    def to_layout(self, rejected: str | None = None, notes: list[str] | None = None) -> Layout:
        """The candidate as the Plan shows it (zeros where the time was never estimated)."""
        d = self.draft
        e = self.est
        return Layout.of(
            d,
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
    experts over a stage's ``tp * dp * cp`` ranks: :func:`engine.plan.memory.expert_tp`)."""

    tp: int
    pp: int
    cp: int
    dp: int
    ep: int
    etp: int = 0
    """Tensor parallelism inside each expert; 0: ``tp`` (:attr:`LayoutDraft.expert_tp`)."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# --------------------------------------------------------------------------------------------
# What each axis may take


def _tp_degrees(ctx: PlanContext) -> list[int]:
    lay = ctx.spec.layout
    dims = ctx.dims
    if lay.tp is not None:
        return [lay.tp]
    # TP stays on NVLink: inside a node, or across the trays of an NVLink domain (NVL72).
    return [
        t
        for t in divisors(ctx.hw.domain)
        if t <= MAX_TP
        and dims.heads % t == 0
        and (dims.kv_heads % t == 0 or t % dims.kv_heads == 0)
    ]


def _pp_degrees(ctx: PlanContext) -> list[int]:
    """Forced, or each depth Megatron can split the layers over (evenly or with lighter end
    stages)."""
    if ctx.spec.layout.pp is not None:
        return [ctx.spec.layout.pp]
    layers = ctx.dims.layers
    return [
        p
        for p in divisors(ctx.world)
        if p <= layers and p <= 64 and (p == 1 or uneven_splits(layers, p))
    ]


def _cp_degrees(ctx: PlanContext) -> list[int]:
    seq = ctx.spec.training.seq_len
    if ctx.spec.layout.cp is not None:
        return [ctx.spec.layout.cp]
    if seq < LONG_SEQUENCE:
        return [1]
    cps = [c for c in (1, 2, 4, 8, 16, 32) if seq % c == 0 and seq // c >= MIN_CP_CHUNK]
    # Keep the search bounded: every split up to the third that brings a chunk to <= 32K (a
    # smaller one, e.g. cp=2 beside tp=4 at 128K, can be the fastest).
    enough = [c for c in cps if seq // c <= LONG_SEQUENCE]
    return [c for c in cps if c <= enough[:3][-1]] if enough else cps


def _ep_degrees(ctx: PlanContext, tp: int, dp: int, cp: int) -> list[int]:
    dims = ctx.dims
    if ctx.spec.layout.ep is not None:
        return [ctx.spec.layout.ep]
    if not dims.is_moe:
        return [1]
    # Every divisor of the experts that divides a stage's ranks (a 256-expert model on 2048
    # GPUs may want ep=64; the experts fold over TP ranks too: memory.expert_tp): the
    # all-to-all and the expert GEMMs decide.
    return [e for e in divisors(dims.num_experts) if (tp * dp * cp) % e == 0]


def _etp_degrees(ctx: PlanContext, tp: int, dp: int, cp: int, ep: int) -> list[int]:
    """Tensor parallelism inside each expert: Megatron's default (``tp``, the experts split
    like a dense MLP, EP inside DP x CP) and, under TP with EP, whole experts with EP folded
    over the TP ranks (1) -- the only choice where EP does not divide DP x CP."""
    forced = ctx.spec.layout.expert_tp
    if forced is not None:
        return [forced]
    if not ctx.dims.is_moe:
        return [1]  # no experts: the plan says 1
    if tp == 1 or ep == 1:
        return [tp]
    return ([tp] if (dp * cp) % ep == 0 else []) + [1]


def _degrees(ctx: PlanContext, batch: int) -> Iterator[Degrees]:
    """Degrees that multiply to the world size, respect the model and the forced settings, and
    give each data-parallel replica a whole number of the ``batch`` sequences."""
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
                if batch % dp:
                    continue
                for ep in _ep_degrees(ctx, tp, dp, cp):
                    for etp in _etp_degrees(ctx, tp, dp, cp, ep):
                        yield Degrees(tp, pp, cp, dp, ep, etp)


def dp_degrees(ctx: PlanContext) -> list[int]:
    """The data-parallel degrees the world size, the model and the forced settings allow,
    whatever the batch (every dp divides the world size, so the world size as a batch keeps
    them all)."""
    return sorted({g.dp for g in _degrees(ctx, ctx.world)})


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
            if g.cp > 1 and not _cp_comm_runs(ctx, g):
                continue
            if g.tp == 1 and g.pp == 1 and g.ep == 1 and lay.strategy is None:
                if lay.framework is None:
                    continue
            out.append(s)
            continue
        if g.tp > 1 or g.pp > 1:
            continue
        if g.cp > 1 and s not in (Strategy.FSDP_FULL,):
            continue  # CP runs under Megatron or FSDP2 (torchtitan)
        if g.ep > 1 and s not in (Strategy.ZERO1, Strategy.ZERO2):
            # EP: Megatron, or DeepSpeed-MoE, which refuses ZeRO-3 ("MoE not supported with
            # Stage 3", deepspeed/runtime/engine.py).
            continue
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


def _cp_comm_runs(ctx: PlanContext, g: Degrees) -> bool:
    """Whether Megatron's context parallelism can move keys and values as asked on degrees
    ``g``: the all-to-all variant splits a TP rank's heads over the cp ranks."""
    if ctx.spec.training.cp_comm != CpComm.A2A:
        return True
    return cp_splits_heads(ctx.dims.heads, ctx.dims.kv_heads, g.tp, g.cp)


def _zero_stages(ctx: PlanContext, s: Strategy, g: Degrees) -> list[int]:
    if s != Strategy.THREE_D:
        return [ZERO_STAGE_OF[s]]
    if ctx.spec.layout.zero_stage is not None:
        return [ctx.spec.layout.zero_stage]
    # The distributed optimizer only matters with data parallelism, and there it is never
    # worse: the same traffic as the all-reduce it replaces (a reduce-scatter and an
    # all-gather, Megatron-LM docs/source/distrib_optimizer.md) for less memory.
    if g.dp * g.cp <= 1:
        return [0]
    if ctx.dims.is_moe and g.ep > 1 and g.pp == 1:
        # An MoE model's experts are most of its parameters: sharding them over the expert
        # data-parallel group too (Megatron-FSDP with EP, FSDP2 + EP as torchtitan and NeMo
        # AutoModel train) is what fits many experts on few GPUs without TP or PP.
        return [1, 3]
    return [1]


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
    # Light recompute frees what MoE and latent-attention layers hold beyond a dense one.
    light = [Recompute.LIGHT] if ctx.dims.light_recompute_frees else []
    if ctx.flash:
        # FlashAttention never stores the score matrix: selective equals none in memory.
        return [Recompute.NONE, *light, Recompute.MLP, Recompute.FULL]
    return [Recompute.NONE, Recompute.SELECTIVE, *light, Recompute.MLP, Recompute.FULL]


MAX_MICRO_BATCH = 32


def _micro_batches(per_replica: int, forced: int | None) -> list[int]:
    """Micro-batches that divide a replica's share of the batch exactly (a forced one only if
    it does), smallest first."""
    if forced is not None:
        return [forced] if per_replica % forced == 0 else []
    return [b for b in divisors(per_replica) if b <= MAX_MICRO_BATCH]


Shape = tuple[int, int, int]
"""A pipeline shape: (first-stage layers, last-stage layers, virtual stages); 0 layers: the
even share."""
REFINED = 3
"""Fastest pipelined layouts whose other shapes (interleaving, lighter end stages) are tried."""


def _pipeline_shapes(ctx: PlanContext, pp: int) -> list[Shape]:
    """The shapes to try for ``pp`` stages, the base one first: the even split (1F1B), else the
    most balanced lighter-ends split; then each interleaving of it and the other splits, each
    with its own interleavings (lighter ends and virtual stages combine where every stage's
    layers split into whole chunks). A forced pp that no split fits keeps the even split (the
    plan warns that Megatron refuses it); forced virtual stages keep the splits they divide, or
    the even one."""
    lay = ctx.spec.layout
    layers = ctx.dims.layers
    if pp <= 1:
        return [(0, 0, 1)]
    splits = uneven_splits(layers, pp) or [(0, 0)]
    if lay.virtual_stages is not None:
        v = lay.virtual_stages
        splits += [s for s in accounted_splits(layers, pp) if s not in splits]
        forced = [
            (f, la, v)
            for f, la in splits
            if v in virtual_options(layers, pp, f, la, accounted=True)
        ]
        return forced or [(0, 0, v)]
    out: list[Shape] = []
    for first, last in splits:
        out += [(first, last, v) for v in virtual_options(layers, pp, first, last)]
    return out


# --------------------------------------------------------------------------------------------
# Enumeration


def candidates(ctx: PlanContext, batch: int | None = None) -> list[Candidate]:
    """Every valid layout that trains ``batch`` sequences a step (the context's batch when
    None), with its memory, in search order (empty when the forced settings and the batch leave
    none). Each pipeline depth is searched in its base shape; the other shapes of the fastest
    few pipelined layouts follow (:func:`_reshaped`)."""
    gb = ctx.batch if batch is None else batch
    out: list[Candidate] = []
    for g in _degrees(ctx, gb):
        shape = _pipeline_shapes(ctx, g.pp)[0]
        for s, z, off in _settings(ctx, g):
            out += _micro_steps(ctx, g, gb, (s, z, off), shape)
    return out + _reshaped(ctx, out, gb)


REMEMBER_FAILURES = True
"""Whether :func:`_micro_steps` skips, at a larger micro-batch, what did not fit at a smaller one
(off: everything is weighed again, the reference the shortcut is tested against)."""


def _micro_steps(
    ctx: PlanContext,
    g: Degrees,
    batch: int,
    setting: tuple[Strategy, int, Offload],
    shape: Shape,
    recomputes: list[Recompute] | None = None,
) -> list[Candidate]:
    """Layouts of degrees ``g``, ``setting`` and ``shape``, micro-batch by micro-batch (smallest
    first), each with the least recompute that fits (less recompute is never slower), up to the
    first micro-batch that fits with none: a larger one needs more memory still."""
    lay = ctx.spec.layout
    framework = lay.framework or FRAMEWORK_OF[setting[0]]
    v = shape[2]
    per_replica = batch // g.dp
    out: list[Candidate] = []
    rcs = recomputes or _recomputes(ctx)
    fixed = training_settings(ctx.spec)
    # What did not fit at a smaller micro-batch does not fit at a larger one while the step
    # still accumulates several (:func:`engine.plan.memory.estimate_memory`: the activations
    # in flight and the logits grow with it; only at one micro-batch a step do the gradient
    # buffers of accumulation fall away), so it is not weighed again.
    failed: set[Recompute] = set()
    block_failed = False
    for mb in _micro_batches(per_replica, lay.micro_batch or ctx.spec.training.micro_batch):
        m = per_replica // mb
        if v > 1 and m % g.pp:
            continue  # Megatron's interleaved schedule: micro-batches divisible by pp
        fitted = False
        partial: Candidate | None = None
        known = REMEMBER_FAILURES and m > 1
        for rc in rcs:
            if rc == Recompute.LIGHT and framework != Framework.MEGATRON:
                continue  # named-module recompute is Megatron-Core's
            d = _draft(ctx, g, setting, shape, mb, m, rc, fixed)
            blocks = _block_recompute_applies(ctx, d, rcs) and not (known and block_failed)
            if rc == Recompute.FULL and blocks:
                partial = partial or _block_recompute(ctx, d)
                block_failed = partial is None
                if partial is not None:
                    out.append(partial)
                    fitted = True
                    break
            if not (known and rc in failed):
                c = weigh(ctx, d)
                out.append(c)
                if c.fits:
                    fitted = True
                    break
                failed.add(rc)
            if rc == Recompute.NONE and blocks:
                # A few recomputed layers can be cheaper than recomputing a part of every
                # layer (selective, MLP): weigh the least block recompute that fits beside them.
                partial = _block_recompute(ctx, replace(d, recompute=Recompute.FULL))
                block_failed = partial is None
                if partial is not None:
                    out.append(partial)
        if not fitted:
            break
    return out


def eager_modules(spec: Spec) -> bool:
    """Whether a PyTorch-native layout's trainer runs its model's Python modules eagerly
    (:attr:`engine.plan.specs.TrainingSpec.torch_compile`): yes for the user's own script
    unless it compiles, no for the shipped example trainer (torch's native norm and activation
    kernels, no rotary embedding: it moves what a compiled model does)."""
    compiled = spec.training.torch_compile
    if compiled is None:
        return spec.launch.script is not None
    return not compiled


def training_settings(spec: Spec) -> dict[str, Any]:
    """The :class:`LayoutDraft` fields the spec's training settings fix for every layout (the
    gradient and moment dtypes, the offloaded activations, the fused loss, the MoE dispatcher, capacity and imbalance, the CP
    traffic, whether the trainer runs Python modules eagerly): the search's drafts and the
    accuracy harness's re-timed ones take them here."""
    tr = spec.training
    return {
        "eager_modules": eager_modules(spec),
        "grads_bf16": bool(tr.grads_bf16),
        "moments_bf16": bool(tr.moments_bf16) and tr.optimizer == Optimizer.ADAMW,
        "offload_modules": tuple(tr.offload_modules or ()),
        "states_offload": bool(tr.offload_optimizer_states) and tr.optimizer == Optimizer.ADAMW,
        "fused_ce": bool(tr.fused_cross_entropy),
        "deepep": tr.moe_dispatcher == MoeDispatcher.DEEPEP,
        "cp_comm": tr.cp_comm or CpComm.P2P,
        "capacity": tr.moe_capacity_factor or 0.0,
        "imbalance": tr.moe_imbalance or 0.0,
    }


def _draft(
    ctx: PlanContext,
    g: Degrees,
    setting: tuple[Strategy, int, Offload],
    shape: Shape,
    mb: int,
    m: int,
    rc: Recompute,
    fixed: dict[str, Any] | None = None,
) -> LayoutDraft:
    """The layout of degrees ``g``, ``setting`` and ``shape`` at micro-batch ``mb`` (``m`` a
    step) and recompute ``rc``, the rest as the spec says (``fixed``: the spec's
    :func:`training_settings`, when the caller has them)."""
    lay = ctx.spec.layout
    tr = ctx.spec.training
    s, z, off = setting
    first, last, v = shape
    return LayoutDraft(
        strategy=s,
        framework=lay.framework or FRAMEWORK_OF[s],
        tp=g.tp,
        pp=g.pp,
        dp=g.dp,
        cp=g.cp,
        ep=g.ep,
        etp=g.etp,
        zero_stage=z,
        offload=off,
        micro_batch=mb,
        grad_accum=m,
        recompute=rc,
        sequence_parallel=(
            lay.sequence_parallel if lay.sequence_parallel is not None else g.tp > 1
        ),
        precision=ctx.precision,
        pp_schedule=PPSchedule.INTERLEAVED if v > 1 else PPSchedule.ONE_F_ONE_B,
        virtual_stages=v,
        first_stage_layers=first,
        last_stage_layers=last,
        **(fixed if fixed is not None else training_settings(ctx.spec)),
        # Megatron's all-to-all overlap where the user asked for it; off otherwise, as in
        # Megatron, whose own recipes mostly leave it off (the plan says when it would be
        # faster). weigh keeps it only where the layout can run it.
        a2a_overlap=tr.moe_a2a_overlap is True,
    )


def overlapped(ctx: PlanContext, cands: list[Candidate]) -> Candidate | None:
    """What asking for Megatron's all-to-all overlap would plan, searched cheaply: each of
    ``cands`` that can run it, with it, at the least recompute (from its own on, full excluded:
    the overlap cannot run under it) at which the overlap's memory fits; the fastest of those.
    Only ``cands`` that fit: the overlap holds a second micro-batch, so a layout that does not
    fit without it does not fit with it (its heavier recomputes are candidates of their own)."""
    rcs = [rc for rc in _recomputes(ctx) if rc != Recompute.FULL]
    out: list[Candidate] = []
    for c in cands:
        d = c.draft
        if (
            not c.fits
            or d.a2a_overlap
            or not a2a_overlap_applies(ctx.dims, d)
            or d.recompute not in rcs
        ):
            continue
        for rc in rcs[rcs.index(d.recompute) :]:
            o = weigh(ctx, replace(d, a2a_overlap=True, recompute=rc))
            if o.fits:
                out.append(o)
                break
    return best(ctx, out)


def _block_recompute_applies(ctx: PlanContext, d: LayoutDraft, rcs: list[Recompute]) -> bool:
    """Whether a full recompute of only some layers of each model chunk is searched for ``d``:
    Megatron layouts (``--recompute-method block``), when the planner chooses the recompute."""
    forced = ctx.spec.layout.recompute or ctx.spec.training.recompute
    return d.framework == Framework.MEGATRON and forced is None and Recompute.FULL in rcs


def _block_recompute(ctx: PlanContext, d: LayoutDraft) -> Candidate | None:
    """``d`` (a full recompute) with the fewest recomputed layers a model chunk that fits, or
    None when recomputing all but one of the smallest chunk's layers still does not fit (plain
    full recompute is then weighed as before). Memory falls as layers are added, so a
    bisection finds the count; it reads only each count's total (:func:`_fits_at`), and the
    count found is weighed as any layout is."""
    split = stage_layers(ctx.dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers)
    heaviest = min(split) // max(1, d.virtual_stages)  # N applies to every chunk
    if heaviest < 2:
        return None
    if d.a2a_overlap and not a2a_overlap_applies(ctx.dims, d):
        d = replace(d, a2a_overlap=False)  # as weigh would, once for every count
    tr = ctx.spec.training
    fixed = memory_fixed(
        ctx.dims,
        d,
        seq_len=tr.seq_len,
        optimizer=tr.optimizer,
        flash=ctx.flash,
        gpus_per_node=ctx.gpn,
        nccl=ctx.nccl,
    )
    best, best_total = heaviest - 1, _fits_at(ctx, fixed, heaviest - 1)
    if best_total is None:
        return None
    lo, hi = 1, heaviest - 1  # hi fits
    if hi > 2:
        # Memory falls with N as the largest of the stages' straight lines (convex): the line
        # through N = hi and hi - 1 bounds it from below, so no N under where that line meets
        # the budget fits. On one stage the line is exact and that N is the answer.
        step = _fits_at(ctx, fixed, hi - 1)
        if step is None:
            return _weigh_at(ctx, d, fixed, best)
        slope = step - best_total
        if slope > 0:
            lo = max(lo, hi - (ctx.usable - best_total) // slope)
        hi, best = hi - 1, hi - 1
        if lo < hi:
            if _fits_at(ctx, fixed, lo) is not None:
                hi, best = lo, lo
            else:
                lo += 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits_at(ctx, fixed, mid) is not None:
            hi, best = mid, mid
        else:
            lo = mid + 1
    return _weigh_at(ctx, d, fixed, best)


def _fits_at(ctx: PlanContext, fixed: MemoryFixed, layers: int) -> int | None:
    """The memory total of the draft ``fixed`` was worked out for
    (:func:`engine.plan.memory.memory_fixed`) with ``layers`` recomputed layers a chunk when
    that fits (as :func:`weigh` judges it), else None."""
    total, cpu = total_at(fixed, layers)
    return total if total <= ctx.usable and cpu * ctx.gpn <= ctx.cpu_usable else None


def _weigh_at(ctx: PlanContext, d: LayoutDraft, fixed: MemoryFixed, layers: int) -> Candidate:
    """:func:`weigh` of ``d`` with ``layers`` recomputed layers a chunk, from its ``fixed``
    share (its all-to-all overlap already settled: the count does not change whether it
    applies)."""
    mem = breakdown_at(fixed, layers)
    fits = mem.total <= ctx.usable and (mem.cpu_bytes * ctx.gpn <= ctx.cpu_usable)
    return Candidate(replace(d, recompute_layers=layers), mem, fits)


def _reshaped(ctx: PlanContext, base: list[Candidate], batch: int) -> list[Candidate]:
    """The other pipeline shapes (interleaving, lighter end stages) of the :data:`REFINED`
    fastest pipelined layouts in ``base`` that fit, at their micro-batch and recompute or
    more: a shape's gain (a smaller bubble, a lighter end stage) is worth weighing only where
    the pipeline is competitive, and trying it everywhere would multiply the search."""
    piped = _fastest(ctx, [c for c in base if c.fits and c.draft.pp > 1], REFINED)
    out: list[Candidate] = []
    seen: set[tuple[object, ...]] = set()
    for c in piped:
        d = c.draft
        g = Degrees(d.tp, d.pp, d.cp, d.dp, d.ep, d.etp)
        for shape in _pipeline_shapes(ctx, d.pp)[1:]:
            key = (g, d.strategy, d.zero_stage, d.offload, shape)
            if key in seen:
                continue
            seen.add(key)
            rcs = _recomputes(ctx)
            out += _micro_steps(
                ctx,
                g,
                batch,
                (d.strategy, d.zero_stage, d.offload),
                shape,
                rcs[rcs.index(d.recompute) :],
            )
    return out


def weigh(ctx: PlanContext, d: LayoutDraft) -> Candidate:
    """``d`` with its memory and whether it fits the GPU and, for offload, the host. The
    all-to-all overlap is kept only where ``d`` (perhaps now fully recomputed) can run it."""
    if d.a2a_overlap and not a2a_overlap_applies(ctx.dims, d):
        d = replace(d, a2a_overlap=False)
    mem = estimate_memory(
        ctx.dims,
        d,
        seq_len=ctx.spec.training.seq_len,
        optimizer=ctx.spec.training.optimizer,
        flash=ctx.flash,
        gpus_per_node=ctx.gpn,
        nccl=ctx.nccl,
    )
    fits = mem.total <= ctx.usable and (mem.cpu_bytes * ctx.gpn <= ctx.cpu_usable)
    return Candidate(d, mem, fits)


def _settings(ctx: PlanContext, g: Degrees) -> Iterator[tuple[Strategy, int, Offload]]:
    """(strategy, ZeRO stage, offload) combinations that can run degrees ``g``."""
    for s in _strategies(ctx, g):
        for z in _zero_stages(ctx, s, g):
            for off in _offloads(ctx, s):
                yield s, z, off


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
            mb=c.mb,
        )
    return c


def floor(ctx: PlanContext, c: Candidate) -> float:
    """A lower bound of ``c``'s :attr:`Candidate.time_per_sequence` (its exact value once
    estimated): the heaviest stage's micro-batches alone (:func:`engine.plan.perf.step_floor`),
    half the work of the estimate. The rankings estimate in its order and stop where the bound
    passes what they look for, so a layout that cannot be among the fastest is never timed."""
    if c.est is not None:
        return c.time_per_sequence
    return floor_step(ctx, c) / c.draft.global_batch


def floor_step(ctx: PlanContext, c: Candidate) -> float:
    """A lower bound of ``c``'s step time (:attr:`Candidate.time`; its exact value once
    estimated), as :func:`floor`."""
    if c.est is not None:
        return c.est.step_time_s
    if c.mb is None:
        c.mb = micro_batch_time(ctx.dims, c.draft, ctx.hw, ctx.spec.training.seq_len)
    return step_floor(c.draft, c.mb)


def _near_fastest(ctx: PlanContext, cands: list[Candidate], within: float) -> list[Candidate]:
    """Those of ``cands`` (each fits) whose time per sequence is at most ``within`` times the
    fastest's, in their order, each estimated: the others are left unestimated, their bound
    (:func:`floor`) already past it. Every ranking of :func:`best` reads only these."""
    floors = [floor(ctx, c) for c in cands]
    fastest = math.inf
    for i in sorted(range(len(cands)), key=floors.__getitem__):
        if floors[i] > fastest * within:
            break
        fastest = min(fastest, evaluate(ctx, cands[i]).time_per_sequence)
    limit = fastest * within
    return [c for c in cands if c.est is not None and c.time_per_sequence <= limit]


def _fastest(ctx: PlanContext, cands: list[Candidate], n: int) -> list[Candidate]:
    """The ``n`` fastest of ``cands`` (each fits) per sequence, in order (ties: as listed),
    estimating only what can be among them (:func:`floor`)."""
    floors = [floor(ctx, c) for c in cands]
    times: list[float] = []
    for i in sorted(range(len(cands)), key=floors.__getitem__):
        if len(times) >= n and floors[i] > times[n - 1]:
            break
        times.append(evaluate(ctx, cands[i]).time_per_sequence)
        times.sort()
    timed = [c for c in cands if c.est is not None]
    timed.sort(key=_rank_key)
    return timed[:n]


TIE = 0.005
"""Layouts within this share of the fastest are tied: the simplest of them wins."""


def _simplicity(c: Candidate) -> tuple[int, int, int, int, int, float]:
    """Among tied layouts: no offload, the simpler strategy, fewer virtual stages, an even
    pipeline split, a larger micro-batch, then the faster."""
    d = c.draft
    return (
        0 if d.offload == Offload.NONE else 1,
        SIMPLICITY[d.strategy],
        d.virtual_stages,
        int(bool(d.first_stage_layers or d.last_stage_layers)),
        -d.micro_batch,
        c.time_per_sequence,
    )


def _rank_key(c: Candidate) -> float:
    return c.time_per_sequence


def deep_enough(d: LayoutDraft) -> bool:
    """At least 4 micro-batches per pipeline stage (dtrain-tui's flowchart), virtual stages counted: they
    shrink the bubble as more micro-batches would."""
    return d.pp == 1 or d.grad_accum * d.virtual_stages >= 4 * d.pp


MARGIN_TIE = 0.02
"""Layouts within this share of the fastest are as fast as it where margin is concerned: a
layout that leaves little memory spare loses to one this close that leaves enough (the plan's
"about as fast", :data:`engine.plan.annotate.SAME_SPEED`)."""
TIGHT = 0.04
"""A layout is tight when it leaves less than the headroom plus this share of the usable
memory (:func:`is_tight`)."""


def spare(ctx: PlanContext, c: Candidate) -> int:
    """What ``c`` leaves of the memory the headroom comes out of (bytes)."""
    return ctx.usable + ctx.headroom_bytes - c.mem.total


def is_tight(ctx: PlanContext, c: Candidate) -> bool:
    """Whether ``c`` fits with little more than the headroom to spare (:data:`TIGHT`)."""
    return spare(ctx, c) < ctx.headroom_bytes + TIGHT * (ctx.usable + ctx.headroom_bytes)


def best(ctx: PlanContext, cands: list[Candidate]) -> Candidate | None:
    """The fastest of ``cands`` per token that fits; among those within :data:`TIE` of it, the
    simplest (see :func:`_simplicity`). When the fastest is tight (:func:`is_tight`) and some
    within :data:`MARGIN_TIE` of it are not, the choice is made among those: 1 % of speed is
    not worth an out-of-memory crash (a block recompute at 75.4 GiB of 75.6 against a plain
    layout at 66.5 GiB, 0.9 % slower)."""
    fitting = [c for c in cands if c.fits]
    if not fitting:
        return None
    # Only layouts within MARGIN_TIE and then TIE of the fastest take part below (the slack: a
    # hair wider than the rounding of those products, never narrower).
    fitting = _near_fastest(ctx, fitting, (1 + MARGIN_TIE) * (1 + TIE) * (1 + 1e-9))
    times = [c.time_per_sequence for c in fitting]
    fastest = min(times)
    first = fitting[times.index(fastest)]  # the first of the fastest, as min() picks
    if is_tight(ctx, first):
        near = fastest * (1 + MARGIN_TIE)
        roomy = [
            (c, t)
            for c, t in zip(fitting, times, strict=True)
            if t <= near and not is_tight(ctx, c)
        ]
        if roomy:
            fitting, times = [c for c, _ in roomy], [t for _, t in roomy]
            fastest = min(times)
    tied = [c for c, t in zip(fitting, times, strict=True) if t <= fastest * (1 + TIE)]
    return min(tied, key=_simplicity)


def kernels_only(
    ctx: PlanContext, flow: Candidate | None, fastest: Candidate | None
) -> Candidate | None:
    """Megatron running the flowchart's DDP layout, when that makes a clearly faster
    model-parallel Megatron layout no longer clearly faster: the gain then comes from Megatron's
    fused kernels (the eager stacks' element-wise work, SDPA), not from splitting the model, and
    a model whose full replica fits each GPU does not need TP or PP for it (GPT-2 at TP 2 on one
    node). None where the model parallelism earns its place: the model needs sharding (the
    flowchart's pick is not DDP), the data-parallel Megatron layout does not fit, or it is itself
    clearly slower (communication, batch)."""
    if (
        flow is None
        or fastest is None
        or fastest.draft.framework != Framework.MEGATRON
        or flow.draft.strategy != Strategy.DDP
        or ctx.dims.is_moe
        or fastest.draft.tp * fastest.draft.pp * fastest.draft.cp == 1
        or fastest.time >= flow.time * (1 - CLEARLY_FASTER)
    ):
        return None
    d = flow.draft
    data_parallel = replace(
        fastest.draft,
        tp=1,
        pp=1,
        cp=1,
        dp=d.world_size,
        zero_stage=1,
        micro_batch=d.micro_batch,
        grad_accum=d.grad_accum,
        recompute=d.recompute,
        recompute_layers=0,
        sequence_parallel=False,
        pp_schedule=PPSchedule.ONE_F_ONE_B,
        virtual_stages=1,
        first_stage_layers=0,
        last_stage_layers=0,
    )
    c = weigh(ctx, data_parallel)
    if not c.fits or fastest.time < evaluate(ctx, c).time * (1 - CLEARLY_FASTER):
        return None
    return c


def smallest(cands: list[Candidate]) -> Candidate:
    """The leanest of ``cands`` in GPU memory (ties: simpler)."""
    return min(cands, key=lambda c: (c.mem.total, SIMPLICITY[c.draft.strategy]))
