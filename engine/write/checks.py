"""The checks every writer runs on a plan before it writes a value: an address, the batch
product, the batch the spec asked for and the world size.

Each raises :class:`~engine.errors.DtrainError` naming the spec field and every factor, so
the person sees the whole constraint rather than DeepSpeed's or Megatron's assert later on.
"""

from __future__ import annotations

from engine.errors import DtrainError
from engine.plan.result import Layout, Plan
from engine.plan.specs import ADDR_RE


def check_addr(value: str, field: str) -> str:
    """A host name or IP address: letters, digits, ``. _ - :`` (IPv6 may be bracketed)."""
    if not ADDR_RE.fullmatch(value):
        raise DtrainError(
            f"{value!r} is not a host name or IP address; use letters, digits and . _ - : only "
            "(not starting with -)",
            field=field,
        )
    return value


def check_batch_product(layout: Layout) -> None:
    """The global batch must equal micro_batch x grad_accum x dp, as DeepSpeed and Megatron
    assert. Checked here first so the message names every factor."""
    product = layout.micro_batch * layout.grad_accum * layout.dp
    if product != layout.global_batch:
        raise DtrainError(
            f"global batch {layout.global_batch} != micro_batch {layout.micro_batch} x "
            f"grad_accum {layout.grad_accum} x dp {layout.dp} (= {product}); "
            "pick a --global-batch divisible by micro_batch x dp, or set --micro-batch",
            field="training.global_batch",
        )


def check_spec_batch(plan: Plan) -> None:
    """The plan must train the global batch the spec asked for: a forced micro batch times
    the data-parallel degree may not divide it, and a bundle would then silently train another
    batch (``--micro-batch 1000 --global-batch 8`` trained 2000 per step)."""
    lay = plan.recommended
    asked = plan.spec.training.global_batch
    if lay.global_batch != asked:
        raise DtrainError(
            f"{asked} is not training.micro_batch x grad_accum x dp ({lay.micro_batch} x "
            f"{lay.grad_accum} x {lay.dp} = {lay.global_batch}); pass a --global-batch divisible "
            f"by {lay.micro_batch * lay.dp}, or another --micro-batch",
            field="training.global_batch",
        )


def check_world(plan: Plan) -> None:
    """The layout's degrees must multiply to the machines' world size."""
    lay = plan.recommended
    if lay.world_size != plan.world_size:
        raise DtrainError(
            f"tp {lay.tp} x pp {lay.pp} x dp {lay.dp} x cp {lay.cp} = {lay.world_size} "
            f"!= {plan.nodes} nodes x {plan.gpus_per_node} GPUs = {plan.world_size}; "
            "force degrees whose product is the GPU count",
            field="layout",
        )
