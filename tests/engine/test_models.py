"""Parameter counts are exact: against the models' published counts and against the models' own
definitions in transformers (instantiated on the meta device, so no weights are allocated)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.plan.models import list_presets, load_hf_config, resolve_model
from engine.plan.specs import ModelSpec

CONFIGS = Path(__file__).parent / "data" / "hf_configs"

# Counts as published on the models' Hugging Face pages / papers (sum of parameter numel).
PUBLISHED = {
    "gpt2": 124_439_808,
    "pythia-160m": 162_322_944,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "qwen2-7b": 7_615_616_512,
    "gemma-2b": 2_506_172_416,
    "gemma2-9b": 9_241_705_984,
    "phi3-mini": 3_821_079_552,
    "falcon-7b": 6_921_720_704,
    "llama-3.2-1b": 1_235_814_400,
    # openai/gpt-oss-20b: "21B parameters" (model card); the sum of transformers' GptOss.
    "gpt-oss-20b": 20_914_757_184,
}


def _config_files() -> list[Path]:
    files = sorted(CONFIGS.glob("*.json"))
    assert len(files) >= 10
    return files


@pytest.mark.parametrize("name,count", sorted(PUBLISHED.items()))
def test_published_counts(name: str, count: int) -> None:
    assert load_hf_config(CONFIGS / f"{name}.json").params_total == count


def test_counts_equal_the_models_own_definitions() -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for path in _config_files():
        cfg = json.loads(path.read_text())
        hf_cfg = transformers.AutoConfig.for_model(**cfg)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_cfg)
        real = sum(p.numel() for p in model.parameters())
        assert load_hf_config(path).params_total == real, path.name


def test_moe_active_parameters() -> None:
    d = load_hf_config(CONFIGS / "mixtral-8x7b.json")
    assert d.is_moe and d.num_experts == 8 and d.experts_per_token == 2
    # Active = everything but 6 of the 8 experts' MLPs in each of the 32 layers.
    per_expert = 3 * 4096 * 14336
    assert d.params_active == d.params_total - 32 * 6 * per_expert
    assert d.params_active == 12_879_925_248


def test_every_preset_resolves() -> None:
    for name in list_presets():
        d = resolve_model(ModelSpec(preset=name))
        assert d.params_total >= d.params_active > 0


def test_directory_holding_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((CONFIGS / "gpt2.json").read_text())
    assert resolve_model(ModelSpec(config_path=tmp_path)).params_total == PUBLISHED["gpt2"]


def test_unsupported_model_type_says_what_to_pass(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    with pytest.raises(SpecError) as e:
        load_hf_config(f)
    msg = str(e.value)
    assert "bert" in msg and "--layers" in msg and "model.config_path" in msg


@pytest.mark.parametrize(
    "text,needle",
    [
        ("{bad", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"model_type": "llama"}', "hidden_size"),
    ],
)
def test_malformed_config(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "config.json"
    f.write_text(text)
    with pytest.raises(SpecError, match=needle):
        load_hf_config(f)


def test_dimensions_and_bare_count() -> None:
    d = resolve_model(ModelSpec(layers=4, hidden=256, heads=4, vocab=1024))
    # 4 blocks of (4h² attention + 8h² MLP + 2 norms) + untied embedding and head + final norm.
    h = 256
    assert d.params_total == 4 * (4 * h * h + 8 * h * h + 2 * h) + 2 * 1024 * h + h
    n = resolve_model(ModelSpec(params="7B"))
    assert n.params_total == 7_000_000_000 and n.layers == 32 and n.hidden == 4096
    with pytest.raises(SpecError, match="--heads"):
        resolve_model(ModelSpec(layers=4, hidden=256))


def test_unknown_preset_suggests() -> None:
    with pytest.raises(SpecError, match="llama"):
        resolve_model(ModelSpec(preset="llama-9-1b"))


def test_qwen3_moe_counts_and_presets() -> None:
    """Qwen3-30B-A3B: 30.5B in total, 3.3B active (its model card); every layer sparse, the
    expert FFN is moe_intermediate_size. The total is checked against transformers above."""
    d = load_hf_config(CONFIGS / "qwen3-30b-a3b.json")
    assert d.is_moe and d.num_experts == 128 and d.experts_per_token == 8 and d.ffn == 768
    assert round(d.params_total / 1e9, 1) == 30.5 and round(d.params_active / 1e9, 1) == 3.4
    preset = resolve_model(ModelSpec(preset="qwen3-30b-a3b"))
    assert preset.params_total == d.params_total
    big = resolve_model(ModelSpec(preset="qwen3-235b-a22b"))
    assert round(big.params_total / 1e9) == 235 and round(big.params_active / 1e9) == 22


def test_a_qwen3_moe_with_dense_layers_is_refused_in_one_line(tmp_path: Path) -> None:
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    cfg["mlp_only_layers"] = [0, 1]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    with pytest.raises(SpecError) as e:
        load_hf_config(f)
    assert "mixes dense and MoE layers" in str(e.value) and "\n" not in str(e.value)


def test_gpt_oss_reads_as_transformers_builds_it() -> None:
    d = load_hf_config(CONFIGS / "gpt-oss-20b.json")
    assert (d.arch, d.num_experts, d.experts_per_token, d.head_dim) == ("gpt_oss", 32, 4, 64)
    # A 128-token window on every second layer from the first (its layer_types), as the preset.
    assert (d.sliding_window, d.window_layers, d.window_pattern) == (128, 12, "[1,0]*12")
    big = resolve_model(ModelSpec(preset="gpt-oss-120b"))
    assert big.params_total == 116_829_156_672  # "117B parameters" (model card)
    # Active: the model card's 5.1B leaves the input embedding out; the planner counts it.
    assert round((big.params_active - big.vocab * big.hidden) / 1e9, 2) == 5.13
    assert resolve_model(ModelSpec(preset="gpt-oss-20b")).params_total == d.params_total


def test_rotary_embedding_is_read_as_transformers_states_it(tmp_path: Path) -> None:
    # Where a stored real config states its rotary embedding (and norm epsilon), the preset of
    # that name agrees.
    stated = 0
    for f in _config_files():
        cfg = json.loads(f.read_text())
        if "rope_theta" not in cfg:
            continue
        stated += 1
        real, preset = load_hf_config(f), resolve_model(ModelSpec(preset=f.stem))
        keys = ("rope_theta", "rotary_percent")  # the stored configs keep rope_scaling or not
        if "rms_norm_eps" in cfg:
            keys += ("norm_eps",)
        if "rope_scaling" in cfg:
            keys += ("rope_scaling", "rope_scaling_factor")
        assert {k: getattr(real, k) for k in keys} == {k: getattr(preset, k) for k in keys}
    assert stated >= 3
    gpt_oss = load_hf_config(CONFIGS / "gpt-oss-20b.json")
    assert (gpt_oss.rope_theta, gpt_oss.rope_scaling, gpt_oss.rope_scaling_factor) == (
        150000.0,
        "yarn",
        32.0,
    )
    base = json.loads((CONFIGS / "llama-3-8b.json").read_text())
    # transformers' newer configs nest them under rope_parameters; GPT-NeoX names its own.
    newer = {**base, "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}
    neox = json.loads((CONFIGS / "pythia-160m.json").read_text())
    neox.update(rotary_emb_base=10000, rotary_pct=0.25)
    for name, cfg, want in (
        ("newer", newer, (500000.0, 1.0, "")),
        ("neox", neox, (10000.0, 0.25, "")),
        ("none", base, (0.0, 1.0, "")),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
        d = load_hf_config(tmp_path / f"{name}.json")
        assert (d.rope_theta, d.rotary_percent, d.rope_scaling) == want, name
    (tmp_path / "bad.json").write_text(json.dumps({**base, "rope_theta": "big"}))
    with pytest.raises(SpecError, match="rope_theta must be a positive number") as e:
        load_hf_config(tmp_path / "bad.json")
    assert e.value.field == "model.config_path (rope_theta)"


def test_a_bare_count_smaller_than_its_shapes_embeddings_is_refused_naming_the_field() -> None:
    """A count below what the smallest shape's embeddings hold would leave the blocks a negative
    share (negative memory and MFU in the plan)."""
    import pytest

    from engine.errors import SpecError
    from engine.plan.models import resolve_model
    from engine.plan.specs import ModelSpec

    with pytest.raises(SpecError) as e:
        resolve_model(ModelSpec(params=1e6))
    assert e.value.field == "model.params" and "--layers" in str(e.value)
    assert resolve_model(ModelSpec(params=1e8)).params_total == 100_000_000
