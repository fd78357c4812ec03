"""Megatron's memory savers a published run states (planner issue #39): Adam's moments in bf16
(the precision-aware optimizer) and fine-grained activation offloading, each counted as
Megatron-Core runs it, written as its flags, and said where the plan cannot use it. The GB200
Qwen3-235B layout the Megatron Core MoE report ran (arXiv:2603.07685 Table 11; its reproduction
command offloads ``expert_fc1 moe_act``) was judged not to fit without them."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.plan.memory import (
    LayoutDraft,
    estimate_memory,
    offloaded_layers,
    offloaded_values,
)
from engine.plan.models import resolve_model
from engine.plan.names import (
    Framework,
    NetworkTier,
    OffloadModule,
    Optimizer,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write import megatron_args

DATA = Path(__file__).resolve().parents[1] / "data"
REPO = Path(__file__).resolve().parents[2]
MOE_MODULES = [OffloadModule.EXPERT_FC1, OffloadModule.MOE_ACT]


def _qwen3_gb200(**training: object) -> Spec:
    """Table 20's GB200 MXFP8 Qwen3-235B run: TP1 PP4 EP64 on 256 GPUs, MBS 3, GBS 3072,
    light recompute (``--recompute-modules moe_act layernorm``), forced balanced routing."""
    return Spec(
        model=ModelSpec(preset="qwen3-235b-a22b"),
        hardware=HardwareSpec(gpu="gb200", gpus_per_node=4, nodes=64),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(
            seq_len=4096,
            global_batch=3072,
            micro_batch=3,
            precision=Precision.FP8,
            recompute=Recompute.LIGHT,
            moe_imbalance=1.0,
            **training,
        ),
        layout=LayoutSpec(tp=1, pp=4, ep=64, virtual_stages=2),
    )


def test_each_module_offloads_its_input_by_hand() -> None:
    """Qwen3-235B (h 4096, 64 query heads and 4 KV heads of 128, experts of 1536, top-8) in
    bf16 bytes per ``sbh``: the norms' inputs 2 each, the QKV input 2, Q/K/V 2·2 + 2·0.125 +
    2·0.125 = 4.5, the output projection's input 2·2 = 4, the 8 routed copies 8·(2 + 8/h),
    the experts' fused gate-up outputs 4·(1536/4096)·8 = 12; FP8 halves the linears' inputs."""
    dims = resolve_model(ModelSpec(preset="qwen3-235b-a22b"))
    every = tuple(OffloadModule)
    rep, split = offloaded_values(dims, every, 1, Recompute.NONE, fp8=False)
    assert rep == 2 + 2 + 2
    assert split == pytest.approx(4.5 + 4 + 8 * (2 + 8 / 4096) + 12)
    rep8, split8 = offloaded_values(dims, every, 1, Recompute.NONE, fp8=True)
    assert rep8 == 2 + 2 + 1
    assert split8 == pytest.approx(4.5 + 2 + 8 * (1 + 8 / 4096) + 12)
    # Expert-parallel folding: experts whole (expert TP 1) under TP 2 keep each rank's
    # sequence-parallel share of the copies, so the split value doubles before the split by t.
    _, folded = offloaded_values(dims, (OffloadModule.EXPERT_FC1,), 2, Recompute.NONE, fp8=True)
    assert folded == pytest.approx(2 * 8 * (1 + 8 / 4096))
    # Full recompute keeps only each layer's input: nothing of the modules is left to move.
    assert offloaded_values(dims, every, 1, Recompute.FULL, fp8=False) == (0.0, 0.0)
    # A dense model has no experts to offload.
    llama = resolve_model(ModelSpec(preset="llama-3-8b"))
    assert offloaded_values(llama, tuple(MOE_MODULES), 1, Recompute.NONE, fp8=False) == (0, 0)


def test_the_gpu_keeps_one_layer_a_chunk_in_flight_and_the_reload() -> None:
    """§4.1.5 of the report: the last layer of each (micro-batch, model chunk) is not offloaded,
    and the layer-staggered reload keeps one more."""
    assert offloaded_layers(1.0, 24, 1) == 22
    assert offloaded_layers(4.0, 24, 4) == 4 * 24 - 4 * 4 - 1
    assert offloaded_layers(1.0, 1, 1) == 0.0


def test_the_published_gb200_layout_fits_only_with_its_offloading() -> None:
    """Without the offloading the run's own layout needs more than the GPU (182 GiB of 165.6
    the planner said); with it, it fits, and what left the GPU is in pinned host memory."""
    refused = plan(_qwen3_gb200())
    without = refused.recommended
    with_off = plan(_qwen3_gb200(offload_modules=MOE_MODULES)).recommended
    assert not without.fits
    # The misfit says which saver makes it fit, and no more of them than it takes.
    said = [w for w in refused.warnings if w.startswith("the forced layout does not fit")]
    assert len(said) == 1 and "with --offload-modules expert_fc1 moe_act it would need" in said[0]
    assert "--moments-bf16" not in said[0] and "--offload-optimizer-states" not in said[0]
    assert with_off.fits
    m0, m1 = without.memory_per_gpu, with_off.memory_per_gpu
    moved = m0.activations - m1.activations
    assert moved > 30 * 1024**3
    # The GPU keeps one layer per chunk and micro-batch in flight plus the reload, so less
    # leaves than is offloaded in all: host holds more than the GPU shed, never less.
    assert m1.host_activations >= moved
    assert m1.cpu_bytes >= m1.host_activations
    assert m0.host_activations == 0
    # Offloading costs time only where the host link cannot keep up with the compute.
    assert with_off.step_time_s >= without.step_time_s * 0.999


def test_offloading_waits_on_a_slow_host_link() -> None:
    """The same bytes over PCIe Gen5 (an H100's host link, 64 GB/s one way) take about 3.5x
    the GB200's NVLink-C2C share (225 GB/s a GPU): the step waits on the copies."""
    from engine.plan.perf import offload_exposed

    fast = SimpleNamespace(pcie_bytes_per_s=225e9)
    slow = SimpleNamespace(pcie_bytes_per_s=64e9)
    moved = 10e9  # bytes one micro-batch offloads on a stage
    forward, backward = 0.1, 0.2
    assert offload_exposed(fast, moved, forward, backward) == 0.0  # type: ignore[arg-type]
    waits = offload_exposed(slow, moved, forward, backward)  # type: ignore[arg-type]
    per_way = moved / (64e9 * 0.7)
    assert waits == pytest.approx((per_way - forward) + (per_way - backward))


def test_bf16_moments_save_a_third_of_the_optimizer_budget() -> None:
    """§4.1.6: bf16 moments cut AdamW's 12 bytes a parameter (fp32 master and moments) to 8,
    "roughly 10-12 GB savings from the 32.1 GB budget in Table 3" (DeepSeek-V3, PP4 x VPP4 x
    EP64 on 256 GPUs): a third of it, 10.7 GB."""
    fig = json.loads((DATA / "moe_memory_published.json").read_text())["figures"][0]
    published = fig["measured_gb"]["main_weights_and_optimizer"]
    d = LayoutDraft(
        Strategy.THREE_D,
        Framework.MEGATRON,
        pp=4,
        dp=64,
        ep=64,
        zero_stage=1,
        micro_batch=1,
        grad_accum=16,
        pp_schedule=PPSchedule.INTERLEAVED,
        virtual_stages=4,
        imbalance=1.0,
        precision=Precision.BF16,
    )
    dims = resolve_model(ModelSpec(preset="deepseek-v3"))
    fp32 = estimate_memory(dims, d, seq_len=4096, optimizer=Optimizer.ADAMW)
    bf16 = estimate_memory(
        dims, replace(d, moments_bf16=True), seq_len=4096, optimizer=Optimizer.ADAMW
    )
    assert bf16.optimizer == pytest.approx(fp32.optimizer * 8 / 12, rel=1e-6)
    assert 10 <= published / 3 <= 12  # GB, as the report says
    assert abs(fp32.optimizer / (published * 1e9) - 1) <= 0.15
    # Only Megatron's distributed optimizer keeps them: not without it, not under DeepSpeed.
    for other in (replace(d, zero_stage=0), replace(d, framework=Framework.DEEPSPEED)):
        a = estimate_memory(dims, other, seq_len=4096, optimizer=Optimizer.ADAMW)
        b = estimate_memory(
            dims, replace(other, moments_bf16=True), seq_len=4096, optimizer=Optimizer.ADAMW
        )
        assert a.optimizer == b.optimizer


def test_the_flags_are_written_and_a_saver_that_cannot_apply_is_said() -> None:
    spec = _qwen3_gb200(offload_modules=MOE_MODULES, moments_bf16=True)
    p = plan(spec)
    args = megatron_args(p)
    assert "--fine-grained-activation-offloading" in args
    assert "--offload-modules expert_fc1 moe_act" in args
    assert "--exp-avg-dtype bf16" in args and "--use-precision-aware-optimizer" in args
    assert any(n.startswith("activations offloaded") for n in p.recommended.notes)
    assert not any(w.startswith("training.offload_modules") for w in p.warnings)
    # Under full recompute nothing is left to offload: no flags, and the plan says so.
    full = spec.model_copy(
        update={"training": spec.training.model_copy(update={"recompute": Recompute.FULL})}
    )
    pf = plan(full)
    assert "--offload-modules" not in megatron_args(pf)
    assert any(w.startswith("training.offload_modules") for w in pf.warnings)
    # A DeepSpeed plan keeps fp32 moments and offloads nothing; both are said.
    small = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        training=TrainingSpec(
            seq_len=4096, global_batch=64, moments_bf16=True, offload_modules=MOE_MODULES
        ),
        layout=LayoutSpec(framework=Framework.DEEPSPEED),
    )
    warned = plan(small).warnings
    assert any(w.startswith("training.moments_bf16") for w in warned)
    assert any(w.startswith("training.offload_modules") for w in warned)


