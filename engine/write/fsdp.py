"""FSDP settings for FSDP plans: ``fsdp.json`` (read by the example trainer and meant to be read
by the user's own script) and ``accelerate_config.yaml`` for ``accelerate launch --config_file``.

``fsdp.json`` names FSDP2 (``fully_shard``, torch >= 2.4) and carries the FSDP1 equivalents
(``sharding_strategy``, ``backward_prefetch``) so a script on either API finds what it needs.
"""

from __future__ import annotations

from typing import Any

from engine.errors import DtrainError
from engine.plan.names import Framework, Offload, Precision, Recompute, Strategy
from engine.plan.result import Plan
from engine.write.checks import check_batch_product
from engine.write.nodes import master_addr
from engine.write.quoting import json_text
from engine.write.yamlio import dump_yaml

FSDP_VERSION = 2
"""Default: FSDP2 (``fully_shard``, torch >= 2.4); ``write --fsdp-version 1`` for FSDP1 scripts."""

# Hugging Face transformer block classes by architecture (what auto-wrap wraps); the example
# trainer's block is ``Block``.
_BLOCK_CLASS = {
    "llama": "LlamaDecoderLayer",
    "mistral": "MistralDecoderLayer",
    "mixtral": "MixtralDecoderLayer",
    "qwen2": "Qwen2DecoderLayer",
    "qwen2_moe": "Qwen2MoeDecoderLayer",
    "qwen3": "Qwen3DecoderLayer",
    "qwen3_moe": "Qwen3MoeDecoderLayer",
    "gemma": "GemmaDecoderLayer",
    "gemma2": "Gemma2DecoderLayer",
    "phi3": "Phi3DecoderLayer",
    "gpt2": "GPT2Block",
    "gpt_neox": "GPTNeoXLayer",
    "falcon": "FalconDecoderLayer",
    "opt": "OPTDecoderLayer",
    "bloom": "BloomBlock",
    "deepseek_v2": "DeepseekV2DecoderLayer",
    "deepseek_v3": "DeepseekV3DecoderLayer",
}
EXAMPLE_BLOCK = "Block"

_SHARDING = {
    Strategy.FSDP_FULL: "FULL_SHARD",
    Strategy.FSDP_GRAD_OP: "SHARD_GRAD_OP",
    Strategy.FSDP_HYBRID: "HYBRID_SHARD",
    Strategy.DDP: "NO_SHARD",
}


def block_class(plan: Plan) -> str:
    """The transformer block class to wrap: the HF class for a known architecture when the
    user brings their script, the example trainer's ``Block`` otherwise."""
    if plan.spec.launch.script is None:
        return EXAMPLE_BLOCK
    return _BLOCK_CLASS.get(plan.model.arch, EXAMPLE_BLOCK)


def _sharding(plan: Plan) -> str:
    strategy = plan.recommended.strategy
    if strategy not in _SHARDING:
        raise DtrainError(
            f"strategy {strategy.value} is not an FSDP strategy; use fsdp-full, fsdp-grad-op "
            "or fsdp-hybrid",
            field="layout.strategy",
        )
    return _SHARDING[strategy]


def torch_dtype_name(precision: Precision) -> str:
    """``bfloat16`` / ``float16`` / ``float32`` as torch spells them."""
    return {
        Precision.BF16: "bfloat16",
        Precision.FP8: "bfloat16",  # FP8 linears inside bf16 mixed precision
        Precision.FP16: "float16",
        Precision.FP32: "float32",
    }[precision]


def _check_version(version: int) -> int:
    if version not in (1, 2):
        raise DtrainError(f"{version} is not an FSDP version; pass 1 or 2", field="--fsdp-version")
    return version


