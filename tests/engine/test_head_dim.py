"""Attention heads whose width is not hidden / heads (Qwen3, Gemma, GPT-OSS): ``--head-dim``
(``model.head_dim``) for explicit dimensions, written as Megatron's ``--kv-channels`` and built
by the example trainer; and a fused attention kernel's rate falls for heads narrower than 128
(one exponential per score beside ``4 x head_dim`` matmul FLOPs, FlashAttention-3 Fig. 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from engine.plan import perf
from engine.plan.catalog import get_gpu
from engine.plan.context import hardware
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Framework, Precision, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args

ROOT = Path(__file__).resolve().parents[2]
# Qwen3-30B-A3B's attention: hidden 2048, 32 heads of 128 (4096 wide), 4 KV heads.
QWEN3_ATTN = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "vocab": 151936}


def test_explicit_dimensions_take_the_head_width() -> None:
    dims = resolve_model(ModelSpec(**QWEN3_ATTN, ffn=6144, head_dim=128))
    plain = resolve_model(ModelSpec(**QWEN3_ATTN, ffn=6144))
    assert (dims.head_dim, plain.head_dim) == (128, 64)
    # q and o are 2048 x 4096, k and v 2048 x 512: twice plain's q/o, k and v per layer.
    per_layer = (dims.params_total - plain.params_total) / 48
    assert per_layer == 2 * 2048 * (4096 - 2048) + 2 * 2048 * (512 - 256)


def test_the_preset_and_the_explicit_dimensions_agree() -> None:
    preset = resolve_model(ModelSpec(preset="qwen3-30b-a3b"))
    assert preset.head_dim == 128
    assert preset.head_dim * preset.heads != preset.hidden


def test_head_dim_beside_a_preset_is_refused_and_frees_hidden_from_heads() -> None:
    with pytest.raises(ValidationError, match="model.head_dim"):
        ModelSpec(preset="llama-3-8b", head_dim=64)
    with pytest.raises(ValidationError, match="or give head_dim"):
        ModelSpec(layers=2, hidden=100, heads=3, vocab=10)
    assert ModelSpec(layers=2, hidden=100, heads=3, head_dim=32, vocab=10).head_dim == 32


def test_megatron_args_state_the_head_width() -> None:
    spec = Spec(
        model=ModelSpec(**QWEN3_ATTN, ffn=6144, head_dim=128),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        training=TrainingSpec(seq_len=4096, global_batch=64),
    )
    args = megatron_args(plan(spec)).splitlines()
    assert "--kv-channels 128" in args


def test_the_cli_takes_head_dim() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--layers", "48", "--hidden", "2048"]
        + ["--heads", "32", "--kv-heads", "4", "--vocab", "151936", "--head-dim", "128"]
        + ["--gpu", "h100", "--gpus-per-node", "8", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"]["head_dim"] == 128


def test_narrow_heads_slow_a_fused_kernel_as_flashattention_3_measured() -> None:
    h100 = get_gpu("h100-sxm")
    d0 = h100.peak_tflops(Precision.BF16) / (4 * h100.exp_tops)
    # FA3 Fig. 5 (H100, bf16 forward, 4k): 476 TFLOP/s at head width 64, 638 at 128.
    assert perf.head_dim_factor(64, d0) == pytest.approx(476 / 638, abs=0.02)
    assert perf.head_dim_factor(128, d0) == 1.0
    assert perf.head_dim_factor(256, d0) == 1.0  # wider tiles gain nothing measured
    a100 = get_gpu("a100-80gb")
    a100_d0 = a100.peak_tflops(Precision.BF16) / (4 * a100.exp_tops)
    # Ampere's tensor cores are slower against its SFUs: head width matters less there.
    assert perf.head_dim_factor(64, d0) < perf.head_dim_factor(64, a100_d0) < 1.0
    assert perf.head_dim_factor(64, 0.0) == 1.0  # a GPU without the figure: unchanged


def test_the_attention_of_narrow_heads_takes_longer_at_the_same_flops() -> None:
    spec = Spec(
        model=ModelSpec(**QWEN3_ATTN, ffn=6144, head_dim=128),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        training=TrainingSpec(seq_len=4096, global_batch=64),
    )
    hw = hardware(spec, get_gpu("h100-sxm"), Precision.BF16)
    assert hw.softmax_head_dim == pytest.approx(989 / (4 * 3.9))
    wide = resolve_model(spec.model)
    narrow = wide.model_copy(update={"heads": 64, "kv_heads": 8, "head_dim": 64})  # same q width
    d = LayoutDraft(Strategy.DDP, Framework.MEGATRON, dp=8, precision=Precision.BF16)
    fast = perf.terms(wide, d, hw, 4096).forward.attention
    slow = perf.terms(narrow, d, hw, 4096).forward.attention
    assert slow / fast == pytest.approx(1 / perf.head_dim_factor(64, hw.softmax_head_dim))
    no_sfu = replace(hw, softmax_head_dim=0.0)
    assert perf.terms(narrow, d, no_sfu, 4096).forward.attention == pytest.approx(fast)


def test_the_example_trainer_builds_the_models_head_width(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(
        json.dumps(
            {
                "model": {"layers": 1, "hidden": 32, "heads": 4, "kv_heads": 2, "head_dim": 16},
                "training": {"seq_len": 8},
            }
        )
    )
    code = (
        "import importlib.util, sys, json\n"
        "spec = importlib.util.spec_from_file_location('t', sys.argv[1])\n"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t)\n"
        "def cfg(*extra):\n"
        "    a = t.parse_args(['--bundle', sys.argv[2], *extra])\n"
        "    c = t.Config(a); b = t.Block(c)\n"
        "    return [c.head_dim, b.q.out_features, b.kv.out_features]\n"
        "print(json.dumps([cfg(), cfg('--hidden', '64')]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "engine/trainer/train.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    model_width, reshaped = json.loads(out.stdout)
    assert model_width == [16, 4 * 16, 2 * 2 * 16]
    assert reshaped == [16, 64, 2 * 2 * 16]  # --hidden 64: hidden / heads again