def test_the_cli_takes_the_savers_and_refuses_an_unknown_module() -> None:
    base = [
        sys.executable,
        "-m",
        "cli",
        "plan",
        "--model",
        "qwen3-235b-a22b",
        "--gpu",
        "gb200",
        "--gpus-per-node",
        "4",
        "--nodes",
        "64",
        "--json",
    ]
    ok = subprocess.run(
        [*base, "--moments-bf16", "--offload-modules", "expert_fc1,moe_act", "moe_act"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    training = json.loads(ok.stdout)["spec"]["training"]
    assert training["offload_modules"] == ["expert_fc1", "moe_act"]
    assert training["moments_bf16"] is True
    bad = subprocess.run(
        [*base, "--offload-modules", "experts"], capture_output=True, text=True, cwd=REPO
    )
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.offload_modules" in lines[0], bad.stderr
    assert "Traceback" not in bad.stderr


def test_optimizer_states_leave_the_gpu_between_steps() -> None:
    """§4.1.6: offloading DeepSeek-V3's optimizer states on GB200 "saves 15-20 GB of GPU
    memory ... with only 0.1-0.2 seconds per iteration overhead". The report's run (TP1 PP4
    EP64, MXFP8, bf16 moments, MLP recompute; its VPP4 split the planner cannot write) states ``--offload-optimizer-states``: the
    GPU holds the states only for the step, when the activations are gone, and the host holds
    them between steps; two copies over NVLink-C2C a step."""

    def run(offload: bool) -> Spec:
        return Spec(
            model=ModelSpec(preset="deepseek-v3"),
            hardware=HardwareSpec(gpu="gb200", gpus_per_node=4, nodes=64),
            network=NetworkSpec(tier=NetworkTier.IB_NDR),
            training=TrainingSpec(
                seq_len=4096,
                global_batch=8192,
                micro_batch=1,
                precision=Precision.FP8,
                recompute=Recompute.MLP,
                moe_imbalance=1.0,
                moments_bf16=True,
                offload_optimizer_states=offload,
            ),
            layout=LayoutSpec(tp=1, pp=4, ep=64),
        )

    kept, off = plan(run(False)), plan(run(True))
    a, b = kept.recommended, off.recommended
    saved = a.memory_per_gpu.total - b.memory_per_gpu.total
    assert saved == min(a.memory_per_gpu.optimizer, a.memory_per_gpu.activations)
    assert 15e9 <= saved <= 20e9
    assert b.memory_per_gpu.cpu_bytes == b.memory_per_gpu.optimizer
    # The checkpoint still holds the states (they are saved from the host).
    assert off.resilience.ckpt_bytes_per_gpu == kept.resilience.ckpt_bytes_per_gpu
    waits = b.step_time_s - a.step_time_s
    assert 0.1 <= waits <= 0.3
    assert "--offload-optimizer-states" in megatron_args(off)
    assert "--offload-optimizer-states" not in megatron_args(kept)
    assert any(n.startswith("optimizer states offloaded") for n in b.notes)
