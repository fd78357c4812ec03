"""``plan.json`` in the bundle: :meth:`engine.plan.result.Plan.to_json_dict` (the ``plan --json``
schema) plus a ``training`` object with what the example trainer reads directly (seq_len,
steps, lr, grad_clip, batch triple, precision) and the run ``name``."""

from __future__ import annotations

from typing import Any

from engine.plan.result import Plan
from engine.write.common import lr, run_name
from engine.write.quoting import json_text


def plan_json_dict(plan: Plan) -> dict[str, Any]:
    """The plan.json object."""
    data = plan.to_json_dict()
    lay = plan.recommended
    tr = plan.spec.training
    data["name"] = run_name(plan)
    data["framework"] = lay.framework.value
    data["training"] = {
        "seq_len": tr.seq_len,
        "steps": tr.steps,
        "lr": lr(plan),
        "grad_clip": tr.grad_clip,
        "micro_batch": lay.micro_batch,
        "grad_accum": lay.grad_accum,
        "global_batch": lay.global_batch,
        "precision": lay.precision.value,
        "optimizer": tr.optimizer.value,
    }
    return data


def plan_json(plan: Plan) -> str:
    """``plan.json`` text (deterministic: no timestamps)."""
    return json_text(plan_json_dict(plan))
