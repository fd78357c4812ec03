"""``ds_config.json`` for DeepSpeed plans: the ZeRO block and its tuning keys, offload, the
precision block, the batch triple, clipping, optimizer and (when asked) a scheduler.

Raw DeepSpeed rejects ``"auto"``; those are written only for the Hugging Face Trainer /
Accelerate integration (``launch.hf_integration``), which fills them in before DeepSpeed sees
the file. The batch product is checked here first (:func:`engine.write.checks.check_batch_product`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from engine.errors import DtrainError
from engine.plan.names import Framework, Offload, Optimizer, Precision
from engine.plan.result import Plan
from engine.write.checks import check_batch_product
from engine.write.learning_rate import lr
from engine.write.quoting import json_text

AUTO = "auto"
BUCKET_BYTES = 500_000_000
"""ZeRO-1/2 reduce and all-gather bucket size (elements): DeepSpeed's own default, 5e8."""
STAGE3_MAX_LIVE = 1_000_000_000
"""Stage-3: most parameters kept gathered at once before releasing (DeepSpeed's default, 1e9)."""


class Scheduler(StrEnum):
    """Learning-rate scheduler written into ds_config.json (``write --scheduler``)."""

    NONE = "none"
    WARMUP = "warmup"
    """WarmupLR: linear warm-up then constant."""
    WARMUP_DECAY = "warmup-decay"
    """WarmupDecayLR: linear warm-up then linear decay to 0 at the last step."""


def _zero_block(plan: Plan, auto: bool) -> dict[str, Any]:
    lay = plan.recommended
    stage = lay.zero_stage
    hidden = plan.model.hidden
    z: dict[str, Any] = {"stage": stage}
    if stage >= 1:
        z["reduce_bucket_size"] = AUTO if auto and stage == 3 else BUCKET_BYTES
    if stage == 1 or stage == 2:
        z["allgather_partitions"] = True
        z["allgather_bucket_size"] = BUCKET_BYTES
        z["reduce_scatter"] = True
    if stage >= 2:
        # Overlap the gradient reduce with backward; copy grads into one contiguous buffer to
        # avoid fragmentation (both DeepSpeed's recommended settings for stage 2 and 3).
        z["overlap_comm"] = True
        z["contiguous_gradients"] = True
    if stage == 3:
        # HF's rule of thumb, which its "auto" resolves to: buckets of hidden^2 elements,
        # keep parameters smaller than 10*hidden resident (norms, biases) instead of gathering.
        z["reduce_bucket_size"] = AUTO if auto else hidden * hidden
        z["stage3_prefetch_bucket_size"] = AUTO if auto else int(0.9 * hidden * hidden)
        z["stage3_param_persistence_threshold"] = AUTO if auto else 10 * hidden
        z["stage3_max_live_parameters"] = STAGE3_MAX_LIVE
        z["stage3_max_reuse_distance"] = STAGE3_MAX_LIVE
        z["sub_group_size"] = STAGE3_MAX_LIVE
        z["stage3_gather_16bit_weights_on_model_save"] = True
    if lay.offload in (Offload.OPTIMIZER, Offload.OPTIMIZER_PARAMS):
        if stage == 0:
            raise DtrainError(
                "optimizer offload needs ZeRO stage 1, 2 or 3; force --zero-stage 2 or drop --offload",
                field="layout.offload",
            )
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if lay.offload == Offload.OPTIMIZER_PARAMS:
        if stage != 3:
            raise DtrainError(
                f"parameter offload needs ZeRO stage 3 (plan has {stage}); "
                "force --zero-stage 3 or use --offload optimizer",
                field="layout.offload",
            )
        z["offload_param"] = {"device": "cpu", "pin_memory": True}
    return z


def _precision_block(precision: Precision, auto: bool) -> dict[str, Any]:
    if precision in (Precision.BF16, Precision.FP8):
        # FP8 linears (Transformer Engine in the model code) run inside bf16 mixed precision.
        return {"bf16": {"enabled": AUTO if auto else True}}
    if precision == Precision.FP16:
        # Dynamic loss scaling (loss_scale 0) starting at 2^16, halving on overflow after
        # `hysteresis` bad steps, doubling after `loss_scale_window` good ones.
        return {
            "fp16": {
                "enabled": AUTO if auto else True,
                "loss_scale": 0,
                "initial_scale_power": 16,
                "loss_scale_window": 1000,
                "hysteresis": 2,
                "min_loss_scale": 1,
            }
        }
    return {}


