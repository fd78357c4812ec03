"""dtrain-tui's decision flowchart, walked over the searched candidates: fits on one GPU → DDP;
fits with optimizer/gradient sharding → ZeRO-1/2 or FSDP SHARD_GRAD_OP; else ZeRO-3 /
FULL_SHARD; still out of memory → TP+PP+DP or CPU offload; then whether a nearby layout is
clearly faster, and the questions about the chosen layout's shape (MoE → expert parallelism,
long sequences → context parallelism, TP inside a node, micro-batches ≥ 4× PP stages, the
pipeline's schedule and stage split). The flowchart's preferences (EP for MoE, CP for long
sequences, ≥ 4 micro-batches per stage) narrow the pool only while they cost less than
:data:`CLEARLY_FASTER`: the time model already charges what they guard against. Each question,
answer and reason is appended to the plan's path as a :class:`PathStep`. Called by
:func:`engine.plan.planner.plan`.
"""

from __future__ import annotations

from engine.plan.annotate import describe, mem_line, shortfall, step_time_text
from engine.plan.context import PlanContext
from engine.plan.frameworks import cp_comm_of
from engine.plan.memory import LayoutDraft, mtp_modules
from engine.plan.names import CpComm, Offload, Strategy
from engine.plan.result import PathStep, gib
from engine.plan.search import (
    CLEARLY_FASTER,
    LONG_SEQUENCE,
    Candidate,
    best,
    deep_enough,
    evaluate,
    floor_step,
    kernels_only,
    smallest,
)
from engine.plan.stages import stage_layers

__all__ = ["CLEARLY_FASTER", "choose", "narrow", "shape_steps", "walk"]
# The flowchart's classes.
CLASS_DDP = (Strategy.DDP,)
CLASS_SHARD_OG = (Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP_GRAD_OP)
CLASS_SHARD_ALL = (Strategy.ZERO3, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID)


def narrow(ctx: PlanContext, cands: list[Candidate]) -> list[Candidate]:
    """The pool the flowchart answers from: MoE → EP and long sequences → CP, and micro-batches
    >= 4x PP stages (the flowchart's rule; counted with the virtual stages, which shrink the bubble
    alike), each applied when a layout honouring it fits and is not clearly slower than the
    fastest without it."""
    spec = ctx.spec
    pool = cands
    if ctx.dims.is_moe and ctx.world > 1 and spec.layout.ep is None:
        pool = _prefer(ctx, pool, [c for c in pool if c.draft.ep > 1])
    if spec.training.seq_len >= LONG_SEQUENCE and spec.layout.cp is None:
        pool = _prefer(ctx, pool, [c for c in pool if c.draft.cp > 1])
    if spec.layout.pp is None:
        pool = _prefer(ctx, pool, [c for c in pool if deep_enough(c.draft)])
    return pool


def _prefer(ctx: PlanContext, pool: list[Candidate], preferred: list[Candidate]) -> list[Candidate]:
    """``preferred`` when one of it fits and its fastest is within :data:`CLEARLY_FASTER` of the
    pool's fastest; else the whole pool."""
    top = best(ctx, preferred)
    if top is None:
        return pool
    fastest = best(ctx, pool)
    if fastest is not None and fastest.time_per_sequence < top.time_per_sequence * (
        1 - CLEARLY_FASTER
    ):
        return pool
    return preferred


