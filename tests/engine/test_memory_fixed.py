"""The block-recompute bisection's shortcut: a draft's memory worked out once before the
recomputed layers a chunk (:func:`engine.plan.memory.memory_fixed`) gives, at every count, the
breakdown and the total :func:`engine.plan.memory.estimate_memory` gives for the draft with
that count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.plan.memory import breakdown_at, estimate_memory, memory_fixed, total_at
from engine.plan.names import Recompute
from tests.engine.test_search_pruning import SPECS, _ctx, _drafts


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_one_fixed_share_gives_every_counts_breakdown(spec: tuple[str, int, int, int]) -> None:
    ctx = _ctx(*spec)
    tr = ctx.spec.training
    kw = {"seq_len": tr.seq_len, "optimizer": tr.optimizer, "flash": ctx.flash, "gpus_per_node": 8}
    checked = 0
    for d in _drafts(ctx)[::5]:
        for rc in (d.recompute, Recompute.FULL):
            base = replace(d, recompute=rc)
            fixed = memory_fixed(ctx.dims, base, **kw)
            for n in (0, 1, 2, 3, 7):
                want = estimate_memory(ctx.dims, replace(base, recompute_layers=n), **kw)
                assert breakdown_at(fixed, n) == want
                assert total_at(fixed, n) == (want.total, want.cpu_bytes)
                checked += 1
    assert checked
