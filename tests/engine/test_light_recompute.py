"""Light recompute (``recompute = "light"``, Megatron-Core's ``--recompute-modules layernorm
moe_act mla_up_proj``): the norms, the experts' activation and MLA's up-projections run again
in backward, the matrix products' outputs are kept. DeepSeek-V3 trained its published layout
(PP16 x EP64 with ZeRO-1, no TP, on 2048 H800s; technical report §3.2) with exactly this
recompute (§3.2.3); without it the layout does not fit an 80 GB GPU."""

from __future__ import annotations

import pytest

from cli import main
from engine.errors import SpecError
from engine.plan import perf
from engine.plan.memory import LayoutDraft, layer_activation_bytes
from engine.plan.models import resolve_model
from engine.plan.names import Framework, MoeDispatcher, NetworkTier, Precision, Recompute, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware


def _deepseek_v3_as_trained(recompute: Recompute | None) -> Spec:
    return Spec(
        model=ModelSpec(preset="deepseek-v3"),
        hardware=HardwareSpec(gpu="h800", gpus_per_node=8, nodes=256),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(
            seq_len=4096,
            global_batch=15360,
            precision=Precision.FP8,
            moe_dispatcher=MoeDispatcher.DEEPEP,
        ),
        layout=LayoutSpec(
            strategy=Strategy.THREE_D,
            framework=Framework.MEGATRON,
            tp=1,
            pp=16,
            ep=64,
            dp=128,
            zero_stage=1,
            micro_batch=1,
            recompute=recompute,
        ),
    )


def test_deepseek_v3_fits_its_published_layout_only_with_its_light_recompute() -> None:
    refused = plan(_deepseek_v3_as_trained(Recompute.NONE))
    step = next(s for s in refused.path if s.question == "Does the forced layout fit?")
    assert step.answer == "no" and "try --recompute light" in step.reason
    none = refused.recommended
    light = plan(_deepseek_v3_as_trained(Recompute.LIGHT)).recommended
    assert not none.fits and light.fits
    # The per-head queries, keys and values are the bulk of what it drops.
    # (Both keep the routed copies' expert inputs: a third of what light recompute holds.)
    assert light.memory_per_gpu.activations < 0.65 * none.memory_per_gpu.activations
    # Redoing norms, activations and the up-projections costs a few per cent, not a forward.
    assert none.step_time_s < light.step_time_s < 1.05 * none.step_time_s


def test_the_planner_finds_it_when_nothing_lighter_fits() -> None:
    # At the memory DeepSeek trained in (no headroom kept: the run fit there, 4 % to spare);
    # with the default dropless-MoE headroom only the MLP recompute leaves 8 % free.
    spec = _deepseek_v3_as_trained(None)
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"headroom": 0})})
    chosen = plan(spec).recommended
    assert chosen.fits and chosen.recompute == Recompute.LIGHT
    assert plan(_deepseek_v3_as_trained(None)).recommended.recompute == Recompute.MLP
    args = megatron_args(plan(spec)).splitlines()
    assert "--recompute-granularity selective" in args
    assert "--recompute-modules layernorm moe_act mla_up_proj" in args


def test_what_each_model_drops() -> None:
    mixtral = resolve_model(ModelSpec(preset="mixtral-8x7b"))
    kept, light, mlp = (
        layer_activation_bytes(mixtral, 4096, 1, t=2, sp=True, flash=True, recompute=r)
        for r in (Recompute.NONE, Recompute.LIGHT, Recompute.MLP)
    )
    # bf16: the pre-MLP norm's output (2 sbh; the attention's norm is fused into the QKV
    # linear) and the routed experts' activation output (2 sbf k) go; the gate/up output the
    # activation is rebuilt from stays.
    sbh = 4096 * 4096
    f, k = 14336 / 4096, 2
    assert kept - light == pytest.approx(sbh / 2 * (2 + 2 * f * k))
    assert mlp < light < kept
    # FP8 linears keep their own FP8 casts of those inputs: MLA's heads go, the rest stays.
    dsv3 = resolve_model(ModelSpec(preset="deepseek-v3"))
    fp8 = {
        r: layer_activation_bytes(dsv3, 4096, 1, flash=True, fp8_linears=True, recompute=r)
        for r in (Recompute.NONE, Recompute.LIGHT)
    }
    heads = 2 * 128 * (192 + 192 + 128) / 7168  # Q, K, V of 128 heads, 16-bit
    assert fp8[Recompute.NONE] - fp8[Recompute.LIGHT] == pytest.approx(4096 * 7168 * heads)


def test_light_costs_the_work_it_redoes() -> None:
    dims = resolve_model(ModelSpec(preset="deepseek-v3"))
    hw = h100_hardware(32)
    lay = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=16, dp=16, ep=8)
    light = LayoutDraft(
        Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=16, dp=16, ep=8, recompute=Recompute.LIGHT
    )
    f = perf.terms(dims, light, hw, 4096).forward
    assert perf.terms(dims, lay, hw, 4096).forward.light == 0.0
    assert 0 < f.light < 0.2 * f.gemm
    base = perf.flops_per_token(dims, 4096, Recompute.NONE)
    up = 61 * (512 * 128 * (128 + 128) + 1536 * 128 * 192)
    assert perf.flops_per_token(dims, 4096, Recompute.LIGHT) == pytest.approx(base + 2 * up)


def test_only_megatron_and_only_moe_or_mla_models_have_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = _deepseek_v3_as_trained(Recompute.LIGHT).model_copy(
        update={"layout": LayoutSpec(strategy=Strategy.ZERO1, recompute=Recompute.LIGHT)}
    )
    with pytest.raises(SpecError) as e:
        plan(spec)
    assert e.value.field == "training.recompute" and "megatron" in str(e.value)
    # Unforced, the search offers it to Megatron layouts only (Mixtral 8x7B on 32 H100s:
    # Megatron-FSDP with it, DeepSpeed ZeRO-1 needing MLP-only recompute beside it).
    moe = Spec(
        model=ModelSpec(preset="mixtral-8x7b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=1024),
    )
    p = plan(moe)
    every = [p.recommended, *p.alternatives]
    light = [lay for lay in every if lay.recompute == Recompute.LIGHT]
    assert light and all(lay.framework == Framework.MEGATRON for lay in light)
    assert any(
        lay.framework != Framework.MEGATRON and lay.recompute != Recompute.NONE for lay in every
    )
    # A dense model's norms are fused into its linears: light would free nothing.
    args = ["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpus-per-node", "8"]
    code = main([*args, "--recompute", "light", "--global-batch", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "training.recompute" in err[0] and "neither" in err[0]
    assert plan(moe.model_copy(update={"model": ModelSpec(preset="llama-3-8b")})).recommended
    dense = plan(moe.model_copy(update={"model": ModelSpec(preset="llama-3-70b")}))
    assert all(lay.recompute != Recompute.LIGHT for lay in [dense.recommended, *dense.alternatives])
    code = main([*args, "--strategy", "fsdp-full", "--recompute", "light", "--global-batch", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "training.recompute" in err[0]