def walk(
    ctx: PlanContext, pool: list[Candidate], cands: list[Candidate], path: list[PathStep]
) -> Candidate | None:
    """The memory questions, simplest class first: the flowchart's layout, or None when nothing
    in ``pool`` fits."""
    if ctx.world == 1:
        path.append(
            PathStep(
                question="Is there more than one GPU?",
                answer="no",
                reason="one device: data parallelism has nothing to split; gradient accumulation "
                "reaches the global batch",
            )
        )
    single = _fits_class(ctx, pool, CLASS_DDP)
    ddp_need = _need(ctx, pool, CLASS_DDP, cands)
    path.append(
        PathStep(
            question="Does the model fit on one GPU (full replica: params, grads, optimizer, activations)?",
            answer="yes" if single else "no",
            reason=(
                f"DDP needs {mem_line(single.mem)} per GPU of {gib(ctx.usable)} usable"
                if single
                else ddp_need
            ),
        )
    )
    if single:
        path.append(
            PathStep(
                question="Which strategy?",
                answer="DDP" if ctx.world > 1 else "single GPU",
                reason="the model fits: replicate it and all-reduce gradients (simplest, near-linear scaling)",
            )
        )
        return single
    for question, strategies in (
        (
            "Does it fit with optimizer and gradient sharding (ZeRO-1/2, FSDP SHARD_GRAD_OP)?",
            CLASS_SHARD_OG,
        ),
        ("Does it fit with full sharding (ZeRO-3, FSDP FULL_SHARD)?", CLASS_SHARD_ALL),
    ):
        found = _fits_class(ctx, pool, strategies)
        path.append(
            PathStep(
                question=question,
                answer="yes" if found else "no",
                reason=(
                    f"{describe(found.draft)} needs {mem_line(found.mem)}"
                    if found
                    else _need(ctx, pool, strategies, cands)
                ),
            )
        )
        if found:
            return found
    return _last_resort(ctx, pool, cands, path)


def _last_resort(
    ctx: PlanContext, pool: list[Candidate], cands: list[Candidate], path: list[PathStep]
) -> Candidate | None:
    """Still out of memory: TP+PP+DP, or CPU offload when it is faster or alone fits."""
    three_d = best(ctx, [c for c in pool if c.draft.strategy == Strategy.THREE_D])
    offl = best(ctx, [c for c in pool if c.draft.offload != Offload.NONE])
    flow = three_d or offl
    if three_d and offl and offl.time < three_d.time:
        flow = offl
    if flow is None:
        lean = smallest(cands)
        reason = (
            f"even the leanest layout, {describe(lean.draft)}, needs {gib(lean.mem.total)} per "
            "GPU; add GPUs, shorten the sequence or use a smaller model"
        )
    else:
        reason = f"needs {mem_line(flow.mem)}; " + (
            "TP splits layers inside a node, PP splits layers across nodes"
            if flow.draft.strategy == Strategy.THREE_D
            else "optimizer state (and params) move to CPU memory: slower, last resort"
        )
    path.append(
        PathStep(
            question="Still out of memory: does TP+PP+DP or CPU offload fit?",
            answer="none fits" if flow is None else describe(flow.draft),
            reason=reason,
        )
    )
    return flow


def _fits_class(
    ctx: PlanContext, cands: list[Candidate], strategies: tuple[Strategy, ...]
) -> Candidate | None:
    pool = [c for c in cands if _in_class(c, strategies) and c.draft.offload == Offload.NONE]
    return best(ctx, pool)


def _in_class(c: Candidate, strategies: tuple[Strategy, ...]) -> bool:
    """Whether ``c`` is a layout of the class: one of its strategies without TP or PP. Full
    sharding with expert parallelism (Megatron-FSDP or FSDP2 with EP: a 3D layout of ZeRO
    stage 3 without TP or PP) is the full-sharding class of an MoE model."""
    d = c.draft
    if d.tp != 1 or d.pp != 1:
        return False
    if d.strategy in strategies:
        return True
    return strategies == CLASS_SHARD_ALL and d.strategy == Strategy.THREE_D and d.zero_stage >= 3


