"""A PyTorch-native trainer's fused cross-entropy (``--fused-cross-entropy``): flash-attn's or
Liger's loss keeps no fp32 copies of the logits, about 4 bytes a logit at the loss where
PyTorch's own holds 14. Megatron's is always fused. A planning input only."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from engine.plan.memory import LayoutDraft, logits_bytes
from engine.plan.models import resolve_model
from engine.plan.names import Framework, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3


def _spec(fused: bool | None) -> Spec:
    # MosaicML's MPT-1B as it trained on 64 H100s (llm-foundry's benchmark table): FSDP full
    # shard, 20 sequences of 2048 a micro-batch, no activation checkpointing, a 50K vocabulary.
    return Spec(
        model=ModelSpec(layers=24, hidden=2048, heads=16, vocab=50368, tie_embeddings=True),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=8),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(
            seq_len=2048, global_batch=1280, recompute="none", fused_cross_entropy=fused
        ),
        layout=LayoutSpec(strategy=Strategy.FSDP_FULL, dp=64, micro_batch=20),
    )


def test_a_fused_loss_holds_four_bytes_a_logit_where_pytorchs_holds_fourteen() -> None:
    dims = resolve_model(_spec(None).model)
    eager = LayoutDraft(strategy=Strategy.FSDP_FULL, framework=Framework.FSDP, dp=8)
    assert logits_bytes(dims, eager, 1) / dims.vocab == 14
    assert logits_bytes(dims, replace(eager, fused_ce=True), 1) / dims.vocab == 4


def test_the_run_that_trained_fits_only_with_the_loss_it_ran() -> None:
    # 40960 tokens x 50368 logits a micro-batch: 29 GB at 14 bytes, 8 GB at 4.
    eager, fused = plan(_spec(None)).recommended, plan(_spec(True)).recommended
    saved = eager.memory_per_gpu.total - fused.memory_per_gpu.total
    assert 18 * GIB < saved < 21 * GIB
    assert not eager.fits and fused.fits
    assert any("fused cross-entropy" in n for n in fused.notes)
    assert not any("fused cross-entropy" in n for n in eager.notes)


def test_megatron_is_fused_either_way() -> None:
    def total(fused: bool | None) -> int:
        spec = _spec(fused)
        spec.layout = LayoutSpec(strategy=Strategy.THREE_D, framework="megatron", tp=1, dp=64)
        return plan(spec).recommended.memory_per_gpu.total

    assert total(None) == total(True)


def test_the_cli_states_it() -> None:
    argv = ["plan", "--model", "gpt2", "--nodes", "1", "--gpus-per-node", "2", "--json"]
    out = [
        json.loads(
            subprocess.run(
                [sys.executable, "-m", "cli", *argv, *extra],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )["spec"]["training"]
        for extra in ([], ["--fused-cross-entropy"])
    ]
    assert out[0].get("fused_cross_entropy") is None
    assert out[1]["fused_cross_entropy"] is True
