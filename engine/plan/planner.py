"""The planner: ``plan(spec) -> Plan``, a pure function from what the user asked for to a reasoned
parallel layout. The CLI's ``plan``, the wizard's decision step and the config writers all call it.

It resolves the model and hardware (:mod:`engine.plan.context`), refuses inconsistent forced
settings (:mod:`engine.plan.forced`), enumerates the valid layouts that train the global batch
exactly, with their memory (:mod:`engine.plan.search`), refuses a batch no layout can train or
moves to the nearest one when the spec allows it (:mod:`engine.plan.batch`), walks dtrain-tui's
decision flowchart over them (:mod:`engine.plan.flowchart`), keeps the flowchart's choice unless
a nearby candidate is clearly faster, and narrates the result: the path of questions and
reasons, the alternatives with why each lost, and the common mistakes as warnings
(:mod:`engine.plan.annotate`). A forced layout (``spec.layout``) narrows the search to what the
user fixed; the plan then says if and why it does not fit, and what would fit instead. Nothing
here imports torch.
"""

from __future__ import annotations

from dataclasses import replace

from engine.errors import SpecError
from engine.plan import flowchart
from engine.plan.annotate import (
    MAX_ALTERNATIVES,
    WORTH_SAYING,
    alternatives,
    describe,
    mem_line,
    mistakes,
    notes,
)
from engine.plan.batch import faster_choices, fewer_gpus, settle
from engine.plan.calibration import Calibration, apply_gpu
from engine.plan.catalog import GpuType, get_gpu
from engine.plan.context import PlanContext, resolve_precision
from engine.plan.dims import ModelDims
from engine.plan.forced import check_forced, forced_fit_step
from engine.plan.models import resolve_model
from engine.plan.resilience import resilience
from engine.plan.result import BatchChoice, GpuInfo, Layout, PathStep, Plan, gib
from engine.plan.search import Candidate, candidates, evaluate, overlapped
from engine.plan.specs import LayoutSpec, Spec

__all__ = ["plan"]


def plan(spec: Spec) -> Plan:
    """Plan ``spec``: resolve the model and hardware, walk the flowchart, search nearby layouts,
    and return the recommendation with its path, alternatives and warnings. Raises
    :class:`SpecError` for specs that cannot be planned (with the field and the fix)."""
    dims = resolve_model(spec.model)
    gpu = _gpu(spec)
    warnings: list[str] = []
    path: list[PathStep] = []
    _check_positions(spec, dims, warnings)
    precision = resolve_precision(spec, gpu, warnings, path)
    calibration = _calibration(spec, gpu, warnings, path)
    ctx = PlanContext.build(spec, dims, gpu, precision)
    check_forced(ctx)
    forced = spec.layout.is_forced
    ctx, cands = _within_headroom(ctx, candidates(ctx), warnings)
    ctx, cands, choices = settle(ctx, cands, path)
    if not cands:
        given = spec.layout.given_text()
        raise SpecError(
            f"no valid layout for {ctx.world} GPU(s) trains a global batch of {ctx.batch}"
            + (f" with the forced settings {given}; relax the forced layout" if forced else "")
            + ("" if forced else "; try another --global-batch or GPU count"),
            field="layout" if forced else "training.global_batch",
        )
    pool = flowchart.narrow(ctx, cands)
    flow = flowchart.walk(ctx, pool, cands, path)
    chosen = flowchart.choose(ctx, flow, pool, cands, path, warnings)
    path += flowchart.shape_steps(ctx, chosen)
    if forced:
        path.append(forced_fit_step(ctx, chosen))
    recommended = chosen.to_layout(notes=notes(ctx, chosen))
    alts = alternatives(ctx, cands, chosen, flow)
    if forced and not chosen.fits:
        alts = _way_out(spec, alts, path)
    if not choices:
        choices = faster_choices(ctx, chosen)
        warnings += [_offer(ctx, recommended, c) for c in choices]
        warnings += fewer_gpus(ctx, chosen)
    warnings += mistakes(ctx, recommended)
    warnings += _overlap_offer(ctx, cands, chosen)
    return Plan(
        spec=spec,
        model=dims,
        gpu=_gpu_info(ctx),
        world_size=ctx.world,
        nodes=ctx.nodes,
        gpus_per_node=ctx.gpn,
        recommended=recommended,
        alternatives=alts,
        path=path,
        warnings=warnings,
        forced=forced,
        batch_choices=choices,
        calibration=calibration,
        usable_bytes=ctx.usable,
        headroom_bytes=ctx.headroom_bytes,
        resilience=resilience(dims, spec, recommended, ctx.world, ctx.nodes),
    )


