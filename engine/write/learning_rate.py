"""The learning rate a bundle trains with and the advice printed beside it.

:func:`lr` is the value the DeepSpeed, Megatron and ``plan.json`` writers put in their configs;
:func:`lr_advice_lines` is the scaling advice the README and node scripts print as comments.
"""

from __future__ import annotations

import math

from engine.plan.result import Plan

DEFAULT_LR = 3e-4
"""AdamW learning rate written when the spec gives none: the common LLM pre-training value."""


def lr(plan: Plan) -> float:
    """The learning rate written into configs: the spec's, else :data:`DEFAULT_LR`."""
    return plan.spec.training.lr if plan.spec.training.lr is not None else DEFAULT_LR


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def lr_advice_lines(plan: Plan) -> list[str]:
    """Learning-rate scaling advice for the plan's global batch."""
    tr = plan.spec.training
    gb = plan.recommended.global_batch
    if tr.lr is None:
        return [
            f"LR: none given; configs use {_fmt(DEFAULT_LR)}. If you tuned an LR at batch B, scale it "
            f"by {gb}/B (linear rule; sqrt({gb}/B) is the safer start for Adam) and warm up.",
        ]
    if tr.reference_batch is None or tr.reference_batch == gb:
        return [f"LR: {_fmt(tr.lr)} as given, for this global batch of {gb}."]
    ratio = gb / tr.reference_batch
    return [
        f"LR: {_fmt(tr.lr)} was tuned at batch {tr.reference_batch}; this run uses {gb} (x{ratio:.3g}). "
        f"Linear scaling suggests {_fmt(tr.lr * ratio)}, sqrt scaling {_fmt(tr.lr * math.sqrt(ratio))} "
        "(safer for Adam); warm up over the first steps. Configs use the LR as given.",
    ]
