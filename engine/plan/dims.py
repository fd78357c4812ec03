"""A resolved model's dimensions: :class:`ModelDims`, what ``engine.plan.models.resolve_model``
builds from a preset, a ``config.json``, explicit dimensions or a bare parameter count.

The memory and time models, the planner and the writers read it; it imports nothing of the
project.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelDims(BaseModel):
    """A resolved model: every dimension concrete, with exact parameter counts.
    Produced by ``engine.plan.models.resolve_model``; frozen, it is a result."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    """Display name (preset name, ``model_type`` of a config, or ``custom``)."""
    arch: str
    """Architecture family (``llama``, ``gpt2``, ``mixtral``, …, or ``generic``)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int
    """Dense MLP intermediate size (per expert for MoE)."""
    gated_mlp: bool
    num_experts: int = 1
    experts_per_token: int = 1
    tie_embeddings: bool = False
    max_position: int | None = None
    params_total: int
    """Exact total parameter count."""
    params_active: int
    """Parameters touched per token (equals total for dense; MoE counts top-k experts)."""
    params_embedding: int = 0
    """Embedding (+ untied head) parameters, part of the total."""
    params_experts: int = 0
    """Parameters inside routed expert MLPs (all experts), part of the total; 0 for dense."""
    q_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): the queries' low-rank width
    (``q_lora_rank``); 0: queries projected directly."""
    kv_lora_rank: int = 0
    """MLA: the compressed key/value latent's width; 0: not MLA (standard attention)."""
    qk_rope_head_dim: int = 0
    """MLA: the rotary part of each query/key head (``head_dim`` is the whole, rope included)."""
    v_head_dim: int = 0
    """MLA: a value head's width; 0: ``head_dim``."""
    shared_experts: int = 0
    """MoE: experts every token passes through beside its routed ones (DeepSeek's shared
    experts, each ``ffn`` wide, no routing and no all-to-all)."""
    dense_layers: int = 0
    """MoE: leading layers with a dense MLP instead of experts (DeepSeek's
    ``first_k_dense_replace``)."""
    dense_ffn: int = 0
    """Those dense layers' MLP width."""
    params_dense_mlp: int = 0
    """Parameters of one of those dense layers' MLP."""
    sliding_window: int = 0
    """Sliding-window attention (Mistral v0.1, Phi-3, Gemma 2): keys each query attends to in
    the windowed layers; 0: every layer attends to the whole causal prefix."""
    window_layers: int = 0
    """How many layers use the window."""
    window_pattern: str = ""
    """Which, as Megatron's list expression (``[1,0]*21``: every second layer from the first);
    empty when every layer or none does."""
    expert_groups: int = 0
    """MoE group-limited routing (DeepSeek-V3's ``n_group``): the experts fall into this many
    contiguous groups, and each token's experts come from :attr:`group_topk` of them (the groups
    of highest affinity); 0: every expert open to every token."""
    group_topk: int = 0
    """Groups a token's experts come from (``topk_group``)."""
    rope_theta: float = 0.0
    """Rotary base (``rope_theta``; GPT-NeoX's ``rotary_emb_base``); 0: not stated (Megatron's
    ``--rotary-base`` default, 10000)."""
    rotary_percent: float = 1.0
    """Share of each head's dimensions rotated (GPT-NeoX's ``rotary_pct``, ``partial_rotary_
    factor``)."""
    rope_scaling: str = ""
    """The config's RoPE scaling type (``llama3``, ``yarn``, ...); empty: none."""
    rope_scaling_factor: float = 0.0
    """Its ``factor``."""
    norm_eps: float = 0.0
    """The norms' epsilon (``rms_norm_eps``, ``layer_norm_eps``, ``layer_norm_epsilon``); 0: not
    stated (Megatron's ``--norm-epsilon`` default, 1e-5)."""
    mtp_layers: int = 0
    """Multi-token prediction modules (DeepSeek-V3 report §2.2; Megatron-Core's
    ``--mtp-num-layers``): each one more transformer layer of the model's kind, a ``2h -> h``
    projection and its own pass through the shared output head, on the last pipeline stage.
    Not in the parameter counts (the model's published size leaves them out, as DeepSeek-V3's
    671B does), and run by Megatron-Core only: transformers' models skip them."""
    rms_norm: bool = False
    """RMSNorm (the Llama family, and dimensions given by hand with a gated MLP); False:
    LayerNorm (GPT-2, GPT-NeoX, Falcon). Set by ``engine.plan.models`` from the model type."""
    rope: bool = False
    """Rotary position embeddings; False: learned absolute positions (GPT-2)."""
    linear_bias: bool = True
    """The linear layers carry biases (Megatron's default); False: none (Llama, Falcon)."""
    qkv_bias: bool = False
    """The query, key and value projections carry a bias where the other linears do not
    (Qwen2)."""
    qk_norm: bool = False
    """Queries and keys are normalised before the scores (Qwen3's ``q_norm``/``k_norm``)."""
    dropout: bool = True
    """Trained with dropout (GPT-2's 0.1, Megatron's default); False: none (the Llama family)."""
    attention_sinks: bool = False
    """A learned logit per head beside the keys (GPT-OSS's attention sinks)."""

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (keys and values from a shared compressed latent)."""
        return self.kv_lora_rank > 0

    @property
    def light_recompute_frees(self) -> bool:
        """Whether a light recompute (:attr:`Recompute.LIGHT`) frees anything: only MoE
        layers (the experts' activation, the pre-MLP norm) and latent attention (the
        up-projections, the input norm) hold what it drops; a dense model's norms are fused
        into the next linear."""
        return self.is_moe or self.is_mla

    @property
    def value_head_dim(self) -> int:
        """Width of one value head (MLA's ``v_head_dim``; otherwise ``head_dim``)."""
        return self.v_head_dim or self.head_dim

    @property
    def moe_layers(self) -> int:
        """Layers with experts (all of them unless some lead dense)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    def dense_view(self) -> ModelDims:
        """One of the leading dense layers as a dense model's layer (what the time model costs
        for it): no experts, the dense MLP width."""
        return self.model_copy(
            update={
                "num_experts": 1,
                "experts_per_token": 1,
                "shared_experts": 0,
                "ffn": self.dense_ffn,
                "dense_layers": 0,
            }
        )
