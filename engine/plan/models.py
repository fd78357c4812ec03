"""Model resolution: from a preset, a local Hugging Face ``config.json``, raw dimensions or a bare
parameter count to a :class:`~engine.plan.dims.ModelDims` with *exact* parameter counts.

The counts follow each architecture's own module definition in ``transformers`` (which
projections carry biases, how many norms a block has, fused or tied matrices), so they equal
``sum(p.numel() for p in model.parameters())`` of the real model (tests check that against
``transformers`` itself). Presets are stored as Hugging Face configs (``engine/plan/data/presets.json``)
and go through the same code path as a user's file.
"""

from __future__ import annotations

import itertools
import json
import math
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

from engine.errors import DtrainError, SpecError
from engine.fsio import JSON_LIMIT, read_regular_text
from engine.plan.dims import ModelDims
from engine.plan.specs import ModelSpec


class _Arch(NamedTuple):
    """How an architecture lays out its parameters (read from its transformers modeling file).
    Every architecture here ends with one final norm."""

    norm_bias: bool = False
    """LayerNorm with a bias (2h per norm) instead of RMSNorm (h)."""
    norms_per_layer: int = 2
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    learned_positions: bool = False
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (qwen3): 2 * head_dim per layer."""
    router_bias: bool = False
    """The MoE router has a bias (gpt_oss): one per expert."""
    sinks: bool = False
    """Attention sinks (gpt_oss): a learned logit per head and layer."""


_SUPPORTED = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "phi3",
    "gpt2",
    "gpt_neox",
    "falcon",
    "deepseek_v3",
    "kimi_k2",
    "gpt_oss",
)


def _cfg(c: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in c and c[k] is not None:
            return c[k]
    return default


MAX_DIM = 2**31
"""Largest dimension read from a config.json: a 10**30 hidden size is a broken file, not a model."""


def _need_int(c: dict[str, Any], field: str, *keys: str, default: int | None = None) -> int:
    v = _cfg(c, *keys, default=default)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_DIM:
        raise SpecError(
            f"config.json has no positive integer {keys[0]!r} up to {MAX_DIM} (got {_shown(v)}); "
            "fix the file or pass --layers/--hidden/--heads/--vocab instead",
            field=f"model.config_path ({field})",
        )
    return v


def _shown(v: object) -> str:
    """A config value as an error line quotes it: its repr, cut to 40 characters."""
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


class _Shape(NamedTuple):
    """An architecture's dimensions, as its config states them: what the parameter count needs."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int
    gated: bool
    """A gated (SwiGLU / GeGLU) MLP: three matrices instead of two."""
    tie: bool
    """The output head shares the input embedding."""
    arch: _Arch = _Arch()
    max_pos: int | None = None
    experts: int = 1
    top_k: int = 1
    mla: _Mla | None = None
    shared: int = 0
    """Shared experts (each ``ffn`` wide) in every MoE layer."""
    dense_layers: int = 0
    """Leading layers with a dense MLP of ``dense_ffn`` instead of experts."""
    dense_ffn: int = 0
    window: int = 0
    """Sliding-window attention: keys each query sees in the windowed layers; 0: none."""
    windowed: tuple[bool, ...] = ()
    """Which layers use the window, first to last."""
    mtp: int = 0
    """Multi-token prediction modules (``num_nextn_predict_layers``)."""
    groups: tuple[int, int] = (0, 0)
    """Group-limited routing: (``n_group``, ``topk_group``); (0, 0): none."""


class _Mla(NamedTuple):
    """Multi-head latent attention's widths (DeepSeek-V2/V3 configs)."""

    q_lora_rank: int
    """0: queries projected directly (``q_lora_rank: null``)."""
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


def _max_pos(c: dict[str, Any], *keys: str, default: Any = None) -> int | None:
    v = _cfg(c, *keys, default=default)
    return v if isinstance(v, int) else None


def _gpt2(c: dict[str, Any]) -> _Shape:
    h = _need_int(c, "hidden", "n_embd")
    layers = _need_int(c, "layers", "n_layer")
    heads = _need_int(c, "heads", "n_head")
    return _Shape(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=heads,
        ffn=_need_int(c, "ffn", "n_inner", default=4 * h),
        vocab=_need_int(c, "vocab", "vocab_size"),
        arch=_Arch(
            norm_bias=True, qkv_bias=True, o_bias=True, mlp_bias=True, learned_positions=True
        ),
        gated=False,
        tie=bool(c.get("tie_word_embeddings", True)),
        max_pos=_max_pos(c, "n_positions", "n_ctx", default=1024),
        head_dim=h // heads,
    )


