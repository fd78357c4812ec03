"""``megatron_args.txt`` and ``pretrain_gpt.sh`` for 3D plans.

``megatron_args.txt``: Megatron-LM's ``pretrain_gpt.py`` arguments for the parallel degrees,
batch, recompute, precision and the model's architecture (normalization, position embedding,
gated MLP, grouped-query attention, biases, tied embeddings, shape). One flag (and its value)
per line; ``#`` lines are comments. The node scripts read it into an array when the plan runs
the user's Megatron script.

``pretrain_gpt.sh``: the real run, one script for every node (``NODE_RANK`` picks the node):
torchrun with the bundle's rendezvous starts ``$MEGATRON_LM/pretrain_gpt.py`` with those
arguments, the tokenizer and the data (``DATA_PATH`` + ``TOKENIZER_MODEL``; without them,
Megatron's mock data and its NullTokenizer at the model's vocabulary). The example trainer that
the launch backends start for a 3D plan trains the data-parallel part only: a smoke test.

Flag names follow Megatron-LM's ``megatron/training/arguments.py`` (NVIDIA/Megatron-LM:
``_add_network_size_args``: ``--normalization {LayerNorm,RMSNorm}``,
``--position-embedding-type {learned_absolute,rope,...}``, ``--swiglu``,
``--group-query-attention``, ``--num-query-groups``, ``--kv-channels``,
``--untie-embeddings-and-output-weights``; ``_add_training_args``: ``--disable-bias-linear``,
``--add-qkv-bias``; ``_add_regularization_args``: ``--attention-dropout``, ``--hidden-dropout``;
``_add_data_args``: ``--mock-data``, ``--vocab-size``, ``--data-path``; ``_add_tokenizer_args``:
``--tokenizer-type {HuggingFaceTokenizer,NullTokenizer,...}``, ``--tokenizer-model``).
"""

from __future__ import annotations

from engine.plan.dims import ModelDims
from engine.plan.frameworks import megatron_fp8_flags, shared_expert_overlap, tp_comm_overlap
from engine.plan.memory import moments_bf16_apply, states_offload_apply
from engine.plan.names import MoeDispatcher, Optimizer, PPSchedule, Precision, Recompute
from engine.plan.result import Layout, Plan
from engine.plan.specs import TrainingSpec
from engine.plan.stages import accounted_ends, stage_layers
from engine.write.checks import check_batch_product
from engine.write.launch_scripts import ckpt_env_lines
from engine.write.learning_rate import lr
from engine.write.naming import run_name
from engine.write.nodes import master_addr
from engine.write.quoting import comment_text, shell_word

PRETRAIN_GPT = "pretrain_gpt.sh"
"""The bundle's Megatron-LM command for 3D plans, next to ``megatron_args.txt``."""


def architecture_args(m: ModelDims) -> list[str]:
    """Megatron flags for what the model *is* beyond its shape (the traits
    ``engine.plan.models`` sets on :class:`ModelDims`): normalization, position embedding,
    biases, dropout, q/k norm, attention sinks and head width."""
    out = [f"--normalization {'RMSNorm' if m.rms_norm else 'LayerNorm'}"]
    if m.norm_eps:
        out.append(f"--norm-epsilon {m.norm_eps:g}")  # Megatron's default 1e-5; Qwen's 1e-6
    out.append(f"--position-embedding-type {'rope' if m.rope else 'learned_absolute'}")
    if m.rope:
        out += rotary_args(m)
    if not m.linear_bias:
        out.append("--disable-bias-linear")
        if m.qkv_bias:
            out.append("--add-qkv-bias")
    if m.qk_norm:
        out.append("--qk-layernorm")
    out += _attention_width_args(m)
    if m.mtp_layers:
        # Multi-token prediction (DeepSeek-V3 §2.2), on the last pipeline stage, its loss
        # weighted by Megatron's default 0.1 (the report's weight for most of its run).
        out.append(f"--mtp-num-layers {m.mtp_layers}")
    if m.attention_sinks:
        out.append("--softmax-type learnable")  # attention sinks: a learned logit per head
    if m.sliding_window:
        # (left, right) keys: the causal window; on the windowed layers only where not all.
        out.append(f"--window-size {m.sliding_window},0")
        if m.window_pattern:
            out.append(f"--window-attn-skip-freq {m.window_pattern}")
    if not m.dropout:
        out += ["--attention-dropout 0.0", "--hidden-dropout 0.0"]
    return out


