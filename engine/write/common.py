"""Helpers every writer shares: the quoting of :mod:`engine.write.quoting` under the names the
writers use (:func:`q`, :func:`single_line`, :func:`check_shell_value`), the batch-product
check, the run name, and the batch / learning-rate advice printed as comments.

Nothing here touches the disk; every function is a pure function of the plan.
"""

from __future__ import annotations

import math
import re

from engine.errors import DtrainError
from engine.plan.names import Precision
from engine.plan.result import Layout, Plan
from engine.plan.specs import ADDR_RE, Host
from engine.write.quoting import comment_text, shell_line, shell_word

DEFAULT_LR = 3e-4
"""AdamW learning rate written when the spec gives none: the common LLM pre-training value."""

_NAME_RE = re.compile(r"[^a-z0-9-]+")


def natural_key(name: str) -> list[object]:
    """Sort key putting ``launch_node2.sh`` before ``launch_node10.sh``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


single_line = comment_text
"""A name for a comment of a script or YAML file: :func:`engine.write.quoting.comment_text`.
(Not :func:`engine.errors.one_line`, which renders an exception.)"""

q = shell_word
"""Quote a value for bash so it reaches the program as one literal word."""

check_shell_value = shell_line
"""Refuse what a script cannot carry on one line (newline, carriage return, NUL); everything
else is quoted with :func:`q` where it is used, so ``; rm -rf ~`` or ``$(id)`` stay literal."""


def check_addr(value: str, field: str) -> str:
    """A host name or IP address: letters, digits, ``. _ - :`` (IPv6 may be bracketed)."""
    if not ADDR_RE.fullmatch(value):
        raise DtrainError(
            f"{value!r} is not a host name or IP address; use letters, digits and . _ - : only "
            "(not starting with -)",
            field=field,
        )
    return value


def run_name(plan: Plan) -> str:
    """A stable run name, e.g. ``llama-2-7b-zero2-1x8``: no timestamp, so output is repeatable."""
    lay = plan.recommended
    raw = f"{plan.model.name}-{lay.strategy.value}-{plan.nodes}x{plan.gpus_per_node}"
    name = _NAME_RE.sub("-", raw.lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:60].strip("-") or "dtrain-run"


def master_addr(plan: Plan) -> str | None:
    """The rendezvous address: the spec's, else the first host, else 127.0.0.1 for one node.
    None for a multi-node plan with no hosts (SkyPilot fills it in at run time)."""
    spec = plan.spec.launch
    if spec.master_addr:
        return check_addr(spec.master_addr, "launch.master_addr")
    hosts = spec.parsed_hosts()
    if hosts:
        return hosts[0].host.strip("[]") if plan.nodes > 1 else "127.0.0.1"
    return "127.0.0.1" if plan.nodes == 1 else None


def hosts(plan: Plan) -> list[Host]:
    """One host per node, checked against the plan's node count."""
    parsed = plan.spec.launch.parsed_hosts()
    if parsed and len(parsed) != plan.nodes:
        raise DtrainError(
            f"{len(parsed)} hosts given for a {plan.nodes}-node plan; "
            f"pass exactly {plan.nodes} (one per node, node 0 first)",
            field="launch.hosts",
        )
    return parsed


def check_batch(layout: Layout) -> None:
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
    return single_line(
        f"{plan.model.name} ({count_text(plan.model.params_total)} params) on {plan.nodes} x "
        f"{plan.gpus_per_node} {plan.gpu.name}; {how}; {degrees}; {lay.precision.value}"
    )


def torch_dtype_name(precision: Precision) -> str:
    """``bfloat16`` / ``float16`` / ``float32`` as torch spells them."""
    return {
        Precision.BF16: "bfloat16",
        Precision.FP8: "bfloat16",  # FP8 linears inside bf16 mixed precision
        Precision.FP16: "float16",
        Precision.FP32: "float32",
    }[precision]


def uses_example_trainer(plan: Plan) -> bool:
    """True when the bundle ships the example trainer as ``train.py``."""
    return plan.spec.launch.script is None


def script_path(plan: Plan) -> str:
    """The training script as node scripts name it (relative to the bundle, or the user's path)."""
    script = plan.spec.launch.script
    if script is None:
        return "train.py"
    if script.startswith("-"):
        # torchrun's parser would take it for one of its own options (--rdzv-endpoint=...).
        raise DtrainError(
            f"{script!r} starts with '-', so torchrun would read it as one of its own options; "
            f"name the script by a path (./{script})",
            field="launch.script",
        )
    return check_shell_value(script, "launch.script")


def script_args(plan: Plan) -> list[str]:
    """The arguments after the training script."""
    args = [check_shell_value(a, "launch.script_args") for a in plan.spec.launch.script_args]
    if uses_example_trainer(plan):
        return ["--bundle", ".", *args]
    return args
