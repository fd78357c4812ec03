"""Megatron's expert all-to-all overlap in the wizard: the Training step sets it (off by default,
as in Megatron), and editing the step keeps the training settings it does not show (a profile's
MoE dispatcher, capacity factor, nearest-batch switch, context-parallel communication, an
explicit "no overlap", Megatron's memory savers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Input, Select

from engine.plan.names import CpComm, MoeDispatcher, OffloadModule
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec
from tests.tui.wizard_support import to_training, until
from tui.app import DtrainApp


def _app(tmp_path: Path, training: TrainingSpec) -> DtrainApp:
    spec = Spec(
        model=ModelSpec(preset="mixtral-8x7b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        training=training,
    )
    return DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.05)


def test_the_overlap_is_chosen_at_the_training_step(tmp_path: Path) -> None:
    asyncio.run(_choose(tmp_path))


async def _choose(tmp_path: Path) -> None:
    app = _app(tmp_path, TrainingSpec(seq_len=4096, global_batch=256))
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        select = app.screen.query_one("#f-moe_a2a_overlap", Select)
        assert select.value == "auto" and app.spec.training.moe_a2a_overlap is None
        select.value = "on"
        await until(pilot, lambda: app.spec.training.moe_a2a_overlap is True, "overlap asked")
        select.value = "auto"
        await until(pilot, lambda: app.spec.training.moe_a2a_overlap is None, "back to default")


def test_editing_the_step_keeps_what_it_does_not_show(tmp_path: Path) -> None:
    asyncio.run(_kept(tmp_path))


async def _kept(tmp_path: Path) -> None:
    given = TrainingSpec(
        seq_len=4096,
        global_batch=256,
        global_batch_nearest=True,
        cp_comm=CpComm.ALLGATHER,
        moe_dispatcher=MoeDispatcher.DEEPEP,
        moe_capacity_factor=1.25,
        moe_imbalance=1.0,
        moe_a2a_overlap=False,
        fused_cross_entropy=True,
        moments_bf16=True,
        offload_modules=[OffloadModule.EXPERT_FC1, OffloadModule.MOE_ACT],
    )
    app = _app(tmp_path, given)
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        seq = app.screen.query_one("#f-seq_len", Input)
        seq.value = "2048"
        await until(pilot, lambda: app.spec.training.seq_len == 2048, "the edit applied")
        t = app.spec.training
        assert t.global_batch_nearest is True
        assert t.cp_comm == CpComm.ALLGATHER
        assert t.moe_dispatcher == MoeDispatcher.DEEPEP
        assert t.moe_capacity_factor == 1.25
        assert t.moe_imbalance == 1.0
        assert t.fused_cross_entropy is True
        assert t.moe_a2a_overlap is False
        assert t.moments_bf16 is True
        assert t.offload_modules == [OffloadModule.EXPERT_FC1, OffloadModule.MOE_ACT]
