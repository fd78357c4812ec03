"""DeepSeek-V3-class models (DeepSeek-V3, Kimi K2): multi-head latent attention, shared
experts and leading dense layers, read from their config.json, counted exactly (transformers'
own count is checked in test_models), costed for what they are and written for Megatron."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli import main
from engine.errors import SpecError
from engine.plan import perf
from engine.plan.catalog import get_gpu
from engine.plan.context import hardware
from engine.plan.memory import LayoutDraft, layer_activation_bytes, stage_params
from engine.plan.models import architecture_notes, load_hf_config, resolve_model
from engine.plan.names import Framework, NetworkTier, Precision, Strategy
from engine.plan.planner import plan
from engine.plan.result import model_json
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware

CONFIG = Path(__file__).parent / "data" / "hf_configs" / "deepseek-v3.json"


def test_counts_match_the_published_totals() -> None:
    d = load_hf_config(CONFIG)
    # 671B in total, 37B activated per token (DeepSeek-V3 technical report, abstract; the
    # 14B multi-token-prediction module is not part of the model transformers builds).
    assert d.params_total == 671_026_404_352
    assert round(d.params_active / 1e9) == 38 and 37e9 < d.params_active < 38e9
    assert (d.is_mla, d.head_dim, d.value_head_dim, d.shared_experts) == (True, 192, 128, 1)
    assert (d.dense_layers, d.moe_layers, d.dense_ffn, d.ffn) == (3, 58, 18432, 2048)
    kimi = resolve_model(ModelSpec(preset="kimi-k2"))
    # Kimi K2: "1 trillion total parameters, 32 billion activated" (its model card).
    assert round(kimi.params_total / 1e12, 2) == 1.03 and round(kimi.params_active / 1e9) == 33
    assert resolve_model(ModelSpec(preset="deepseek-v3")).params_total == d.params_total


def test_a_config_with_experts_every_other_layer_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = json.loads(CONFIG.read_text())
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "moe_layer_freq": 2}))
    with pytest.raises(SpecError, match="moe_layer_freq") as e:
        load_hf_config(f)
    assert "\n" not in str(e.value) and e.value.field == "model.config_path"
    f.write_text(json.dumps({**cfg, "first_k_dense_replace": 61}))
    with pytest.raises(SpecError, match="first_k_dense_replace"):
        load_hf_config(f)


def test_latent_attention_costs_its_own_projections_and_head_widths() -> None:
    d = load_hf_config(CONFIG)
    mha = d.model_copy(update={"kv_lora_rank": 0, "q_lora_rank": 0, "v_head_dim": 0})
    # Scores at 192 (q.k), context at 128 (p.v): the mean, 160 a head.
    assert perf.attention_dim(d) == 128 * 160
    assert perf.attention_dim(mha) == 128 * 192

    t, tp = 4096.0, 2
    # The latents' down-projections are whole on each TP rank, the rest split.
    flops = perf.projection_flops(d, t, tp)
    expected = (
        2
        * t
        * (
            7168 * (512 + 64)
            + 512 * 128 * (128 + 128) / tp
            + 7168 * 1536
            + 1536 * 128 * 192 / tp
            + 128 * 128 * 7168 / tp
        )
    )
    assert flops == pytest.approx(expected)
    assert flops < perf.projection_flops(mha, t, tp)


def test_the_leading_dense_layers_sit_on_the_first_stage() -> None:
    d = load_hf_config(CONFIG)
    lay = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=16, dp=16, ep=8)
    dense, experts = stage_params(d, lay)
    # A middle stage: 4 MoE layers of 32 local experts; the first stage's 3 dense layers hold
    # none, so a middle stage is the heavier.
    per_expert = 3 * 7168 * 2048
    assert experts == pytest.approx(4 * 32 * per_expert)
    hw = hardware(
        Spec(
            model=ModelSpec(preset="deepseek-v3"),
            hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=32),
            network=NetworkSpec(tier=NetworkTier.IB_NDR),
        ),
        get_gpu("h100-sxm"),
        Precision.BF16,
    )
    mb = perf.micro_batch_time(d, lay, hw, 4096)
    as_moe = perf.micro_batch_time(d.model_copy(update={"dense_layers": 0}), lay, hw, 4096)
    # The first stage's dense layers need no all-to-all: its traffic is lighter, and the
    # heaviest stage is now a stage of MoE layers.
    assert mb.comm == pytest.approx(as_moe.comm)
    assert mb.compute <= as_moe.compute * 1.05


def test_shared_experts_add_dense_work_but_no_all_to_all() -> None:
    d = load_hf_config(CONFIG)
    hw = h100_hardware(32)
    lay = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=16, dp=16, ep=8)
    alone = d.model_copy(update={"shared_experts": 0})
    assert perf.terms(d, lay, hw, 4096).forward.mlp > perf.terms(alone, lay, hw, 4096).forward.mlp
    assert perf.terms(d, lay, hw, 4096).cp_ep == perf.terms(alone, lay, hw, 4096).cp_ep
    # The shared expert's intermediates are saved like a ninth routed expert's.
    kept = layer_activation_bytes(d, 4096, 1)
    assert kept > layer_activation_bytes(alone, 4096, 1)


def test_the_plan_names_the_architecture_and_megatron_gets_it() -> None:
    spec = Spec(
        model=ModelSpec(preset="deepseek-v3"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=32),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=1024),
    )
    p = plan(spec)
    assert p.recommended.fits
    notes = architecture_notes(p.model)
    assert notes == [
        "latent attention (kv 512, q 1536)",
        "1 shared expert",
        "first 3 layers dense",
        "experts from 4 of 8 groups a token",
        "1 multi-token prediction module (Megatron)",
    ]
    args = megatron_args(p).splitlines()
    for flag in (
        "--multi-latent-attention",
        "--q-lora-rank 1536",
        "--kv-lora-rank 512",
        "--qk-head-dim 128",
        "--qk-pos-emb-head-dim 64",
        "--v-head-dim 128",
        "--moe-shared-expert-intermediate-size 2048",
        "--moe-layer-freq [0]*3+[1]*58",
        "--moe-ffn-hidden-size 2048",
        "--ffn-hidden-size 18432",
        "--normalization RMSNorm",
        "--position-embedding-type rope",
    ):
        assert flag in args, flag
    assert not any(a.startswith("--kv-channels") for a in args)


def test_model_inspect_names_the_architecture(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "inspect", "deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "architecture notes  latent attention (kv 512, q 1536), 1 shared expert" in out
    assert main(["model", "inspect", "llama-3-8b"]) == 0
    assert "architecture notes" not in capsys.readouterr().out


def test_plan_json_carries_the_architecture_only_where_the_model_has_it() -> None:
    ds = model_json(resolve_model(ModelSpec(preset="deepseek-v3")))
    assert (ds["kv_lora_rank"], ds["shared_experts"], ds["dense_layers"]) == (512, 1, 3)
    gemma = model_json(resolve_model(ModelSpec(preset="gemma2-9b")))
    assert (gemma["sliding_window"], gemma["window_pattern"]) == (4096, "[1,0]*21")
    plain = model_json(resolve_model(ModelSpec(preset="llama-3-8b")))
    assert not {"kv_lora_rank", "shared_experts", "sliding_window"} & plain.keys()