def _optimizer_block(plan: Plan, auto: bool) -> dict[str, Any] | None:
    opt = plan.spec.training.optimizer
    rate: Any = AUTO if auto else lr(plan)
    if opt == Optimizer.ADAMW:
        return {
            "type": "AdamW",
            "params": {
                "lr": rate,
                "betas": AUTO if auto else [0.9, 0.95],
                "eps": AUTO if auto else 1e-8,
                "weight_decay": AUTO if auto else 0.1,
            },
        }
    if opt == Optimizer.SGD:
        return {"type": "SGD", "params": {"lr": rate, "momentum": 0.9}}
    # adam8bit (bitsandbytes) is not a DeepSpeed optimizer: the script builds it and passes
    # it to deepspeed.initialize(optimizer=...), so the config names none.
    return None


def _scheduler_block(
    plan: Plan, scheduler: Scheduler, warmup_steps: int | None, auto: bool
) -> dict[str, Any] | None:
    if scheduler == Scheduler.NONE:
        return None
    steps = plan.spec.training.steps
    warm = warmup_steps if warmup_steps is not None else max(1, steps // 20)
    if warm > steps:
        raise DtrainError(
            f"warm-up of {warm} steps exceeds the {steps} training steps; pass a smaller value",
            field="--warmup-steps",
        )
    params: dict[str, Any] = {
        "warmup_min_lr": AUTO if auto else 0.0,
        "warmup_max_lr": AUTO if auto else lr(plan),
        "warmup_num_steps": AUTO if auto else warm,
        "warmup_type": "linear",
    }
    if scheduler == Scheduler.WARMUP:
        return {"type": "WarmupLR", "params": params}
    params["total_num_steps"] = AUTO if auto else steps
    return {"type": "WarmupDecayLR", "params": params}


def ds_config_dict(
    plan: Plan,
    *,
    scheduler: Scheduler = Scheduler.NONE,
    warmup_steps: int | None = None,
) -> dict[str, Any]:
    """The ds_config as a dict (key order is the file's order)."""
    lay = plan.recommended
    if lay.framework != Framework.DEEPSPEED:
        raise DtrainError(
            f"ds_config.json is for DeepSpeed plans; this plan uses {lay.framework.value}",
            field="layout.framework",
        )
    check_batch_product(lay)
    auto = plan.spec.launch.hf_integration
    cfg: dict[str, Any] = {
        "train_batch_size": AUTO if auto else lay.global_batch,
        "train_micro_batch_size_per_gpu": AUTO if auto else lay.micro_batch,
        "gradient_accumulation_steps": AUTO if auto else lay.grad_accum,
        "gradient_clipping": AUTO if auto else plan.spec.training.grad_clip,
        "steps_per_print": 100,
        "wall_clock_breakdown": False,
    }
    cfg.update(_precision_block(lay.precision, auto))
    cfg["zero_optimization"] = _zero_block(plan, auto)
    opt = _optimizer_block(plan, auto)
    if opt is not None:
        cfg["optimizer"] = opt
    elif lay.zero_stage > 0:
        # ZeRO refuses an optimizer it has not been tested with unless told otherwise.
        cfg["zero_allow_untested_optimizer"] = True
    sched = _scheduler_block(plan, scheduler, warmup_steps, auto)
    if sched is not None:
        cfg["scheduler"] = sched
    if lay.recompute.value != "none":
        # Only read when the script uses deepspeed.checkpointing; harmless otherwise.
        cfg["activation_checkpointing"] = {
            "partition_activations": lay.tp > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return cfg


def ds_config(
    plan: Plan,
    *,
    scheduler: Scheduler = Scheduler.NONE,
    warmup_steps: int | None = None,
) -> str:
    """``ds_config.json`` text."""
    data = ds_config_dict(plan, scheduler=scheduler, warmup_steps=warmup_steps)
    try:
        # allow_nan=False: DeepSpeed's JSON reader would take "Infinity"/"NaN" as numbers.
        return json_text(data, allow_nan=False)
    except ValueError:
        raise DtrainError(
            "a number in ds_config.json would be inf or nan; pass finite values "
            "(training.grad_clip, training.lr)",
            field="training",
        ) from None
