"""``--precision fp8`` and ``--grads-bf16`` (issue 12): FP8 linear layers at the GPU's FP8 peak
with attention and the rest in bf16, refused in one line on a GPU without FP8; bf16 gradients
for Megatron layouts. Each is checked where it lands: the time and memory model, the plan's
words, Megatron's arguments and Accelerate's config loader (DeepSpeed's config class reads an fp8
plan's ds_config.json in tests/engine/test_writers_deepspeed.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.plan.catalog import get_gpu
from engine.plan.memory import LayoutDraft, model_states
from engine.plan.perf import _grad_reduce_bytes
from engine.plan.planner import plan
from engine.plan.specs import (
    Framework,
    HardwareSpec,
    LayoutSpec,
    ModelSpec,
    NetworkSpec,
    Optimizer,
    Precision,
    Spec,
    Strategy,
    TrainingSpec,
)
from engine.write import megatron_args, write_bundle
from tests.engine.writers_fixtures import make_plan

ROOT = Path(__file__).resolve().parents[2]

FORCED = LayoutSpec(strategy=Strategy.THREE_D, tp=2, pp=1, dp=4, micro_batch=1)


def _spec(precision: Precision, gpu: str = "h100-sxm", **training: object) -> Spec:
    return Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu=gpu, gpus_per_node=8, nodes=1),
        network=NetworkSpec(tier="ib-ndr"),  # type: ignore[arg-type]
        training=TrainingSpec(
            seq_len=8192,
            global_batch=64,
            precision=precision,
            **training,  # type: ignore[arg-type]
        ),
        layout=FORCED,
    )


def test_fp8_runs_the_linear_layers_at_the_fp8_peak_and_keeps_their_inputs_in_fp8() -> None:
    bf16 = plan(_spec(Precision.BF16)).recommended
    fp8 = plan(_spec(Precision.FP8)).recommended
    assert fp8.precision == Precision.FP8
    # H100: 1979 vs 989 TFLOP/s dense for the GEMMs, attention unchanged: clearly faster, but
    # nowhere near twice (attention, element-wise work and communication stay where they were).
    assert 0.55 * bf16.step_time_s < fp8.step_time_s < 0.85 * bf16.step_time_s
    # Transformer Engine saves each linear's input as its FP8 copy: fewer activation bytes.
    assert fp8.memory_per_gpu.activations < bf16.memory_per_gpu.activations
    assert fp8.memory_per_gpu.params == bf16.memory_per_gpu.params


def test_fp8_plan_says_what_runs_in_fp8_and_what_mfu_is_quoted_against() -> None:
    p = plan(_spec(Precision.FP8))
    note = next(n for n in p.recommended.notes if n.startswith("fp8:"))
    assert "1979" in note and "989" in note


def test_fp8_on_a_gpu_without_fp8_is_one_line_naming_the_field() -> None:
    with pytest.raises(SpecError) as e:
        plan(_spec(Precision.FP8, gpu="a100-80gb"))
    assert e.value.field == "training.precision"
    assert "--precision bf16" in str(e.value)
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "llama-3-8b", "--gpu", "a100-80gb"]
        + ["--gpus-per-node", "8", "--precision", "fp8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "training.precision" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_fp8_megatron_arguments_ask_transformer_engine_for_fp8() -> None:
    p = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        tp=2,
        precision=Precision.FP8,
    )
    lines = megatron_args(p).splitlines()
    for flag in ("--bf16", "--fp8-format hybrid", "--fp8-amax-history-len 1024"):
        assert flag in lines, flag
    assert "--grad-reduce-in-bf16" not in lines


def test_fp8_accelerate_config_loads_with_accelerates_loader(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import ClusterConfig

    p = make_plan(
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.FSDP_FULL,
        framework=Framework.FSDP,
        precision=Precision.FP8,
    )
    write_bundle(p, tmp_path)
    cfg = ClusterConfig.from_yaml_file(str(tmp_path / "accelerate_config.yaml"))
    assert str(cfg.mixed_precision) == "fp8"
    assert cfg.fp8_config == {"backend": "AO"}


def test_the_example_trainer_runs_an_fp8_plan_in_bf16() -> None:
    import torch

    from engine.trainer.train import dtype_of

    assert dtype_of("fp8", torch.device("cuda")) == torch.bfloat16


def test_bf16_grads_halve_megatrons_gradient_memory_and_traffic() -> None:
    kw = dict(
        framework=Framework.MEGATRON,
        strategy=Strategy.THREE_D,
        zero_stage=1,
        precision=Precision.BF16,
        optimizer=Optimizer.ADAMW,
    )
    fp32 = model_states(1e9, 8, **kw)  # type: ignore[arg-type]
    bf16 = model_states(1e9, 8, grads_bf16=True, **kw)  # type: ignore[arg-type]
    assert fp32.grads == 4e9 and bf16.grads == 2e9
    assert bf16.params == fp32.params and bf16.optimizer == fp32.optimizer
    on = plan(_spec(Precision.BF16, grads_bf16=True)).recommended
    off = plan(_spec(Precision.BF16)).recommended
    assert on.memory_per_gpu.grads == pytest.approx(off.memory_per_gpu.grads / 2)
    # The data-parallel reduction moves half the bytes (fp32 main grads: 4 a parameter).
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, precision=Precision.BF16)
    assert _grad_reduce_bytes(d) == 4
    assert _grad_reduce_bytes(replace(d, grads_bf16=True)) == 2


def test_bf16_grads_reach_megatrons_arguments() -> None:
    p = make_plan(
        model=ModelSpec(preset="llama-3-8b"),
        gpu="h100-sxm",
        gpus_per_node=8,
        strategy=Strategy.THREE_D,
        tp=2,
        precision=Precision.BF16,
        training={"grads_bf16": True},
    )
    assert "--grad-reduce-in-bf16" in megatron_args(p).splitlines()


def test_fp8_catalog_peaks_are_the_datasheets() -> None:
    # Dense FP8 tensor-core peaks, TFLOP/s: H100 SXM 1979, B200 4500, MI300X 2614.9.
    assert get_gpu("h100-sxm").fp8_peak_tflops() == 1979
    assert get_gpu("b200").fp8_peak_tflops() == 4500
    assert get_gpu("a100-80gb").fp8_peak_tflops() == 0


def test_bf16_grads_on_a_layout_that_cannot_keep_them_is_said() -> None:
    # Llama 3.2 1B on 8 A100s plans DDP: --grads-bf16 has nothing to act on.
    spec = _spec(Precision.BF16, gpu="a100-80gb", grads_bf16=True).model_copy(
        update={"layout": LayoutSpec(), "model": ModelSpec(preset="llama-3.2-1b")}
    )
    p = plan(spec)
    assert p.recommended.framework != Framework.MEGATRON
    assert any(w.startswith("training.grads_bf16:") for w in p.warnings)
    assert not any(
        w.startswith("training.grads_bf16:")
        for w in plan(_spec(Precision.BF16, grads_bf16=True)).warnings
    )


@pytest.mark.parametrize(
    ("framework", "how"),
    [
        (Framework.MEGATRON, "--fp8-format hybrid"),
        (Framework.FSDP, "torchao's float8"),
        (Framework.DEEPSPEED, "must be Transformer Engine modules"),
        (Framework.DDP, "convert your model's linears"),
    ],
)
def test_the_fp8_note_says_how_the_run_gets_its_fp8_linears(framework: Framework, how: str) -> None:
    # The estimate assumes FP8 linears; only Megatron's and Accelerate's configs ask for them,
    # DeepSpeed and DDP need the model code to, and the example trainer runs bf16.
    spec = _spec(Precision.FP8).model_copy(update={"layout": LayoutSpec(framework=framework)})
    notes = [n for n in plan(spec).recommended.notes if n.startswith("fp8:")]
    assert len(notes) == 1 and how in notes[0] and "example trainer" in notes[0]
