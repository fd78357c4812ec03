"""The plan's narration: how bytes and layouts read in its text, the notes on the recommended
layout, each alternative with why it lost, and the common mistakes as warnings a person can act
on. Called by the flowchart walk (:mod:`engine.plan.flowchart`), the forced checks
(:mod:`engine.plan.forced`) and :func:`engine.plan.planner.plan`; ``describe``, the one name of a
layout, also by the CLI's report and the wizard. Pure text from values: nothing here changes what
is chosen.
"""

from __future__ import annotations

import math
from dataclasses import replace
from enum import StrEnum
from itertools import combinations

from engine.plan.context import BLOCK_SCALED_FP8_RATE, PlanContext
from engine.plan.dims import ModelDims
from engine.plan.frameworks import megatron_fp8_flags, shared_expert_overlap
from engine.plan.memory import (
    LayoutDraft,
    estimate_memory,
    moments_bf16_apply,
    mtp_modules,
    states_offload_apply,
)
from engine.plan.names import (
    Fp8Recipe,
    Framework,
    MoeDispatcher,
    NetworkTier,
    Offload,
    OffloadModule,
    Optimizer,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.perf import (
    UNALIGNED_GEMM_SLOWDOWN,
    estimate_time,
    padded_vocab,
    unpadded_vocab_seconds,
)
from engine.plan.result import Layout, MemoryBreakdown, Plan, gib
from engine.plan.search import (
    CLEARLY_FASTER,
    LONG_SEQUENCE,
    Candidate,
    best,
    deep_enough,
    evaluate,
    kernels_only,
    smallest,
)
from engine.plan.stages import stage_layers
from engine.plan.strategies import DISPLAY_NAME

MAX_ALTERNATIVES = 6
# Runner-up meshes of the plan's own kind listed among the alternatives.
OTHER_MESHES = 2
# Anti-pattern thresholds of dtrain-tui's decision guide (its common mistakes).
MAX_BUBBLE = 0.20
MIN_SCALING = 0.80
# Step times this close (relative) read as "about as fast".
SAME_SPEED = 0.02


def step_time_text(s: float) -> str:
    """A step time, one rule for the plan's text, the CLI and the wizard: ``84 ms/step`` below a
    second, ``57.1 s/step`` (three significant digits) below 100 s, ``2.0 min/step`` above."""
    if s < 1:
        return f"{s * 1e3:.3g} ms/step"
    if s < 100:
        return f"{s:.3g} s/step"
    return f"{s / 60:.1f} min/step"


def forcing_cost(forced: Plan, auto: Plan | None, refusal: str = "") -> str:
    """What forcing a layout costs, in one line: ``auto plan: 3d · megatron · tp8 pp2 dp2,
    2.0 min/step; forcing costs +103 %`` (``auto``: the plan of the same spec with nothing
    forced; None with ``refusal`` when the planner refused that spec). "" when nothing is
    forced."""
    if not forced.forced:
        return ""
    if auto is None:
        return f"auto plan: none ({refusal})" if refusal else "auto plan: none"
    a, f = auto.recommended, forced.recommended
    head = f"auto plan: {describe(a)}, {step_time_text(a.step_time_s)}"
    if not a.fits:
        return f"{head} (does not fit either)"
    if not f.fits:
        return f"{head}; the forced layout does not fit"
    if describe(a) == describe(f):
        return f"{head}; forcing changes nothing"
    extra = f.step_time_s / a.step_time_s - 1 if a.step_time_s > 0 else 0.0
    if abs(extra) < SAME_SPEED:
        return f"{head}; forcing costs nothing (within {SAME_SPEED:.0%})"
    return f"{head}; forcing costs {100 * extra:+.0f} %"


def short_reason(plan: Layout, alt: Layout, *, flow_pick: bool = False) -> str:
    """Why ``alt`` is not the plan, in a few words for a table row (the full sentence is
    ``alt.rejected_because``): ``does not fit``, ``23% slower``, ``as fast, simpler kept``,
    ``8% faster, under 15%``, ``offload: last resort``."""
    if not alt.fits:
        return "does not fit"
    if not plan.fits:
        return "fits; not the forced layout"
    ratio = alt.step_time_s / plan.step_time_s if plan.step_time_s > 0 else 1.0
    offload = alt.offload != Offload.NONE and plan.offload == Offload.NONE
    if flow_pick:
        return f"flowchart's pick, {ratio - 1:.0%} slower"
    if ratio > 1 + SAME_SPEED:
        return f"{ratio - 1:.0%} slower"
    if offload:
        return "offload: last resort"
    if ratio >= 1 - SAME_SPEED:
        return "as fast; simpler plan kept"
    why = alt.rejected_because or ""
    if "fused kernels" in why:
        return f"{1 - ratio:.0%} faster, by fused kernels only"
    if "does not split" in why:
        return f"{1 - ratio:.0%} faster, breaks a flowchart rule"
    if "micro-batches for" in why:
        return f"{1 - ratio:.0%} faster, pipeline too shallow"
    return f"{math.floor((1 - ratio) * 100):.0f}% faster, under {CLEARLY_FASTER:.0%}"


def mem_line(m: MemoryBreakdown) -> str:
    """A memory breakdown in one phrase: the total, then each part."""
    nccl = f", NCCL {gib(m.nccl)}" if m.nccl else ""
    host = (
        f"; {gib(m.host_activations)} of activations in host memory" if m.host_activations else ""
    )
    return (
        f"{gib(m.total)} (params {gib(m.params)}, grads {gib(m.grads)}, optimizer "
        f"{gib(m.optimizer)}, activations {gib(m.activations)}, buffers {gib(m.buffers)}{nccl}"
        f"{host})"
    )


def recompute_scope(d: LayoutDraft | Layout) -> str:
    """Which layers a block recompute (``recompute_layers`` > 0) covers, in words: the first N
    of each pipeline stage, of each model chunk under interleaving, or of the model."""
    n = d.recompute_layers
    if d.pp == 1:
        return f"the first {n} layers"
    if d.virtual_stages > 1:
        return f"the first {n} layers of each model chunk"
    return f"the first {n} layers of each stage"


def recompute_text(d: LayoutDraft | Layout) -> str:
    """``recompute full (the first 1 layers of each model chunk)``, ``recompute none``: what a
    layout recomputes, in the words the CLI and the wizard print."""
    scope = f" ({recompute_scope(d)})" if d.recompute_layers else ""
    return f"recompute {d.recompute.value}{scope}"


class NameForm(StrEnum):
    """How much of a layout :func:`describe` names, for where the name is read."""

    PLAN = "plan"
    """The plan's text, the CLI's report and the search's reasons:
    ``3D (megatron) tp=8 pp=4 dp=2 + distributed optimizer``."""
    CARD = "card"
    """A memory card's line, under a title that names the strategy and framework:
    ``tp8 pp4 dp2 · mb 1×64``."""
    FULL = "full"
    """Every choice that tells two layouts apart, for a comparison row:
    ``zero3 · deepspeed · tp1 pp1 dp32 · ZeRO-3 · offload optimizer``."""


def describe(d: LayoutDraft | Layout, form: NameForm = NameForm.PLAN) -> str:
    """A human name for a layout: the one every part of dtrain-tui names layouts by, in
    ``form`` (:class:`NameForm`). Lighter end stages are named in every form: they are all
    that tells two pipelines of the same degrees apart."""
    ends = ""
    if d.first_stage_layers or d.last_stage_layers:
        first, last = (d.first_stage_layers or "even", d.last_stage_layers or "even")
        ends = f"(first/last stage {first}/{last} layers)"
    if form == NameForm.PLAN:
        return _plan_name(d, ends)
    degrees = f"tp{d.tp} pp{d.pp} dp{d.dp}"
    if d.virtual_stages > 1:
        degrees += f" vp{d.virtual_stages}"
    if d.cp > 1:
        degrees += f" cp{d.cp}"
    if d.ep > 1:
        degrees += f" ep{d.ep}"
    if ends:
        degrees += f" {ends}"
    offloaded = d.offload != Offload.NONE
    if form == NameForm.CARD:
        offload = f" · offload {d.offload.value}" if offloaded else ""
        return f"{degrees} · mb {d.micro_batch}×{d.grad_accum}{offload}"
    parts = [d.strategy.value, d.framework.value, degrees]
    if d.zero_stage:
        megatron = d.framework == Framework.MEGATRON
        parts.append("distributed optimizer" if megatron else f"ZeRO-{d.zero_stage}")
    parts.append(f"offload {d.offload.value}" if offloaded else "no offload")
    return " · ".join(parts)


def _plan_name(d: LayoutDraft | Layout, ends: str) -> str:
    """:attr:`NameForm.PLAN`: ``ZeRO-2 (deepspeed) dp=8``, degrees above 1 only."""
    parts = [f"{DISPLAY_NAME[d.strategy]} ({d.framework.value})"]
    degrees = [f"{k}={getattr(d, k)}" for k in ("tp", "pp", "cp", "ep") if getattr(d, k) > 1]
    if d.virtual_stages > 1:
        degrees.insert(2 if d.tp > 1 else 1, f"vp={d.virtual_stages}")
    if d.ep > 1 and d.tp > 1:
        degrees.append(f"etp={d.expert_tp}")  # experts whole (1) or split like the MLP (tp)
    parts.append(" ".join([*degrees, f"dp={d.dp}"]))
    if ends:
        parts.append(ends)
    if d.strategy == Strategy.THREE_D and d.zero_stage >= 3:
        parts.append("+ Megatron-FSDP (params, grads, optimizer sharded)")
    elif d.strategy == Strategy.THREE_D and d.zero_stage:
        parts.append("+ distributed optimizer")
    if d.offload != Offload.NONE:
        parts.append(f"+ {d.offload.value} offload")
    if d.a2a_overlap:
        parts.append("+ all-to-all overlap")
    return " ".join(parts)


def shortfall(ctx: PlanContext, c: Candidate) -> str:
    """Why ``c`` does not fit, in numbers: GPU memory, or host RAM for what it offloads."""
    if c.mem.total > ctx.usable:
        return f"needs {gib(c.mem.total)} per GPU of {gib(ctx.usable)} usable"
    need = c.mem.cpu_bytes * ctx.gpn
    return (
        f"offloads {gib(need)} per node to host RAM of {gib(ctx.cpu_usable)} usable "
        "(pass --cpu-ram-gb if the nodes have more)"
    )


def fix_hint(d: LayoutDraft, dims: ModelDims | None = None) -> str:
    """The next thing to try when layout ``d`` (of model ``dims``) does not fit."""
    light = (
        dims is not None
        and dims.light_recompute_frees
        and d.framework == Framework.MEGATRON
        and d.recompute in (Recompute.NONE, Recompute.SELECTIVE)
    )
    if light:
        return "try --recompute light (or mlp, full), larger tp/pp, or more GPUs"
    if d.strategy in (Strategy.DDP, Strategy.ZERO1):
        return "try --strategy zero2 or zero3"
    if d.strategy in (Strategy.ZERO2, Strategy.FSDP_GRAD_OP):
        return "try --strategy zero3 (or fsdp-full)"
    if d.offload == Offload.NONE and d.strategy != Strategy.THREE_D:
        return "try --offload optimizer, more GPUs, or --recompute full"
    return "try larger tp/pp, --recompute full, or more GPUs"


def notes(ctx: PlanContext, c: Candidate) -> list[str]:
    """What a person should know about the recommended layout's costs."""
    d = c.draft
    out = _recompute_notes(d)
    out += _placement_notes(c)
    out += _precision_notes(ctx, d)
    out += _mtp_notes(ctx, d)
    out += _overlap_notes(ctx, d)
    out += _dispatcher_hint(ctx, c)
    out += _compile_hint(ctx, c)
    out += _offload_notes(ctx, c)
    out += _vocab_notes(ctx, c)
    return out


def _offload_notes(ctx: PlanContext, c: Candidate) -> list[str]:
    """What fine-grained activation offloading moves to host memory, and what of its copies
    the step waits on."""
    d = c.draft
    host = c.mem.host_activations
    out = []
    if states_offload_apply(d):
        out.append(
            f"optimizer states offloaded between steps (--offload-optimizer-states): "
            f"{gib(c.mem.optimizer)} a GPU in host memory, back on the GPU for the step while "
            "the activations are gone; two host-link copies a step"
        )
    if not host or c.est is None:
        return out
    names = " ".join(m.value for m in d.offload_modules)
    seq = ctx.spec.training.seq_len
    kept = estimate_time(ctx.dims, replace(d, offload_modules=()), ctx.hw, seq_len=seq)
    waits = c.est.step_time_s - kept.step_time_s
    cost = (
        f"the step waits {waits:.3g} s on the host link ({waits / c.est.step_time_s:.1%})"
        if waits > 0.001 * c.est.step_time_s
        else "its copies hide behind the compute"
    )
    return [
        *out,
        f"activations offloaded (--offload-modules {names}): {gib(host)} a GPU in pinned host "
        f"memory, {gib(host * ctx.gpn)} a node; {cost}",
    ]


def _recompute_notes(d: LayoutDraft) -> list[str]:
    """What the layout recomputes in backward, and how the framework is asked to."""
    out: list[str] = []
    if d.recompute == Recompute.FULL and d.recompute_layers:
        out.append(
            f"full recompute of only {recompute_scope(d)} (Megatron's --recompute-method "
            "block): the least that fits"
        )
    elif d.recompute == Recompute.FULL:
        out.append("full activation recompute: about 33% more compute per step")
    elif d.recompute == Recompute.LIGHT:
        out.append(
            "light recompute: the unfused norms, the experts' activation and latent "
            "attention's up-projections run again in backward, every matrix product's output "
            "is kept (Megatron's --recompute-modules)"
        )
    return out + _partial_recompute_how(d)


def _placement_notes(c: Candidate) -> list[str]:
    """Where the experts, the offloaded state and the loss live, where that needs saying."""
    d = c.draft
    out: list[str] = []
    if d.framework == Framework.DEEPSPEED and d.ep > 1:
        out.append(
            f"ep={d.ep} is DeepSpeed-MoE's: your model builds its expert layers with "
            f"deepspeed.moe.layer.MoE(ep_size={d.ep}) (ds_config.json cannot set it); the example "
            "trainer has no experts"
        )
    if d.offload != Offload.NONE:
        out.append(
            f"{gib(c.mem.cpu_bytes)} per GPU lives in CPU memory ({d.offload.value}); "
            "the optimizer step runs on the CPU"
        )
    if d.fused_ce and d.framework != Framework.MEGATRON:
        out.append(
            "the loss is sized as your trainer's fused cross-entropy (training."
            "fused_cross_entropy: about 4 bytes a logit); the example trainer computes "
            "PyTorch's own, 14"
        )
    return out


def _precision_notes(ctx: PlanContext, d: LayoutDraft) -> list[str]:
    """fp16's loss scaling, FP8's rates and flags, CPU ranks' nominal times."""
    out: list[str] = []
    if d.precision == Precision.FP16:
        out.append("fp16: dynamic loss scaling is on (initial scale 2^16)")
    if d.precision == Precision.FP8:
        out.append(_fp8_note(ctx, d))
    if ctx.gpu.is_cpu:
        out.append("CPU ranks over gloo: a smoke-test set-up; times are nominal")
    return out


def _mtp_notes(ctx: PlanContext, d: LayoutDraft) -> list[str]:
    """What the model's multi-token prediction modules cost, or that the framework drops them."""
    mtp = ctx.dims.mtp_layers
    if mtp_modules(ctx.dims, d):
        what = (
            "one more layer and output-head pass"
            if mtp == 1
            else f"{mtp} more layers and head passes"
        )
        return [
            f"multi-token prediction: {what} on the last pipeline stage (Megatron's "
            "--mtp-num-layers)"
        ]
    if mtp:
        return [
            f"multi-token prediction is Megatron's (--mtp-num-layers): {d.framework.value} "
            "trains the model without its prediction module, as transformers' model runs it"
        ]
    return []


def _overlap_notes(ctx: PlanContext, d: LayoutDraft) -> list[str]:
    """Sequence parallelism, and what hides the expert all-to-all."""
    out: list[str] = []
    if d.strategy == Strategy.THREE_D and d.sequence_parallel:
        out.append("sequence parallelism splits layer-norm and dropout activations across TP ranks")
    if d.a2a_overlap:
        out.append(
            "expert all-to-all overlapped: each micro-batch's forward runs beside another's "
            "backward, hiding its dispatch and combine (Megatron's "
            "--overlap-moe-expert-parallel-comm)"
        )
    elif shared_expert_overlap(ctx.dims, d.framework, d.ep, deepep=d.deepep):
        out.append(
            "the shared expert runs beside the expert all-to-all, hiding part of the dispatch "
            "and combine (Megatron's --moe-shared-expert-overlap); the rest is on the critical "
            "path"
        )
    return out


def _vocab_notes(ctx: PlanContext, c: Candidate) -> list[str]:
    """An unpadded vocabulary's slow LM head, in seconds a step."""
    d = c.draft
    extra = unpadded_vocab_seconds(ctx.dims, d, ctx.hw, ctx.spec.training.seq_len)
    if not extra or c.est is None:
        return []
    return [
        f"the vocabulary ({ctx.dims.vocab}) is not a multiple of 8: pad it to "
        f"{padded_vocab(ctx.dims.vocab)} (resize the embeddings, as the example trainer "
        f"does); the estimates assume it. Left as it is, the LM head's matrix products run "
        f"about {UNALIGNED_GEMM_SLOWDOWN:g}x slower: {c.est.step_time_s + extra:.3g} s a "
        f"step instead of {c.est.step_time_s:.3g} s"
    ]


def _fp8_note(ctx: PlanContext, d: LayoutDraft) -> str:
    """What FP8 training means for this plan: the linears' rate under the recipe, the bf16
    rest, and how the framework's configs ask for it."""
    peak = ctx.gpu.fp8_peak_tflops()
    asked = ctx.spec.training.fp8_recipe
    recipe = asked or Fp8Recipe.DELAYED
    rate = f"at the FP8 peak ({peak:g} TFLOP/s)"
    if recipe.block_scaled:
        rate = (
            f"at {BLOCK_SCALED_FP8_RATE:.0%} of the FP8 peak ({peak * BLOCK_SCALED_FP8_RATE:g} "
            f"of {peak:g} TFLOP/s: {recipe.value}'s block scales)"
        )
    how = FP8_HOW[d.framework]
    if d.framework == Framework.MEGATRON:
        how = how.format(flags=" ".join(megatron_fp8_flags(recipe)))
    elif d.framework == Framework.FSDP and recipe.block_scaled:
        how = how.replace(
            "; the example",
            f", per tensor: for {recipe.value} convert them yourself (torchao's MXLinear, or "
            "Transformer Engine's recipe); the example",
        )
    label = f"fp8 ({asked.value} scaling)" if asked else "fp8"
    return (
        f"{label}: linear layers {rate}, attention and the rest in bf16; "
        f"MFU is quoted against the bf16 peak ({ctx.gpu.peak_tflops(Precision.BF16):g} "
        f"TFLOP/s); {how}"
    )


FP8_HOW: dict[Framework, str] = {
    Framework.MEGATRON: (
        "megatron_args.txt asks Transformer Engine for it ({flags}); the example trainer's "
        "smoke test runs bf16"
    ),
    Framework.FSDP: (
        "accelerate_config.yaml converts the linears with torchao's float8 (fp8_config backend "
        "AO) when your script trains through Accelerate; the example trainer runs bf16"
    ),
    Framework.DEEPSPEED: (
        "DeepSpeed has no FP8 of its own: ds_config.json sets bf16 and your model's linears must "
        "be Transformer Engine modules under te.fp8_autocast; the example trainer runs bf16"
    ),
    Framework.DDP: (
        "DDP has no FP8 of its own: convert your model's linears (torchao's "
        "convert_to_float8_training, or Transformer Engine modules); the example trainer runs bf16"
    ),
}
"""How each framework's run gets the FP8 linears the estimate assumes (said in the plan's fp8
note: only Megatron's and Accelerate's configs ask for them; DeepSpeed and DDP need the model
code to)."""


PARTIAL_RECOMPUTE: dict[Recompute, str] = {
    Recompute.MLP: "each block's MLP",
    Recompute.SELECTIVE: "each block's attention core",
    Recompute.LIGHT: "the norms and activations (torch.utils.checkpoint with a selective policy)",
}
"""What a partial recompute checkpoints, for frameworks whose configs cannot say it."""


def _partial_recompute_how(d: LayoutDraft) -> list[str]:
    """Under DDP, FSDP or DeepSpeed a partial recompute is the model code's: their configs only
    switch checkpointing of whole blocks on (Accelerate's ``fsdp_activation_checkpointing``
    wraps every transformer layer), which is a full recompute, slower than estimated."""
    part = PARTIAL_RECOMPUTE.get(d.recompute)
    if part is None or d.framework == Framework.MEGATRON:
        return []
    where = {
        Framework.FSDP: "accelerate_config.yaml's fsdp_activation_checkpointing wraps whole blocks",
        Framework.DEEPSPEED: "your script chooses what deepspeed.checkpointing wraps",
        Framework.DDP: "your script chooses what torch.utils.checkpoint wraps",
    }[d.framework]
    trainer = "" if d.recompute == Recompute.SELECTIVE else ", as the example trainer does"
    return [
        f"{d.recompute.value} recompute: the estimate checkpoints only {part}{trainer}; {where}, "
        "and whole blocks are a full recompute (slower than estimated)"
    ]


WORTH_SAYING = 0.05
"""A change the user would have to make (install DeepEP) is suggested when it saves at least
this share of the step."""


def _dispatcher_hint(ctx: PlanContext, c: Candidate) -> list[str]:
    """Where the expert-parallel group spans nodes under NCCL's all-to-all (every routed copy
    of a token crosses the network), what DeepEP's dispatch (a token once per remote node)
    would make of the same layout, when that is clearly faster."""
    d = c.draft
    if (
        d.framework != Framework.MEGATRON
        or not ctx.dims.is_moe
        or d.deepep
        or d.ep * d.expert_tp <= ctx.hw.domain
        or ctx.nodes <= 1
        or c.est is None
    ):
        return []
    seq = ctx.spec.training.seq_len
    with_deepep = estimate_time(ctx.dims, replace(d, deepep=True), ctx.hw, seq_len=seq)
    if with_deepep.step_time_s > (1 - WORTH_SAYING) * c.est.step_time_s:
        return []
    return [
        f"the expert all-to-all spans {math.ceil(d.ep * d.expert_tp / ctx.hw.domain)} nodes and "
        "NCCL sends every routed copy of a token: DeepEP sends it once per node "
        f"({with_deepep.step_time_s:.3g} s a step instead of {c.est.step_time_s:.3g} s; "
        "--moe-dispatcher deepep, with DeepEP installed)"
    ]


def _compile_hint(ctx: PlanContext, c: Candidate) -> list[str]:
    """Where a PyTorch-native layout is timed as your model's Python modules run eagerly, what
    ``torch.compile`` (its fused element-wise kernels) would make of the same step."""
    d = c.draft
    if not d.eager_modules or d.framework == Framework.MEGATRON or c.est is None:
        return []
    seq = ctx.spec.training.seq_len
    fused = estimate_time(ctx.dims, replace(d, eager_modules=False), ctx.hw, seq_len=seq)
    if fused.step_time_s > (1 - WORTH_SAYING) * c.est.step_time_s:
        return []
    return [
        "timed as your model's Python modules run eagerly (a Hugging Face model as it loads): "
        f"under torch.compile the step would take {fused.step_time_s:.3g} s instead of "
        f"{c.est.step_time_s:.3g} s (--torch-compile if your script compiles it)"
    ]


def alternatives(
    ctx: PlanContext, cands: list[Candidate], chosen: Candidate, flow: Candidate | None = None
) -> list[Layout]:
    """What the recommended layout beat, each with why it lost, fastest first: the flowchart's
    own pick when a faster one replaced it, the best layout of each other strategy/offload
    kind, and of the chosen kind the best other pipeline schedule or split of its own mesh
    and the best of its :data:`OTHER_MESHES` runner-up meshes (other TP/PP/CP/EP/DP degrees:
    what an expert weighs the plan against)."""
    picks: list[Candidate] = []
    if flow is not None and flow is not chosen:
        picks.append(flow)
    kind = (chosen.draft.strategy, chosen.draft.offload)
    groups: dict[tuple[Strategy, Offload], list[Candidate]] = {}
    for c in cands:
        groups.setdefault((c.draft.strategy, c.draft.offload), []).append(c)
    out: list[tuple[float, Layout]] = []
    flow_layout: Layout | None = None
    for key, group in groups.items():
        if key == kind:
            picks += [w for w in _runners_up(ctx, group, chosen) if all(w is not p for p in picks)]
            continue
        winner = best(ctx, group)
        if winner is None and group:
            lean = smallest(group)
            why = f"does not fit: {shortfall(ctx, lean)}"
            out.append((math.inf, evaluate(ctx, lean).to_layout(rejected=why)))
        elif winner is not None and all(winner is not p for p in picks):
            picks.append(winner)
    for c in picks:
        why = _why_lost(ctx, chosen, c, is_flow=c is flow)
        lay = c.to_layout(rejected=why)
        if c is flow:
            flow_layout = lay
        out.append((c.time_per_sequence, lay))
    out.sort(key=lambda t: t[0])
    kept = [lay for _, lay in out[:MAX_ALTERNATIVES]]
    if flow_layout is not None and all(lay is not flow_layout for lay in kept):
        kept[-1] = flow_layout  # the flowchart's own pick is always listed, however slow
    return kept


def _runners_up(ctx: PlanContext, group: list[Candidate], chosen: Candidate) -> list[Candidate]:
    """Of the chosen kind's candidates: the best other schedule or split of the chosen mesh,
    and the best layout of each other mesh, the :data:`OTHER_MESHES` fastest of them."""
    same = [c for c in group if _mesh(c) == _mesh(chosen) and _shape(c) != _shape(chosen)]
    meshes: dict[tuple[int, ...], list[Candidate]] = {}
    for c in group:
        if _mesh(c) != _mesh(chosen):
            meshes.setdefault(_mesh(c), []).append(c)
    others = [w for w in (best(ctx, m) for m in meshes.values()) if w is not None]
    others.sort(key=lambda c: c.time_per_sequence)
    variant = best(ctx, same)
    return ([variant] if variant is not None else []) + others[:OTHER_MESHES]


def _mesh(c: Candidate) -> tuple[int, ...]:
    d = c.draft
    return (d.tp, d.pp, d.cp, d.ep, d.dp)


def _shape(c: Candidate) -> tuple[int, ...]:
    d = c.draft
    return (
        d.tp,
        d.pp,
        d.cp,
        d.ep,
        d.dp,
        d.virtual_stages,
        d.first_stage_layers,
        d.last_stage_layers,
    )


def _why_lost(ctx: PlanContext, chosen: Candidate, winner: Candidate, *, is_flow: bool) -> str:
    """Why ``winner`` is not the plan, with both step times (they train the same batch)."""
    if not (chosen.est and winner.est):
        return "not evaluated"
    if not chosen.fits:
        return "fits but differs from the forced layout"
    ratio = winner.time_per_sequence / chosen.time_per_sequence if chosen.time else 1.0
    times = f"{winner.time:.3g} s vs {chosen.time:.3g} s per step"
    if is_flow:
        return (
            f"the flowchart's choice, {ratio - 1:.0%} slower ({times}): the plan takes the "
            f"layout at least {CLEARLY_FASTER:.0%} faster"
        )
    if ratio > 1 + SAME_SPEED:
        return f"{ratio - 1:.0%} slower ({times})"
    offload = winner.draft.offload != Offload.NONE and chosen.draft.offload == Offload.NONE
    if ratio >= 1 - SAME_SPEED:
        if offload:
            return "offload is the last resort: the plan fits without it"
        return (
            f"about as fast ({times}): within {SAME_SPEED:.0%}, the plan keeps the simpler "
            "layout (the flowchart's, or fewer moving parts)"
        )
    faster = f"{1 - ratio:.0%} faster ({times})"
    if offload:
        return f"{faster}, but offload is the last resort: the plan fits without it"
    outside = _outside_pool(ctx, winner)
    if outside:
        return f"{faster}, but {outside}"
    fused = kernels_only(ctx, chosen, winner)
    if fused is not None:
        return (
            f"{faster}, only by Megatron's fused kernels: Megatron runs the plan's own layout in "
            f"{fused.time:.3g} s (--framework megatron --tp 1 --pp 1); the model needs no tensor "
            "or pipeline parallelism for it"
        )
    # Rounded down to a tenth of a per cent: 14.97 % must not read "15 %, under the 15 %".
    under = f"{math.floor((1 - ratio) * 1000) / 10:g}% faster ({times})"
    return (
        f"{under}, under the {CLEARLY_FASTER:.0%} it takes to leave the flowchart's simpler "
        f"{describe(chosen.draft)}"
    )


def _outside_pool(ctx: PlanContext, c: Candidate) -> str:
    """The seeds' preference ``c`` breaks (why the flowchart's pool left it out), or ''."""
    d = c.draft
    if ctx.dims.is_moe and ctx.world > 1 and d.ep == 1 and ctx.spec.layout.ep is None:
        return "it does not split the experts (dtrain-tui's flowchart: MoE → expert parallelism)"
    seq = ctx.spec.training.seq_len
    if seq >= LONG_SEQUENCE and d.cp == 1 and ctx.spec.layout.cp is None:
        return "it does not split the long sequence (context parallelism)"
    if not deep_enough(d):
        return f"{d.grad_accum} micro-batches for {d.pp} stages is under the 4x the flowchart asks"
    return ""


# --------------------------------------------------------------------------------------------
# Common mistakes


def mistakes(ctx: PlanContext, lay: Layout) -> list[str]:
    """The seeds' common mistakes in the recommended layout ``lay``, as warnings a person can
    act on."""
    return [*_batch_mistakes(ctx, lay), *_layout_mistakes(ctx, lay), *_saver_mistakes(ctx, lay)]


def _batch_mistakes(ctx: PlanContext, lay: Layout) -> list[str]:
    t = ctx.spec.training
    out: list[str] = []
    if lay.global_batch != t.global_batch:
        out.append(
            f"training.global_batch: no layout trains {t.global_batch} exactly; the plan trains "
            f"{lay.global_batch} ({lay.micro_batch} x {lay.grad_accum} x dp {lay.dp}) as "
            f"--global-batch-nearest allows; pass --global-batch {lay.global_batch} to make it "
            "yours"
        )
    if t.lr is not None:
        if t.reference_batch:
            scaled = t.lr * lay.global_batch / t.reference_batch
            if abs(scaled - t.lr) / t.lr > 0.01:
                out.append(
                    f"training.lr: {t.lr:g} was tuned for a global batch of {t.reference_batch}; "
                    f"at {lay.global_batch} the linear scaling rule gives {scaled:.3g} "
                    "(with warmup; for Adam at large batches, sqrt scaling is safer)"
                )
        else:
            out.append(
                f"training.lr: {t.lr:g} is kept as is; if it was tuned for another global batch, "
                f"scale it linearly to {lay.global_batch} (pass reference_batch for the figure)"
            )
    return out


def _exposed_traffic(ctx: PlanContext, lay: Layout) -> str:
    """What the exposed time of ``lay`` is and what would shrink it. Offload's PCIe copies and
    CPU optimizer step count as exposed, and a one-node layout's traffic never touches the
    network, so neither gets told to buy a faster one."""
    share = f"{lay.comm_time_s:.3g} s of the {lay.step_time_s:.3g} s step, not hidden by compute"
    if lay.offload != Offload.NONE:
        return (
            f"CPU offload takes {share} (its PCIe copies and the CPU optimizer step); more "
            "GPUs to shard the model over (less to offload) would help"
        )
    if ctx.nodes == 1:
        return (
            f"communication inside the node takes {share}; a larger micro-batch or fewer "
            "ranks in each collective would help (the network is not involved)"
        )
    return (
        f"communication takes {share}; a faster network, a larger micro-batch or fewer "
        "GPUs would help"
    )


def _layout_mistakes(ctx: PlanContext, lay: Layout) -> list[str]:
    spec = ctx.spec
    dims = ctx.dims
    out: list[str] = []
    uneven = not (lay.first_stage_layers or lay.last_stage_layers)
    if lay.pp > 1 and dims.layers % lay.pp and uneven:
        out.append(
            f"layout.pp: {dims.layers} layers do not split evenly into {lay.pp} stages, and "
            "Megatron refuses that without --decoder-first/last-pipeline-num-layers; the first "
            f"stages get {max(stage_layers(dims.layers, lay.pp))} layers (pass a pp that divides "
            f"{dims.layers})"
        )
    if lay.tp > ctx.hw.domain:
        out.append(
            f"layout.tp: tp={lay.tp} exceeds {ctx.gpn} GPUs per node, so TP crosses nodes and every "
            "layer's all-reduce goes over the network; keep tp <= gpus_per_node"
        )
    if lay.bubble_fraction > MAX_BUBBLE:
        out.append(
            f"pipeline bubble {lay.bubble_fraction:.0%} > {MAX_BUBBLE:.0%}: {lay.grad_accum} "
            f"micro-batches for {lay.pp} stages; use >= {4 * lay.pp} micro-batches (raise the "
            "global batch or lower the micro-batch)"
        )
    if lay.fits and lay.scaling_efficiency < MIN_SCALING:
        # Scaling efficiency is the step without its exposed communication over the step, so
        # below the bar the communication is what costs the time.
        out.append(
            f"scaling efficiency {lay.scaling_efficiency:.0%} < {MIN_SCALING:.0%} (the step "
            f"without exposed communication over the step): {_exposed_traffic(ctx, lay)}"
        )
    if spec.training.grads_bf16 and (
        lay.framework != Framework.MEGATRON or lay.precision not in (Precision.BF16, Precision.FP8)
    ):
        out.append(
            f"training.grads_bf16: only Megatron layouts in bf16 keep their gradients in bf16; "
            f"this plan ({lay.framework.value}, {lay.precision.value}) reduces them as its "
            "framework does (drop --grads-bf16, or force --framework megatron)"
        )
    if ctx.nodes > 1 and spec.network.tier == NetworkTier.TCP:
        out.append(
            "network.tier: multi-node over plain TCP; inter-node gradients will bottleneck (use "
            "InfiniBand/EFA, e.g. SkyPilot network_tier: best, and pass --network)"
        )
    if lay.fits and lay.offload != Offload.NONE and not spec.layout.offload:
        out.append(
            "CPU offload is the last resort (dtrain-tui's flowchart): it fits, but expect a slow "
            "optimizer step"
        )
    if lay.framework == Framework.MEGATRON and ctx.gpu.is_cpu:
        out.append(
            "layout.framework: Megatron-LM needs CUDA GPUs; on CPU ranks use ddp, deepspeed or fsdp"
        )
    if lay.sequence_parallel and lay.tp == 1:
        out.append("layout.sequence_parallel: needs tp > 1; it has no effect here")
    cp_comm = spec.training.cp_comm
    if cp_comm and (lay.cp <= 1 or lay.framework != Framework.MEGATRON):
        why = "splits no sequence (cp 1)" if lay.cp <= 1 else f"runs as {describe(lay)}"
        out.append(
            f"training.cp_comm: chooses how a Megatron layout's context parallelism moves keys "
            f"and values, and this plan {why}; it has no effect here"
            + ("" if lay.cp <= 1 else " (PyTorch-native context parallelism all-gathers them)")
        )
    if spec.training.moe_a2a_overlap and not lay.a2a_overlap:
        out.append(
            "training.moe_a2a_overlap: needs a Megatron MoE layout with ep > 1, one pipeline stage "
            "or --virtual-stages, no full recompute and no Megatron-FSDP (zero stage 3); it has "
            "no effect here"
        )
    out += _moe_setting_mistakes(ctx, lay)
    if not lay.fits and spec.layout.is_forced:
        out.append(_forced_misfit(ctx, lay))
    return out


def _saver_mistakes(ctx: PlanContext, lay: Layout) -> list[str]:
    """Megatron's memory savers (bf16 moments, fine-grained activation offloading) asked for
    where the recommended layout cannot use them, each named with why and the fix."""
    t = ctx.spec.training
    out: list[str] = []
    if t.moments_bf16 and not moments_bf16_apply(lay):
        out.append(
            "training.moments_bf16: Megatron's precision-aware optimizer keeps AdamW's moments "
            "in bf16 under its distributed optimizer, in 16-bit training; this plan "
            f"({lay.framework.value}, ZeRO stage {lay.zero_stage}, {t.optimizer.value}, "
            f"{lay.precision.value}) keeps them as its framework does (force --framework "
            "megatron --zero-stage 1, or drop --moments-bf16)"
        )
    if t.offload_optimizer_states and not states_offload_apply(lay):
        out.append(
            "training.offload_optimizer_states: Megatron moves AdamW's states to host memory "
            "between steps under its distributed optimizer, in 16-bit training; this plan "
            f"({lay.framework.value}, ZeRO stage {lay.zero_stage}, {t.optimizer.value}, "
            f"{lay.precision.value}) keeps them on the GPU (force --framework megatron "
            "--zero-stage 1, or drop --offload-optimizer-states)"
        )
    if not t.offload_modules:
        return out
    why = ""
    if lay.framework != Framework.MEGATRON:
        why = f"this plan runs {lay.framework.value}"
    elif lay.recompute == Recompute.FULL:
        why = "this plan recomputes every layer in full, which keeps only each layer's input"
    elif not lay.memory_per_gpu.host_activations:
        why = f"{ctx.spec.model.preset or 'the model'} has none of these modules' inputs to move"
    if why:
        out.append(
            "training.offload_modules: Megatron's fine-grained activation offloading moves "
            f"saved inputs to host memory, and {why}; nothing is offloaded (force --framework "
            "megatron without --recompute full, or drop --offload-modules)"
        )
    return out


def _moe_setting_mistakes(ctx: PlanContext, lay: Layout) -> list[str]:
    """MoE settings the recommended layout cannot use, each named with why (a setting that
    silently does nothing would let the user believe the plan uses it)."""
    t = ctx.spec.training
    name = ctx.spec.model.preset or "the model"
    out: list[str] = []
    if t.moe_capacity_factor and not ctx.dims.is_moe:
        out.append(
            f"training.moe_capacity_factor: needs a mixture-of-experts model, and {name} is "
            "dense; it has no effect here (drop --moe-capacity-factor)"
        )
    if t.moe_imbalance and not (ctx.dims.is_moe and lay.ep > 1):
        why = "is dense" if not ctx.dims.is_moe else f"runs as {describe(lay)}, without EP"
        out.append(
            "training.moe_imbalance: sets the load of the busiest expert-parallel rank, and "
            f"{name} {why}; it has no effect here (drop --moe-imbalance)"
        )
    if t.moe_dispatcher == MoeDispatcher.DEEPEP and not (
        ctx.dims.is_moe and lay.framework == Framework.MEGATRON and lay.ep > 1
    ):
        why = "is dense" if not ctx.dims.is_moe else f"runs as {describe(lay)}"
        out.append(
            "training.moe_dispatcher: DeepEP dispatches the tokens of a Megatron MoE layout with "
            f"ep > 1, and {name} {why}; it has no effect here"
        )
    return out


def _forced_misfit(ctx: PlanContext, lay: Layout) -> str:
    m = lay.memory_per_gpu
    text = f"the forced layout does not fit: {gib(m.total)} per GPU of {gib(ctx.usable)} usable"
    if m.total <= ctx.usable:
        text += (
            f", and {gib(m.cpu_bytes * ctx.gpn)} per node offloaded "
            f"to host RAM of {gib(ctx.cpu_usable)} usable"
        )
    saver = _saver_hint(ctx, lay)
    return text + f"; {saver or fix_hint(lay, ctx.dims)}"


def _saver_hint(ctx: PlanContext, lay: Layout) -> str:
    """What Megatron's memory savers not asked for would make of the forced Megatron layout
    ``lay`` that does not fit, cheapest first (bf16 moments, then the optimizer states
    between steps on the host, then an MoE layer's expert inputs offloaded): the smallest set
    with which it fits, inside the headroom if need be (as the plan itself falls back to),
    said with its figures; "" where none makes it fit."""
    t = ctx.spec.training
    if lay.framework != Framework.MEGATRON or lay.recompute == Recompute.FULL:
        return ""
    d = lay.draft()
    adam = t.optimizer == Optimizer.ADAMW
    savers: list[tuple[str, dict[str, object]]] = []
    if adam and not d.moments_bf16:
        savers.append(("--moments-bf16", {"moments_bf16": True}))
    if adam and not d.states_offload:
        savers.append(("--offload-optimizer-states", {"states_offload": True}))
    if ctx.dims.is_moe and not d.offload_modules:
        moe = (OffloadModule.EXPERT_FC1, OffloadModule.MOE_ACT)
        savers.append(("--offload-modules expert_fc1 moe_act", {"offload_modules": moe}))
    # The fewest savers first, and of as many the cheapest (the order above).
    for n in range(1, len(savers) + 1):
        for chosen in combinations(savers, n):
            tried = d
            for _, change in chosen:
                tried = replace(tried, **change)  # type: ignore[arg-type]
            m = estimate_memory(
                ctx.dims,
                tried,
                seq_len=t.seq_len,
                optimizer=t.optimizer,
                flash=ctx.flash,
                gpus_per_node=ctx.gpn,
                nccl=ctx.nccl,
            )
            limit = ctx.usable + ctx.headroom_bytes
            if m.total <= limit and m.cpu_bytes * ctx.gpn <= ctx.cpu_usable:
                flags = " ".join(flag for flag, _ in chosen)
                host = f" and {gib(m.cpu_bytes)} of host memory" if m.cpu_bytes else ""
                eats = " (inside the headroom)" if m.total > ctx.usable else ""
                return f"with {flags} it would need {gib(m.total)} per GPU{host}{eats}"
    return ""