def fsdp_settings_dict(plan: Plan, *, version: int = FSDP_VERSION) -> dict[str, Any]:
    """The fsdp.json object."""
    _check_version(version)
    lay = plan.recommended
    if lay.framework != Framework.FSDP:
        raise DtrainError(
            f"fsdp.json is for FSDP plans; this plan uses {lay.framework.value}",
            field="layout.framework",
        )
    check_batch_product(lay)
    sharding = _sharding(plan)
    mixed: dict[str, Any] | None = None
    if lay.precision != Precision.FP32:
        dtype = torch_dtype_name(lay.precision)
        # Gradients are reduced in fp32: a bf16 reduce over many ranks loses precision.
        mixed = {"param_dtype": dtype, "reduce_dtype": "float32", "buffer_dtype": dtype}
    mesh: dict[str, int] | None = None
    if sharding == "HYBRID_SHARD":
        mesh = {"replicate": plan.nodes, "shard": plan.gpus_per_node}
    return {
        "fsdp_version": version,
        "sharding_strategy": sharding,
        "reshard_after_forward": sharding in ("FULL_SHARD", "HYBRID_SHARD"),
        "device_mesh": mesh,
        "mixed_precision": mixed,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": [block_class(plan)],
        "backward_prefetch": "BACKWARD_PRE",
        "forward_prefetch": False,
        "limit_all_gathers": True,
        "state_dict_type": "SHARDED_STATE_DICT",
        "activation_checkpointing": lay.recompute != Recompute.NONE,
        "cpu_offload": lay.offload != Offload.NONE,
        "use_orig_params": True,
        "sync_module_states": True,
        "micro_batch": lay.micro_batch,
        "grad_accum": lay.grad_accum,
        "global_batch": lay.global_batch,
        "grad_clip": plan.spec.training.grad_clip,
        # Context parallelism: consecutive groups of cp ranks split each sequence (torchtitan's
        # FSDP2 + CP; the example trainer all-gathers keys and values within the group).
        **({"context_parallel": lay.cp} if lay.cp > 1 else {}),
    }


def fsdp_settings(plan: Plan, *, version: int = FSDP_VERSION) -> str:
    """``fsdp.json`` text."""
    return json_text(fsdp_settings_dict(plan, version=version))


def accelerate_config(plan: Plan, *, version: int = FSDP_VERSION) -> str:
    """``accelerate_config.yaml`` for ``accelerate launch --config_file`` (node 0's view)."""
    s = fsdp_settings_dict(plan, version=version)
    lay = plan.recommended
    fsdp: dict[str, Any] = {
        "fsdp_version": version,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": s["transformer_layer_cls_to_wrap"][0],
    }
    if version == 2:
        fsdp["fsdp_reshard_after_forward"] = s["reshard_after_forward"]
    else:
        # FSDP1 names the strategy and the backward prefetch explicitly.
        fsdp["fsdp_sharding_strategy"] = s["sharding_strategy"]
        fsdp["fsdp_backward_prefetch"] = s["backward_prefetch"]
        fsdp["fsdp_forward_prefetch"] = s["forward_prefetch"]
    fsdp |= {
        "fsdp_state_dict_type": s["state_dict_type"],
        "fsdp_offload_params": s["cpu_offload"],
        "fsdp_activation_checkpointing": s["activation_checkpointing"],
        "fsdp_cpu_ram_efficient_loading": True,
        "fsdp_sync_module_states": True,
        "fsdp_use_orig_params": True,
    }
    addr = master_addr(plan)
    data: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "FSDP",
        "debug": False,
        "downcast_bf16": "no",
        "mixed_precision": "no" if lay.precision == Precision.FP32 else lay.precision.value,
        # FP8 under FSDP: torchao's float8 linears (Accelerate's "AO" backend), as torchtitan.
        **({"fp8_config": {"backend": "AO"}} if lay.precision == Precision.FP8 else {}),
        "num_machines": plan.nodes,
        "num_processes": plan.world_size,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": plan.gpu.dist_backend == "gloo",
        "fsdp_config": fsdp,
    }
    if lay.cp > 1:
        if version != 2:
            raise DtrainError(
                f"context parallelism (cp={lay.cp}) runs under FSDP2 only in Accelerate; "
                "pass --fsdp-version 2",
                field="--fsdp-version",
            )
        # Accelerate's ParallelismConfig: the FSDP2 mesh of dp shards x cp sequence slices.
        data["parallelism_config"] = {
            "parallelism_config_dp_replicate_size": 1,
            "parallelism_config_dp_shard_size": lay.dp,
            "parallelism_config_tp_size": 1,
            "parallelism_config_cp_size": lay.cp,
        }
    if plan.nodes > 1:
        data["main_process_ip"] = addr or "NODE0_ADDRESS"
        data["main_process_port"] = plan.spec.launch.master_port
    header = [
        "# Accelerate config for this FSDP plan, written by dtrain-tui.",
        "#   accelerate launch --config_file accelerate_config.yaml your_script.py",
    ]
    if plan.nodes > 1:
        header.append("# On node i pass --machine_rank i (this file holds node 0's rank).")
    return "\n".join(header) + "\n" + dump_yaml(data)