def _check_positions(spec: Spec, dims: ModelDims, warnings: list[str]) -> None:
    """The sequence length against the positions the model was built for, as a warning naming
    ``training.seq_len``: past a learned position table (GPT-2's) or an unscaled rotary context
    the model's own code cannot read the tokens, while a script that builds its model from the
    dimensions (the example trainer sizes its position table to the sequence) can, so the plan
    says it and goes on; a config that scales its rotary positions (YaRN, Llama 3's) may stretch
    further only if the run scales it."""
    limit = dims.max_position
    seq = spec.training.seq_len
    if not limit or seq <= limit:
        return
    if "seq_len" not in spec.training.model_fields_set:
        warnings.append(
            f"training.seq_len: the default {seq} tokens is past {dims.name}'s {limit} "
            f"positions; pass --seq-len {limit} (or less) to train what the model can read"
        )
    elif dims.rope and dims.rope_scaling:
        warnings.append(
            f"training.seq_len: {seq} tokens is past {dims.name}'s {limit} positions; its "
            f"{dims.rope_scaling} rotary scaling may stretch that far, but only if the run "
            "scales it to this length (check the loss at the first steps)"
        )
    else:
        warnings.append(
            f"training.seq_len: {seq} tokens is longer than {dims.name}'s {limit} positions: "
            f"the model's own code cannot read past them; use --seq-len {limit} or less, or a "
            "model with a longer context (a script that builds the model from its dimensions, "
            "as the example trainer does, sizes the table to the sequence)"
        )


def _within_headroom(
    ctx: PlanContext, cands: list[Candidate], warnings: list[str]
) -> tuple[PlanContext, list[Candidate]]:
    """``cands`` when one fits within the headroom; else, where some fit the memory the
    headroom comes out of, the search again without it and a warning that says so: a layout
    that fits is never refused for the margin (published runs sit there), but the plan names
    the risk."""
    if not ctx.headroom_bytes or any(c.fits for c in cands):
        return ctx, cands
    tight = replace(ctx, usable=ctx.usable + ctx.headroom_bytes, headroom_bytes=0)
    again = candidates(tight)
    if not any(c.fits for c in again):
        return ctx, cands
    share = ctx.headroom_bytes / tight.usable
    warnings.append(
        f"training.headroom: no layout fits with {share:.0%} of the usable memory kept free "
        f"({gib(ctx.usable)} of {gib(tight.usable)}); the plan uses the margin, so an allocator "
        "peak or a busier expert rank can run it out of memory (recompute more, a smaller "
        "micro-batch or more GPUs keep it; --headroom 0 accepts the risk)"
    )
    return tight, again


def _offer(ctx: PlanContext, lay: Layout, choice: BatchChoice) -> str:
    """The warning that offers a nearby global batch (never applied without the user)."""
    return (
        f"training.global_batch: a global batch of {choice.global_batch} would train "
        f"{choice.reason} ({choice.layout} instead of {describe(lay)}); pass --global-batch "
        f"{choice.global_batch} to take it"
    )


