"""Pipeline stage splits: how many transformer layers each pipeline stage holds, and which splits
the search tries. Read by the candidate search (:mod:`engine.plan.search`) and, for the heaviest
stage's memory and time, by the cost model (:mod:`engine.plan.memory`, :mod:`engine.plan.perf`).

Megatron-LM splits ``L`` layers evenly over ``p`` stages and refuses a ``p`` that does not divide
``L``, unless ``--decoder-first-pipeline-num-layers`` / ``--decoder-last-pipeline-num-layers``
give the end stages their own counts; the remaining layers then split evenly over the other
stages. The end stages are the ones to lighten: the first holds the embedding and, under 1F1B,
the most micro-batches' activations; the last runs the LM head and the loss (for a 128K vocabulary
about one more layer's compute). Llama 3 405B trained with one layer fewer on each end
(126 = 7 + 14 x 8 + 7 over 16 stages; Llama 3 paper, §3.3.2). Interleaving (virtual stages) needs
``L`` divisible by ``p x v`` and, in Megatron, a number of micro-batches divisible by ``p``.
Pure arithmetic.
"""

from __future__ import annotations

import functools
import math

MIN_CHUNK_LAYERS = 2
"""Fewest layers per interleaved model chunk the search tries: one-layer chunks double the
point-to-point sends of two-layer ones for a bubble only a little smaller."""
MAX_VIRTUAL_OPTIONS = 4
"""Virtual-stage counts tried per pipeline depth (a bound on the search, the largest kept)."""


def stage_layers(layers: int, pp: int, first: int = 0, last: int = 0) -> list[int]:
    """Layers per stage, first to last. ``first`` / ``last`` 0: that end takes the even share;
    an even split of layers that ``pp`` does not divide gives the first stages one more."""
    return list(_stage_layers(layers, pp, first, last))


@functools.lru_cache(maxsize=4096)
def _stage_layers(layers: int, pp: int, first: int, last: int) -> tuple[int, ...]:
    """:func:`stage_layers`, cached: a search asks for the same few splits thousands of times."""
    if pp <= 1:
        return (layers,)
    ends = [first, last]
    fixed = sum(ends)
    free = pp - sum(1 for e in ends if e)
    if free == 0:
        return (first, *([0] * (pp - 2)), last)
    base, rem = divmod(max(0, layers - fixed), free)
    shares = [base + (1 if i < rem else 0) for i in range(free)]
    out: list[int] = []
    if first:
        out.append(first)
    out += shares
    if last:
        out.append(last)
    return tuple(out)


def uneven_splits(layers: int, pp: int) -> list[tuple[int, int]]:
    """The (first, last) splits worth trying for ``pp`` stages, most balanced first: the even
    split when ``pp`` divides ``layers`` (``(0, 0)``); one or two lighter end stages that
    Megatron can express (the others' share a whole number, the ends one layer or more lighter,
    the lightest such gap). Empty when Megatron cannot split ``layers`` over ``pp`` stages
    without making an end stage heavier."""
    if pp <= 1:
        return [(0, 0)]
    out: list[tuple[int, int]] = []
    if layers % pp == 0:
        out.append((0, 0))
    both = _lighter_ends(layers, pp, ends=2)
    if both:
        out.append((both, both))
    last = _lighter_ends(layers, pp, ends=1)
    if last:
        out += [(0, last), (last, 0)]
    return out


def _lighter_ends(layers: int, pp: int, ends: int) -> int:
    """The layer count ``e`` for ``ends`` end stages such that the other ``pp - ends`` stages
    share the rest evenly with ``k > e`` layers each, ``e`` as large as possible (closest to
    balanced); 0 when none exists or when it would be lopsided: the others more than one layer
    above the even share, or the ends lighter by more than half a stage (and three layers)."""
    rest = pp - ends
    if rest <= 0:
        return 0
    even = math.ceil(layers / pp)
    for e in range(even, 0, -1):
        middle, rem = divmod(layers - ends * e, rest)
        if rem == 0 and middle > e:
            ok = middle <= even + 1 and middle - e <= max(3, math.ceil(middle / 2))
            return e if ok else 0
    return 0


