"""The rankings' shortcut: a candidate's bound (:func:`engine.plan.search.floor`) never exceeds
its estimated time, and :func:`engine.plan.search.best` and the pipeline refinement's fastest
few, which estimate only what the bound leaves in play, pick what estimating every candidate
picks."""

from __future__ import annotations

import random

import pytest

from engine.plan import search
from engine.plan.context import PlanContext
from engine.plan.search import Candidate, evaluate, floor, floor_step
from tests.engine.test_search_pruning import SPECS, _ctx


def _fresh(ctx: PlanContext) -> list[Candidate]:
    """The search's candidates, none estimated yet."""
    return [Candidate(c.draft, c.mem, c.fits) for c in search.candidates(ctx)]


def _plain_best(ctx: PlanContext, cands: list[Candidate]) -> Candidate | None:
    """best() as it read before the bound: every fitting candidate estimated."""
    fitting = [evaluate(ctx, c) for c in cands if c.fits]
    if not fitting:
        return None
    times = [c.time_per_sequence for c in fitting]
    fastest = min(times)
    first = fitting[times.index(fastest)]
    if search.is_tight(ctx, first):
        near = fastest * (1 + search.MARGIN_TIE)
        roomy = [
            (c, t)
            for c, t in zip(fitting, times, strict=True)
            if t <= near and not search.is_tight(ctx, c)
        ]
        if roomy:
            fitting, times = [c for c, _ in roomy], [t for _, t in roomy]
            fastest = min(times)
    tied = [c for c, t in zip(fitting, times, strict=True) if t <= fastest * (1 + search.TIE)]
    return min(tied, key=search._simplicity)


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_the_bound_never_exceeds_the_estimate(spec: tuple[str, int, int, int]) -> None:
    ctx = _ctx(*spec)
    cands = [c for c in _fresh(ctx) if c.fits]
    assert cands
    for c in cands:
        bound, step_bound = floor(ctx, c), floor_step(ctx, c)
        evaluate(ctx, c)
        assert bound <= c.time_per_sequence
        assert step_bound <= c.time
        assert floor(ctx, c) == c.time_per_sequence  # once estimated: the exact value


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_best_picks_what_estimating_everything_picks(spec: tuple[str, int, int, int]) -> None:
    ctx = _ctx(*spec)
    lazy, plain = _fresh(ctx), _fresh(ctx)
    rng = random.Random(7)
    pools = [list(range(len(lazy)))]
    pools += [rng.sample(range(len(lazy)), k=max(1, len(lazy) // 5)) for _ in range(20)]
    by_strategy: dict[object, list[int]] = {}
    for i, c in enumerate(lazy):
        by_strategy.setdefault(c.draft.strategy, []).append(i)
    pools += list(by_strategy.values())
    for pool in pools:
        got = search.best(ctx, [lazy[i] for i in pool])
        want = _plain_best(ctx, [plain[i] for i in pool])
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert got.draft == want.draft
            assert got.est == want.est
    assert sum(c.est is None for c in lazy if c.fits)  # the bound left some untimed


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
@pytest.mark.parametrize("n", [1, 3, 10])
def test_the_fastest_few_are_those_of_every_estimate(
    spec: tuple[str, int, int, int], n: int
) -> None:
    ctx = _ctx(*spec)
    lazy = [c for c in _fresh(ctx) if c.fits]
    plain = [evaluate(ctx, c) for c in _fresh(ctx) if c.fits]
    plain.sort(key=lambda c: c.time_per_sequence)
    got = search._fastest(ctx, lazy, n)
    assert [c.draft for c in got] == [c.draft for c in plain[:n]]
