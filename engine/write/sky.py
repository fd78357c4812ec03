"""``sky.yaml``: a SkyPilot task for the plan: ``num_nodes``, ``resources.accelerators``, the
set-up command, and a ``run`` section that starts torchrun from SkyPilot's ``SKYPILOT_*``
variables (node 0's IP from ``SKYPILOT_NODE_IPS`` is the rendezvous address).

A multi-node plan that assumes an RDMA fabric (InfiniBand, EFA, RoCE) asks for it with
``resources.network_tier: best`` (SkyPilot >= 0.10, which the ``sky`` extra requires): without
it SkyPilot provisions ordinary networking and NCCL falls back to TCP, far below the plan's
communication estimates. Called by the bundle writer; the text is loaded by ``sky.Task.from_yaml``
in the tests and by the SkyPilot backend.

Launch it from the bundle directory: ``sky launch -c NAME sky.yaml`` (``workdir: .`` syncs the
bundle to every node). ``remote_setup`` is copied into ``setup`` verbatim: it is a command by
design (e.g. ``source ~/venv/bin/activate``), the one spec field that is not quoted.
"""

from __future__ import annotations

from typing import Any

from engine.plan.names import Framework, NetworkTier
from engine.plan.result import Plan
from engine.write.launch_scripts import AGENT_SCRIPT, PREFLIGHT_SCRIPT, PREFLIGHT_VAR, TEE_ALL
from engine.write.naming import run_name
from engine.write.quoting import comment_text, env_name, shell_word
from engine.write.script import script_args, script_path
from engine.write.summary import effective_batch_lines, plan_summary
from engine.write.yamlio import dump_yaml

# Catalog key -> SkyPilot accelerator name (`sky show-gpus`).
_SKY_ACCELERATOR = {
    "v100-32gb": "V100-32GB",
    "a100-40gb": "A100",
    "a100-80gb": "A100-80GB",
    "h100-sxm": "H100",
    "h100-pcie": "H100",
    "h200": "H200",
    "b200": "B200",
    "mi300x": "MI300X",
    "l40s": "L40S",
    "a10g": "A10G",
    "l4": "L4",
}
# Tiers the plan's communication model prices as RDMA; a single node never leaves the box.
_FAST_TIERS = (
    NetworkTier.IB,
    NetworkTier.IB_HDR,
    NetworkTier.IB_NDR,
    NetworkTier.EFA,
    NetworkTier.ROCE,
)


def sky_accelerator(plan: Plan) -> str | None:
    """``NAME:COUNT`` for ``resources.accelerators``; None for CPU plans."""
    if plan.gpu.dist_backend == "gloo":
        return None
    name = _SKY_ACCELERATOR.get(plan.gpu.key, plan.gpu.key.upper())
    return f"{name}:{plan.gpus_per_node}"


def wants_best_network(plan: Plan) -> bool:
    """True when the plan's numbers assume an inter-node RDMA fabric SkyPilot must ask for."""
    return plan.nodes > 1 and plan.spec.network.tier in _FAST_TIERS


def _setup(plan: Plan) -> str:
    setup = plan.spec.launch.remote_setup
    if setup:
        return setup + "\n"
    pkgs = ["'torch>=2.4'"]
    if plan.recommended.framework == Framework.DEEPSPEED:
        pkgs.append("deepspeed")
    return f"pip install {' '.join(pkgs)}\n"


def _run(plan: Plan) -> str:
    gloo = plan.gpu.dist_backend == "gloo"
    nproc = str(plan.gpus_per_node) if gloo else '"$SKYPILOT_NUM_GPUS_PER_NODE"'
    # Through the bundle's rank agent, as the node scripts start every rank.
    words = " ".join([AGENT_SCRIPT, '"$ENTRY"', *(shell_word(w) for w in script_args(plan))])
    return (
        "\n".join(
            [
                "set -euo pipefail",
                "set -a; source ./nccl.env; set +a",
                f"# {PREFLIGHT_VAR}=1 (set by `dtrain-tui preflight`): this same world runs the",
                f"# bundle's {PREFLIGHT_SCRIPT} (all-reduce sweep, node pairs, GEMM) instead.",
                f"ENTRY={shell_word(script_path(plan))}",
                f'if [[ "${{{PREFLIGHT_VAR}:-}}" == 1 ]]; then ENTRY={PREFLIGHT_SCRIPT}; fi',
                'MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"',
                "export MASTER_ADDR",
                "mkdir -p logs",
                "exec torchrun \\",
                '  --nnodes "$SKYPILOT_NUM_NODES" \\',
                f"  --nproc-per-node {nproc} \\",
                '  --node-rank "$SKYPILOT_NODE_RANK" \\',
                '  --master-addr "$MASTER_ADDR" \\',
                '  --master-port "$MASTER_PORT" \\',
                # SkyPilot's managed-job recovery restarts the task (resources.job_recovery);
                # torchrun's own restarts stay off, as in the node scripts.
                "  --max-restarts 0 \\",
                "  --log-dir logs \\",
                f"  --tee {TEE_ALL} \\",
                f"  {words}",
            ]
        )
        + "\n"
    )


def sky_task_dict(plan: Plan) -> dict[str, Any]:
    """The task as a dict, in file order."""
    launch = plan.spec.launch
    resources: dict[str, Any] = {}
    if launch.sky_cloud:
        resources["cloud"] = launch.sky_cloud
    acc = sky_accelerator(plan)
    if acc is None:
        resources["cpus"] = f"{plan.gpus_per_node}+"
    else:
        resources["accelerators"] = acc
    if wants_best_network(plan):
        resources["network_tier"] = "best"
    if launch.max_restarts:
        # ``sky jobs launch``: a task that fails is restarted up to N times (SkyPilot's
        # managed-job recovery), its ranks resuming from the newest complete checkpoint.
        resources["job_recovery"] = {"max_restarts_on_errors": launch.max_restarts}
    envs: dict[str, str] = {"MASTER_PORT": str(launch.master_port)}
    envs.update({env_name(k): launch.env[k] for k in sorted(launch.env)})
    return {
        "name": launch.sky_cluster or run_name(plan),
        "num_nodes": plan.nodes,
        "resources": resources,
        "workdir": ".",
        "envs": envs,
        "setup": _setup(plan),
        "run": _run(plan),
    }


def sky_yaml(plan: Plan) -> str:
    """``sky.yaml`` text."""
    header = [
        "# SkyPilot task written by dtrain-tui. From the bundle directory:",
        f"#   sky launch -c {run_name(plan)} sky.yaml",
        *(
            [
                f"# or, restarted up to {plan.spec.launch.max_restarts} time(s) on failure "
                "(resources.job_recovery), as a managed job:",
                "#   sky jobs launch sky.yaml",
            ]
            if plan.spec.launch.max_restarts
            else []
        ),
        f"# Plan: {plan_summary(plan)}.",
        *(f"# {line}" for line in effective_batch_lines(plan)),
    ]
    if wants_best_network(plan):
        header.append(
            f"# Network: the plan assumes {plan.spec.network.tier.value}; `network_tier: best` "
            "asks SkyPilot (>= 0.10) for it (InfiniBand / EFA / GPUDirect)."
        )
    # A name in a comment could end it at any character YAML reads as a line break.
    comments = [comment_text(line) for line in header]
    return "\n".join(comments) + "\n" + dump_yaml(sky_task_dict(plan))
