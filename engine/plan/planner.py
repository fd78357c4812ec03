"""The planner: ``plan(spec) -> Plan``, a pure function from what the user asked for to a reasoned
parallel layout. The CLI's ``plan``, the wizard's decision step and the config writers all call it.

It walks the seed documents' decision flowchart (docs 000 and 001: fits on one GPU → DDP; fits
with optimizer/gradient sharding → ZeRO-1/2 or FSDP SHARD_GRAD_OP; else ZeRO-3 / FULL_SHARD;
still out of memory → TP+PP+DP or CPU offload; MoE → expert parallelism; long sequences →
context parallelism; TP inside a node, PP across nodes; micro-batches ≥ 4× PP stages) and records
each question, answer and reason as a :class:`PathStep`. It then searches the valid layouts near
that outcome (TP, PP, DP, CP, EP degrees, ZeRO stage, offload, micro-batch, recompute), ranks the
ones that fit by estimated step time (:mod:`engine.plan.perf`), and keeps the flowchart's choice unless
a candidate is clearly faster (by :data:`CLEARLY_FASTER`), saying so. A forced layout
(``spec.layout``) narrows the search to what the user fixed; the plan then says if and why it
does not fit. Inconsistent degrees are a :class:`SpecError` stating the whole constraint.

The search is bounded (a few thousand candidates at most, memory first, time only for those that
fit) so ``dtrain-tui plan --json`` stays well under half a second; nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from engine.errors import SpecError
from engine.plan.catalog import GpuType, get_gpu, get_network
from engine.plan.memory import LayoutDraft, estimate_memory, usable_bytes
from engine.plan.models import resolve_model
from engine.plan.perf import Estimate, Hardware, estimate_time
from engine.plan.result import GpuInfo, Layout, MemoryBreakdown, PathStep, Plan
from engine.plan.specs import (
    Framework,
    LayoutSpec,
    ModelDims,
    Offload,
    PPSchedule,
    Precision,
    Recompute,
    Spec,
    Strategy,
)

# A searched layout replaces the flowchart's choice only when it is at least this much faster.
CLEARLY_FASTER = 0.15
# Sequences at least this long bring context parallelism into the search (seed doc 000: "very
# long sequences → CP"); each CP rank keeps at least MIN_CP_CHUNK tokens.
LONG_SEQUENCE = 32_768
MIN_CP_CHUNK = 4_096
MAX_TP = 8
MAX_ALTERNATIVES = 6
# Anti-pattern thresholds of seed doc 003.
MAX_BUBBLE = 0.20
MIN_SCALING = 0.80

_FRAMEWORK_OF = {
    Strategy.DDP: Framework.DDP,
    Strategy.ZERO1: Framework.DEEPSPEED,
    Strategy.ZERO2: Framework.DEEPSPEED,
    Strategy.ZERO3: Framework.DEEPSPEED,
    Strategy.FSDP_FULL: Framework.FSDP,
    Strategy.FSDP_GRAD_OP: Framework.FSDP,
    Strategy.FSDP_HYBRID: Framework.FSDP,
    Strategy.THREE_D: Framework.MEGATRON,
}
_ZERO_OF = {
    Strategy.DDP: 0,
    Strategy.ZERO1: 1,
    Strategy.ZERO2: 2,
    Strategy.ZERO3: 3,
    Strategy.FSDP_FULL: 3,
    Strategy.FSDP_GRAD_OP: 2,
    Strategy.FSDP_HYBRID: 3,
}
_STRATEGIES_OF = {
    Framework.DDP: (Strategy.DDP,),
    Framework.DEEPSPEED: (Strategy.DDP, Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3),
    Framework.FSDP: (Strategy.FSDP_GRAD_OP, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID),
    Framework.MEGATRON: (Strategy.THREE_D,),
}
# What each strategy can offload: ZeRO-Offload (stage 2/3), ZeRO-Infinity to CPU (stage 3),
# FSDP's CPUOffload (params, grads and optimizer together).
_OFFLOADS_OF = {
    Strategy.DDP: (Offload.NONE,),
    Strategy.ZERO1: (Offload.NONE,),
    Strategy.ZERO2: (Offload.NONE, Offload.OPTIMIZER),
    Strategy.ZERO3: (Offload.NONE, Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS),
    Strategy.FSDP_FULL: (Offload.NONE, Offload.OPTIMIZER_PARAMS),
    Strategy.FSDP_GRAD_OP: (Offload.NONE,),
    Strategy.FSDP_HYBRID: (Offload.NONE,),
    Strategy.THREE_D: (Offload.NONE,),
}
# The flowchart's classes.
_CLASS_DDP = (Strategy.DDP,)
_CLASS_SHARD_OG = (Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP_GRAD_OP)
_CLASS_SHARD_ALL = (Strategy.ZERO3, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID)
# Preference among equally fast layouts: simpler first (seed doc 000: "start simple").
_SIMPLICITY = {
    Strategy.DDP: 0,
    Strategy.ZERO2: 1,
    Strategy.FSDP_GRAD_OP: 2,
    Strategy.ZERO1: 3,
    Strategy.FSDP_FULL: 4,
    Strategy.ZERO3: 5,
    Strategy.FSDP_HYBRID: 6,
    Strategy.THREE_D: 7,
}


@dataclass(slots=True)
class _Cand:
    draft: LayoutDraft
    mem: MemoryBreakdown
    fits: bool
    est: Estimate | None = None

    @property
    def time(self) -> float:
        return self.est.step_time_s if self.est else math.inf


@dataclass(slots=True)
class _Ctx:
    spec: Spec
    dims: ModelDims
    gpu: GpuType
    hw: Hardware
    precision: Precision
    usable: int
    cpu_usable: int
    """Host RAM per node offload may use (bytes)."""
    flash: bool
    world: int
    gpn: int
    nodes: int


def _gib(n: float) -> str:
    """Bytes for a reason line: GiB, or MiB below 1 GiB so small models don't read as 0.0 GiB."""
    if abs(n) < 1024**3:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / 1024**3:.1f} GiB"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _resolve_precision(
    spec: Spec, gpu: GpuType, warnings: list[str], path: list[PathStep]
) -> Precision:
    asked = spec.training.precision
    default = gpu.default_precision()
    if asked is None:
        why = (
            "CPU ranks train in fp32 (no fast 16-bit math over gloo)"
            if gpu.vendor == "cpu"
            else f"{gpu.name} has bf16"
            if gpu.has_bf16
            else f"{gpu.name} has no bf16: fp16 mixed precision with dynamic loss scaling"
        )
        path.append(PathStep(question="Which precision?", answer=default.value, reason=why))
        return default
    if asked == Precision.BF16 and not gpu.has_bf16 and gpu.vendor != "cpu":
        warnings.append(
            f"training.precision: {gpu.name} has no bf16; using fp16 with dynamic loss scaling "
            "(pass --precision fp16 to silence this)"
        )
        path.append(
            PathStep(
                question="Which precision?",
                answer="fp16",
                reason=f"bf16 was asked for but {gpu.name} has no bf16 units",
            )
        )
        return Precision.FP16
    path.append(PathStep(question="Which precision?", answer=asked.value, reason="as given"))
    return asked


