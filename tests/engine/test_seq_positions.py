"""The sequence length against the model's positions: a learned position table (GPT-2's 1024)
cannot be read past its end by the model's own code, so a longer ``training.seq_len`` is warned
in one line naming the limit (a script that builds the model from its dimensions, as the example
trainer does, sizes its table to the sequence and still runs); a model whose config scales its
rotary positions (YaRN, Llama 3's) is warned past its stated context."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_gpt2_at_8k_tokens_is_warned_naming_its_1024_positions() -> None:
    said = [w for w in plan(_spec("gpt2", 8192)).warnings if w.startswith("training.seq_len:")]
    assert len(said) == 1 and "1024" in said[0] and "8192" in said[0]
    inside = plan(_spec("gpt2", 1024))
    assert inside.recommended.fits
    assert not any(w.startswith("training.seq_len:") for w in inside.warnings)


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


def test_the_cli_warns_in_one_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "gpt2", "--gpu", "h100"]
        + ["--seq-len", "8192"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    said = [line for line in run.stdout.splitlines() if "training.seq_len" in line]
    assert len(said) == 1 and "1024 positions" in said[0] and "Traceback" not in run.stderr
