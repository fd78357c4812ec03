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
from engine.plan import frameworks, perf
from engine.plan.catalog import get_gpu
from engine.plan.context import hardware
from engine.plan.memory import LayoutDraft, model_states
from engine.plan.models import resolve_model
from engine.plan.names import Fp8Recipe, Framework, Optimizer, Precision, Strategy
from engine.plan.perf import grad_reduce_bytes
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
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
    _refused_in_one_line("training.precision", "--gpu", "a100-80gb", "--precision", "fp8")


def _refused_in_one_line(field: str, *args: str) -> None:
    """``dtrain-tui plan`` of Llama 3 8B on 8 GPUs with ``args`` exits 2 with one line naming
    ``field``."""
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "llama-3-8b", "--gpus-per-node", "8"]
        + list(args),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and field in proc.stderr
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
    assert grad_reduce_bytes(d) == 4
    assert grad_reduce_bytes(replace(d, grads_bf16=True)) == 2


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


# --- --fp8-recipe ------------------------------------------------------------------------------


def _recipe_spec(recipe: Fp8Recipe | None, gpu: str = "b200") -> Spec:
    return _spec(Precision.FP8, gpu=gpu, fp8_recipe=recipe)


def test_block_scaled_fp8_runs_its_linear_gemms_slower_than_per_tensor() -> None:
    # The linear GEMMs lose BLOCK_SCALED_FP8_RATE of the FP8 peak under MX or 128-blocks; per-
    # tensor recipes (delayed, tensorwise) run at the peak; attention and the rest are bf16
    # under every recipe, so the step is slower by less than the GEMMs are.
    gpu = get_gpu("b200")
    tensorwise = hardware(_recipe_spec(Fp8Recipe.TENSORWISE), gpu, Precision.FP8)
    mx = hardware(_recipe_spec(Fp8Recipe.MXFP8), gpu, Precision.FP8)
    assert tensorwise.linear_peak_flops == pytest.approx(gpu.fp8_tflops * 1e12)
    assert hardware(_recipe_spec(None), gpu, Precision.FP8) == tensorwise
    assert mx.linear_peak_flops == pytest.approx(tensorwise.linear_peak_flops * 0.92)
    assert mx.peak_flops == tensorwise.peak_flops  # MFU's denominator, bf16
    steps = {r: plan(_recipe_spec(r)).recommended.step_time_s for r in Fp8Recipe}
    assert steps[Fp8Recipe.DELAYED] == steps[Fp8Recipe.TENSORWISE]
    assert steps[Fp8Recipe.MXFP8] == steps[Fp8Recipe.BLOCKWISE]
    assert 1.0 < steps[Fp8Recipe.MXFP8] / steps[Fp8Recipe.TENSORWISE] < 1 / 0.92
    bf16 = plan(_spec(Precision.BF16, gpu="b200")).recommended.step_time_s
    assert steps[Fp8Recipe.MXFP8] < bf16


def test_the_block_scaled_rate_reproduces_torchaos_b200_pair() -> None:
    # TorchAO's B200 benchmark (tests/data/published_runs.json, scope "ratio"): mxfp8_cublas at
    # 9969 tokens/s against float8 tensorwise's 10417 on the same FSDP2 layout. The planner
    # times the pair 4.5 % apart, as measured (within half a percent).
    import benchmarks.estimate_accuracy as harness

    rows = {r.id: r for r in harness.load_rows() if r.id.startswith("torchtitan_torchao_b200")}
    assert len(rows) == 3 and all(r.spec is None for r in rows.values())  # not scored
    times = {}
    for name in ("float8_tensorwise", "mxfp8"):
        raw = {**rows[f"torchtitan_torchao_b200_llama3_8b_{name}"].raw, "scope": "end_to_end"}
        spec, why = harness.build_spec(raw)
        assert spec is not None, why
        times[name] = plan(spec).recommended.step_time_s
    measured = 10417.0 / 9969.0
    assert times["mxfp8"] / times["float8_tensorwise"] == pytest.approx(measured, abs=0.005)


def test_a_recipe_without_fp8_or_mxfp8_without_mx_tensor_cores_is_one_line() -> None:
    with pytest.raises(SpecError) as e:
        plan(_spec(Precision.BF16, gpu="b200", fp8_recipe=Fp8Recipe.MXFP8))
    assert e.value.field == "training.fp8_recipe" and "--precision fp8" in str(e.value)
    with pytest.raises(SpecError) as e:
        plan(_recipe_spec(Fp8Recipe.MXFP8, gpu="h100-sxm"))
    assert e.value.field == "training.fp8_recipe" and "blockwise" in str(e.value)
    assert "b200" in str(e.value)
    assert plan(_recipe_spec(Fp8Recipe.BLOCKWISE, gpu="h100-sxm")).recommended
    _refused_in_one_line(
        "training.fp8_recipe", "--gpu", "h100-sxm", "--precision", "fp8", "--fp8-recipe", "mxfp8"
    )