def _gpu(spec: Spec) -> GpuType:
    """The catalog's GPU, its GEMM efficiency scaled by the spec's calibration for it."""
    try:
        gpu = get_gpu(spec.hardware.gpu)
    except ValueError as e:
        raise SpecError(str(e), field="hardware.gpu") from None
    cal = spec.calibration
    return apply_gpu(gpu, cal) if cal is not None and cal.applies_to(gpu.key) else gpu


def _calibration(
    spec: Spec, gpu: GpuType, warnings: list[str], path: list[PathStep]
) -> Calibration | None:
    """The spec's calibration when it was measured on this GPU (its path step says so), else
    None with a warning: factors measured on another GPU say nothing of this one."""
    cal = spec.calibration
    if cal is None:
        return None
    if not cal.applies_to(gpu.key):
        warnings.append(
            f"calibration: {cal.name!r} was measured on {cal.gpu}, not {gpu.key}; not applied "
            f"(calibrate from a run on {gpu.key})"
        )
        return None
    src = cal.source
    why = (
        f"{src.layout or 'the run'} measured {src.measured_step_time_s:.4g} s/step over "
        f"{src.steps} steps ({src.date[:10]}), where the catalog's figures predicted "
        f"{src.predicted_step_time_s:.4g} s"
    )
    if cal.network != 1.0 and not cal.network_applies(spec.network.tier.value):
        why += f"; network factor not applied: measured on {cal.network_tier or 'one node'}"
    path.append(PathStep(question="Which efficiency figures?", answer=cal.label(), reason=why))
    return cal


def _way_out(spec: Spec, alts: list[Layout], path: list[PathStep]) -> list[Layout]:
    """When the forced layout does not fit: what the planner would pick without the forced
    settings, first among the alternatives, so the user sees a way out."""
    free = plan(spec.model_copy(update={"layout": LayoutSpec()}))
    if not free.recommended.fits:
        return alts
    alt = replace(free.recommended, rejected_because="fits, but is not the forced layout")
    path.append(
        PathStep(
            question="What would fit instead?",
            answer=describe(alt),
            reason=f"the unforced plan: {mem_line(alt.memory_per_gpu)}",
        )
    )
    return [alt, *alts][:MAX_ALTERNATIVES]


def _gpu_info(ctx: PlanContext) -> GpuInfo:
    gpu = ctx.gpu
    hw = ctx.hw
    return GpuInfo(
        key=gpu.key,
        name=gpu.name,
        memory_bytes=gpu.memory_bytes,
        peak_tflops=hw.peak_flops / 1e12,
        bf16=gpu.has_bf16,
        intra_node_gbps=hw.intra_bytes_per_s / 1e9,
        inter_node_gbps=hw.inter_bytes_per_s / 1e9,
        dist_backend=gpu.dist_backend,
        price_per_gpu_hour=hw.price_per_gpu_hour,
    )


def _overlap_offer(ctx: PlanContext, cands: list[Candidate], chosen: Candidate) -> list[str]:
    """Megatron's expert all-to-all overlap is off unless asked for (as in Megatron). Where
    asking for it would plan a step at least :data:`WORTH_SAYING` shorter (the search's own
    layouts with it, :func:`engine.plan.search.overlapped`), one line says which layout and how
    fast; the user opts in with ``--moe-a2a-overlap``."""
    if not ctx.dims.is_moe or ctx.spec.training.moe_a2a_overlap is not None or not chosen.fits:
        return []
    other = overlapped(ctx, cands)
    chosen = evaluate(ctx, chosen)
    if other is None or other.est is None or chosen.est is None:
        return []
    if other.time_per_sequence > (1 - WORTH_SAYING) * chosen.time_per_sequence:
        return []
    return [
        f"with Megatron's expert all-to-all overlap (--moe-a2a-overlap): {describe(other.draft)}, "
        f"{other.est.step_time_s:.3g} s a step instead of {chosen.est.step_time_s:.3g} s"
    ]
