"""MFU in the convention people log: Megatron-LM's ``num_floating_point_operations``
(``megatron/training/training.py``), which counts causal attention's half of the score and
context products, the LM head, and no embedding lookup; and a scaling efficiency that compares
the step with the same layout's step without communication."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.plan import perf
from engine.plan.models import resolve_model
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]


def _megatron(
    *, s: int, L: int, h: int, a: int, g: int, kv: int, f: int, V: int, swiglu: bool
) -> float:
    """Megatron-LM's per-token count, transcribed: ``12·s·L·h²·((1 + g/a + s/(2h))·(kv·a/h) +
    (f/h)·(3/2 if swiglu) + V/(2·L·h))`` divided by ``s`` (one sequence)."""
    ratio = kv * a / h  # query_projection_size / hidden_size
    attention = (1 + g / a + s / h / 2) * ratio
    mlp = f / h * (1.5 if swiglu else 1)
    logit = V / (2 * L * h)
    return 12 * s * L * h * h * (attention + mlp + logit) / s


@pytest.mark.parametrize("seq_len", [8192, 131072])
def test_llama_3_8b_matches_megatrons_count_by_hand(seq_len: int) -> None:
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    ours = perf.model_flops_per_token(dims, seq_len)
    theirs = _megatron(s=seq_len, L=32, h=4096, a=32, g=8, kv=128, f=14336, V=128256, swiglu=True)
    # Megatron leaves out the norms' weights (a few hundred thousand of 8 billion).
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_the_count_is_not_palms() -> None:
    """PaLM's ``6N + 12·L·h·s`` counts the lookup as a matmul and every score: +10 % at 8K for
    Llama 3 8B, 1.9x at 128K."""
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    palm = 6 * dims.params_active + 12 * dims.layers * dims.hidden * 131072
    assert perf.model_flops_per_token(dims, 131072) < 0.6 * palm


def _ddp_spec(gpus: int) -> Spec:
    return Spec(
        model=ModelSpec(preset="gpt2"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=gpus, nodes=1),
        network=NetworkSpec(),
        training=TrainingSpec(seq_len=1024, global_batch=64),
    )


def test_scaling_efficiency_is_the_step_without_communication_over_the_step() -> None:
    one = plan(_ddp_spec(1)).recommended
    assert one.scaling_efficiency == pytest.approx(1.0)
    eight = plan(_ddp_spec(8)).recommended
    expected = (eight.step_time_s - eight.comm_time_s) / eight.step_time_s
    assert eight.scaling_efficiency == pytest.approx(expected)


def test_the_plan_names_the_convention() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "gpt2", "--gpu", "h100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert "MFU (Megatron convention)" in out