@pytest.mark.parametrize(
    ("recipe", "flags"),
    [
        (None, ["--fp8-format hybrid", "--fp8-amax-history-len 1024"]),
        (Fp8Recipe.TENSORWISE, ["--fp8-format hybrid", "--fp8-recipe tensorwise"]),
        (Fp8Recipe.MXFP8, ["--fp8-format e4m3", "--fp8-recipe mxfp8"]),
        (Fp8Recipe.BLOCKWISE, ["--fp8-format e4m3", "--fp8-recipe blockwise"]),
    ],
)
def test_the_fp8_recipe_reaches_megatrons_arguments_and_the_note(
    recipe: Fp8Recipe | None, flags: list[str]
) -> None:
    p = plan(_recipe_spec(recipe))
    lines = megatron_args(p).splitlines()
    for flag in flags:
        assert flag in lines, (flag, lines)
    assert sum(1 for x in lines if x.startswith("--fp8-format")) == 1
    note = next(n for n in p.recommended.notes if n.startswith("fp8"))
    assert " ".join(flags) in note
    assert ("92% of the FP8 peak" in note) == bool(recipe and recipe.block_scaled)


def test_a_block_scaled_fsdp_plan_says_accelerates_float8_is_per_tensor() -> None:
    spec = _recipe_spec(Fp8Recipe.MXFP8).model_copy(
        update={"layout": LayoutSpec(strategy=Strategy.FSDP_FULL, framework=Framework.FSDP)}
    )
    note = next(n for n in plan(spec).recommended.notes if n.startswith("fp8"))
    assert "per tensor: for mxfp8 convert them yourself" in note
    tensorwise = _recipe_spec(Fp8Recipe.TENSORWISE).model_copy(update={"layout": spec.layout})
    assert "convert them yourself" not in next(
        n for n in plan(tensorwise).recommended.notes if n.startswith("fp8")
    )


def _cast_share(model: ModelSpec, monkeypatch: pytest.MonkeyPatch, **layout: int) -> float:
    """Share of a layer's FP8 linear time that is casting into FP8 (an H100, 4096 tokens a
    sequence)."""
    dims = resolve_model(model)
    gpu = get_gpu("h100-sxm")
    hw = hardware(_spec(Precision.FP8), gpu, Precision.FP8)
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, **layout)  # type: ignore[arg-type]
    with_casts = perf.terms(dims, d, hw, 4096).forward.gemm
    monkeypatch.setattr(perf, "FP8_CAST_BYTES", 0.0)
    without = perf.terms(dims, d, hw, 4096).forward.gemm
    monkeypatch.undo()
    return with_casts / without - 1


def test_casting_into_fp8_weighs_on_thin_gemms(monkeypatch: pytest.MonkeyPatch) -> None:
    # An FP8 linear reads its 16-bit input and writes two FP8 copies of it (and the same of its
    # output's gradient): bytes that grow with k + n where the FLOPs grow with k·n. A wide
    # dense layer hardly notices (405B at TP 8: about 5 %); a layer of fine-grained experts
    # (Qwen3-30B-A3B's, 768 wide) spends a quarter more.
    # (Micro-batch 8 for the experts, so that their GEMMs outlast launching them.)
    wide = _cast_share(ModelSpec(preset="llama-3.1-405b"), monkeypatch, tp=8, dp=1, micro_batch=1)
    thin = _cast_share(ModelSpec(preset="qwen3-30b-a3b"), monkeypatch, dp=8, ep=8, micro_batch=8)
    assert 0 < wide < 0.08
    assert thin > 0.2
    assert thin > 4 * wide
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    bf16 = hardware(_spec(Precision.BF16), get_gpu("h100-sxm"), Precision.BF16)
    assert not frameworks.fp8_linears(bf16)
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=2, dp=4, micro_batch=1)
    base = perf.terms(dims, d, bf16, 4096).forward.gemm
    monkeypatch.setattr(perf, "FP8_CAST_BYTES", 0.0)
    assert perf.terms(dims, d, bf16, 4096).forward.gemm == base  # bf16 casts nothing
