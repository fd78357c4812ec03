"""The sequence length against the model's positions: a learned position table (GPT-2's 1024)
cannot be read past its end, so a longer ``training.seq_len`` is refused in one line naming the
limit; a model whose config scales its rotary positions (YaRN, Llama 3's) is warned, not
refused, past its stated context."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec

ROOT = Path(__file__).resolve().parents[2]


def _spec(model: str, seq_len: int, nodes: int = 1) -> Spec:
    return Spec(
        model=ModelSpec(preset=model),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=nodes),
        network=NetworkSpec(),
        training=TrainingSpec(seq_len=seq_len, global_batch=8 * nodes),
    )


def test_gpt2_at_8k_tokens_is_refused_naming_its_1024_positions() -> None:
    with pytest.raises(SpecError) as e:
        plan(_spec("gpt2", 8192))
    assert e.value.field == "training.seq_len"
    assert "1024" in str(e.value) and "8192" in str(e.value)
    assert plan(_spec("gpt2", 1024)).recommended.fits


def test_the_default_length_past_the_table_is_warned() -> None:
    spec = _spec("gpt2", 1024).model_copy(update={"training": TrainingSpec(global_batch=8)})
    said = [w for w in plan(spec).warnings if w.startswith("training.seq_len:")]
    assert len(said) == 1 and "--seq-len 1024" in said[0]


def test_a_rope_scaled_model_past_its_context_is_warned_not_refused() -> None:
    p = plan(_spec("gpt-oss-20b", 1_048_576, nodes=16))
    said = [w for w in p.warnings if w.startswith("training.seq_len:")]
    assert len(said) == 1 and "131072" in said[0] and "yarn" in said[0]
    inside = plan(_spec("gpt-oss-20b", 8192))
    assert not any(w.startswith("training.seq_len:") for w in inside.warnings)


def test_the_cli_refuses_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "gpt2", "--gpu", "h100"]
        + ["--seq-len", "8192"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.seq_len" in lines[0] and "Traceback" not in run.stderr