def _hardware(spec: Spec, gpu: GpuType, precision: Precision) -> Hardware:
    net = get_network(spec.network.tier)
    inter = net.bytes_per_s
    if spec.network.bandwidth_gbps:
        inter = spec.network.bandwidth_gbps * 1e9 / 8 * net.efficiency
    intra = gpu.intra_gbps * 1e9
    if spec.hardware.intra_node_link is not None and spec.hardware.intra_node_link.value == "pcie":
        intra = min(intra, gpu.pcie_gbps * 1e9)
    price = spec.training.price_per_gpu_hour
    if price is None:
        price = gpu.price_per_hour or None
    return Hardware(
        peak_flops=(gpu.peak_tflops(precision) or gpu.fp32_tflops) * 1e12,
        achievable_mfu=gpu.achievable_mfu,
        intra_bytes_per_s=intra,
        inter_bytes_per_s=inter,
        pcie_bytes_per_s=gpu.pcie_gbps * 1e9,
        gpus_per_node=spec.hardware.gpus_per_node,
        nodes=spec.hardware.nodes,
        price_per_gpu_hour=price,
    )


# --------------------------------------------------------------------------------------------
# Forced layout checks


def _check_forced(ctx: _Ctx) -> None:
    """Refuse inconsistent forced degrees with the whole constraint in one line."""
    lay = ctx.spec.layout
    dims = ctx.dims
    w = ctx.world
    where = f"world size {w} ({ctx.nodes} node(s) x {ctx.gpn} gpus_per_node)"
    tp, pp, cp = lay.tp or 1, lay.pp or 1, lay.cp or 1
    if lay.dp is not None:
        prod = tp * pp * lay.dp * cp
        if prod != w:
            raise SpecError(
                f"tp({tp}) * pp({pp}) * dp({lay.dp}) * cp({cp}) = {prod} != {where}; "
                "pick degrees whose product is the world size",
                field="layout",
            )
    elif w % (tp * pp * cp):
        raise SpecError(
            f"tp({tp}) * pp({pp}) * cp({cp}) = {tp * pp * cp} does not divide {where}; "
            "pick degrees that divide the world size",
            field="layout",
        )
    if lay.tp is not None:
        if dims.heads % lay.tp:
            raise SpecError(
                f"{dims.heads} attention heads are not divisible by tp={lay.tp}; "
                f"pick a tp that divides {dims.heads} (e.g. {max(t for t in _divisors(dims.heads) if t <= max(1, lay.tp) and not t & (t - 1))})",
                field="layout.tp",
            )
        if dims.kv_heads % lay.tp and lay.tp % dims.kv_heads:
            raise SpecError(
                f"{dims.kv_heads} key/value heads and tp={lay.tp} do not divide one another; "
                "pick a tp that divides kv_heads or a multiple of it",
                field="layout.tp",
            )
    if lay.pp is not None and lay.pp > dims.layers:
        raise SpecError(
            f"pp={lay.pp} stages exceed the model's {dims.layers} layers; pass at most {dims.layers}",
            field="layout.pp",
        )
    if lay.ep is not None and lay.ep > 1:
        if not dims.is_moe:
            raise SpecError(
                f"ep={lay.ep} needs a mixture-of-experts model, and {dims.name} is dense; drop --ep",
                field="layout.ep",
            )
        if dims.num_experts % lay.ep:
            raise SpecError(
                f"ep={lay.ep} does not divide the {dims.num_experts} experts; pass a divisor of "
                f"{dims.num_experts}",
                field="layout.ep",
            )
        dpcp = w // (tp * pp)
        if dpcp % lay.ep:
            raise SpecError(
                f"ep({lay.ep}) must divide dp * cp = {dpcp} (experts are spread over data-parallel "
                "ranks); pick an ep that divides it",
                field="layout.ep",
            )
    if lay.cp is not None and ctx.spec.training.seq_len % lay.cp:
        raise SpecError(
            f"seq_len {ctx.spec.training.seq_len} is not divisible by cp={lay.cp}; pass a cp that "
            "divides the sequence length",
            field="layout.cp",
        )
    if lay.strategy is not None and lay.framework is not None:
        if lay.strategy not in _STRATEGIES_OF[lay.framework]:
            allowed = ", ".join(s.value for s in _STRATEGIES_OF[lay.framework])
            raise SpecError(
                f"strategy {lay.strategy.value} does not run on framework {lay.framework.value}; "
                f"with {lay.framework.value} use one of: {allowed}",
                field="layout.strategy",
            )
    if lay.strategy is not None and lay.zero_stage is not None and lay.strategy in _ZERO_OF:
        if _ZERO_OF[lay.strategy] != lay.zero_stage and lay.strategy != Strategy.DDP:
            raise SpecError(
                f"zero_stage {lay.zero_stage} contradicts strategy {lay.strategy.value} (stage "
                f"{_ZERO_OF[lay.strategy]}); pass one of them",
                field="layout.zero_stage",
            )
    if lay.strategy is not None and lay.strategy != Strategy.THREE_D and (tp > 1 or pp > 1):
        raise SpecError(
            f"strategy {lay.strategy.value} is pure data parallelism but tp={tp}, pp={pp} were "
            "given; use --strategy 3d for TP/PP",
            field="layout.strategy",
        )
    if lay.offload not in (None, Offload.NONE):
        if lay.strategy in (Strategy.DDP, Strategy.THREE_D, Strategy.ZERO1, Strategy.FSDP_GRAD_OP):
            raise SpecError(
                f"offload {lay.offload.value} needs ZeRO-2/3 or FSDP FULL_SHARD, not "
                f"{lay.strategy.value if lay.strategy else ''}; use --strategy zero3, zero2 or fsdp-full",
                field="layout.offload",
            )
        if lay.offload == Offload.OPTIMIZER_PARAMS and lay.strategy == Strategy.ZERO2:
            raise SpecError(
                "offloading params needs ZeRO-3; use --strategy zero3 or --offload optimizer",
                field="layout.offload",
            )
    if lay.strategy == Strategy.FSDP_HYBRID and ctx.nodes == 1:
        raise SpecError(
            "fsdp-hybrid shards inside a node and replicates across nodes, and there is one node; "
            "use --strategy fsdp-full (or add --nodes)",
            field="layout.strategy",
        )
    if (lay.cp or 1) > 1 and lay.strategy not in (None, Strategy.FSDP_FULL, Strategy.THREE_D):
        raise SpecError(
            f"cp={lay.cp} runs under Megatron (--strategy 3d) or FSDP2 (--strategy fsdp-full), "
            f"not {lay.strategy.value if lay.strategy else ''}; pick one of those or drop --cp",
            field="layout.cp",
        )
    if (lay.ep or 1) > 1 and lay.strategy not in (
        None,
        Strategy.ZERO1,
        Strategy.ZERO2,
        Strategy.ZERO3,
        Strategy.THREE_D,
    ):
        raise SpecError(
            f"ep={lay.ep} runs under DeepSpeed-MoE (--strategy zero1/zero2/zero3) or Megatron "
            f"(--strategy 3d), not {lay.strategy.value if lay.strategy else ''}",
            field="layout.ep",
        )
    if lay.offload == Offload.OPTIMIZER and (
        lay.framework == Framework.FSDP or lay.strategy in _STRATEGIES_OF[Framework.FSDP]
    ):
        raise SpecError(
            "FSDP offloads parameters, gradients and optimizer together; pass --offload "
            "optimizer+params, or --strategy zero2/zero3 for optimizer-only offload",
            field="layout.offload",
        )
    if lay.virtual_stages is not None and lay.virtual_stages > 1:
        stages = (lay.pp or 1) * lay.virtual_stages
        if (lay.pp or 1) == 1 or dims.layers % stages:
            raise SpecError(
                f"virtual_stages={lay.virtual_stages} needs pp > 1 and layers ({dims.layers}) "
                f"divisible by pp * virtual_stages ({stages})",
                field="layout.virtual_stages",
            )