def _attention_width_args(m: ModelDims) -> list[str]:
    """Latent attention's widths, or a head width apart from hidden / heads."""
    if m.is_mla:
        # Multi-head latent attention (DeepSeek-V3, Kimi K2): the latents' RMSNorms are
        # Megatron's --qk-layernorm; the head widths come from these, not --kv-channels.
        out = ["--multi-latent-attention", "--qk-layernorm"]
        if m.q_lora_rank:
            out.append(f"--q-lora-rank {m.q_lora_rank}")
        return out + [
            f"--kv-lora-rank {m.kv_lora_rank}",
            f"--qk-head-dim {m.head_dim - m.qk_rope_head_dim}",
            f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}",
            f"--v-head-dim {m.value_head_dim}",
        ]
    if m.head_dim * m.heads != m.hidden:
        return [f"--kv-channels {m.head_dim}"]
    return []


def rotary_args(m: ModelDims) -> list[str]:
    """The rotary embedding as the model's config has it (Megatron's defaults are base 10000,
    every dimension rotated, no scaling): ``--rotary-base`` (Llama 3: 500000, Qwen3: 1e6),
    ``--rotary-percent`` (GPT-NeoX: 0.25) and Llama 3.1's frequency scaling
    (``--use-rope-scaling``; Megatron's fixed low/high frequency factors 1 and 4 over 8192
    original positions are Llama 3.1's and 3.2's). YaRN scaling has no flag here:
    :func:`rotary_note` says so."""
    out = []
    if m.rope_theta:
        out.append(f"--rotary-base {round(m.rope_theta)}")
    if m.rotary_percent != 1.0:
        out.append(f"--rotary-percent {m.rotary_percent:g}")
    if m.rope_scaling == "llama3":
        out.append("--use-rope-scaling")
        if m.rope_scaling_factor:  # else Megatron's default, 8 (Llama 3.1's)
            out.append(f"--rope-scaling-factor {m.rope_scaling_factor:g}")
    return out


def rotary_note(m: ModelDims) -> str:
    """A comment for ``megatron_args.txt`` where the rotary embedding is not all in its
    flags: an unknown base (dimensions given by hand) or a scaling other than Llama 3.1's."""
    if not m.rope:
        return ""
    if m.rope_scaling and m.rope_scaling != "llama3":
        return (
            f"# The config's {m.rope_scaling} RoPE scaling (factor {m.rope_scaling_factor:g}) is not "
            "passed: it extends a trained context; add Megatron's flags for it to train with it."
        )
    if not m.rope_theta:
        return "# No rope_theta known: Megatron's --rotary-base default is 10000; set yours."
    return ""


def activation_args(m: ModelDims) -> list[str]:
    """The MLP's activation: SwiGLU for gated models; GPT-OSS's clamped quick-GELU GLU with
    its ``+1`` on the linear half (Megatron-Bridge's GPTOSSProvider: ``quick_gelu``,
    ``glu_linear_offset 1.0``, ``activation_func_clamp_value 7.0``)."""
    if m.arch == "gpt_oss":
        return ["--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7.0"]
    return ["--swiglu"] if m.gated_mlp else []


def light_modules(m: ModelDims) -> str:
    """Megatron-Core's output-discarding recompute modules that :attr:`Recompute.LIGHT` is:
    the layer norms (those Transformer Engine does not fuse into a linear: an MoE layer's
    pre-MLP norm, MLA's input norm), the experts' activation where the model has experts
    (Megatron runs them as a grouped GEMM, which ``moe_act`` needs), the up-projections where
    attention is latent (``mla_up_proj`` needs ``--multi-latent-attention``)."""
    return " ".join(
        ["layernorm"] + (["moe_act"] if m.is_moe else []) + (["mla_up_proj"] if m.is_mla else [])
    )


