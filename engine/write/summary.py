"""The plan told in a line or two, for the comments heading a script, the README and the
``write`` command's output: the one-line summary and what one optimizer step consumes.
"""

from __future__ import annotations

from engine.plan.result import Plan
from engine.write.quoting import comment_text


def count_text(n: int) -> str:
    """``6.74B``, ``350M``, ``0.56M``: a parameter count for people."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    return f"{n / 1e6:.3g}M"


def plan_summary(plan: Plan) -> str:
    """One line: model, machines, strategy and degrees."""
    lay = plan.recommended
    degrees = f"tp={lay.tp} pp={lay.pp} dp={lay.dp}"
    if lay.cp > 1:
        degrees += f" cp={lay.cp}"
    if lay.ep > 1:
        degrees += f" ep={lay.ep}"
    how = lay.strategy.value
    if lay.framework.value != how:
        how += f" via {lay.framework.value}"
    return comment_text(
        f"{plan.model.name} ({count_text(plan.model.params_total)} params) on {plan.nodes} x "
        f"{plan.gpus_per_node} {plan.gpu.name}; {how}; {degrees}; {lay.precision.value}"
    )


def effective_batch_lines(plan: Plan) -> list[str]:
    """What one optimizer step consumes, spelled out."""
    lay = plan.recommended
    seq = plan.spec.training.seq_len
    tokens = lay.global_batch * seq
    return [
        f"Effective batch: micro_batch {lay.micro_batch} x grad_accum {lay.grad_accum} x "
        f"dp {lay.dp} = {lay.global_batch} sequences = {tokens:,} tokens per optimizer step "
        f"(seq_len {seq}).",
    ]