# --------------------------------------------------------------------------------------------
# Candidates


def _micro_batches(per_replica: int, forced: int | None) -> list[int]:
    if forced is not None:
        return [forced]
    out = [b for b in (1, 2, 4, 8, 16, 32) if b <= per_replica and per_replica % b == 0]
    return out or [1]


def _strategies(ctx: _Ctx, tp: int, pp: int, cp: int, ep: int, dp: int) -> list[Strategy]:
    lay = ctx.spec.layout
    if lay.strategy is not None:
        chosen: tuple[Strategy, ...] = (lay.strategy,)
    elif lay.framework is not None:
        chosen = _STRATEGIES_OF[lay.framework]
    else:
        chosen = tuple(Strategy)
    out: list[Strategy] = []
    for s in chosen:
        if (lay.offload or Offload.NONE) not in _OFFLOADS_OF[s]:
            continue
        if s == Strategy.THREE_D:
            if ctx.gpu.vendor == "cpu" and lay.strategy is None and lay.framework is None:
                continue  # Megatron needs CUDA
            if tp == 1 and pp == 1 and lay.strategy is None and lay.framework is None:
                continue
            out.append(s)
            continue
        if tp > 1 or pp > 1:
            continue
        if cp > 1 and s not in (Strategy.FSDP_FULL,):
            continue  # CP runs under Megatron or FSDP2 (torchtitan)
        if ep > 1 and s not in (Strategy.ZERO1, Strategy.ZERO2, Strategy.ZERO3):
            continue  # EP: DeepSpeed-MoE or Megatron
        if s == Strategy.FSDP_HYBRID and ctx.nodes == 1:
            continue
        if lay.zero_stage is not None and _ZERO_OF[s] != lay.zero_stage:
            continue
        if (
            dp == 1
            and s not in (Strategy.DDP, Strategy.ZERO2, Strategy.ZERO3)
            and lay.strategy is None
        ):
            continue
        out.append(s)
    return out