def _gpt_neox(c: dict[str, Any]) -> _Shape:
    h = _need_int(c, "hidden", "hidden_size")
    layers = _need_int(c, "layers", "num_hidden_layers")
    heads = _need_int(c, "heads", "num_attention_heads")
    return _Shape(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=heads,
        ffn=_need_int(c, "ffn", "intermediate_size"),
        vocab=_need_int(c, "vocab", "vocab_size"),
        arch=_Arch(
            norm_bias=True,
            qkv_bias=bool(c.get("attention_bias", True)),
            o_bias=bool(c.get("attention_bias", True)),
            mlp_bias=True,
        ),
        gated=False,
        tie=bool(c.get("tie_word_embeddings", False)),
        max_pos=_max_pos(c, "max_position_embeddings"),
        head_dim=h // heads,
    )


def _falcon(c: dict[str, Any]) -> _Shape:
    h = _need_int(c, "hidden", "hidden_size")
    layers = _need_int(c, "layers", "num_hidden_layers", "n_layer")
    heads = _need_int(c, "heads", "num_attention_heads", "n_head")
    new_arch = bool(c.get("new_decoder_architecture", False))
    if new_arch:
        kv = _need_int(c, "kv_heads", "num_kv_heads", default=heads)
    elif c.get("multi_query", True):
        kv = 1
    else:
        kv = heads
    bias = bool(c.get("bias", False))
    ffn = _need_int(c, "ffn", "ffn_hidden_size", default=4 * h)
    vocab = _need_int(c, "vocab", "vocab_size")
    norms = 2 if new_arch else (1 if c.get("parallel_attn", True) else 2)
    if new_arch and c.get("num_ln_in_parallel_attn") == 1:
        norms = 1
    return _Shape(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=kv,
        ffn=ffn,
        vocab=vocab,
        arch=_Arch(
            norm_bias=True, norms_per_layer=norms, qkv_bias=bias, o_bias=bias, mlp_bias=bias
        ),
        gated=False,
        tie=bool(c.get("tie_word_embeddings", True)),
        max_pos=_max_pos(c, "max_position_embeddings"),
        head_dim=h // heads,
    )


