"""The global batch is the user's hyperparameter: the plan trains it exactly, or says that no
layout can and offers the nearest batches that one can, as an explicit choice. Called by
:func:`engine.plan.planner.plan`:

* :func:`settle` before the flowchart: when no layout trains the asked batch (or none that does
  fits), it raises :class:`GlobalBatchError` naming the nearest batches, or, with
  ``training.global_batch_nearest``, moves the plan to the nearest one and says so in the path;
* :func:`faster_choices` after it: when the asked batch holds data parallelism back (7 sequences
  on 32 GPUs) and a nearby batch trains clearly faster per token, the plan offers it (a warning
  and ``Plan.batch_choices``) and still trains the asked batch.

Layouts at different batches are compared per token, never per step.
"""

from __future__ import annotations

import dataclasses

from engine.errors import SpecError
from engine.plan import flowchart
from engine.plan.annotate import describe, mem_line
from engine.plan.context import PlanContext
from engine.plan.result import BatchChoice, PathStep, gib
from engine.plan.search import (
    CLEARLY_FASTER,
    Candidate,
    candidates,
    dp_degrees,
    evaluate,
    smallest,
)

NEAR_FRACTION = 0.25
"""A batch is "nearby" within this share of the asked one: far enough to reach the next
multiple of a useful data-parallel degree (8 for 7), near enough to keep the hyperparameter."""
MAX_TRIES = 12
"""Other batches searched at most when looking for the nearest that can be trained."""


class GlobalBatchError(SpecError):
    """No layout trains ``training.global_batch`` exactly (or none that does fits);
    ``choices`` are the nearest batches one can, for a wizard to offer."""

    def __init__(self, message: str, choices: list[BatchChoice]) -> None:
        super().__init__(message, field="training.global_batch")
        self.choices = choices


def _forced_micro_batch(ctx: PlanContext) -> int:
    return ctx.spec.layout.micro_batch or ctx.spec.training.micro_batch or 1


