"""The plan package's structure: no import circle inside engine.plan, the framework rules in
one module the time model and the writers share, the layout checks on the Layout, the model's
traits on ModelDims."""

from __future__ import annotations

from dataclasses import fields, replace

import grimp
import pytest

from engine.errors import DtrainError
from engine.plan.models import resolve_model
from engine.plan.names import CpComm, Framework, Optimizer, PPSchedule, Recompute, Strategy
from engine.plan.result import Layout, LayoutDraft, MemoryBreakdown
from engine.plan.search import Candidate
from engine.plan.specs import ModelSpec
from tests.engine.writers_fixtures import make_plan


def _plan_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module among engine.plan's imports
    (module-level and function-level alike, as grimp counts them)."""
    g = grimp.build_graph("engine")
    mods = sorted(m for m in g.modules if m.startswith("engine.plan"))
    edges = {
        m: {x for x in g.find_modules_directly_imported_by(m) if x.startswith("engine.plan")}
        for m in mods
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v] - {v}:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    return out


def test_engine_plan_has_no_import_circle() -> None:
    assert _plan_cycles() == []


def test_the_megatron_writer_reads_the_framework_rules_not_the_time_model() -> None:
    g = grimp.build_graph("engine")
    assert "engine.plan.perf" not in g.find_modules_directly_imported_by("engine.write.megatron")
    assert "engine.plan.frameworks" in g.find_modules_directly_imported_by("engine.plan.perf")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sequence_parallel": True, "tp": 1}, "layout.sequence_parallel"),
        (
            {"pp": 4, "virtual_stages": 3, "pp_schedule": PPSchedule.INTERLEAVED},
            "layout.virtual_stages",
        ),
    ],
)
def test_the_layout_refuses_what_megatron_cannot_run(change: dict[str, object], field: str) -> None:
    plan = make_plan(model=ModelSpec(preset="llama-3-8b"), gpu="h100-sxm", gpus_per_node=8)
    lay = replace(plan.recommended, **change)
    with pytest.raises(DtrainError) as e:
        lay.check_megatron(plan.model.layers, Optimizer.ADAMW)
    assert e.value.field == field and "\n" not in str(e.value)


def test_the_layout_refuses_8bit_adam_without_the_distributed_optimizer() -> None:
    plan = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        zero_stage=0,
        tp=2,
    )
    plan.recommended.check_megatron(plan.model.layers, Optimizer.ADAMW)
    with pytest.raises(DtrainError) as e:
        plan.recommended.check_megatron(plan.model.layers, Optimizer.ADAM8BIT)
    assert e.value.field == "training.optimizer" and "--zero-stage 1" in str(e.value)


@pytest.mark.parametrize(
    ("model", "traits"),
    [
        (ModelSpec(preset="gpt2"), (False, False, True, False, False, True, False)),
        (ModelSpec(preset="llama-3-8b"), (True, True, False, False, False, False, False)),
        (ModelSpec(preset="qwen2-7b"), (True, True, False, True, False, False, False)),
        (ModelSpec(preset="qwen3-30b-a3b"), (True, True, False, False, True, False, False)),
        (ModelSpec(preset="gpt-oss-20b"), (True, True, True, False, False, False, True)),
        (ModelSpec(preset="falcon-7b"), (False, True, False, False, False, True, False)),
        (ModelSpec(preset="pythia-160m"), (False, True, True, False, False, True, False)),
        (
            ModelSpec(layers=4, hidden=256, heads=4, vocab=1024),
            (False,) * 2 + (True,) + (False,) * 2 + (True, False),
        ),
        (
            ModelSpec(layers=4, hidden=256, heads=4, vocab=1024, ffn=512),
            (True, True) + (False,) * 5,
        ),
        (ModelSpec(params=7e9), (True, True) + (False,) * 5),
    ],
)
def test_the_model_carries_its_traits(model: ModelSpec, traits: tuple[bool, ...]) -> None:
    m = resolve_model(model)
    got = (m.rms_norm, m.rope, m.linear_bias, m.qkv_bias, m.qk_norm, m.dropout, m.attention_sinks)
    assert got == traits


ESTIMATES = {
    "memory_per_gpu",
    "fits",
    "step_time_s",
    "tokens_per_s",
    "mfu",
    "compute_time_s",
    "comm_time_s",
    "bubble_fraction",
    "scaling_efficiency",
    "gpu_hours",
    "cost_usd",
    "rejected_because",
    "notes",
}


def test_a_layout_is_its_draft_and_the_estimates() -> None:
    # The shape is declared once, on LayoutDraft; Layout adds the estimates. A draft field (or
    # a derived one, expert_tp, global_batch) declared again on Layout shows here.
    shape = {f.name for f in fields(LayoutDraft)}
    derived = {name for name, v in vars(LayoutDraft).items() if isinstance(v, property)}
    assert issubclass(Layout, LayoutDraft)
    assert set(Layout.__annotations__) == ESTIMATES
    assert not (shape | derived) & set(vars(Layout))
    assert {f.name for f in fields(Layout)} == shape | ESTIMATES


def test_a_layout_carries_every_field_of_its_draft() -> None:
    d = LayoutDraft(
        Strategy.THREE_D,
        Framework.MEGATRON,
        tp=2,
        dp=4,
        ep=2,
        etp=1,
        micro_batch=2,
        grad_accum=3,
        recompute=Recompute.FULL,
        recompute_layers=3,
        a2a_overlap=True,
        fp8_linears=True,
        capacity=1.25,
        imbalance=1.5,
        deepep=True,
        fused_ce=True,
        grads_bf16=True,
        cp_comm=CpComm.ALLGATHER,
    )
    mem = MemoryBreakdown(params=1, grads=1, optimizer=1, activations=1, buffers=1, total=5)
    lay = Candidate(d, mem, fits=True).to_layout(rejected="slower")
    assert all(getattr(lay, f.name) == getattr(d, f.name) for f in fields(LayoutDraft))
    assert (lay.global_batch, lay.expert_tp, lay.rejected_because) == (24, 1, "slower")
    # plan --json: the derived degrees after the field they follow, the spec's settings left out.
    keys = list(lay.to_json_dict())
    assert keys[6:9] == ["ep", "expert_tp", "zero_stage"]
    assert keys[11:14] == ["grad_accum", "global_batch", "recompute"]
    assert not {"etp", "fp8_linears", "deepep", "cp_comm"} & set(keys)
