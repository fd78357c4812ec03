"""``megatron_args.txt`` for 3D plans: Megatron-LM's ``pretrain_gpt.py`` arguments for the
parallel degrees, batch, recompute, precision and model shape. One flag (and its value) per
line; ``#`` lines are comments. The node scripts read it into an array when the plan runs the
user's Megatron script."""

from __future__ import annotations

from engine.errors import DtrainError
from engine.plan.result import Plan
from engine.plan.specs import PPSchedule, Precision, Recompute
from engine.write.common import check_batch, lr


def megatron_args_list(plan: Plan) -> list[str]:
    """The argument lines, without comments."""
    lay = plan.recommended
    m = plan.model
    tr = plan.spec.training
    check_batch(lay)
    out = [
        f"--tensor-model-parallel-size {lay.tp}",
        f"--pipeline-model-parallel-size {lay.pp}",
        f"--context-parallel-size {lay.cp}",
    ]
    if m.is_moe:
        out.append(f"--expert-model-parallel-size {lay.ep}")
    if lay.sequence_parallel:
        if lay.tp == 1:
            raise DtrainError(
                "sequence parallelism needs tp > 1; drop --sequence-parallel or force --tp",
                field="layout.sequence_parallel",
            )
        out.append("--sequence-parallel")
    if lay.pp_schedule == PPSchedule.INTERLEAVED and lay.virtual_stages > 1:
        per_chunk, rem = divmod(m.layers, lay.pp * lay.virtual_stages)
        if rem or per_chunk == 0:
            raise DtrainError(
                f"{m.layers} layers do not split into pp {lay.pp} x {lay.virtual_stages} "
                "virtual stages; force a --virtual-stages that divides layers/pp",
                field="layout.virtual_stages",
            )
        out.append(f"--num-layers-per-virtual-pipeline-stage {per_chunk}")
    # Lighter end stages (embedding on the first, LM head on the last): Megatron's own flags.
    if lay.first_stage_layers:
        out.append(f"--decoder-first-pipeline-num-layers {lay.first_stage_layers}")
    if lay.last_stage_layers:
        out.append(f"--decoder-last-pipeline-num-layers {lay.last_stage_layers}")
    out += [
        f"--micro-batch-size {lay.micro_batch}",
        f"--global-batch-size {lay.global_batch}",
    ]
    if lay.recompute == Recompute.SELECTIVE:
        out.append("--recompute-granularity selective")
    elif lay.recompute == Recompute.FULL:
        out += [
            "--recompute-granularity full",
            "--recompute-method uniform",
            "--recompute-num-layers 1",
        ]
    if lay.precision == Precision.BF16:
        out.append("--bf16")
    elif lay.precision == Precision.FP16:
        out.append("--fp16")
    if lay.zero_stage >= 1:
        out.append("--use-distributed-optimizer")
    out += [
        f"--num-layers {m.layers}",
        f"--hidden-size {m.hidden}",
        f"--num-attention-heads {m.heads}",
    ]
    if m.kv_heads != m.heads:
        out += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    out.append(f"--ffn-hidden-size {m.ffn}")
    if m.gated_mlp:
        out.append("--swiglu")
    if m.is_moe:
        out += [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.experts_per_token}"]
    if not m.tie_embeddings:
        out.append("--untie-embeddings-and-output-weights")
    out += [
        f"--seq-length {tr.seq_len}",
        f"--max-position-embeddings {max(tr.seq_len, m.max_position or 0)}",
        f"--lr {lr(plan):g}",
        f"--clip-grad {tr.grad_clip:g}",
        f"--train-iters {tr.steps}",
    ]
    return out


def megatron_args(plan: Plan) -> str:
    """``megatron_args.txt`` text."""
    lay = plan.recommended
    header = [
        "# Megatron-LM (pretrain_gpt.py) arguments for this plan, written by dtrain-tui.",
        f"# tp {lay.tp} x pp {lay.pp} x cp {lay.cp} x dp {lay.dp} = {lay.world_size} GPUs"
        + (f"; ep {lay.ep} inside dp" if lay.ep > 1 else ""),
        "# Add your data, tokenizer and checkpoint flags; pass with: $(grep -v '^#' megatron_args.txt)",
    ]
    return "\n".join(header + megatron_args_list(plan)) + "\n"