def megatron_args_list(plan: Plan) -> list[str]:
    """The argument lines, without comments. Refuses (one line naming the field) a layout
    Megatron-LM cannot run (:meth:`Layout.check_megatron`) before writing a flag."""
    lay = plan.recommended
    m = plan.model
    tr = plan.spec.training
    check_batch_product(lay)
    lay.check_megatron(m.layers, tr.optimizer)
    return [
        *_parallel_args(lay, m, tr),
        *_pipeline_args(lay, m),
        f"--micro-batch-size {lay.micro_batch}",
        f"--global-batch-size {lay.global_batch}",
        *_recompute_args(lay, m),
        *_offload_args(lay),
        *_precision_args(lay, tr),
        *_sharding_args(lay),
        *optimizer_args(tr.optimizer, lay),
        *_shape_args(m),
        *activation_args(m),
        *(_moe_args(lay, m, tr) if m.is_moe else []),
        *([] if m.tie_embeddings else ["--untie-embeddings-and-output-weights"]),
        *architecture_args(m),
        f"--seq-length {tr.seq_len}",
        f"--max-position-embeddings {max(tr.seq_len, m.max_position or 0)}",
        f"--lr {lr(plan):g}",
        f"--clip-grad {tr.grad_clip:g}",
        f"--train-iters {tr.steps}",
        *checkpoint_args(plan),
    ]


def checkpoint_args(plan: Plan) -> list[str]:
    """Megatron's checkpoint flags for plan.json's interval (none when it is 0): the save
    interval and the distributed checkpoint format, ``torch_dist`` (sharded, reshards on load
    into another parallelism), saved asynchronously; Megatron-FSDP keeps its own
    ``fsdp_dtensor`` format (:func:`_sharding_args`) and saves synchronously. ``--save`` and
    ``--load`` come from ``DTRAIN_CKPT_DIR`` in the node scripts, a path no word-split file
    could hold."""
    from engine.write.plan_json import checkpoint_section

    every = int(checkpoint_section(plan)["every"])
    if every <= 0:
        return []
    out = [f"--save-interval {every}"]
    if plan.recommended.zero_stage < 3:
        out += ["--ckpt-format torch_dist", "--async-save"]
    return out


def _parallel_args(lay: Layout, m: ModelDims, tr: TrainingSpec) -> list[str]:
    """The tensor, pipeline, context and expert parallel degrees, and sequence parallelism."""
    out = [
        f"--tensor-model-parallel-size {lay.tp}",
        f"--pipeline-model-parallel-size {lay.pp}",
        f"--context-parallel-size {lay.cp}",
    ]
    if lay.cp > 1 and tr.cp_comm:
        out.append(f"--cp-comm-type {tr.cp_comm.value}")
    if m.is_moe:
        out.append(f"--expert-model-parallel-size {lay.ep}")
        if lay.tp > 1 or lay.expert_tp > 1:
            # 1: experts whole, EP folded over the TP ranks; tp: split like the dense MLP
            # (Megatron's default, said explicitly). LayoutDraft.expert_tp has the model.
            out.append(f"--expert-tensor-parallel-size {lay.expert_tp}")
    if lay.sequence_parallel:
        out.append("--sequence-parallel")
    if tp_comm_overlap(lay.framework, lay.tp, lay.sequence_parallel, lay.precision):
        # Transformer Engine's userbuffers overlap the TP collectives with the GEMMs, as the
        # time model assumed (engine.plan.frameworks.tp_comm_overlap).
        out.append("--tp-comm-overlap")
    return out


