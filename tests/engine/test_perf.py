"""The time and cost model: FLOPs, collective volumes, bubble, overlap and the derived figures."""

from __future__ import annotations

import pytest

from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.perf import (
    Hardware,
    bubble_fraction,
    estimate_time,
    flops_per_token,
    gather_bytes,
    model_flops_per_token,
    ring_allreduce_bytes,
)
from engine.plan.specs import Framework, ModelSpec, Offload, Recompute, Strategy

DIMS = resolve_model(ModelSpec(preset="llama-2-7b"))


def _hw(nodes: int = 1, gpn: int = 8, inter: float = 50e9, price: float | None = 2.0) -> Hardware:
    return Hardware(
        peak_flops=989e12,
        achievable_mfu=0.45,
        intra_bytes_per_s=450e9,
        inter_bytes_per_s=inter,
        pcie_bytes_per_s=64e9,
        gpus_per_node=gpn,
        nodes=nodes,
        price_per_gpu_hour=price,
    )


def test_flops_per_token() -> None:
    n = DIMS.params_active
    attn = 12 * DIMS.layers * DIMS.hidden * 4096
    assert flops_per_token(DIMS, 4096, Recompute.NONE, attention=False) == 6 * n
    assert flops_per_token(DIMS, 4096, Recompute.NONE) == 6 * n + attn
    assert flops_per_token(DIMS, 4096, Recompute.FULL, attention=False) == 8 * n
    assert flops_per_token(DIMS, 4096, Recompute.SELECTIVE) > flops_per_token(
        DIMS, 4096, Recompute.NONE
    )
    assert model_flops_per_token(DIMS, 4096) == 6 * n + attn
    moe = resolve_model(ModelSpec(preset="mixtral-8x7b"))
    assert flops_per_token(moe, 1, Recompute.NONE, attention=False) == 6 * moe.params_active
    assert moe.params_active < moe.params_total


def test_collective_volumes_and_bubble() -> None:
    assert ring_allreduce_bytes(1000, 8) == pytest.approx(2 * 7 / 8 * 1000)
    assert ring_allreduce_bytes(1000, 1) == 0
    assert gather_bytes(1000, 4) == pytest.approx(750)
    assert bubble_fraction(1, 8) == 0
    assert bubble_fraction(4, 12) == pytest.approx(3 / 15)
    assert bubble_fraction(4, 12, v=3) == pytest.approx(1 / 13)


def _draft(**kw: object) -> LayoutDraft:
    base: dict[str, object] = {
        "strategy": Strategy.DDP,
        "framework": Framework.DDP,
        "dp": 8,
        "micro_batch": 1,
        "grad_accum": 8,
    }
    base.update(kw)
    return LayoutDraft(**base)  # type: ignore[arg-type]


def test_single_gpu_is_pure_compute() -> None:
    e = estimate_time(DIMS, _draft(dp=1, grad_accum=64), _hw(gpn=1), seq_len=4096)
    assert e.comm_time_s == 0
    assert e.scaling_efficiency == pytest.approx(1.0)
    assert e.mfu == pytest.approx(0.45, rel=1e-6)
    assert e.tokens_per_s == pytest.approx(64 * 4096 / e.step_time_s)


def test_communication_strategies_rank_as_expected() -> None:
    hw = _hw(nodes=4, inter=3200e9 / 8 * 0.85)
    ddp = estimate_time(DIMS, _draft(dp=32, grad_accum=1), hw, seq_len=4096)
    z3 = estimate_time(
        DIMS,
        _draft(
            strategy=Strategy.ZERO3,
            framework=Framework.DEEPSPEED,
            zero_stage=3,
            dp=32,
            grad_accum=1,
        ),
        hw,
        seq_len=4096,
    )
    # ZeRO-3 moves 1.5x the DDP volume.
    assert z3.comm_time_s >= ddp.comm_time_s
    slow = estimate_time(
        DIMS, _draft(dp=32, grad_accum=1), _hw(nodes=4, inter=100e9 / 8 * 0.5), seq_len=4096
    )
    assert slow.step_time_s > ddp.step_time_s
    assert slow.scaling_efficiency < ddp.scaling_efficiency
    off = estimate_time(
        DIMS,
        _draft(
            strategy=Strategy.ZERO2,
            framework=Framework.DEEPSPEED,
            zero_stage=2,
            offload=Offload.OPTIMIZER,
            grad_accum=1,
        ),
        _hw(),
        seq_len=4096,
    )
    on = estimate_time(
        DIMS,
        _draft(strategy=Strategy.ZERO2, framework=Framework.DEEPSPEED, zero_stage=2, grad_accum=1),
        _hw(),
        seq_len=4096,
    )
    assert off.step_time_s > on.step_time_s


def test_pipeline_and_tensor_parallel_costs() -> None:
    few = estimate_time(
        DIMS,
        _draft(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, dp=2, pp=4, grad_accum=4),
        _hw(),
        seq_len=4096,
    )
    many = estimate_time(
        DIMS,
        _draft(
            strategy=Strategy.THREE_D,
            framework=Framework.MEGATRON,
            dp=2,
            pp=4,
            grad_accum=32,
            micro_batch=1,
        ),
        _hw(),
        seq_len=4096,
    )
    assert few.bubble_fraction == pytest.approx(3 / 7)
    assert many.bubble_fraction < 0.1
    tp_in = estimate_time(
        DIMS,
        _draft(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, dp=4, tp=8, grad_accum=8),
        _hw(nodes=4),
        seq_len=4096,
    )
    tp_out = estimate_time(
        DIMS,
        _draft(strategy=Strategy.THREE_D, framework=Framework.MEGATRON, dp=2, tp=16, grad_accum=8),
        _hw(nodes=4),
        seq_len=4096,
    )
    assert tp_out.comm_time_s > tp_in.comm_time_s


def test_cost_for_a_token_budget() -> None:
    e = estimate_time(DIMS, _draft(), _hw(price=2.5), seq_len=4096, tokens_budget=1e9)
    steps = 1e9 / (8 * 8 * 4096)
    assert e.gpu_hours == pytest.approx(steps * e.step_time_s * 8 / 3600)
    assert e.cost_usd == pytest.approx(e.gpu_hours * 2.5)  # type: ignore[operator]
    assert estimate_time(DIMS, _draft(), _hw(), seq_len=4096).gpu_hours is None