def _need(
    ctx: PlanContext,
    cands: list[Candidate],
    strategies: tuple[Strategy, ...],
    everything: list[Candidate],
) -> str:
    """What the leanest layout of a class needs (from the whole search when the pool has none)."""
    pool = [c for c in cands if c.draft.strategy in strategies and c.draft.offload == Offload.NONE]
    set_aside = not pool
    if set_aside:
        pool = [
            c
            for c in everything
            if c.draft.strategy in strategies and c.draft.offload == Offload.NONE
        ]
    if not pool:
        if ctx.batch % ctx.world:
            return (
                f"pure data parallelism needs dp={ctx.world}, and a global batch of {ctx.batch} "
                f"does not split into {ctx.world} replicas of whole sequences"
            )
        if ctx.spec.layout.is_forced:
            return f"the forced {ctx.spec.layout.given_text()} rules it out"
        return "no such layout applies to this world size"
    c = smallest(pool)
    if set_aside and c.fits:
        return (
            f"{describe(c.draft)} would fit ({gib(c.mem.total)} of {gib(ctx.usable)} usable) but "
            f"{_why_set_aside(ctx, c)}"
        )
    return f"{describe(c.draft)} needs at least {mem_line(c.mem)} of {gib(ctx.usable)} usable"


def _why_set_aside(ctx: PlanContext, c: Candidate) -> str:
    """Why :func:`narrow` left a fitting layout out of the flowchart's pool."""
    d = c.draft
    if ctx.dims.is_moe and d.ep == 1:
        return (
            "does not split the experts, and an expert-parallel layout is not clearly slower "
            "(dtrain-tui's flowchart: MoE → expert parallelism)"
        )
    if ctx.spec.training.seq_len >= LONG_SEQUENCE and d.cp == 1:
        return (
            "does not split the sequence, and a context-parallel layout is not clearly slower "
            "(long sequences → context parallelism)"
        )
    return "a layout the flowchart prefers is not clearly slower"


BETTER_FASTER = 0.10
"""A layout at least this much faster than the flowchart's (a 12 % faster Megatron layout
kept out by the 15 % rule is a day lost on a long run; a 5 % one on a 7B model on one node is
not worth leaving ZeRO-2's simplicity for) ..."""
BETTER_LEANER = 0.05
"""... that also needs at least this share of the usable memory less replaces it, however
short of :data:`CLEARLY_FASTER` its gain (:func:`_dominating`). Both are beyond the time and
memory models' noise: a 1 % gain or a few MiB saved is no reason to leave the simpler layout."""


def _dominating(ctx: PlanContext, flow: Candidate, near: list[Candidate]) -> Candidate | None:
    """The fastest layout of ``near`` that fits, is :data:`BETTER_FASTER` faster than ``flow``
    and :data:`BETTER_LEANER` leaner: :data:`CLEARLY_FASTER` guards a simpler layout's ease of
    running, but one that is slower and closer to running out of memory has nothing left to
    guard. None when there is no such layout."""
    flow = evaluate(ctx, flow)
    leaner = flow.mem.total - BETTER_LEANER * ctx.usable
    faster = flow.time * (1 - BETTER_FASTER)
    return best(
        ctx,
        [
            c
            for c in near
            if c is not flow
            and c.fits
            and c.mem.total <= leaner
            # The bound first: a layout it already puts past ``faster`` is never timed.
            and floor_step(ctx, c) <= faster
            and evaluate(ctx, c).time <= faster
        ],
    )


def choose(
    ctx: PlanContext,
    flow: Candidate | None,
    pool: list[Candidate],
    cands: list[Candidate],
    path: list[PathStep],
    warnings: list[str],
) -> Candidate:
    """The recommended candidate: the flowchart's layout unless one nearby is clearly faster;
    the leanest of all when nothing fits (with a warning, unless the layout was forced).
    Offload stays the last resort: it never replaces a layout that fits without it."""
    near = pool
    if flow is not None and flow.draft.offload == Offload.NONE:
        near = [c for c in pool if c.draft.offload == Offload.NONE]
    fastest = best(ctx, near)
    chosen = flow or fastest
    if flow is not None:
        step, chosen = nearby_step(ctx, flow, fastest, near, cands)
        path.append(step)
    if chosen is None:
        chosen = evaluate(ctx, smallest(cands))
        if not ctx.spec.layout.is_forced:
            warnings.append(
                f"nothing fits: the leanest layout ({describe(chosen.draft)}) "
                f"{shortfall(ctx, chosen)}; add GPUs or nodes, shorten --seq-len, or use "
                "--recompute full / --offload"
            )
    return chosen