def _gated_decoder(c: dict[str, Any], mt: str) -> _Shape:
    """Llama-style decoders (llama, mistral, mixtral, qwen2/3, gemma/2, phi3): gated MLP, RMSNorm."""
    h = _need_int(c, "hidden", "hidden_size")
    layers = _need_int(c, "layers", "num_hidden_layers")
    heads = _need_int(c, "heads", "num_attention_heads")
    kv = _need_int(c, "kv_heads", "num_key_value_heads", default=heads)
    if mt == "qwen3_moe":  # every layer sparse: the expert FFN is the MLP
        ffn = _need_int(c, "moe_intermediate_size", "moe_intermediate_size")
    else:
        ffn = _need_int(c, "ffn", "intermediate_size")
    vocab = _need_int(c, "vocab", "vocab_size")
    head_dim = _need_int(c, "head_dim", "head_dim", default=max(h // heads, 1))
    if mt == "qwen2":
        arch = _Arch(qkv_bias=True)
    elif mt in ("qwen3", "qwen3_moe"):
        ab = bool(c.get("attention_bias", False))
        arch = _Arch(qkv_bias=ab, o_bias=ab, qk_norm=True)
    elif mt == "gemma2":
        arch = _Arch(norms_per_layer=4)
    elif mt in ("llama", "mistral"):
        ab = bool(c.get("attention_bias", False))
        arch = _Arch(qkv_bias=ab, o_bias=ab, mlp_bias=bool(c.get("mlp_bias", False)))
    elif mt == "gpt_oss":
        # transformers' GptOss: biased attention projections and attention sinks, a biased
        # router, experts with biased gate/up and down projections (gate_up_proj_bias,
        # down_proj_bias).
        ab = bool(c.get("attention_bias", True))
        arch = _Arch(qkv_bias=ab, o_bias=ab, mlp_bias=True, router_bias=True, sinks=True)
    else:  # mixtral, gemma, phi3: no biases, RMSNorm, two norms
        arch = _Arch()
    window, windowed = _sliding_window(c, mt, layers)
    return _Shape(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=kv,
        head_dim=head_dim,
        ffn=ffn,
        vocab=vocab,
        arch=arch,
        gated=True,
        tie=bool(c.get("tie_word_embeddings", mt in ("gemma", "gemma2"))),
        max_pos=_max_pos(c, "max_position_embeddings"),
        window=window,
        windowed=windowed,
    )


def _sliding_window(c: dict[str, Any], mt: str, layers: int) -> tuple[int, tuple[bool, ...]]:
    """(window, the layers that use it) as transformers reads a Llama-family config: a
    ``layer_types`` list where the config has one; otherwise every second layer from the
    first for Gemma 2 and GPT-OSS, the layers from ``max_window_layers`` on for Qwen2/3 when
    ``use_sliding_window`` is set, every layer for Mistral, Mixtral and Phi-3."""
    w = c.get("sliding_window")
    if isinstance(w, bool) or not isinstance(w, int) or w <= 0:
        return 0, ()
    types = c.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        windowed = tuple(t == "sliding_attention" for t in types)
    elif mt in ("gemma2", "gpt_oss"):
        windowed = tuple(i % 2 == 0 for i in range(layers))
    elif mt in ("qwen2", "qwen3", "qwen3_moe"):
        first = c.get("max_window_layers")
        if not c.get("use_sliding_window") or not isinstance(first, int):
            return 0, ()
        windowed = tuple(i >= first for i in range(layers))
    elif mt in ("mistral", "mixtral", "phi3"):
        windowed = (True,) * layers
    else:
        return 0, ()
    return (w, windowed) if any(windowed) else (0, ())


def _layer_pattern(flags: tuple[bool, ...]) -> str:
    """Megatron's list expression of per-layer flags (1 where set): the shortest repeating
    unit (``[1,0]*21``), else the runs (``[0]*28+[1]*4``)."""
    bits = [1 if f else 0 for f in flags]
    n = len(bits)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and bits == bits[:p] * (n // p):
            return f"[{','.join(map(str, bits[:p]))}]*{n // p}"
    return "+".join(f"[{b}]*{len(list(run))}" for b, run in itertools.groupby(bits))


def _deepseek_v3(c: dict[str, Any]) -> _Shape:
    """DeepSeek-V3 (and Kimi K2, the same architecture): multi-head latent attention, routed
    plus shared experts, the first ``first_k_dense_replace`` layers dense (transformers'
    ``DeepseekV3ForCausalLM``); its multi-token prediction modules (``num_nextn_predict_layers``)
    are kept apart from the parameter count, as the model's published size keeps them."""
    h = _need_int(c, "hidden", "hidden_size")
    heads = _need_int(c, "heads", "num_attention_heads")
    q_lora = _cfg(c, "q_lora_rank")
    mla = _Mla(
        q_lora_rank=_need_int(c, "q_lora_rank", "q_lora_rank") if q_lora is not None else 0,
        kv_lora_rank=_need_int(c, "kv_lora_rank", "kv_lora_rank"),
        qk_nope_head_dim=_need_int(c, "qk_nope_head_dim", "qk_nope_head_dim"),
        qk_rope_head_dim=_need_int(c, "qk_rope_head_dim", "qk_rope_head_dim"),
        v_head_dim=_need_int(c, "v_head_dim", "v_head_dim"),
    )
    if c.get("moe_layer_freq", 1) != 1:
        raise SpecError(
            "this deepseek_v3 config puts experts in only some layers after the first dense "
            "ones (moe_layer_freq), which the planner does not model; give its dimensions with "
            "--layers/--hidden/--heads/--ffn/--experts instead",
            field="model.config_path",
        )
    layers = _need_int(c, "layers", "num_hidden_layers")
    dense = _cfg(c, "first_k_dense_replace", default=0)
    if isinstance(dense, bool) or not isinstance(dense, int) or not 0 <= dense < layers:
        raise SpecError(
            f"config.json's first_k_dense_replace must be a whole number below "
            f"num_hidden_layers ({layers}); fix the file",
            field="model.config_path (first_k_dense_replace)",
        )
    ab = bool(c.get("attention_bias", False))
    mtp = _cfg(c, "num_nextn_predict_layers", default=0) or 0
    if isinstance(mtp, bool) or not isinstance(mtp, int) or not 0 <= mtp <= 16:
        raise SpecError(
            "config.json's num_nextn_predict_layers must be a whole number from 0 to 16; "
            "fix the file",
            field="model.config_path (num_nextn_predict_layers)",
        )
    experts = _need_int(c, "n_routed_experts", "n_routed_experts", "num_local_experts")
    groups = _routing_groups(c, experts)
    return _Shape(
        layers=layers,
        hidden=h,
        heads=heads,
        kv_heads=heads,
        head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        ffn=_need_int(c, "moe_intermediate_size", "moe_intermediate_size"),
        vocab=_need_int(c, "vocab", "vocab_size"),
        arch=_Arch(qkv_bias=ab, o_bias=ab),
        gated=True,
        tie=bool(c.get("tie_word_embeddings", False)),
        max_pos=_max_pos(c, "max_position_embeddings"),
        experts=experts,
        top_k=_need_int(c, "experts_per_token", "num_experts_per_tok", default=8),
        mla=mla,
        shared=_cfg(c, "n_shared_experts", default=0) or 0,
        dense_layers=dense,
        dense_ffn=_need_int(c, "ffn", "intermediate_size"),
        mtp=mtp,
        groups=groups,
    )


def _routing_groups(c: dict[str, Any], experts: int) -> tuple[int, int]:
    """(``n_group``, ``topk_group``) of a group-limited router (DeepSeek-V3's node-limited
    routing: 8 groups, 4 per token); (0, 0) where every group is open (Kimi K2: 1 of 1)."""
    groups = c.get("n_group") or 0
    topk = c.get("topk_group") or 0
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (groups, topk))
    if ok and (not groups or not topk or topk >= groups):
        return (0, 0)
    if not ok or groups < 1 or topk < 1 or experts % groups:
        raise SpecError(
            f"config.json's n_group ({groups!r}) must divide n_routed_experts ({experts}) and "
            f"topk_group ({topk!r}) be a whole number of groups; fix the file",
            field="model.config_path (n_group)",
        )
    return (groups, topk)


_READERS = {
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "deepseek_v3": _deepseek_v3,
    "kimi_k2": _deepseek_v3,
}
"""Readers of the architectures whose config keys differ from the Llama family's."""


def _dims_from_hf(c: dict[str, Any], name: str) -> ModelDims:
    mt = c.get("model_type")
    if not isinstance(mt, str):
        raise SpecError(
            "config.json has no 'model_type'; pass a Hugging Face config.json or give "
            "--layers/--hidden/--heads/--vocab",
            field="model.config_path",
        )
    if mt not in _SUPPORTED:
        raise SpecError(
            f"model_type {mt!r} is not supported (supported: {', '.join(_SUPPORTED)}); "
            "pass its dimensions with --layers/--hidden/--heads/--kv-heads/--vocab/--ffn "
            "or a bare --params count",
            field="model.config_path",
        )
    reader = _READERS.get(mt)
    shape = reader(c) if reader else _gated_decoder(c, mt)
    if shape.heads % shape.kv_heads:
        raise SpecError(
            f"num_key_value_heads {shape.kv_heads} does not divide num_attention_heads "
            f"{shape.heads}; fix config.json",
            field="model.config_path",
        )
    if mt == "qwen3_moe" and (c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1):
        raise SpecError(
            "this qwen3_moe config mixes dense and MoE layers (mlp_only_layers / "
            "decoder_sparse_step), which the planner does not model; give its dimensions "
            "with --layers/--hidden/--heads/--ffn/--experts instead",
            field="model.config_path",
        )
    if mt in ("mixtral", "qwen3_moe", "gpt_oss"):
        shape = shape._replace(
            experts=_need_int(c, "num_experts", "num_local_experts", "num_experts"),
            top_k=_need_int(c, "experts_per_token", "num_experts_per_tok", default=2),
        )
    return _build(name, mt, shape).model_copy(update=_rope_and_norm(c))


def _rope_and_norm(c: dict[str, Any]) -> dict[str, Any]:
    """The config's rotary embedding: base, rotated share of a head, scaling (type and factor),
    transformers' newer configs nesting them under ``rope_parameters``; and its norms' epsilon."""
    nested = c.get("rope_parameters")
    params = nested if isinstance(nested, dict) else {}
    theta = _positive(c, "rope_theta", params.get("rope_theta", c.get("rope_theta")))
    if theta is None:
        theta = _positive(c, "rotary_emb_base", c.get("rotary_emb_base"))
    share = _positive(c, "rotary_pct", c.get("rotary_pct", c.get("partial_rotary_factor")))
    if share is not None and share > 1:
        raise SpecError(
            f"config.json rotary_pct {share} is above 1 (it is the share of a head rotated); "
            "fix the file",
            field="model.config_path (rotary_pct)",
        )
    scaling = c.get("rope_scaling")
    if not isinstance(scaling, dict):
        scaling = params
    kind = scaling.get("rope_type", scaling.get("type", ""))
    kind = kind if isinstance(kind, str) and kind != "default" else ""
    factor = _positive(c, "rope_scaling.factor", scaling.get("factor")) if kind else None
    eps = None
    for key in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon"):
        if c.get(key) is not None:
            eps = _positive(c, key, c[key])
            break
    return {
        "rope_theta": theta or 0.0,
        "rotary_percent": share or 1.0,
        "rope_scaling": kind,
        "rope_scaling_factor": factor or 0.0,
        "norm_eps": eps or 0.0,
    }


def _positive(c: dict[str, Any], key: str, v: object) -> float | None:
    """``v`` as a positive number; None when absent; one clear line when it is not a number."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
        raise SpecError(
            f"config.json {key} must be a positive number (got {_shown(v)}); fix the file",
            field=f"model.config_path ({key})",
        )
    return float(v)


_LLAMA_LIKE = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "phi3",
        "deepseek_v3",
        "kimi_k2",
        "gpt_oss",
    }
)
"""Hugging Face model types built like Llama: RMSNorm, rotary positions, no dropout."""
_NO_LINEAR_BIAS = (_LLAMA_LIKE - {"gpt_oss"}) | {"falcon"}
"""Model types whose linear layers carry no bias (qwen2 keeps one on q, k and v; gpt_oss one
on every linear, Megatron's default)."""
_ROPE_LAYERNORM = frozenset({"gpt_neox", "falcon"})
"""LayerNorm models with rotary positions."""


class _Traits(TypedDict):
    """What a model *is* beyond its shape (the :class:`ModelDims` fields of the same names)."""

    rms_norm: bool
    rope: bool
    linear_bias: bool
    qkv_bias: bool
    qk_norm: bool
    dropout: bool
    attention_sinks: bool


def _traits(arch_name: str, gated: bool) -> _Traits:
    """The norm, positions, biases and dropout of model type ``arch_name``; dimensions given by
    hand (``generic``) with a gated MLP are modelled as a Llama-style decoder."""
    llama = arch_name in _LLAMA_LIKE or (arch_name == "generic" and gated)
    return _Traits(
        rms_norm=llama,
        rope=llama or arch_name in _ROPE_LAYERNORM,
        linear_bias=not (arch_name in _NO_LINEAR_BIAS or (arch_name == "generic" and gated)),
        qkv_bias=arch_name == "qwen2",
        qk_norm=arch_name in ("qwen3", "qwen3_moe"),
        dropout=not llama,
        attention_sinks=arch_name == "gpt_oss",
    )


def _build(name: str, arch_name: str, shape: _Shape) -> ModelDims:
    """Exact parameter counts of ``shape`` (see the module docstring)."""
    h = shape.hidden
    arch = shape.arch
    experts = shape.experts
    head_dim = shape.head_dim
    norm = 2 * h if arch.norm_bias else h
    mla = shape.mla
    if mla is not None:
        attn = _mla_params(h, shape.heads, mla, arch)
    else:
        q = shape.heads * head_dim
        k = shape.kv_heads * head_dim
        attn = h * q + 2 * h * k + q * h
        if arch.qkv_bias:
            attn += q + 2 * k
        if arch.o_bias:
            attn += h
        if arch.qk_norm:
            attn += 2 * head_dim
    mlp = (3 if shape.gated else 2) * h * shape.ffn
    if arch.mlp_bias:
        mlp += (2 * shape.ffn if shape.gated else shape.ffn) + h
    router = h * experts + (experts if arch.router_bias else 0) if experts > 1 else 0
    sinks = shape.heads if arch.sinks else 0
    per_layer_dense = attn + sinks + arch.norms_per_layer * norm + router + shape.shared * mlp
    embed = shape.vocab * h
    positions = (shape.max_pos or 1024) * h if arch.learned_positions else 0
    head = 0 if shape.tie else shape.vocab * h
    final = norm
    layers = shape.layers
    moe_layers = layers - shape.dense_layers
    # A leading dense layer: the attention and norms, its own MLP, no router or experts.
    dense_mlp = 3 * h * shape.dense_ffn if shape.dense_layers else 0
    dense_layer = attn + arch.norms_per_layer * norm + dense_mlp
    rest = shape.dense_layers * dense_layer + embed + positions + head + final
    total = moe_layers * (per_layer_dense + experts * mlp) + rest
    active = moe_layers * (per_layer_dense + min(shape.top_k, experts) * mlp) + rest
    return ModelDims(
        name=name,
        arch=arch_name,
        layers=layers,
        hidden=h,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=head_dim,
        vocab=shape.vocab,
        ffn=shape.ffn,
        gated_mlp=shape.gated,
        num_experts=experts,
        experts_per_token=min(shape.top_k, experts),
        tie_embeddings=shape.tie,
        max_position=shape.max_pos,
        params_total=total,
        params_active=active,
        params_embedding=embed + positions + head,
        params_experts=moe_layers * experts * mlp if experts > 1 else 0,
        q_lora_rank=mla.q_lora_rank if mla else 0,
        kv_lora_rank=mla.kv_lora_rank if mla else 0,
        qk_rope_head_dim=mla.qk_rope_head_dim if mla else 0,
        v_head_dim=mla.v_head_dim if mla else 0,
        shared_experts=shape.shared,
        dense_layers=shape.dense_layers,
        dense_ffn=shape.dense_ffn,
        params_dense_mlp=dense_mlp,
        sliding_window=shape.window,
        window_layers=sum(shape.windowed),
        window_pattern=_layer_pattern(shape.windowed) if 0 < sum(shape.windowed) < layers else "",
        mtp_layers=shape.mtp,
        expert_groups=shape.groups[0],
        group_topk=shape.groups[1],
        **_traits(arch_name, shape.gated),
    )


def _mla_params(h: int, heads: int, mla: _Mla, arch: _Arch) -> int:
    """Parameters of one multi-head latent attention block (transformers' DeepseekV3Attention):
    the queries through a low-rank ``q_lora_rank`` bottleneck with its RMSNorm (or one
    projection), keys and values from one ``kv_lora_rank`` latent (normed) plus a shared rotary
    key, up-projected per head, and the output projection from the value heads."""
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        q = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * qk
        q += mla.q_lora_rank if arch.qkv_bias else 0
    else:
        q = h * heads * qk
    kv_a = mla.kv_lora_rank + mla.qk_rope_head_dim
    kv = h * kv_a + (kv_a if arch.qkv_bias else 0) + mla.kv_lora_rank
    kv += mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    o = heads * mla.v_head_dim * h + (h if arch.o_bias else 0)
    return q + kv + o


def architecture_notes(dims: ModelDims) -> list[str]:
    """What a model's shape line cannot say: its attention's kind and head width when unusual,
    shared experts, leading dense layers and multi-token prediction (for the plan's and the
    wizard's model lines)."""
    notes = []
    if dims.is_mla:
        notes.append(f"latent attention (kv {dims.kv_lora_rank}, q {dims.q_lora_rank or 'full'})")
    elif dims.head_dim * dims.heads != dims.hidden:
        notes.append(f"heads of {dims.head_dim}")
    if dims.shared_experts:
        notes.append(f"{dims.shared_experts} shared expert{'s' if dims.shared_experts > 1 else ''}")
    if dims.dense_layers:
        notes.append(f"first {dims.dense_layers} layer{'s' if dims.dense_layers > 1 else ''} dense")
    if dims.attention_sinks:
        notes.append("attention sinks")
    if dims.sliding_window:
        where = "" if dims.window_layers == dims.layers else f" on {dims.window_layers} layers"
        notes.append(f"sliding window {dims.sliding_window}{where}")
    if dims.expert_groups:
        notes.append(f"experts from {dims.group_topk} of {dims.expert_groups} groups a token")
    if dims.mtp_layers:
        n = dims.mtp_layers
        notes.append(f"{n} multi-token prediction module{'s' if n > 1 else ''} (Megatron)")
    return notes


@cache
def _presets() -> dict[str, dict[str, Any]]:
    text = resources.files("engine.plan").joinpath("data/presets.json").read_text(encoding="utf-8")
    data: dict[str, dict[str, Any]] = json.loads(text)
    return data


def list_presets() -> list[str]:
    """Preset names, in catalog order."""
    return list(_presets())


def preset_config(name: str) -> dict[str, Any]:
    """The Hugging Face config a preset stands for (without our ``_`` metadata keys)."""
    try:
        entry = _presets()[name.lower()]
    except KeyError:
        close = [p for p in _presets() if name.lower().split("-")[0] in p][:5]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise SpecError(
            f"unknown preset {name!r}{hint}; `dtrain-tui model list` shows the presets",
            field="model.preset",
        ) from None
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def preset_description(name: str) -> str:
    return str(_presets()[name].get("_description", ""))


def load_hf_config(path: Path) -> ModelDims:
    """Read a local Hugging Face ``config.json`` (or a directory holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        text = read_regular_text(p, JSON_LIMIT, label=str(p), follow=True)
    except FileNotFoundError:
        raise SpecError(
            f"{p} does not exist; pass the path of a config.json", field="model.config_path"
        ) from None
    except DtrainError as e:  # a device, FIFO, or too big
        raise SpecError(e.message, field="model.config_path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read {p}: {e}", field="model.config_path") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(
            f"{p} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})",
            field="model.config_path",
        ) from None
    except RecursionError:
        raise SpecError(
            f"{p} nests too deeply to be a Hugging Face config.json", field="model.config_path"
        ) from None
    except ValueError:  # an integer of more than 4300 digits
        raise SpecError(
            f"{p} holds a number too long to be a model dimension; fix the file",
            field="model.config_path",
        ) from None
    if not isinstance(data, dict):
        raise SpecError(f"{p} must hold a JSON object", field="model.config_path")
    stem = p.parent.name if p.name == "config.json" else p.stem
    name = str(data.get("_name_or_path") or stem or data.get("model_type", "model"))
    return _dims_from_hf(data, name)


# Shapes of well-known dense decoders, used to give a bare parameter count plausible dimensions
# (params ≈ 12·L·h² for a non-gated block). Sizes from GPT-3 (Brown et al. 2020, Table 2.1) and
# Llama 2/3 (Touvron et al. 2023; Meta 2024).
_SHAPES: tuple[tuple[float, int, int, int, int, int], ...] = (
    # params, layers, hidden, heads, kv_heads, ffn (gated)
    (125e6, 12, 768, 12, 12, 2048),
    (350e6, 24, 1024, 16, 16, 2816),
    (760e6, 24, 1536, 16, 16, 4096),
    (1.3e9, 24, 2048, 16, 16, 5504),
    (2.7e9, 32, 2560, 32, 32, 6912),
    (7e9, 32, 4096, 32, 32, 11008),
    (13e9, 40, 5120, 40, 40, 13824),
    (30e9, 60, 6656, 52, 52, 17920),
    (70e9, 80, 8192, 64, 8, 28672),
    (175e9, 96, 12288, 96, 96, 32768),
    (405e9, 126, 16384, 128, 8, 53248),
    (1e12, 128, 25600, 160, 16, 81920),
)


def format_count(n: float) -> str:
    """A parameter count for people: 6.74B, 124M."""
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def _from_count(spec: ModelSpec, params: float) -> ModelDims:
    shape = min(_SHAPES, key=lambda s: abs(math.log(s[0] / params)))
    _, layers, hidden, heads, kv, ffn = shape
    vocab = spec.vocab or 32000
    n = int(round(params))
    experts = spec.num_experts or 1
    top_k = min(spec.experts_per_token or (2 if experts > 1 else 1), experts)
    if experts > 1:
        # Split the count: attention + embeddings as in the shape, the rest spread over experts.
        dense = _build(
            "x",
            "generic",
            _Shape(
                layers=layers,
                hidden=hidden,
                heads=heads,
                kv_heads=kv,
                head_dim=hidden // heads,
                vocab=vocab,
                ffn=ffn,
                gated=True,
                tie=False,
            ),
        )
        mlp = 3 * hidden * ffn
        non_expert = dense.params_total - layers * mlp
        per_expert_total = max(n - non_expert, 0) / (layers * experts)
        active = int(non_expert + layers * top_k * per_expert_total)
        experts_params = n - non_expert
    else:
        active = n
        experts_params = 0
    embedding = 2 * vocab * (spec.hidden or hidden)
    if n <= embedding:
        # The blocks would hold a negative count: no shape fits, and every estimate would be
        # nonsense (negative memory, negative MFU).
        raise SpecError(
            f"{format_count(params)} parameters is less than the embeddings alone of the "
            f"smallest shape a bare count maps to ({format_count(embedding)}: vocab {vocab} x "
            f"hidden {spec.hidden or hidden}, input and output); give the dimensions "
            "(--layers --hidden --heads --vocab) instead",
            field="model.params",
        )
    return ModelDims(
        name=f"custom-{format_count(params)}",
        arch="generic",
        layers=spec.layers or layers,
        hidden=spec.hidden or hidden,
        heads=spec.heads or heads,
        kv_heads=spec.kv_heads or kv,
        head_dim=spec.head_dim or (spec.hidden or hidden) // (spec.heads or heads),
        vocab=vocab,
        ffn=spec.ffn or ffn,
        gated_mlp=True,
        num_experts=experts,
        experts_per_token=top_k,
        tie_embeddings=spec.tie_embeddings,
        params_total=n,
        params_active=min(active, n),
        params_embedding=embedding,
        params_experts=max(experts_params, 0),
        **_traits("generic", True),
    )


def _from_dims(spec: ModelSpec) -> ModelDims:
    missing = [f for f in ("layers", "hidden", "heads", "vocab") if getattr(spec, f) is None]
    if missing:
        raise SpecError(
            f"dimensions incomplete: give {', '.join('--' + m for m in missing)} too, "
            "or a preset / config.json / bare --params",
            field=f"model.{missing[0]}",
        )
    assert spec.layers and spec.hidden and spec.heads and spec.vocab
    gated = spec.gated_mlp if spec.gated_mlp is not None else spec.ffn is not None
    ffn = spec.ffn or 4 * spec.hidden
    experts = spec.num_experts or 1
    top_k = spec.experts_per_token or (2 if experts > 1 else 1)
    return _build(
        "custom",
        "generic",
        _Shape(
            layers=spec.layers,
            hidden=spec.hidden,
            heads=spec.heads,
            kv_heads=spec.kv_heads or spec.heads,
            head_dim=spec.head_dim or spec.hidden // spec.heads,
            vocab=spec.vocab,
            ffn=ffn,
            gated=gated,
            tie=spec.tie_embeddings,
            experts=experts,
            top_k=top_k,
        ),
    )


def resolve_model(spec: ModelSpec) -> ModelDims:
    """Resolve a ModelSpec: config file, then preset, then dimensions, then a bare count;
    ``mtp_layers``, where given, replaces the config's multi-token prediction depth."""
    dims = _resolve(spec)
    if spec.mtp_layers is not None and spec.mtp_layers != dims.mtp_layers:
        return dims.model_copy(update={"mtp_layers": spec.mtp_layers})
    return dims


def _resolve(spec: ModelSpec) -> ModelDims:
    if spec.config_path is not None:
        return load_hf_config(spec.config_path)
    if spec.preset:
        return _dims_from_hf(preset_config(spec.preset), spec.preset.lower())
    if spec.layers is not None or spec.hidden is not None:
        return _from_dims(spec)
    if spec.params is not None:
        return _from_count(spec, spec.params)
    raise SpecError(
        "no model given; pass --model PRESET, --model-config FILE, --params N, "
        "or --layers/--hidden/--heads/--vocab",
        field="model",
    )
