"""Experts folded over TP ranks (Megatron-Core's MoE parallel folding,
``--expert-tensor-parallel-size 1``): the layout Megatron-Bridge trains Qwen3-235B with on H100
(TP2 x PP8, EP32 over 16 data-parallel ranks) was refused before ("ep must divide dp * cp")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.errors import SpecError
from engine.plan import perf
from engine.plan.memory import LayoutDraft, stage_params
from engine.plan.models import resolve_model
from engine.plan.names import Framework, NetworkTier, Precision, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware


def _qwen235_on_h100(**layout: object) -> Spec:
    return Spec(
        model=ModelSpec(preset="qwen3-235b-a22b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=32),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=2048, precision=Precision.FP8),
        layout=LayoutSpec(**layout),
    )


def _draft(ep: int, etp: int = 1) -> LayoutDraft:
    """Qwen3-235B's Megatron-Bridge H100 degrees: TP2 x PP8 x DP16."""
    return LayoutDraft(
        Strategy.THREE_D,
        Framework.MEGATRON,
        tp=2,
        pp=8,
        dp=16,
        ep=ep,
        etp=etp,
        sequence_parallel=True,
    )


def test_megatron_bridges_h100_layout_for_qwen3_235b_is_planned_and_written() -> None:
    p = plan(_qwen235_on_h100(tp=2, pp=8, ep=32, micro_batch=1))
    lay = p.recommended
    assert (lay.tp, lay.pp, lay.dp, lay.ep) == (2, 8, 16, 32)
    lines = [x for x in megatron_args(p).splitlines() if not x.startswith("#")]
    assert "--expert-model-parallel-size 32" in lines
    assert "--expert-tensor-parallel-size 1" in lines
    assert "--sequence-parallel" in lines  # Megatron asserts it for MoE under TP


def test_an_ep_that_does_not_divide_a_stage_is_one_line_naming_the_field() -> None:
    # 256 GPUs, PP8: a stage has 32 GPUs; ep 64 cannot be carved out of them.
    with pytest.raises(SpecError) as e:
        plan(_qwen235_on_h100(tp=2, pp=8, ep=64))
    assert e.value.field == "layout.ep"
    assert "tp * dp * cp = 32" in str(e.value)


def test_folded_experts_are_whole_and_split_only_by_ep() -> None:
    dims = resolve_model(ModelSpec(preset="qwen3-235b-a22b"))
    folded = _draft(ep=32)
    split = _draft(ep=8, etp=2)  # Megatron's default mapping: experts split like the MLP
    assert (folded.expert_tp, folded.expert_dp) == (1, 1)
    assert (split.expert_tp, split.expert_dp) == (2, 2)
    assert replace(split, etp=0).expert_tp == 2  # unset: Megatron's default, tp
    _, experts_folded = stage_params(dims, folded)
    _, experts_split = stage_params(dims, split)
    assert experts_folded == pytest.approx(experts_split * (2 * 8) / 32)


def test_an_moe_layer_under_folded_experts_has_only_its_attentions_tp_collectives() -> None:
    # Each TP rank routes its own sequence-parallel tokens to the experts: the MLP half of the
    # layer has no all-gather / reduce-scatter (Megatron-Core's MoE layer with ETP 1).
    dims = resolve_model(ModelSpec(preset="qwen3-235b-a22b"))
    hw = h100_hardware(32)
    # fp16: the classic stack hides no backward collective, so every one of them is counted.
    fp16 = Precision.FP16
    folded = perf.terms(dims, replace(_draft(ep=32), precision=fp16), hw, 4096).tp
    split = perf.terms(dims, replace(_draft(ep=8, etp=2), precision=fp16), hw, 4096).tp
    d = _draft(ep=32)
    size = d.micro_batch * 4096 * dims.hidden * 2
    attention = 2 * perf.gather_time(hw, size, d.tp, 1)
    assert folded == pytest.approx(2 * attention)  # forward + backward, attention only
    # Split experts add the all-to-all dispatcher's all-gather of every routed copy (top-8)
    # over the expert-TP group and its reduce-scatter of the experts' output.
    routed = 2 * perf.gather_time(hw, size * dims.experts_per_token, 2, 1)
    assert split == pytest.approx(2 * (attention + routed))


def test_the_search_weighs_both_expert_mappings_and_a_forced_one_is_kept() -> None:
    from engine.plan.catalog import get_gpu
    from engine.plan.context import PlanContext
    from engine.plan.search import candidates

    spec = _qwen235_on_h100(tp=2, pp=8)
    ctx = PlanContext.build(spec, resolve_model(spec.model), get_gpu("h100-sxm"), Precision.FP8)
    got = {(c.draft.ep, c.draft.expert_tp) for c in candidates(ctx)}
    assert (8, 2) in got and (8, 1) in got  # EP inside DP: both mappings
    assert (32, 1) in got and (32, 2) not in got  # EP folded over TP: whole experts only
    p = plan(_qwen235_on_h100(tp=2, pp=8, ep=8, expert_tp=2, micro_batch=1))
    assert p.recommended.expert_tp == 2
    args = [x for x in megatron_args(p).splitlines() if not x.startswith("#")]
    assert "--expert-tensor-parallel-size 2" in args


def test_a_forced_expert_tp_that_megatron_cannot_map_is_one_line() -> None:
    with pytest.raises(SpecError) as e:
        plan(_qwen235_on_h100(tp=4, pp=8, ep=8, expert_tp=2))
    assert e.value.field == "layout.expert_tp"
    dense = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        layout=LayoutSpec(tp=2, expert_tp=1),
    )
    with pytest.raises(SpecError) as e:
        plan(dense)
    assert e.value.field == "layout.expert_tp" and "dense" in str(e.value)
