"""The memory and time models' speed shortcuts give the numbers the plain computation gives: the
peak stage is weighed once per kind of stage, a micro-batch sums each kind of stage once, the
block-recompute bisection's totals are those of the full breakdown, and the caches (keyed by
the model's identity) answer as a fresh computation does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.plan import memory, perf
from engine.plan.memory import estimate_memory, memory_total
from engine.plan.names import Recompute
from engine.plan.stages import in_flight, stage_layers
from tests.engine.test_search_pruning import SPECS, _ctx, _drafts

SPLITS = [
    # (layers, pp, first, last, mtp): even, uneven, lighter ends, one stage, a bare last stage.
    (61, 8, 0, 0, 1),
    (61, 8, 6, 6, 0),
    (94, 4, 0, 0, 0),
    (126, 16, 6, 8, 0),
    (32, 1, 0, 0, 0),
    (10, 3, 4, 0, 2),
]


@pytest.mark.parametrize("split", SPLITS, ids=[str(s) for s in SPLITS])
@pytest.mark.parametrize("grad_accum", [1, 2, 3, 8, 64])
@pytest.mark.parametrize("v", [1, 2, 3])
def test_the_peak_stage_is_the_first_of_its_size(
    split: tuple[int, int, int, int, int], grad_accum: int, v: int
) -> None:
    layers, pp, first, last, mtp = split
    every = stage_layers(layers, pp, first, last)
    every[-1] += mtp
    kept, per_layer = 3.7, 1.3  # any two non-negative per-layer figures
    for redone in (0, 1, 2):

        def held(i: int, n: int, redone: int = redone) -> float:
            body = n * per_layer if not redone else min(redone, n) * per_layer
            body += max(0, n - redone) * kept if redone else 0.0
            return in_flight(pp, grad_accum, v, i) * body

        full = max(held(i, n) for i, n in enumerate(every))
        short = max(held(i, n) for i, n in memory._peak_stages(layers, pp, first, last, mtp))
        assert short == full


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_block_recompute_totals_are_the_breakdowns(spec: tuple[str, int, int, int]) -> None:
    ctx = _ctx(*spec)
    tr = ctx.spec.training
    kw = {"seq_len": tr.seq_len, "optimizer": tr.optimizer, "flash": ctx.flash}
    checked = 0
    for d in _drafts(ctx)[::7]:
        full = replace(d, recompute=Recompute.FULL)
        for n in (0, 1, 2, 5):
            mem = estimate_memory(ctx.dims, replace(full, recompute_layers=n), **kw)
            got = memory_total(ctx.dims, full, recompute_layers=n, **kw)
            assert got == (mem.total, mem.cpu_bytes)
            checked += 1
    assert checked


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_cached_estimates_equal_fresh_ones(spec: tuple[str, int, int, int]) -> None:
    """Each draft weighed and timed twice (the second from the caches) and once more with the
    caches emptied before each: the same figures."""
    ctx = _ctx(*spec)
    tr = ctx.spec.training
    kw = {"seq_len": tr.seq_len, "optimizer": tr.optimizer, "flash": ctx.flash}
    drafts = _drafts(ctx)[::5]
    warm = [estimate_memory(ctx.dims, d, **kw) for d in drafts]
    again = [estimate_memory(ctx.dims, d, **kw) for d in drafts]
    cold = []
    for d in drafts:
        memory._STATES_CACHE.clear()
        memory._LAYER_BYTES.clear()
        memory._STAGE_PARAMS.clear()
        cold.append(estimate_memory(ctx.dims, d, **kw))
    assert warm == again == cold
    times = [perf.micro_batch_time(ctx.dims, d, ctx.hw, tr.seq_len) for d in drafts]
    perf._stage_kinds.cache_clear()
    perf._LAYER_CACHE.clear()
    assert times == [perf.micro_batch_time(ctx.dims, d, ctx.hw, tr.seq_len) for d in drafts]


@pytest.mark.parametrize("split", SPLITS, ids=[str(s) for s in SPLITS])
@pytest.mark.parametrize("dense_layers", [0, 1, 3])
def test_stage_kinds_rebuild_every_stage(
    split: tuple[int, int, int, int, int], dense_layers: int
) -> None:
    layers, pp, first, last, mtp = split
    every = stage_layers(layers, pp, first, last)
    kinds, of_stage = perf._stage_kinds(layers, pp, first, last, dense_layers, mtp)
    before = 0
    assert len(of_stage) == len(every)
    for i, n in enumerate(every):
        n_dense = min(n, max(0, dense_layers - before))
        before += n
        is_last = i == len(every) - 1
        assert kinds[of_stage[i]] == (n + (mtp if is_last else 0), n_dense, is_last)
    assert len(set(kinds)) == len(kinds)