def _pipeline_args(lay: Layout, m: ModelDims) -> list[str]:
    """Interleaved stages and lighter end stages."""
    out = []
    uneven = bool(lay.first_stage_layers or lay.last_stage_layers)
    if lay.pp_schedule == PPSchedule.INTERLEAVED and lay.virtual_stages > 1 and uneven:
        # Lighter ends with interleaving: Megatron-Core splits each stage's own layer count
        # into this many chunks (the planner only picks counts every stage divides).
        out.append(f"--num-virtual-stages-per-pipeline-rank {lay.virtual_stages}")
    elif lay.pp_schedule == PPSchedule.INTERLEAVED and lay.virtual_stages > 1:
        # Layout.check_megatron refused a split that leaves a remainder.
        per_chunk = m.layers // (lay.pp * lay.virtual_stages)
        out.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    # Lighter end stages (embedding on the first, LM head on the last): Megatron's own flags,
    # or, where the split is the one that counts the embedding and the loss as layers, the
    # flags that say so (Megatron refuses them beside the first/last counts).
    emb = loss = False
    split = stage_layers(m.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)
    if lay.pp_schedule == PPSchedule.INTERLEAVED and any(n % lay.virtual_stages for n in split):
        # Chunks of units, not of each stage's layers: only the accounted split can say that.
        emb, loss = accounted_ends(m.layers, lay.pp, lay.first_stage_layers, lay.last_stage_layers)
    if emb:
        out.append("--account-for-embedding-in-pipeline-split")
    elif lay.first_stage_layers:
        out.append(f"--decoder-first-pipeline-num-layers {lay.first_stage_layers}")
    if loss:
        out.append("--account-for-loss-in-pipeline-split")
    elif lay.last_stage_layers:
        out.append(f"--decoder-last-pipeline-num-layers {lay.last_stage_layers}")
    return out