def _near(batch: int, units: list[int]) -> list[int]:
    """Multiples of each unit (``dp``, times a forced micro-batch) next to ``batch`` (below and
    above), nearest first (ties: the larger)."""
    values: set[int] = set()
    for d in units:
        below = batch // d * d
        if below >= d:
            values.add(below)
        values.add(-(-batch // d) * d)
    values.discard(batch)
    return sorted(values, key=lambda b: (abs(b - batch), -b))


def _pick(ctx: PlanContext, batch: int) -> Candidate | None:
    """What the plan would recommend at ``batch`` (the flowchart and its nearby search, with the
    narration thrown away); None when no layout trains it."""
    at = dataclasses.replace(ctx, batch=batch)
    cands = candidates(at)
    if not cands:
        return None
    pool = flowchart.narrow(at, cands)
    flow = flowchart.walk(at, pool, cands, [])
    return flowchart.choose(at, flow, pool, cands, [], [])


def _choice(c: Candidate, reason: str) -> BatchChoice:
    return BatchChoice(
        global_batch=c.draft.global_batch,
        layout=describe(c.draft),
        tokens_per_s=c.est.tokens_per_s if c.est and c.fits else 0.0,
        fits=c.fits,
        reason=reason,
    )


def nearest_choices(ctx: PlanContext) -> list[BatchChoice]:
    """The nearest batch below and the nearest above the context's that a layout can train,
    preferring ones where a layout fits (nearest first)."""
    fitting: dict[str, Candidate] = {}
    trainable: dict[str, Candidate] = {}
    mb = _forced_micro_batch(ctx)
    for b in _near(ctx.batch, [d * mb for d in dp_degrees(ctx)])[:MAX_TRIES]:
        side = "below" if b < ctx.batch else "above"
        if side in fitting:
            continue
        c = _pick(ctx, b)
        if c is None:
            continue
        trainable.setdefault(side, c)
        if c.fits:
            fitting[side] = c
        if len(fitting) == 2:
            break
    found = fitting or trainable

    def order(kv: tuple[str, Candidate]) -> tuple[int, float]:
        c = kv[1]
        return abs(c.draft.global_batch - ctx.batch), -(c.est.tokens_per_s if c.est else 0.0)

    return [
        _choice(c, f"the nearest batch {side} {ctx.batch} that a layout trains")
        for side, c in sorted(found.items(), key=order)
    ]


def settle(
    ctx: PlanContext, cands: list[Candidate], path: list[PathStep]
) -> tuple[PlanContext, list[Candidate], list[BatchChoice]]:
    """The context and candidates to plan from: unchanged when a layout trains the asked batch
    and fits (or when nothing fits at any batch: the batch is not the problem); else the
    nearest batch, when the spec allows it; else :class:`GlobalBatchError`."""
    if any(c.fits for c in cands):
        return ctx, cands, []
    choices = nearest_choices(ctx)
    if not choices or (cands and not any(ch.fits for ch in choices)):
        return ctx, cands, []
    if not ctx.spec.training.global_batch_nearest:
        raise GlobalBatchError(_refusal(ctx, cands, choices), choices)
    target = choices[0]
    new = dataclasses.replace(ctx, batch=target.global_batch)
    path.append(
        PathStep(
            question=f"Can a layout train the global batch of {ctx.batch} exactly?",
            answer=f"no: training {target.global_batch} (--global-batch-nearest)",
            reason=f"{_why_not(ctx, cands)}; {target.global_batch} is the nearest batch that "
            f"{target.layout} trains",
        )
    )
    return new, candidates(new), choices


def _why_not(ctx: PlanContext, cands: list[Candidate]) -> str:
    if cands:
        lean = smallest(cands)
        return (
            f"every layout that trains it needs too much memory (the leanest, "
            f"{describe(lean.draft)}, needs {mem_line(lean.mem)} of {gib(ctx.usable)} usable)"
        )
    mb = _forced_micro_batch(ctx)
    each = f"a multiple of micro_batch {mb} sequences" if mb > 1 else "whole sequences"
    forced = " that honours the forced settings" if ctx.spec.layout.is_forced else ""
    interleaved = (
        ", and the interleaved schedule needs micro-batches divisible by pp"
        if (ctx.spec.layout.virtual_stages or 1) > 1
        else ""
    )
    return (
        f"micro_batch x grad_accum x dp must equal it, and no layout{forced} splits it into "
        f"{each} per data-parallel replica (dp tried: {_short(dp_degrees(ctx))}){interleaved}"
    )


def _refusal(ctx: PlanContext, cands: list[Candidate], choices: list[BatchChoice]) -> str:
    offers = ", ".join(f"{c.global_batch} ({c.layout})" for c in choices)
    return (
        f"no layout of {ctx.world} GPU(s) trains a global batch of {ctx.batch} exactly: "
        f"{_why_not(ctx, cands)}; the nearest that can: {offers}; pass --global-batch "
        f"{choices[0].global_batch}, or --global-batch-nearest to train the nearest"
    )


def _short(values: list[int]) -> str:
    if len(values) <= 8:
        return ", ".join(map(str, values))
    return ", ".join(map(str, values[:4])) + ", ..., " + ", ".join(map(str, values[-2:]))


def faster_choices(ctx: PlanContext, chosen: Candidate) -> list[BatchChoice]:
    """Nearby batches (within :data:`NEAR_FRACTION`) that a wider data parallelism than
    ``chosen``'s can split, where the plan would train clearly faster per token: at most the
    nearest below and the nearest above. Searched only when the asked batch holds data
    parallelism back, so a round batch costs nothing."""
    if not chosen.fits or not chosen.est:
        return []
    batch = ctx.batch
    mb = _forced_micro_batch(ctx)
    wider = [d * mb for d in dp_degrees(ctx) if d > chosen.draft.dp and batch % (d * mb)]
    near = [b for b in _near(batch, wider) if abs(b - batch) <= NEAR_FRACTION * batch]
    below = [b for b in near if b < batch][:1]
    above = [b for b in near if b > batch][:1]
    out: list[BatchChoice] = []
    for b in below + above:
        c = _pick(ctx, b)
        if c is None or not c.fits:
            continue
        gain = chosen.time_per_sequence / evaluate(ctx, c).time_per_sequence
        if gain >= 1 / (1 - CLEARLY_FASTER):
            out.append(_choice(c, f"{gain:.1f}x the tokens/s of the plan at {batch}"))
    return out


def fewer_gpus(ctx: PlanContext, chosen: Candidate) -> list[str]:
    """Where the batch does not split over every GPU (7 sequences on 8) and a plan on fewer of
    them trains clearly faster (the batch's largest pure data parallelism, or one GPU), one
    line offers it: the plan would leave the other GPUs idle, which the search itself never
    does. Only on one node, or on whole nodes, so the offer is a ``--gpus-per-node`` or
    ``--nodes`` the user can pass."""
    if not chosen.fits or not chosen.est or ctx.spec.layout.is_forced or ctx.batch % ctx.world == 0:
        return []
    counts = [w for w in range(ctx.world - 1, 0, -1) if ctx.batch % w == 0 and _whole(ctx, w)]
    tried = ([counts[0]] if counts else []) + ([1] if counts and counts[0] != 1 else [])
    for w in tried:
        c = _pick(_on(ctx, w), ctx.batch)
        if c is None or not c.fits:
            continue
        gain = chosen.time_per_sequence / evaluate(_on(ctx, w), c).time_per_sequence
        if gain < 1 / (1 - CLEARLY_FASTER):
            continue
        gpus = "1 GPU" if w == 1 else f"{w} of the {ctx.world} GPUs"
        how = f"--gpus-per-node {w}" if w <= ctx.gpn else f"--nodes {w // ctx.gpn}"
        return [
            f"hardware.gpus: {gpus} would train the batch of {ctx.batch} at {gain:.1f}x the "
            f"tokens/s ({describe(c.draft)} instead of {describe(chosen.draft)}), leaving "
            f"{ctx.world - w} idle: {ctx.batch} sequences do not split over {ctx.world} "
            f"replicas; pass {how} to take it"
        ]
    return []


def _whole(ctx: PlanContext, world: int) -> bool:
    """Whether ``world`` GPUs are part of one node or whole nodes."""
    return world <= ctx.gpn if ctx.nodes == 1 else world % ctx.gpn == 0


def _on(ctx: PlanContext, world: int) -> PlanContext:
    """``ctx`` on ``world`` of its GPUs (part of one node, or whole nodes)."""
    gpn, nodes = (world, 1) if world <= ctx.gpn else (ctx.gpn, world // ctx.gpn)
    hw = dataclasses.replace(ctx.hw, gpus_per_node=gpn, nodes=nodes)
    return dataclasses.replace(ctx, world=world, gpn=gpn, nodes=nodes, hw=hw)
