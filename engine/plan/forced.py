"""A forced layout (``spec.layout``) checked before the search: inconsistent degrees or
combinations no framework runs are a :class:`SpecError` stating the whole constraint and the fix,
one line each. Also the path step that says whether the forced layout fits. Called by
:func:`engine.plan.planner.plan`; the checks run in a fixed order, so the first broken rule is
the one reported.
"""

from __future__ import annotations

from engine.errors import SpecError
from engine.plan.annotate import describe, fix_hint, mem_line, shortfall
from engine.plan.context import PlanContext
from engine.plan.frameworks import cp_splits_heads
from engine.plan.names import CpComm, Framework, Offload, Recompute, Strategy
from engine.plan.result import PathStep, gib
from engine.plan.search import Candidate, divisors
from engine.plan.stages import accounted_ends, accounted_splits, stage_layers, uneven_splits
from engine.plan.strategies import STRATEGIES_OF, ZERO_STAGE_OF


def check_forced(ctx: PlanContext) -> None:
    """Refuse inconsistent forced degrees with the whole constraint in one line."""
    _check_product(ctx)
    _check_model_split(ctx)
    _check_cp_heads(ctx)
    _check_strategy(ctx)
    _check_runs_under(ctx)
    _check_virtual_stages(ctx)


def _check_product(ctx: PlanContext) -> None:
    """The degrees multiply to the world size (or divide it when dp is left to the search)."""
    lay = ctx.spec.layout
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