def _offloads(ctx: _Ctx, s: Strategy) -> list[Offload]:
    forced = ctx.spec.layout.offload
    if forced is not None:
        return [forced]
    if ctx.gpu.vendor == "cpu":
        return [Offload.NONE]  # CPU ranks: there is nothing to offload to
    return list(_OFFLOADS_OF[s])


def _recomputes(ctx: _Ctx) -> list[Recompute]:
    forced = ctx.spec.layout.recompute or ctx.spec.training.recompute
    if forced is not None:
        return [forced]
    if ctx.flash:
        # FlashAttention never stores the score matrix: selective equals none in memory.
        return [Recompute.NONE, Recompute.FULL]
    return [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL]


def _degrees(ctx: _Ctx) -> Iterator[tuple[int, int, int, int, int]]:
    """(tp, pp, cp, dp, ep) tuples that multiply to the world size and respect the model."""
    lay = ctx.spec.layout
    dims = ctx.dims
    w = ctx.world
    seq = ctx.spec.training.seq_len
    if lay.tp is not None:
        tps = [lay.tp]
    else:
        tps = [
            t
            for t in _divisors(ctx.gpn)
            if t <= MAX_TP
            and dims.heads % t == 0
            and (dims.kv_heads % t == 0 or t % dims.kv_heads == 0)
        ]
    if lay.pp is not None:
        pps = [lay.pp]
    else:
        pps = [p for p in _divisors(w) if p <= dims.layers and p <= 64]
    if lay.cp is not None:
        cps = [lay.cp]
    elif seq >= LONG_SEQUENCE:
        cps = [c for c in (1, 2, 4, 8, 16, 32) if seq % c == 0 and seq // c >= MIN_CP_CHUNK]
        # Keep the search bounded: no split, and the three smallest that bring a chunk to <= 32K.
        enough = [c for c in cps if seq // c <= LONG_SEQUENCE]
        cps = sorted({1, *enough[:3]} & set(cps)) if enough else cps
    else:
        cps = [1]
    for tp in tps:
        for pp in pps:
            for cp in cps:
                if w % (tp * pp * cp):
                    continue
                dp = w // (tp * pp * cp)
                if lay.dp is not None and dp != lay.dp:
                    continue
                if lay.ep is not None:
                    eps = [lay.ep]
                elif dims.is_moe:
                    fit = [e for e in _divisors(dims.num_experts) if (dp * cp) % e == 0]
                    in_node = [e for e in fit if e <= ctx.gpn]
                    # Bounded: none, 2, the largest inside a node, and the largest overall.
                    eps = sorted({1, *(e for e in fit if e == 2), in_node[-1], fit[-1]})
                else:
                    eps = [1]
                for ep in eps:
                    yield tp, pp, cp, dp, ep


def _candidates(ctx: _Ctx) -> list[_Cand]:
    spec = ctx.spec
    lay = spec.layout
    gb = spec.training.global_batch
    forced_mb = lay.micro_batch or spec.training.micro_batch
    out: list[_Cand] = []
    for tp, pp, cp, dp, ep in _degrees(ctx):
        per_replica = max(1, gb // dp)
        mbs = _micro_batches(per_replica, forced_mb)
        strategies = _strategies(ctx, tp, pp, cp, ep, dp)
        if not strategies:
            continue
        sp = lay.sequence_parallel if lay.sequence_parallel is not None else tp > 1
        sched = PPSchedule.INTERLEAVED if (lay.virtual_stages or 1) > 1 else PPSchedule.ONE_F_ONE_B
        for s in strategies:
            framework = lay.framework or _FRAMEWORK_OF[s]
            zeros: list[int]
            if s == Strategy.THREE_D:
                if lay.zero_stage is not None:
                    zeros = [lay.zero_stage]
                else:  # the distributed optimizer only matters with data parallelism
                    zeros = [1, 0] if dp * cp > 1 else [0]
            else:
                zeros = [_ZERO_OF[s]]
            for z in zeros:
                for off in _offloads(ctx, s):
                    for rc in _recomputes(ctx):
                        for mb in mbs:
                            accum = max(1, math.ceil(per_replica / mb))
                            d = LayoutDraft(
                                strategy=s,
                                framework=framework,
                                tp=tp,
                                pp=pp,
                                dp=dp,
                                cp=cp,
                                ep=ep,
                                zero_stage=z,
                                offload=off,
                                micro_batch=mb,
                                grad_accum=accum,
                                recompute=rc,
                                sequence_parallel=sp,
                                precision=ctx.precision,
                                pp_schedule=sched,
                                virtual_stages=lay.virtual_stages or 1,
                            )
                            mem = estimate_memory(
                                ctx.dims,
                                d,
                                seq_len=spec.training.seq_len,
                                optimizer=spec.training.optimizer,
                                flash=ctx.flash,
                                gpus_per_node=ctx.gpn,
                            )
                            fits = mem.total <= ctx.usable and (
                                mem.cpu_bytes * ctx.gpn <= ctx.cpu_usable
                            )
                            out.append(_Cand(d, mem, fits))
                            if not fits:
                                break  # a larger micro-batch needs more memory still
    return out


def _evaluate(ctx: _Ctx, c: _Cand) -> _Cand:
    if c.est is None:
        c.est = estimate_time(
            ctx.dims,
            c.draft,
            ctx.hw,
            seq_len=ctx.spec.training.seq_len,
            tokens_budget=ctx.spec.training.tokens,
        )
    return c


def _rank_key(c: _Cand) -> tuple[float, int, int, int]:
    d = c.draft
    offload = 0 if d.offload == Offload.NONE else 1
    return (round(c.time, 4), offload, _SIMPLICITY[d.strategy], -d.micro_batch)


def _best(ctx: _Ctx, cands: list[_Cand]) -> _Cand | None:
    fitting = [_evaluate(ctx, c) for c in cands if c.fits]
    if not fitting:
        return None
    return min(fitting, key=_rank_key)


def _smallest(cands: list[_Cand]) -> _Cand:
    return min(cands, key=lambda c: (c.mem.total, _SIMPLICITY[c.draft.strategy]))


# --------------------------------------------------------------------------------------------
# Describing


def describe(d: LayoutDraft | Layout) -> str:
    """A short human name for a layout: ``ZeRO-2 (DeepSpeed) dp=8``."""
    names = {
        Strategy.DDP: "DDP",
        Strategy.ZERO1: "ZeRO-1",
        Strategy.ZERO2: "ZeRO-2",
        Strategy.ZERO3: "ZeRO-3",
        Strategy.FSDP_FULL: "FSDP FULL_SHARD",
        Strategy.FSDP_GRAD_OP: "FSDP SHARD_GRAD_OP",
        Strategy.FSDP_HYBRID: "FSDP HYBRID_SHARD",
        Strategy.THREE_D: "3D",
    }
    parts = [f"{names[d.strategy]} ({d.framework.value})"]
    degrees = [f"{k}={getattr(d, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(d, k) > 1]
    parts.append(" ".join([*degrees, f"dp={d.dp}"]))
    if d.strategy == Strategy.THREE_D and d.zero_stage:
        parts.append("+ distributed optimizer")
    if d.offload != Offload.NONE:
        parts.append(f"+ {d.offload.value} offload")
    return " ".join(parts)


def _mem_line(m: MemoryBreakdown) -> str:
    return (
        f"{_gib(m.total)} (params {_gib(m.params)}, grads {_gib(m.grads)}, optimizer "
        f"{_gib(m.optimizer)}, activations {_gib(m.activations)}, buffers {_gib(m.buffers)})"
    )


def _to_layout(c: _Cand, rejected: str | None = None, notes: list[str] | None = None) -> Layout:
    d = c.draft
    e = c.est
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
        memory_per_gpu=c.mem,
        fits=c.fits,
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


# --------------------------------------------------------------------------------------------
# The flowchart


def _fits_class(ctx: _Ctx, cands: list[_Cand], strategies: tuple[Strategy, ...]) -> _Cand | None:
    pool = [
        c
        for c in cands
        if c.draft.strategy in strategies
        and c.draft.offload == Offload.NONE
        and c.draft.tp == 1
        and c.draft.pp == 1
    ]
    return _best(ctx, pool)


def _need(
    ctx: _Ctx, cands: list[_Cand], strategies: tuple[Strategy, ...], everything: list[_Cand]
) -> str:
    pool = [c for c in cands if c.draft.strategy in strategies and c.draft.offload == Offload.NONE]
    if not pool:
        pool = [
            c
            for c in everything
            if c.draft.strategy in strategies and c.draft.offload == Offload.NONE
        ]
    if not pool:
        return "no such layout applies to this world size"
    c = _smallest(pool)
    return f"{describe(c.draft)} needs at least {_mem_line(c.mem)} of {_gib(ctx.usable)} usable"


def plan(spec: Spec) -> Plan:
    """Plan ``spec``: resolve the model and hardware, walk the flowchart, search nearby layouts,
    and return the recommendation with its path, alternatives and warnings. Raises
    :class:`SpecError` for specs that cannot be planned (with the field and the fix)."""
    dims = resolve_model(spec.model)
    try:
        gpu = get_gpu(spec.hardware.gpu)
    except ValueError as e:
        raise SpecError(str(e), field="hardware.gpu") from None
    warnings: list[str] = []
    path: list[PathStep] = []
    precision = _resolve_precision(spec, gpu, warnings, path)
    hw = _hardware(spec, gpu, precision)
    world = spec.hardware.world_size
    ctx = _Ctx(
        spec=spec,
        dims=dims,
        gpu=gpu,
        hw=hw,
        precision=precision,
        usable=usable_bytes(gpu.memory_bytes),
        cpu_usable=usable_bytes(
            int(spec.hardware.cpu_ram_gb * 1e9)
            if spec.hardware.cpu_ram_gb
            else 2 * gpu.memory_bytes * spec.hardware.gpus_per_node
        ),
        flash=gpu.vendor != "cpu",
        world=world,
        gpn=spec.hardware.gpus_per_node,
        nodes=spec.hardware.nodes,
    )
    _check_forced(ctx)
    forced = spec.layout.is_forced
    cands = _candidates(ctx)
    if not cands:
        raise SpecError(
            f"no valid layout for {world} GPU(s) with the forced settings "
            f"{spec.layout.model_dump(exclude_none=True, mode='json')}; relax the forced layout",
            field="layout",
        )
    seq = spec.training.seq_len

    # MoE → EP and long sequences → CP narrow the pool the flowchart answers from.
    pool = cands
    if dims.is_moe and world > 1 and spec.layout.ep is None:
        with_ep = [c for c in pool if c.draft.ep > 1]
        if any(c.fits for c in with_ep):
            pool = with_ep
    if seq >= LONG_SEQUENCE and spec.layout.cp is None:
        with_cp = [c for c in pool if c.draft.cp > 1]
        if any(c.fits for c in with_cp):
            pool = with_cp

    # Micro-batches >= 4x PP stages (seed doc 001), unless nothing else fits.
    deep = [c for c in pool if c.draft.pp == 1 or c.draft.grad_accum >= 4 * c.draft.pp]
    if spec.layout.pp is None and any(c.fits for c in deep):
        pool = deep

    flow: _Cand | None = None
    if world == 1:
        path.append(
            PathStep(
                question="Is there more than one GPU?",
                answer="no",
                reason="one device: data parallelism has nothing to split; gradient accumulation "
                "reaches the global batch",
            )
        )
    single = _fits_class(ctx, pool, _CLASS_DDP)
    ddp_need = _need(ctx, pool, _CLASS_DDP, cands)
    path.append(
        PathStep(
            question="Does the model fit on one GPU (full replica: params, grads, optimizer, activations)?",
            answer="yes" if single else "no",
            reason=(
                f"DDP needs {_mem_line(single.mem)} per GPU of {_gib(ctx.usable)} usable"
                if single
                else ddp_need
            ),
        )
    )
    if single:
        flow = single
        path.append(
            PathStep(
                question="Which strategy?",
                answer="DDP" if world > 1 else "single GPU",
                reason="the model fits: replicate it and all-reduce gradients (simplest, near-linear scaling)",
            )
        )
    else:
        og = _fits_class(ctx, pool, _CLASS_SHARD_OG)
        path.append(
            PathStep(
                question="Does it fit with optimizer and gradient sharding (ZeRO-1/2, FSDP SHARD_GRAD_OP)?",
                answer="yes" if og else "no",
                reason=(
                    f"{describe(og.draft)} needs {_mem_line(og.mem)}"
                    if og
                    else _need(ctx, pool, _CLASS_SHARD_OG, cands)
                ),
            )
        )
        if og:
            flow = og
        else:
            full = _fits_class(ctx, pool, _CLASS_SHARD_ALL)
            path.append(
                PathStep(
                    question="Does it fit with full sharding (ZeRO-3, FSDP FULL_SHARD)?",
                    answer="yes" if full else "no",
                    reason=(
                        f"{describe(full.draft)} needs {_mem_line(full.mem)}"
                        if full
                        else _need(ctx, pool, _CLASS_SHARD_ALL, cands)
                    ),
                )
            )
            if full:
                flow = full
            else:
                three_d = _best(ctx, [c for c in pool if c.draft.strategy == Strategy.THREE_D])
                offl = _best(ctx, [c for c in pool if c.draft.offload != Offload.NONE])
                flow = three_d or offl
                if three_d and offl and offl.time < three_d.time:
                    flow = offl
                answer = "none fits" if flow is None else describe(flow.draft)
                reason = (
                    f"needs {_mem_line(flow.mem)}; "
                    + (
                        "TP splits layers inside a node, PP splits layers across nodes"
                        if flow.draft.strategy == Strategy.THREE_D
                        else "optimizer state (and params) move to CPU memory: slower, last resort"
                    )
                    if flow
                    else f"even the leanest layout, {describe(_smallest(cands).draft)}, needs "
                    f"{_gib(_smallest(cands).mem.total)} per GPU; add GPUs, shorten the sequence "
                    "or use a smaller model"
                )
                path.append(
                    PathStep(
                        question="Still out of memory: does TP+PP+DP or CPU offload fit?",
                        answer=answer,
                        reason=reason,
                    )
                )

    # Search near the flowchart's outcome. Offload stays the last resort: it never replaces a
    # layout that fits without it.
    near = pool
    if flow is not None and flow.draft.offload == Offload.NONE:
        near = [c for c in pool if c.draft.offload == Offload.NONE]
    best = _best(ctx, near)
    chosen = flow or best
    if flow and best and best is not flow and best.time < flow.time * (1 - CLEARLY_FASTER):
        gain = 1 - best.time / flow.time
        path.append(
            PathStep(
                question="Is a nearby layout clearly faster?",
                answer=f"yes: {describe(best.draft)}",
                reason=(
                    f"{gain:.0%} shorter step ({best.time:.3g} s vs {flow.time:.3g} s for the "
                    f"flowchart's {describe(flow.draft)})"
                ),
            )
        )
        chosen = best
    elif flow:
        path.append(
            PathStep(
                question="Is a nearby layout clearly faster?",
                answer="no",
                reason=(
                    f"searched {len(cands)} layouts; none is {CLEARLY_FASTER:.0%} faster than "
                    f"{describe(flow.draft)} ({flow.time:.3g} s/step)"
                ),
            )
        )
    if chosen is None:
        chosen = _evaluate(ctx, _smallest(cands))
        if not forced:
            warnings.append(
                f"nothing fits: the leanest layout ({describe(chosen.draft)}) "
                f"{_shortfall(ctx, chosen)}; add GPUs or nodes, shorten --seq-len, or use "
                "--recompute full / --offload"
            )
    if dims.is_moe:
        ep = chosen.draft.ep
        path.append(
            PathStep(
                question="Is it a mixture-of-experts model?",
                answer=f"yes: ep={ep}" if ep > 1 else "yes, but ep=1",
                reason=(
                    f"{dims.num_experts} experts, top-{dims.experts_per_token}: expert parallelism "
                    f"places {dims.num_experts // ep} expert(s) per GPU and routes tokens with all-to-all"
                    if ep > 1
                    else "no expert-parallel layout fits this world size"
                ),
            )
        )
    if seq >= LONG_SEQUENCE:
        cp = chosen.draft.cp
        path.append(
            PathStep(
                question=f"Is the sequence long (>= {LONG_SEQUENCE // 1024}K tokens)?",
                answer=f"yes: cp={cp}" if cp > 1 else "yes, but cp=1",
                reason=(
                    f"context parallelism splits the {seq}-token sequence into {cp} chunks of "
                    f"{seq // cp} (ring attention), dividing activations by {cp}"
                    if cp > 1
                    else "activations fit without splitting the sequence"
                ),
            )
        )
    d = chosen.draft
    if d.tp > 1:
        inside = d.tp <= ctx.gpn
        path.append(
            PathStep(
                question="Does TP stay inside a node?",
                answer="yes" if inside else "no",
                reason=(
                    f"tp={d.tp} <= {ctx.gpn} GPUs per node: TP all-reduces run on "
                    f"{gpu.intra_link.value}"
                    if inside
                    else f"tp={d.tp} spans nodes: every layer's all-reduce crosses the network"
                ),
            )
        )
    if d.pp > 1:
        m = d.grad_accum
        path.append(
            PathStep(
                question="Are there at least 4x as many micro-batches as PP stages?",
                answer="yes" if m >= 4 * d.pp else "no",
                reason=(
                    f"{m} micro-batches for {d.pp} stages: bubble "
                    f"{chosen.est.bubble_fraction if chosen.est else 0:.0%} (p-1)/(m+p-1)"
                ),
            )
        )
    if forced:
        given = spec.layout.model_dump(exclude_none=True, mode="json")
        path.append(
            PathStep(
                question="Does the forced layout fit?",
                answer="yes" if chosen.fits else "no",
                reason=(
                    f"{given}: {describe(d)} needs {_mem_line(chosen.mem)} of {_gib(ctx.usable)} usable"
                    + (
                        ""
                        if chosen.fits
                        else (
                            f"; {_shortfall(ctx, chosen)}" if chosen.mem.total <= ctx.usable else ""
                        )
                        + f"; {_fix_hint(d)}"
                    )
                ),
            )
        )

    recommended = _to_layout(chosen, notes=_notes(ctx, chosen))
    alternatives = _alternatives(ctx, cands, chosen)
    if forced and not chosen.fits:
        # What the planner would pick without the forced settings, so the user sees a way out.
        free = plan(spec.model_copy(update={"layout": LayoutSpec()}))
        if free.recommended.fits:
            alt = free.recommended.model_copy(
                update={"rejected_because": "fits, but is not the forced layout"}
            )
            alternatives = [alt, *alternatives][:MAX_ALTERNATIVES]
            path.append(
                PathStep(
                    question="What would fit instead?",
                    answer=describe(alt),
                    reason=f"the unforced plan: {_mem_line(alt.memory_per_gpu)}",
                )
            )
    _check_mistakes(ctx, recommended, warnings)
    return Plan(
        spec=spec,
        model=dims,
        gpu=GpuInfo(
            key=gpu.key,
            name=gpu.name,
            memory_bytes=gpu.memory_bytes,
            peak_tflops=hw.peak_flops / 1e12,
            bf16=gpu.has_bf16,
            intra_node_gbps=hw.intra_bytes_per_s / 1e9,
            inter_node_gbps=hw.inter_bytes_per_s / 1e9,
            dist_backend=gpu.dist_backend,
            price_per_gpu_hour=hw.price_per_gpu_hour,
        ),
        world_size=world,
        nodes=ctx.nodes,
        gpus_per_node=ctx.gpn,
        recommended=recommended,
        alternatives=alternatives,
        path=path,
        warnings=warnings,
        forced=forced,
    )


def _shortfall(ctx: _Ctx, c: _Cand) -> str:
    """Why ``c`` does not fit, in numbers: GPU memory, or host RAM for what it offloads."""
    if c.mem.total > ctx.usable:
        return f"needs {_gib(c.mem.total)} per GPU of {_gib(ctx.usable)} usable"
    need = c.mem.cpu_bytes * ctx.gpn
    return (
        f"offloads {_gib(need)} per node to host RAM of {_gib(ctx.cpu_usable)} usable "
        "(pass --cpu-ram-gb if the nodes have more)"
    )


def _fix_hint(d: LayoutDraft) -> str:
    if d.strategy in (Strategy.DDP, Strategy.ZERO1):
        return "try --strategy zero2 or zero3"
    if d.strategy in (Strategy.ZERO2, Strategy.FSDP_GRAD_OP):
        return "try --strategy zero3 (or fsdp-full)"
    if d.offload == Offload.NONE and d.strategy != Strategy.THREE_D:
        return "try --offload optimizer, more GPUs, or --recompute full"
    return "try larger tp/pp, --recompute full, or more GPUs"


def _notes(ctx: _Ctx, c: _Cand) -> list[str]:
    d = c.draft
    notes: list[str] = []
    if d.recompute == Recompute.FULL:
        notes.append("full activation recompute: about 33% more compute per step")
    if d.offload != Offload.NONE:
        notes.append(
            f"{_gib(c.mem.cpu_bytes)} per GPU lives in CPU memory ({d.offload.value}); "
            "the optimizer step runs on the CPU"
        )
    if d.precision == Precision.FP16:
        notes.append("fp16: dynamic loss scaling is on (initial scale 2^16)")
    if ctx.gpu.vendor == "cpu":
        notes.append("CPU ranks over gloo: a smoke-test set-up; times are nominal")
    if d.strategy == Strategy.THREE_D and d.sequence_parallel:
        notes.append(
            "sequence parallelism splits layer-norm and dropout activations across TP ranks"
        )
    return notes


def _alternatives(ctx: _Ctx, cands: list[_Cand], chosen: _Cand) -> list[Layout]:
    """The best layout of each other strategy/offload kind, each with why it lost."""
    groups: dict[tuple[Strategy, Offload], list[_Cand]] = {}
    for c in cands:
        groups.setdefault((c.draft.strategy, c.draft.offload), []).append(c)
    out: list[tuple[float, Layout]] = []
    for (strategy, offload), group in groups.items():
        if strategy == chosen.draft.strategy and offload == chosen.draft.offload:
            continue
        best = _best(ctx, group)
        if best is None:
            lean = _smallest(group)
            why = f"does not fit: {_shortfall(ctx, lean)}"
            out.append((math.inf, _to_layout(_evaluate(ctx, lean), rejected=why)))
            continue
        if chosen.est and best.est:
            ratio = best.time / chosen.time if chosen.time else 1.0
            if ratio > 1.005:
                why = f"{ratio - 1:.0%} slower ({best.time:.3g} s vs {chosen.time:.3g} s per step)"
            elif offload != Offload.NONE:
                why = "offload is the last resort: the plan fits without it"
            else:
                why = (
                    f"about as fast ({best.time:.3g} s per step); the recommended layout is the "
                    "flowchart's choice"
                )
            if not chosen.fits:
                why = "fits but differs from the forced layout"
        else:
            why = "not evaluated"
        out.append((best.time, _to_layout(best, rejected=why)))
    out.sort(key=lambda t: t[0])
    return [lay for _, lay in out[:MAX_ALTERNATIVES]]


def _check_mistakes(ctx: _Ctx, lay: Layout, warnings: list[str]) -> None:
    """The seeds' common mistakes, as warnings a person can act on."""
    spec = ctx.spec
    t = spec.training
    dims = ctx.dims
    if lay.global_batch != t.global_batch:
        warnings.append(
            f"training.global_batch: {t.global_batch} is not micro_batch x grad_accum x dp "
            f"({lay.micro_batch} x {lay.grad_accum} x {lay.dp}); the plan trains with "
            f"{lay.global_batch}. Pass a global batch divisible by {lay.micro_batch * lay.dp}"
        )
    if t.lr is not None:
        if t.reference_batch:
            scaled = t.lr * lay.global_batch / t.reference_batch
            if abs(scaled - t.lr) / t.lr > 0.01:
                warnings.append(
                    f"training.lr: {t.lr:g} was tuned for a global batch of {t.reference_batch}; "
                    f"at {lay.global_batch} the linear scaling rule gives {scaled:.3g} "
                    "(with warmup; for Adam at large batches, sqrt scaling is safer)"
                )
        else:
            warnings.append(
                f"training.lr: {t.lr:g} is kept as is; if it was tuned for another global batch, "
                f"scale it linearly to {lay.global_batch} (pass reference_batch for the figure)"
            )
    if lay.pp > 1 and dims.layers % lay.pp:
        warnings.append(
            f"layout.pp: {dims.layers} layers do not split evenly into {lay.pp} stages; the first "
            f"stages get {math.ceil(dims.layers / lay.pp)} layers (pass a pp that divides {dims.layers})"
        )
    if lay.tp > ctx.gpn:
        warnings.append(
            f"layout.tp: tp={lay.tp} exceeds {ctx.gpn} GPUs per node, so TP crosses nodes and every "
            "layer's all-reduce goes over the network; keep tp <= gpus_per_node"
        )
    if lay.bubble_fraction > MAX_BUBBLE:
        warnings.append(
            f"pipeline bubble {lay.bubble_fraction:.0%} > {MAX_BUBBLE:.0%}: {lay.grad_accum} "
            f"micro-batches for {lay.pp} stages; use >= {4 * lay.pp} micro-batches (raise the "
            "global batch or lower the micro-batch)"
        )
    if lay.fits and lay.scaling_efficiency < MIN_SCALING and ctx.world > 1:
        warnings.append(
            f"scaling efficiency {lay.scaling_efficiency:.0%} < {MIN_SCALING:.0%}: communication "
            "dominates; a faster network, a larger micro-batch or fewer GPUs would help"
        )
    if ctx.nodes > 1 and spec.network.tier.value == "tcp":
        warnings.append(
            "network.tier: multi-node over plain TCP; inter-node gradients will bottleneck (use "
            "InfiniBand/EFA, e.g. SkyPilot network_tier: best, and pass --network)"
        )
    if lay.fits and lay.offload != Offload.NONE and not spec.layout.offload:
        warnings.append(
            "CPU offload is the last resort (seed doc 000): it fits, but expect a slow optimizer step"
        )
    if lay.framework == Framework.MEGATRON and ctx.gpu.vendor == "cpu":
        warnings.append(
            "layout.framework: Megatron-LM needs CUDA GPUs; on CPU ranks use ddp, deepspeed or fsdp"
        )
    if lay.sequence_parallel and lay.tp == 1:
        warnings.append("layout.sequence_parallel: needs tp > 1; it has no effect here")
    if not lay.fits and spec.layout.is_forced:
        warnings.append(
            f"the forced layout does not fit: {_gib(lay.memory_per_gpu.total)} per GPU of "
            f"{_gib(ctx.usable)} usable"
            + (
                ""
                if lay.memory_per_gpu.total > ctx.usable
                else f", and {_gib(lay.memory_per_gpu.cpu_bytes * ctx.gpn)} per node offloaded "
                f"to host RAM of {_gib(ctx.cpu_usable)} usable"
            )
            + f"; {_fix_hint(_draft_of(lay))}"
        )


def _draft_of(lay: Layout) -> LayoutDraft:
    return LayoutDraft(
        strategy=lay.strategy,
        framework=lay.framework,
        tp=lay.tp,
        pp=lay.pp,
        dp=lay.dp,
        cp=lay.cp,
        ep=lay.ep,
        zero_stage=lay.zero_stage,
        offload=lay.offload,
        micro_batch=lay.micro_batch,
        grad_accum=lay.grad_accum,
        recompute=lay.recompute,
        sequence_parallel=lay.sequence_parallel,
        precision=lay.precision,
    )