def _recompute_args(lay: Layout, m: ModelDims) -> list[str]:
    """Activation recompute as planned."""
    if lay.recompute == Recompute.SELECTIVE:
        return ["--recompute-granularity selective"]
    if lay.recompute == Recompute.MLP:
        # Megatron-Core's selective recompute of named submodules (arguments.py --recompute-modules).
        return ["--recompute-granularity selective", "--recompute-modules mlp"]
    if lay.recompute == Recompute.LIGHT:
        return ["--recompute-granularity selective", f"--recompute-modules {light_modules(m)}"]
    if lay.recompute == Recompute.FULL and lay.recompute_layers:
        # Block method: the first N layers of each stage recompute, the rest keep everything.
        return [
            "--recompute-granularity full",
            "--recompute-method block",
            f"--recompute-num-layers {lay.recompute_layers}",
        ]
    if lay.recompute == Recompute.FULL:
        return [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    return []


def _offload_args(lay: Layout) -> list[str]:
    """Fine-grained activation offloading of the modules the plan moves to host memory
    (:attr:`Layout.offload_modules`; not under full recompute, whose layers keep only their
    input), and the optimizer states between steps where the plan moves them
    (:func:`engine.plan.memory.states_offload_apply`)."""
    out = ["--offload-optimizer-states"] if states_offload_apply(lay) else []
    if not lay.offload_modules or lay.recompute == Recompute.FULL:
        return out
    modules = " ".join(m.value for m in lay.offload_modules)
    return [*out, "--fine-grained-activation-offloading", f"--offload-modules {modules}"]


def _precision_args(lay: Layout, tr: TrainingSpec) -> list[str]:
    """bf16 (and its gradient reduction), FP8's recipe, or fp16."""
    out = []
    if lay.precision in (Precision.BF16, Precision.FP8):
        out.append("--bf16")
        if tr.grads_bf16:
            out.append("--grad-reduce-in-bf16")
    if lay.precision == Precision.FP8:
        out += megatron_fp8_flags(tr.fp8_recipe)
    elif lay.precision == Precision.FP16:
        out.append("--fp16")
    return out


def _sharding_args(lay: Layout) -> list[str]:
    """Megatron-FSDP and the distributed optimizer, by the layout's ZeRO stage."""
    out = []
    if lay.zero_stage >= 3:
        # Megatron-FSDP: parameters, gradients and optimizer states sharded (its required
        # flags, Megatron-LM megatron/core/distributed/fsdp/README.md).
        out += [
            "--use-megatron-fsdp",
            "--data-parallel-sharding-strategy optim_grads_params",
            "--no-gradient-accumulation-fusion",
            "--ckpt-format fsdp_dtensor",
        ]
    if lay.zero_stage >= 1:
        out.append("--use-distributed-optimizer")
    return out


def _shape_args(m: ModelDims) -> list[str]:
    """Layers, widths, heads and query groups."""
    out = [
        f"--num-layers {m.layers}",
        f"--hidden-size {m.hidden}",
        f"--num-attention-heads {m.heads}",
    ]
    if m.kv_heads != m.heads:
        out += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    out.append(f"--ffn-hidden-size {m.dense_ffn or m.ffn}")
    return out


def _moe_args(lay: Layout, m: ModelDims, tr: TrainingSpec) -> list[str]:
    """An MoE model's experts, routing, dispatcher and overlaps, as the time model costs them."""
    out = [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.experts_per_token}"]
    if m.dense_layers:
        # The leading dense layers (--ffn-hidden-size wide), then experts in every layer.
        out += [
            f"--moe-ffn-hidden-size {m.ffn}",
            f"--moe-layer-freq [0]*{m.dense_layers}+[1]*{m.moe_layers}",
        ]
    if m.shared_experts:
        out.append(f"--moe-shared-expert-intermediate-size {m.shared_experts * m.ffn}")
    if m.expert_groups:
        # Group-limited routing as the model was trained (DeepSeek-V3: 4 of 8 groups).
        out += [
            f"--moe-router-num-groups {m.expert_groups}",
            f"--moe-router-group-topk {m.group_topk}",
        ]
    # What the time model assumes: tokens moved by all-to-all or DeepEP (Megatron's
    # default is an all-gather dispatcher) into one grouped GEMM per rank, balanced by the
    # auxiliary loss (Megatron-LM's Mixtral example).
    deepep = tr.moe_dispatcher == MoeDispatcher.DEEPEP
    if deepep:
        out += ["--moe-token-dispatcher-type flex", "--moe-enable-deepep"]
    else:
        out.append("--moe-token-dispatcher-type alltoall")
    if lay.a2a_overlap:
        # One micro-batch's forward beside another's backward, each hiding the other's
        # all-to-all (Megatron-Core's combined 1F1B; the weight gradients wait for it).
        out += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    elif shared_expert_overlap(m, lay.framework, lay.ep, deepep=deepep):
        # The shared expert on a side stream beside the dispatch and combine, as the time
        # model counts it.
        out.append("--moe-shared-expert-overlap")
    if tr.moe_capacity_factor:
        # Token-drop training as the time model assumes it: every expert's input padded to
        # capacity, so the shapes are static and the host never waits for token counts.
        out += [
            f"--moe-expert-capacity-factor {tr.moe_capacity_factor:g}",
            "--moe-pad-expert-input-to-capacity",
        ]
    return out + [
        "--moe-grouped-gemm",
        "--moe-router-load-balancing-type aux_loss",
        "--moe-aux-loss-coeff 1e-2",
    ]


def optimizer_args(optimizer: Optimizer, lay: Layout) -> list[str]:
    """The optimizer as planned (Megatron's default is Adam with fp32 moments): SGD with
    momentum, or, for 8-bit Adam, Megatron's precision-aware optimizer with both moments in FP8
    (Transformer Engine's FusedAdam; Megatron has no bitsandbytes): the two bytes a parameter
    the plan counts, beside the fp32 master copy; AdamW with ``training.moments_bf16``, the same
    optimizer with both moments in bf16 (:func:`engine.plan.memory.moments_bf16_apply`). It lives in the distributed optimizer (or
    Megatron-FSDP); :meth:`Layout.check_megatron` refuses a layout without it over several
    data-parallel ranks rather than have it written as plain Adam."""
    if optimizer == Optimizer.SGD:
        return ["--optimizer sgd", "--sgd-momentum 0.9"]
    if optimizer == Optimizer.ADAMW and moments_bf16_apply(lay):
        return [
            "--use-precision-aware-optimizer",
            "--exp-avg-dtype bf16",
            "--exp-avg-sq-dtype bf16",
        ]
    if optimizer != Optimizer.ADAM8BIT:
        return []
    fp8_moments = [
        "--use-precision-aware-optimizer",
        "--exp-avg-dtype fp8",
        "--exp-avg-sq-dtype fp8",
    ]
    if lay.zero_stage >= 1:
        return fp8_moments
    # One data-parallel rank: the distributed optimizer shards nothing, it only holds them.
    return ["--use-distributed-optimizer", *fp8_moments]


def megatron_args(plan: Plan) -> str:
    """``megatron_args.txt`` text."""
    lay = plan.recommended
    header = [
        "# Megatron-LM (pretrain_gpt.py) arguments for this plan, written by dtrain-tui.",
        f"# tp {lay.tp} x pp {lay.pp} x cp {lay.cp} x dp {lay.dp} = {lay.world_size} GPUs"
        + (f"; ep {lay.ep}, expert tp {lay.expert_tp}" if lay.ep > 1 else ""),
        "# pretrain_gpt.sh runs Megatron-LM with these, adding the data, the tokenizer and",
        "# --save/--load \"$DTRAIN_CKPT_DIR\". By hand: $(grep -v '^#' megatron_args.txt)",
    ]
    note = rotary_note(plan.model)
    if note:
        header.append(note)
    return "\n".join(header + megatron_args_list(plan)) + "\n"


def pretrain_gpt_script(plan: Plan) -> str:
    """``pretrain_gpt.sh`` text: Megatron-LM's ``pretrain_gpt.py`` under torchrun for node
    ``$NODE_RANK`` with ``megatron_args.txt``, the tokenizer and the data."""
    m = plan.model
    launch = plan.spec.launch
    nodes, g = plan.nodes, plan.gpus_per_node
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM pretrain_gpt.py for run {run_name(plan)}, written by dtrain-tui: the real",
        "# training run of this 3D plan (the example trainer the launch backends start is a smoke",
        "# test that trains its data-parallel part only).",
        f"# {nodes} node(s) x {g} GPU(s); on node i run: NODE_RANK=i ./{PRETRAIN_GPT}",
        "# Environment:",
        "#   MEGATRON_LM      your Megatron-LM checkout (required)",
        "#   DATA_PATH        Megatron's --data-path (a preprocessed dataset prefix); unset: mock data",
        f"#   TOKENIZER_MODEL  a Hugging Face tokenizer (name or directory) for {comment_text(m.name)}",
        "#   NODE_RANK        this node's rank (default 0)",
        "#   MASTER_ADDR, MASTER_PORT, TORCHRUN as for launch_node*.sh",
        "set -euo pipefail",
        'cd "$(dirname "${BASH_SOURCE[0]}")"',
        ': "${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout (it holds pretrain_gpt.py)}"',
        "set -a",
        "# shellcheck source=nccl.env",
        "source ./nccl.env",
        "set +a",
    ]
    if plan.recommended.a2a_overlap:
        # The overlapped all-to-all runs on its own CUDA streams beside the compute ones, which
        # one hardware queue would serialise; Megatron MoE launch scripts that turn the overlap
        # on set 32 (and 1 without it).
        lines.append("export CUDA_DEVICE_MAX_CONNECTIONS=32")
    lines += [
        'NODE_RANK="${NODE_RANK:-0}"',
        f'if [[ -z "${{MASTER_PORT:-}}" ]]; then MASTER_PORT={launch.master_port}; fi',
    ]
    addr = master_addr(plan)
    if addr is None:
        lines.append(': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"')
    else:
        lines.append(f'if [[ -z "${{MASTER_ADDR:-}}" ]]; then MASTER_ADDR={shell_word(addr)}; fi')
    lines += [
        "export MASTER_ADDR MASTER_PORT",
        *ckpt_env_lines(plan),
        "CKPT_ARGS=()",
        'if [[ "$DTRAIN_CKPT_EVERY" != 0 ]]; then',
        '  CKPT_ARGS=(--save "$DTRAIN_CKPT_DIR" --load "$DTRAIN_CKPT_DIR")',
        "fi",
        "MEGATRON_ARGS=()",
        "while read -r -a words; do",
        "  [[ ${#words[@]} -eq 0 || ${words[0]} == \\#* ]] && continue",
        '  MEGATRON_ARGS+=("${words[@]}")',
        "done < megatron_args.txt",
        'if [[ -n "${DATA_PATH:-}" ]]; then',
        '  : "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the tokenizer of your data}"',
        '  DATA_ARGS=(--data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer'
        ' --tokenizer-model "$TOKENIZER_MODEL")',
        "else",
        f"  DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size {m.vocab})",
        "fi",
        "exec ${TORCHRUN:-torchrun} \\",
        f'  --nnodes {nodes} --nproc-per-node {g} --node-rank "$NODE_RANK" \\',
        '  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \\',
        '  "$MEGATRON_LM/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "${DATA_ARGS[@]}" \\',
        '  ${CKPT_ARGS[@]+"${CKPT_ARGS[@]}"}',
    ]
    return "\n".join(lines) + "\n"