def _check_model_split(ctx: PlanContext) -> None:
    """TP divides the heads, PP the layers, EP the experts, CP the sequence."""
    lay = ctx.spec.layout
    dims = ctx.dims
    if lay.tp is not None:
        if dims.heads % lay.tp:
            example = max(
                t for t in divisors(dims.heads) if t <= max(1, lay.tp) and not t & (t - 1)
            )
            raise SpecError(
                f"{dims.heads} attention heads are not divisible by tp={lay.tp}; "
                f"pick a tp that divides {dims.heads} (e.g. {example})",
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
        _check_ep(ctx, lay.ep)
    if lay.expert_tp is not None:
        _check_expert_tp(ctx, lay.expert_tp)
    if lay.cp is not None and ctx.spec.training.seq_len % lay.cp:
        raise SpecError(
            f"seq_len {ctx.spec.training.seq_len} is not divisible by cp={lay.cp}; pass a cp that "
            "divides the sequence length",
            field="layout.cp",
        )


def _check_cp_heads(ctx: PlanContext) -> None:
    """The all-to-all variant of context parallelism splits a TP rank's heads over the cp
    ranks: a forced Megatron layout whose heads do not divide cannot run it."""
    lay, dims = ctx.spec.layout, ctx.dims
    cp, tp = lay.cp or 1, lay.tp or 1
    # TP and PP run under Megatron only (FSDP2's context parallelism all-gathers).
    megatron = (
        lay.framework == Framework.MEGATRON
        or lay.strategy == Strategy.THREE_D
        or tp > 1
        or (lay.pp or 1) > 1
    )
    if ctx.spec.training.cp_comm != CpComm.A2A or cp <= 1 or not megatron:
        return
    if not cp_splits_heads(dims.heads, dims.kv_heads, tp, cp):
        raise SpecError(
            f"--cp-comm a2a splits each TP rank's heads over the cp ranks, and tp({tp}) x "
            f"cp({cp}) = {tp * cp} does not divide {dims.name}'s {dims.heads} query and "
            f"{dims.kv_heads} key/value heads; use --cp-comm p2p or allgather, or a tp x cp "
            "that divides both",
            field="training.cp_comm",
        )


def _check_ep(ctx: PlanContext, ep: int) -> None:
    dims = ctx.dims
    if not dims.is_moe:
        raise SpecError(
            f"ep={ep} needs a mixture-of-experts model, and {dims.name} is dense; drop --ep",
            field="layout.ep",
        )
    if dims.num_experts % ep:
        raise SpecError(
            f"ep={ep} does not divide the {dims.num_experts} experts; pass a divisor of "
            f"{dims.num_experts}",
            field="layout.ep",
        )
    stage = ctx.world // (ctx.spec.layout.pp or 1)
    if stage % ep:
        raise SpecError(
            f"ep({ep}) must divide tp * dp * cp = {stage} (the GPUs of a pipeline stage, over "
            "which the experts are spread); pick an ep that divides it",
            field="layout.ep",
        )


def _check_expert_tp(ctx: PlanContext, etp: int) -> None:
    """``expert_tp`` is 1 or the forced tp (Megatron's two mappings: whole experts, or experts
    split like the dense MLP), and ``expert_tp x ep`` divides a stage's GPUs."""
    lay = ctx.spec.layout
    tp = lay.tp
    if not ctx.dims.is_moe:
        raise SpecError(
            f"expert_tp={etp} needs a mixture-of-experts model, and {ctx.dims.name} is dense; "
            "drop --expert-tp",
            field="layout.expert_tp",
        )
    if etp > 1 and tp is None:
        raise SpecError(
            f"expert_tp={etp} splits the experts like tp: force --tp {etp} too, or pass "
            "--expert-tp 1",
            field="layout.expert_tp",
        )
    if etp not in (1, tp):
        raise SpecError(
            f"expert_tp={etp} must be 1 (experts whole) or tp={tp} (experts split like the "
            "dense MLP); pass one of them",
            field="layout.expert_tp",
        )
    stage = ctx.world // (lay.pp or 1)
    ep = lay.ep or 1
    if stage % (etp * ep):
        raise SpecError(
            f"expert_tp x ep = {etp * ep} must divide tp * dp * cp = {stage} (the GPUs of a "
            "pipeline stage); pass --expert-tp 1 or a smaller ep",
            field="layout.expert_tp",
        )


def _check_strategy(ctx: PlanContext) -> None:
    """The strategy runs on the forced framework, at the forced ZeRO stage, with the forced
    TP/PP."""
    lay = ctx.spec.layout
    tp, pp = lay.tp or 1, lay.pp or 1
    if lay.strategy is not None and lay.framework is not None:
        if lay.strategy not in STRATEGIES_OF[lay.framework]:
            allowed = ", ".join(s.value for s in STRATEGIES_OF[lay.framework])
            raise SpecError(
                f"strategy {lay.strategy.value} does not run on framework {lay.framework.value}; "
                f"with {lay.framework.value} use one of: {allowed}",
                field="layout.strategy",
            )
    if lay.strategy is not None and lay.zero_stage is not None and lay.strategy in ZERO_STAGE_OF:
        if ZERO_STAGE_OF[lay.strategy] != lay.zero_stage and lay.strategy != Strategy.DDP:
            raise SpecError(
                f"zero_stage {lay.zero_stage} contradicts strategy {lay.strategy.value} (stage "
                f"{ZERO_STAGE_OF[lay.strategy]}); pass one of them",
                field="layout.zero_stage",
            )
    if lay.strategy is not None and lay.strategy != Strategy.THREE_D and (tp > 1 or pp > 1):
        raise SpecError(
            f"strategy {lay.strategy.value} is pure data parallelism but tp={tp}, pp={pp} were "
            "given; use --strategy 3d for TP/PP",
            field="layout.strategy",
        )


def _check_runs_under(ctx: PlanContext) -> None:
    """Offload, multi-node sharding, CP and EP each run under some strategies only."""
    lay = ctx.spec.layout
    strategy = lay.strategy.value if lay.strategy else ""
    if lay.offload not in (None, Offload.NONE):
        if lay.strategy in (Strategy.DDP, Strategy.THREE_D, Strategy.ZERO1, Strategy.FSDP_GRAD_OP):
            raise SpecError(
                f"offload {lay.offload.value} needs ZeRO-2/3 or FSDP FULL_SHARD, not "
                f"{strategy}; use --strategy zero3, zero2 or fsdp-full",
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
            f"not {strategy}; pick one of those or drop --cp",
            field="layout.cp",
        )
    # DeepSpeed-MoE refuses ZeRO-3 ("MoE not supported with Stage 3", deepspeed/runtime/engine.py).
    if (lay.ep or 1) > 1 and lay.strategy not in (
        None,
        Strategy.ZERO1,
        Strategy.ZERO2,
        Strategy.THREE_D,
    ):
        raise SpecError(
            f"ep={lay.ep} runs under DeepSpeed-MoE (--strategy zero1/zero2; it refuses ZeRO-3) "
            f"or Megatron (--strategy 3d), not {strategy}",
            field="layout.ep",
        )
    if lay.offload == Offload.OPTIMIZER and (
        lay.framework == Framework.FSDP or lay.strategy in STRATEGIES_OF[Framework.FSDP]
    ):
        raise SpecError(
            "FSDP offloads parameters, gradients and optimizer together; pass --offload "
            "optimizer+params, or --strategy zero2/zero3 for optimizer-only offload",
            field="layout.offload",
        )
    recompute = lay.recompute or ctx.spec.training.recompute
    light_elsewhere = lay.framework not in (None, Framework.MEGATRON) or lay.strategy not in (
        None,
        Strategy.THREE_D,
    )
    if recompute == Recompute.LIGHT and light_elsewhere:
        runs = lay.framework.value if lay.framework else strategy
        raise SpecError(
            f"recompute light is Megatron-Core's recompute of named modules (norms, MoE "
            f"activation, MLA up-projections), which {runs} does not have; use --strategy 3d "
            "--framework megatron, or --recompute mlp / full",
            field="training.recompute",
        )
    if recompute == Recompute.LIGHT and not ctx.dims.light_recompute_frees:
        raise SpecError(
            "recompute light frees what MoE experts' activations and latent attention's "
            "up-projections hold, and this model has neither (its norms are fused into the "
            "next linear); use --recompute mlp, selective or full",
            field="training.recompute",
        )


def _check_virtual_stages(ctx: PlanContext) -> None:
    """Megatron-Core's rule: every stage's layer count divisible by the virtual stages, the
    stages split evenly or with lighter end stages (``--decoder-first/last-pipeline-num-layers``),
    or the layers with the embedding and the loss counted divisible by ``pp x v``
    (``--account-for-embedding/loss-in-pipeline-split``)."""
    lay = ctx.spec.layout
    if lay.virtual_stages is not None and lay.virtual_stages > 1:
        pp, v, layers = lay.pp or 1, lay.virtual_stages, ctx.dims.layers
        splits = [stage_layers(layers, pp, f, la) for f, la in uneven_splits(layers, pp)]
        # Accounted: each stage's units (its layers, the embedding, the loss) split in v.
        units = [
            (layers + sum(accounted_ends(layers, pp, f, la))) // pp
            for f, la in accounted_splits(layers, pp)
        ]
        if pp == 1 or not (
            any(all(n % v == 0 for n in split) for split in splits)
            or any(u % v == 0 for u in units)
        ):
            raise SpecError(
                f"virtual_stages={v} needs pp > 1 and a split of the {layers} layers over "
                f"{pp} stage(s) (even, lighter first/last stages, or the embedding and the loss "
                f"counted as layers) where every stage's count divides by {v}; pick another "
                "virtual_stages or pp",
                field="layout.virtual_stages",
            )


def forced_fit_step(ctx: PlanContext, chosen: Candidate) -> PathStep:
    """The path's "Does the forced layout fit?" step: what was forced, what it needs, and when
    it does not fit, by how much and what to try."""
    given = ctx.spec.layout.given_text()
    d = chosen.draft
    reason = f"{given}: {describe(d)} needs {mem_line(chosen.mem)} of {gib(ctx.usable)} usable"
    if not chosen.fits:
        if chosen.mem.total <= ctx.usable:
            reason += f"; {shortfall(ctx, chosen)}"
        reason += f"; {fix_hint(d, ctx.dims)}"
    return PathStep(
        question="Does the forced layout fit?",
        answer="yes" if chosen.fits else "no",
        reason=reason,
    )