def nearby_step(
    ctx: PlanContext,
    flow: Candidate,
    fastest: Candidate | None,
    near: list[Candidate],
    cands: list[Candidate],
) -> tuple[PathStep, Candidate]:
    """ "Is a nearby layout clearly faster?" asked of the flowchart's layout ``flow``: the step
    that answers it, and the layout that wins (``flow`` itself unless one nearby is clearly
    faster, or faster and leaner)."""
    question = "Is a nearby layout clearly faster?"
    fused = kernels_only(ctx, flow, fastest)
    if fastest and fused is not None:
        reason = (
            f"{describe(fastest.draft)} ({fastest.time:.3g} s vs {flow.time:.3g} s) is "
            "faster only by Megatron's fused kernels: Megatron runs this layout itself in "
            f"{fused.time:.3g} s (--framework megatron --tp 1 --pp 1), so the model "
            "needs no tensor or pipeline parallelism for it"
        )
        return PathStep(question=question, answer="no", reason=reason), flow
    if fastest and fastest is not flow and fastest.time < flow.time * (1 - CLEARLY_FASTER):
        gain = 1 - fastest.time / flow.time
        reason = (
            f"{gain:.0%} shorter step ({fastest.time:.3g} s vs {flow.time:.3g} s for the "
            f"flowchart's {describe(flow.draft)})"
        )
        answer = f"yes: {describe(fastest.draft)}"
        return PathStep(question=question, answer=answer, reason=reason), fastest
    if (leaner := _dominating(ctx, flow, near)) is not None:
        gain = 1 - leaner.time / flow.time
        reason = (
            f"{gain:.0%} shorter step ({leaner.time:.3g} s vs {flow.time:.3g} s) and "
            f"{gib(leaner.mem.total)} a GPU against {gib(flow.mem.total)} for the "
            f"flowchart's {describe(flow.draft)}: better on both counts, so the "
            f"{CLEARLY_FASTER:.0%} it takes to leave the flowchart's layout does not apply"
        )
        answer = f"faster and leaner: {describe(leaner.draft)}"
        return PathStep(question=question, answer=answer, reason=reason), leaner
    reason = (
        f"of the {len(cands)} layouts the forced {ctx.spec.layout.given_text()} allows, none"
        if ctx.spec.layout.is_forced
        else f"searched {len(cands)} layouts; none"
    ) + f" is {CLEARLY_FASTER:.0%} faster than {describe(flow.draft)} ({step_time_text(flow.time)})"
    return PathStep(question=question, answer="no", reason=reason), flow