def accounted_ends(layers: int, pp: int, first: int, last: int) -> tuple[bool, bool]:
    """Whether the split (``first``, ``last``) is the one Megatron makes when it counts the
    embedding and/or the loss as a layer (``--account-for-embedding-in-pipeline-split``,
    ``--account-for-loss-in-pipeline-split``): ``L`` plus those split evenly over the stages,
    the first (last) stage one transformer layer short. (False, False) for any other split."""
    if pp <= 1:
        return False, False
    for emb, loss in ((True, True), (True, False), (False, True)):
        units, rem = divmod(layers + emb + loss, pp)
        if rem:
            continue
        want = (units - 1 if emb else 0, units - 1 if loss else 0)
        if (first, last) == want and units > 1:
            return emb, loss
    return False, False


def accounted_splits(layers: int, pp: int) -> list[tuple[int, int]]:
    """The splits that count the embedding and/or the loss as layers (:func:`accounted_ends`),
    tried where the virtual stages are forced (the recipes that run them say so)."""
    out = []
    for emb, loss in ((True, True), (True, False), (False, True)):
        units, rem = divmod(layers + emb + loss, pp)
        if pp > 1 and not rem and units > 1:
            out.append((units - 1 if emb else 0, units - 1 if loss else 0))
    return out


def virtual_options(
    layers: int, pp: int, first: int = 0, last: int = 0, *, accounted: bool = False
) -> list[int]:
    """Virtual stages (model chunks per stage) to try for ``pp`` stages split as
    :func:`stage_layers` splits them: 1, and each ``v`` that divides every stage's layer count
    (Megatron-Core's rule for ``--num-virtual-stages-per-pipeline-rank`` beside
    ``--decoder-first/last-pipeline-num-layers``: "each stage's layer count must be divisible by
    the VPP size") with chunks of at least :data:`MIN_CHUNK_LAYERS` on the heaviest stage (at
    most :data:`MAX_VIRTUAL_OPTIONS` of them, the largest kept: they shrink the bubble most).
    Lighter ends and interleaving combine, as Llama 3 405B trained (§3.3.2)."""
    if pp <= 1:
        return [1]
    split = stage_layers(layers, pp, first, last)
    if sum(split) != layers or min(split) < 1:
        return [1]
    heaviest = max(split)
    vs = [
        v
        for v in range(2, min(split) + 1)
        if all(n % v == 0 for n in split) and heaviest // v >= MIN_CHUNK_LAYERS
    ]
    if accounted and any(accounted_ends(layers, pp, first, last)):
        # Megatron's accounted split (tried where the virtual stages are forced): each stage's
        # units (layers, the embedding, the loss) divide into the chunks, the first (last)
        # chunk one layer short.
        vs = [
            v
            for v in range(2, heaviest + 1)
            if heaviest % v == 0 and heaviest // v >= MIN_CHUNK_LAYERS
        ]
    return [1, *vs[-MAX_VIRTUAL_OPTIONS:]]


def in_flight(pp: int, grad_accum: int, v: int, stage: int) -> float:
    """Micro-batches' worth of activations (of that stage's whole layer count) that pipeline
    stage ``stage`` holds at its peak. 1F1B: stage ``i`` runs ``p - i`` forwards before its
    first backward, at most the ``m`` there are. Interleaved (``v`` chunks of ``1/v`` of the
    stage): Megatron's warm-up runs ``2(p - i - 1) + (v - 1)p`` chunk forwards and one more,
    at most the ``m·v`` there are -- ``p + (p-1)/v`` micro-batches on the first stage
    (Korthikanti et al. 2022, §4.2.3), but no more than all ``m`` when ``m = p``."""
    m = max(1, grad_accum)
    if pp <= 1:
        return 1.0
    if v <= 1:
        return float(min(pp - stage, m))
    chunks = min(m * v, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    return chunks / v


def heaviest_stage_layers(layers: int, pp: int, first: int = 0, last: int = 0) -> int:
    """Layers on the stage that holds the most."""
    return max(stage_layers(layers, pp, first, last))
