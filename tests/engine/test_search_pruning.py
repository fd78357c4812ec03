"""The search's shortcuts keep every plan: what did not fit at a smaller micro-batch is not weighed
again (memory never falls as the micro-batch grows while several are accumulated), and the
fewest block-recomputed layers are found from the memory's slope, not by trying each count."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.plan import search
from engine.plan.catalog import get_gpu
from engine.plan.context import PlanContext
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Precision, Recompute
from engine.plan.specs import Spec
from engine.plan.stages import stage_layers

SPECS = [
    # (preset, nodes, seq_len, global batch): dense and MoE, one stage and deep pipelines.
    ("gemma2-27b", 1, 8192, 1024),
    ("llama-3-70b", 16, 8192, 1024),
    ("deepseek-v3", 32, 4096, 1024),
    ("mixtral-8x7b", 4, 4096, 512),
]


def _ctx(preset: str, nodes: int, seq_len: int, batch: int) -> PlanContext:
    spec = Spec.model_validate(
        {
            "model": {"preset": preset},
            "hardware": {"gpu": "h100", "gpus_per_node": 8, "nodes": nodes},
            "network": {"tier": "ib-ndr"},
            "training": {"seq_len": seq_len, "global_batch": batch},
        }
    )
    return PlanContext.build(spec, resolve_model(spec.model), get_gpu("h100"), Precision.BF16)


def _drafts(ctx: PlanContext) -> list[LayoutDraft]:
    """The search's own drafts, one per mesh, setting and recompute (at micro-batch 1)."""
    return [
        search._draft(
            ctx, g, setting, search._pipeline_shapes(ctx, g.pp)[0], 1, ctx.batch // g.dp, rc
        )
        for g in search._degrees(ctx, ctx.batch)
        for setting in search._settings(ctx, g)
        for rc in search._recomputes(ctx)
    ]


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_memory_never_falls_as_the_micro_batch_grows_while_several_are_accumulated(
    spec: tuple[str, int, int, int],
) -> None:
    ctx = _ctx(*spec)
    checked = 0
    for d in _drafts(ctx):
        per_replica = d.grad_accum
        previous = 0
        for mb in search._micro_batches(per_replica, None):
            m = per_replica // mb
            if m <= 1:
                break
            total = search.weigh(ctx, replace(d, micro_batch=mb, grad_accum=m)).mem.total
            assert total >= previous, (d, mb)
            previous = total
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("spec", SPECS, ids=[s[0] for s in SPECS])
def test_the_fewest_block_recomputed_layers_are_found(spec: tuple[str, int, int, int]) -> None:
    """Against trying every count: the answer fits and one fewer does not."""
    ctx = _ctx(*spec)
    found = 0
    for d in _drafts(ctx):
        if d.recompute != Recompute.FULL or d.framework.value != "megatron":
            continue
        for mb in (1, 2, 4):
            if d.grad_accum % mb:
                continue
            full = replace(d, micro_batch=mb, grad_accum=d.grad_accum // mb)
            got = search._block_recompute(ctx, full)
            split = stage_layers(ctx.dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers)
            heaviest = min(split) // max(1, d.virtual_stages)
            fitting = [
                n
                for n in range(1, heaviest)
                if search.weigh(ctx, replace(full, recompute_layers=n)).fits
            ]
            if got is None:
                assert not fitting or heaviest < 2
                continue
            assert got.fits and got.draft.recompute_layers == min(fitting), (full, fitting)
            found += 1
    assert found > 5


def test_the_shortcuts_keep_every_fitting_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The search that remembers what did not fit finds the same fitting layouts, and weighs
    fewer, than one that weighs everything again."""
    ctx = _ctx("gemma2-27b", 1, 8192, 1024)
    weighed = 0
    weigh = search.weigh

    def counted(ctx: PlanContext, d: LayoutDraft) -> search.Candidate:
        nonlocal weighed
        weighed += 1
        return weigh(ctx, d)

    monkeypatch.setattr(search, "weigh", counted)

    def fitting() -> set[tuple[object, ...]]:
        return {(c.draft, c.mem.total) for c in search.candidates(ctx) if c.fits}

    pruned, pruned_weighs = fitting(), weighed
    monkeypatch.setattr(search, "REMEMBER_FAILURES", False)
    weighed = 0
    full = fitting()
    assert pruned == full and len(full) > 20
    assert pruned_weighs < weighed
