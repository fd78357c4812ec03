"""How much of the expert-parallel all-to-all the step waits for. Megatron-Core's MoE layer runs
permute, dispatch, experts, combine and unpermute one after another on the compute stream, so
the dispatch and combine are on the critical path unless a schedule hides them: the combined
1F1B of ``--overlap-moe-expert-parallel-comm`` (tests/engine/test_a2a_overlap.py) or the shared
expert on a side stream (``--moe-shared-expert-overlap``). The time model used to hide a fixed
20 % of every all-to-all behind nothing in particular."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from engine.plan import perf
from engine.plan.dims import ModelDims
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Framework, MoeDispatcher, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware

ROUTED = ModelSpec(
    layers=24, hidden=2048, heads=16, vocab=32000, ffn=1024, num_experts=64, experts_per_token=8
)
DSV3 = Path(__file__).parent / "data" / "hf_configs" / "deepseek-v3.json"


def _shared_dims() -> ModelDims:
    """The routed model with two shared experts (DeepSeek-V2-Lite's count)."""
    return resolve_model(ROUTED).model_copy(update={"shared_experts": 2})


def _draft(**kw: object) -> LayoutDraft:
    base = {"tp": 1, "pp": 2, "dp": 16, "ep": 16, "micro_batch": 1, "grad_accum": 8}
    base.update(kw)
    return LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, zero_stage=1, **base)  # type: ignore[arg-type]


def test_without_a_schedule_for_it_the_whole_all_to_all_is_waited_for() -> None:
    dims, d, hw = resolve_model(ROUTED), _draft(), h100_hardware(4)
    ep = perf.terms(dims, d, hw, 4096).ep
    assert ep > 0
    # TP 1, CP 1: the layer's exposed traffic is its dispatch and combine, all of them.
    assert perf.terms(dims, d, hw, 4096).layer[2] == pytest.approx(ep)


def test_a_shared_expert_beside_the_dispatch_hides_what_it_takes() -> None:
    dims, d, hw = _shared_dims(), _draft(), h100_hardware(4)
    ep = perf.terms(dims, d, hw, 4096).ep
    shared = perf.terms(dims, d, hw, 4096).forward.shared
    assert 0 < 3 * shared < ep  # across four nodes the all-to-all outlasts it
    exposed = perf.terms(dims, d, hw, 4096).layer[2]
    assert exposed == pytest.approx(ep - 3 * shared)
    # Under DeepEP (Megatron-Bridge turns the overlap off there) and on a stack other than
    # Megatron-Core the shared expert runs after the routed ones: all of the all-to-all waits.
    for other in (replace(d, deepep=True), replace(d, framework=Framework.FSDP)):
        assert perf.terms(dims, other, hw, 4096).layer[2] == pytest.approx(
            perf.terms(dims, other, hw, 4096).ep
        ), other


def _small_deepseek(tmp_path: Path) -> ModelSpec:
    """DeepSeek-V3's architecture (MLA, one shared expert) at a size 32 GPUs hold."""
    config = json.loads(DSV3.read_text())
    config.update(
        hidden_size=2048,
        intermediate_size=8192,
        moe_intermediate_size=1024,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_routed_experts=64,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return ModelSpec(config_path=path)


def _args(model: ModelSpec, **training: object) -> tuple[list[str], list[str]]:
    """The written Megatron arguments and the plan's notes."""
    p = plan(
        Spec(
            model=model,
            hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
            training=TrainingSpec(seq_len=4096, global_batch=256, **training),  # type: ignore[arg-type]
            layout=LayoutSpec(framework=Framework.MEGATRON, tp=1, pp=2, ep=16),
        )
    )
    assert p.recommended.ep == 16
    args = [line for line in megatron_args(p).splitlines() if not line.startswith("#")]
    return args, p.recommended.notes


def test_the_arguments_turn_on_what_the_time_model_counts(tmp_path: Path) -> None:
    flag = "--moe-shared-expert-overlap"
    shared = _small_deepseek(tmp_path)
    assert resolve_model(shared).shared_experts == 1
    args, notes = _args(shared)
    assert flag in args
    assert any(flag in n for n in notes)  # and the plan says so
    for other in (_args(shared, moe_dispatcher=MoeDispatcher.DEEPEP), _args(ROUTED)):
        args, notes = other  # DeepEP; no shared expert to run beside it
        assert flag not in args
        assert not any(flag in n for n in notes)
