"""Sliding-window attention (Mistral v0.1, Phi-3, Gemma 2, configs with ``layer_types``): read
as transformers reads it, costed as a fused kernel runs it (only the pairs inside the window)
and written for Megatron (``--window-size``, ``--window-attn-skip-freq``)."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest

from engine.plan import perf
from engine.plan.catalog import get_gpu
from engine.plan.context import hardware
from engine.plan.memory import LayoutDraft
from engine.plan.models import architecture_notes, load_hf_config, resolve_model
from engine.plan.names import Recompute, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args

LLAMA_LIKE = {
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 1000,
}


def _load(tmp_path: Path, **cfg: object) -> object:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_LIKE, **cfg}))
    return load_hf_config(f)


def test_which_layers_use_the_window(tmp_path: Path) -> None:
    every = _load(tmp_path, model_type="mistral", sliding_window=4096)
    assert (every.sliding_window, every.window_layers, every.window_pattern) == (4096, 8, "")
    gemma = _load(tmp_path, model_type="gemma2", sliding_window=4096, head_dim=64)
    assert (gemma.window_layers, gemma.window_pattern) == (4, "[1,0]*4")
    listed = ["full_attention"] * 6 + ["sliding_attention"] * 2
    typed = _load(tmp_path, model_type="llama", sliding_window=128, layer_types=listed)
    assert (typed.window_layers, typed.window_pattern) == (2, "[0]*6+[1]*2")
    qwen_off = _load(tmp_path, model_type="qwen2", sliding_window=4096, use_sliding_window=False)
    assert qwen_off.sliding_window == 0
    qwen_on = _load(
        tmp_path,
        model_type="qwen2",
        sliding_window=4096,
        use_sliding_window=True,
        max_window_layers=5,
    )
    assert (qwen_on.window_layers, qwen_on.window_pattern) == (3, "[0]*5+[1]*3")
    assert _load(tmp_path, model_type="mistral", sliding_window=None).sliding_window == 0


def test_the_window_saves_the_pairs_outside_it() -> None:
    dims = resolve_model(ModelSpec(preset="mistral-7b"))
    assert dims.sliding_window == 4096 and dims.window_layers == dims.layers
    assert perf.window_share(dims, 4096) == 1.0  # the window covers the whole sequence
    assert perf.window_share(dims, 8192) == pytest.approx(0.75)  # (2sw - w^2) / s^2
    assert perf.window_share(dims, 32768) == pytest.approx((2 * 32768 * 4096 - 4096**2) / 32768**2)
    gemma = resolve_model(ModelSpec(preset="gemma2-9b"))
    assert perf.window_share(gemma, 8192) == pytest.approx(1 - 21 / 42 * 0.25)
    full = dims.model_copy(update={"sliding_window": 0, "window_layers": 0})
    attention = perf.flops_per_token(dims, 32768, Recompute.NONE) - 6 * dims.params_active
    plain = perf.flops_per_token(full, 32768, Recompute.NONE) - 6 * full.params_active
    assert attention == pytest.approx(plain * perf.window_share(dims, 32768))


def test_a_long_context_plan_is_faster_with_the_window() -> None:
    spec = Spec(
        model=ModelSpec(preset="mistral-7b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        training=TrainingSpec(seq_len=32768, global_batch=16),
    )
    p = plan(spec)
    lay = p.recommended
    draft = LayoutDraft(
        **{f.name: getattr(lay, f.name) for f in fields(LayoutDraft) if hasattr(lay, f.name)}
    )
    hw = hardware(spec, get_gpu("h100-sxm"), lay.precision)
    full = p.model.model_copy(update={"sliding_window": 0, "window_layers": 0})
    without = perf.estimate_time(full, draft, hw, seq_len=32768).step_time_s
    assert lay.step_time_s < 0.8 * without


def test_notes_and_megatron_args_name_the_window() -> None:
    gemma = resolve_model(ModelSpec(preset="gemma2-9b"))
    assert "sliding window 4096 on 21 layers" in architecture_notes(gemma)
    spec = Spec(
        model=ModelSpec(preset="gemma2-27b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        training=TrainingSpec(seq_len=8192, global_batch=64),
    )
    spec = spec.model_copy(update={"layout": LayoutSpec(strategy=Strategy.THREE_D)})
    args = megatron_args(plan(spec)).splitlines()
    assert "--window-size 4096,0" in args
    assert "--window-attn-skip-freq [1,0]*23" in args
    mistral = spec.model_copy(update={"model": ModelSpec(preset="mistral-7b")})
    args = megatron_args(plan(mistral)).splitlines()
    assert "--window-size 4096,0" in args
    assert not any(a.startswith("--window-attn-skip-freq") for a in args)