def shape_steps(ctx: PlanContext, chosen: Candidate) -> list[PathStep]:
    """The questions about the chosen layout's shape: experts, long sequences, TP placement and
    the pipeline (each asked only where it applies)."""
    dims = ctx.dims
    seq = ctx.spec.training.seq_len
    d = chosen.draft
    steps: list[PathStep] = []
    if dims.is_moe:
        steps.append(
            PathStep(
                question="Is it a mixture-of-experts model?",
                answer=f"yes: ep={d.ep}" if d.ep > 1 else "yes, but ep=1",
                reason=(
                    f"{dims.num_experts} experts, top-{dims.experts_per_token}: expert parallelism "
                    f"places {dims.num_experts // d.ep} expert(s) per GPU and routes tokens with all-to-all"
                    if d.ep > 1
                    else "no expert-parallel layout fits, or one without it is clearly faster"
                ),
            )
        )
    if seq >= LONG_SEQUENCE:
        steps.append(
            PathStep(
                question=f"Is the sequence long (>= {LONG_SEQUENCE // 1024}K tokens)?",
                answer=f"yes: cp={d.cp}" if d.cp > 1 else "yes, but cp=1",
                reason=(
                    f"context parallelism splits the {seq}-token sequence into {d.cp} chunks of "
                    f"{seq // d.cp} ({_cp_how(d)}), dividing activations by {d.cp}"
                    if d.cp > 1
                    else "activations fit without splitting the sequence"
                ),
            )
        )
    if d.tp > 1:
        domain = ctx.hw.domain
        inside = d.tp <= domain
        where = (
            f"{ctx.gpn} GPUs per node"
            if domain <= ctx.gpn
            else f"the {domain}-GPU NVLink domain ({ctx.gpn}-GPU trays)"
        )
        steps.append(
            PathStep(
                question="Does TP stay inside a node?",
                answer="yes" if inside else "no",
                reason=(
                    f"tp={d.tp} <= {where}: TP all-reduces run on {ctx.gpu.intra_link.value}"
                    if inside
                    else f"tp={d.tp} spans nodes: every layer's all-reduce crosses the network"
                ),
            )
        )
    return steps + _pipeline_steps(ctx, chosen)


def _pipeline_steps(ctx: PlanContext, chosen: Candidate) -> list[PathStep]:
    """The pipeline's questions: enough micro-batches, and its schedule and stage split."""
    d = chosen.draft
    if d.pp <= 1:
        return []
    m = d.grad_accum
    v = d.virtual_stages
    bubble = chosen.est.bubble_fraction if chosen.est else 0.0
    formula = "(p-1)/(m+p-1)" if v == 1 else f"(p-1)/v / (m+(p-1)/v) with v={v}"
    steps = [
        PathStep(
            question="Are there at least 4x as many micro-batches as PP stages?",
            answer="yes" if m * v >= 4 * d.pp else "no",
            reason=f"{m} micro-batches for {d.pp} stages: bubble {bubble:.0%} {formula}",
        )
    ]
    layers = stage_layers(ctx.dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers)
    if v > 1:
        answer = f"interleaved 1F1B, {v} virtual stages of {layers[0] // v} layer(s)"
        reason = (
            f"each stage holds {v} model chunks: the bubble shrinks {v}x for {v}x the "
            "point-to-point sends (Megatron needs micro-batches divisible by pp)"
        )
    elif d.first_stage_layers or d.last_stage_layers:
        answer = f"1F1B, layers per stage {_split(layers)}"
        last = "the LM head and loss"
        if mtp_modules(ctx.dims, d):
            last = "the LM head, loss and multi-token prediction"
        reason = (
            "lighter end stages balance the embedding and the first stage's in-flight "
            f"activations (first) and {last} (last) against the others; Megatron's "
            "--decoder-first/last-pipeline-num-layers"
        )
    else:
        answer = f"1F1B, {layers[0]} layers per stage"
        reason = (
            "the even split (interleaving and lighter end stages are weighed for the fastest "
            "pipelines)"
        )
    steps.append(
        PathStep(question="Which pipeline schedule and split?", answer=answer, reason=reason)
    )
    return steps


def _split(layers: list[int]) -> str:
    """``7 + 14x8 + 7``: a stage split, the middle stages run together."""
    first, *mid, last = layers
    middle = f"{len(mid)}x{mid[0]}" if mid and len(set(mid)) == 1 else " + ".join(map(str, mid))
    return " + ".join(p for p in (str(first), middle, str(last)) if p)


def _cp_how(d: LayoutDraft) -> str:
    """How the layout's context parallelism brings each rank the other chunks' keys and values."""
    how = cp_comm_of(d)
    if how == CpComm.ALLGATHER:
        return "keys and values all-gathered before the attention"
    if how == CpComm.A2A:
        return "an all-to-all gives each rank 1/cp of the heads over the whole sequence"
    return "ring attention: keys and values passed round behind it"
