"""``plan.json`` in the bundle: :meth:`engine.plan.result.Plan.to_json_dict` (the ``plan --json``
schema) plus a ``training`` object with what the example trainer reads directly (seq_len,
steps, lr, grad_clip, batch triple, precision), a ``checkpoint`` object (dir, every: where and
how often the run saves, :func:`checkpoint_section`) and the run ``name``."""

from __future__ import annotations

from typing import Any

from engine.errors import DtrainError
from engine.plan.resilience import shared_ckpt_dir
from engine.plan.result import Plan
from engine.write.learning_rate import lr
from engine.write.naming import run_name
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
    data["checkpoint"] = checkpoint_section(plan)
    return data


CKPT_DIR = "checkpoints"
"""The checkpoint directory when the spec names none: ``checkpoints/`` in the bundle (the
example trainer resolves a relative one against the bundle)."""


def checkpoint_section(plan: Plan) -> dict[str, Any]:
    """plan.json's ``checkpoint`` object: ``dir`` (``training.ckpt_dir`` or
    :data:`CKPT_DIR`) and ``every`` (the plan's :attr:`~engine.plan.result.Resilience.every`:
    ``training.ckpt_every``, else the interval that loses the least work; 0: no checkpoints),
    which the example trainer, the node scripts' ``DTRAIN_CKPT_*`` and the Megatron arguments
    all take."""
    tr = plan.spec.training
    res = plan.resilience
    every = res.every if res is not None else (tr.ckpt_every or 0)
    return {"dir": tr.ckpt_dir or CKPT_DIR, "every": every}


def check_ckpt_dir(plan: Plan) -> None:
    """Refuse, in one line naming ``--ckpt-dir``, a multi-node bundle asked to checkpoint to a
    path not every node reaches: the bundle's own ``checkpoints/`` or a relative path (each
    node would save its shards on its own disk and none could resume), unless the user says
    it is shared (``--ckpt-shared``)."""
    tr = plan.spec.training
    if plan.nodes < 2 or not checkpoint_section(plan)["every"] or shared_ckpt_dir(plan.spec):
        return
    where = f"{tr.ckpt_dir!r} (a relative path)" if tr.ckpt_dir else "the bundle's checkpoints/"
    raise DtrainError(
        f"a {plan.nodes}-node run cannot resume from {where}: each node would save its shards "
        "on its own disk; pass --ckpt-dir /an/absolute/path every node reaches (--ckpt-shared "
        "if the bundle is on shared storage, --ckpt-every 0 for no checkpoints)",
        field="training.ckpt_dir",
    )


def plan_json(plan: Plan) -> str:
    """``plan.json`` text (deterministic: no timestamps)."""
    return json_text(plan_json_dict(plan))
