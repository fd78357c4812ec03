"""``launch_node{i}.sh``: one bash script per node that starts that node's ranks with torchrun.

Each script runs from its bundle directory, reads ``nccl.env``, and execs
``${TORCHRUN:-torchrun}`` with ``--tee 3`` so every line carries torchrun's
``[default<local_rank>]:`` prefix (global rank = node_rank * gpus_per_node + local_rank).

Rendezvous: one node uses c10d on 127.0.0.1; several nodes use torchrun's static rendezvous at
``MASTER_ADDR:MASTER_PORT`` with an explicit ``--node-rank``, because c10d hands out node ranks
in join order, and the launch backends, the hostfile and the monitor all number ranks by node
position. ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment override the written values
(the local backend picks a free port this way). ``DTRAIN_PREFLIGHT=1`` runs the bundle's
``preflight.py`` in place of the training script (``dtrain-tui preflight``), in the same world.

Every rank starts through the bundle's rank agent (:data:`AGENT_SCRIPT`, ``torchrun ...
dtrain_agent.py SCRIPT ARGS...``), which runs the script as ``__main__`` with its own
arguments and answers the launcher's diagnosis request and samples telemetry, whatever the
script (``engine/trainer/agent.py``).

Every spec value in a script is shell-quoted (:func:`engine.write.quoting.shell_word`) or refused.
"""

from __future__ import annotations

from engine.plan.names import Framework
from engine.plan.result import Plan
from engine.write.learning_rate import lr_advice_lines
from engine.write.naming import run_name
from engine.write.nodes import hosts, master_addr
from engine.write.quoting import comment_text, shell_word
from engine.write.script import script_args, script_path
from engine.write.summary import effective_batch_lines, plan_summary

TEE_ALL = 3
"""torchrun ``--tee 3``: copy both stdout (1) and stderr (2) of every rank, prefixed."""


PREFLIGHT_VAR = "DTRAIN_PREFLIGHT"
"""Set to 1 in a node script's environment, it runs :data:`PREFLIGHT_SCRIPT` in the run's world."""
PREFLIGHT_SCRIPT = "preflight.py"
"""The rank-side preflight (``engine/trainer/preflight.py``), in every bundle."""
AGENT_SCRIPT = "dtrain_agent.py"
"""The rank agent (``engine/trainer/agent.py``), in every bundle: torchrun's training script,
the real script and its arguments after it (a script never starts with ``-``: refused by
:func:`engine.write.script.script_path`, so the agent never takes it for an option of its own)."""


def node_script_name(node: int) -> str:
    return f"launch_node{node}.sh"


def torchrun_argv(plan: Plan, node: int) -> list[str]:
    """The words after ``torchrun`` for ``node``, as bash will see them: ``$MASTER_ADDR`` and
    ``$MASTER_PORT`` are left as variables (bound by the script), everything else is literal."""
    argv = [
        "--nnodes",
        str(plan.nodes),
        "--nproc-per-node",
        str(plan.gpus_per_node),
        "--node-rank",
        str(node),
    ]
    if plan.nodes == 1:
        argv += [
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:$MASTER_PORT",
            "--rdzv-id",
            run_name(plan),
        ]
    else:
        argv += ["--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT"]
    argv += [
        # 0: the launcher's restart policy (engine/launch/restart.py, ``--max-restarts``)
        # restarts the whole run from its newest checkpoint; torchrun's own would restart one
        # node's workers from a rendezvous the other nodes have left.
        "--max-restarts",
        "0",
        "--log-dir",
        "logs",
        "--tee",
        str(TEE_ALL),
        AGENT_SCRIPT,
        script_path(plan),
        *script_args(plan),
    ]
    return argv


def _render_word(word: str) -> str:
    if word in ("$MASTER_ADDR", "$MASTER_PORT"):
        return f'"{word}"'
    if word == "127.0.0.1:$MASTER_PORT":
        return '"127.0.0.1:${MASTER_PORT}"'
    return shell_word(word)


CKPT_VARS = ("DTRAIN_CKPT_DIR", "DTRAIN_CKPT_EVERY", "DTRAIN_RESUME")
"""What a node script tells every rank's script of checkpoints: where to save (an absolute
path), every how many steps (0: never), and from where to resume (``auto``: the newest
complete checkpoint in the directory; ``never``; or a checkpoint's path)."""


def ckpt_env_lines(plan: Plan) -> list[str]:
    """Bash lines that export :data:`CKPT_VARS` from plan.json's checkpoint section, each
    unless already set (the launcher's restart sets ``DTRAIN_RESUME``; a user's own
    ``DTRAIN_CKPT_DIR`` wins). A relative directory is made absolute against the bundle."""
    from engine.write.plan_json import checkpoint_section

    section = checkpoint_section(plan)
    where = str(section["dir"])
    value = shell_word(where) if where.startswith("/") else f'"$PWD"/{shell_word(where)}'
    lines = [
        "# Checkpoints (plan.json's checkpoint section): where to save, how often, where to",
        "# resume from; any of them set before this script wins. README.md: Checkpoints.",
    ]
    for name, val in zip(CKPT_VARS, (value, str(section["every"]), "auto"), strict=True):
        lines.append(f'if [[ -z "${{{name}:-}}" ]]; then {name}={val}; fi')
    lines.append(f"export {' '.join(CKPT_VARS)}")
    return lines


def node_script(plan: Plan, node: int) -> str:
    """``launch_node{node}.sh`` text."""
    if not 0 <= node < plan.nodes:
        raise ValueError(f"node {node} is outside 0..{plan.nodes - 1}")
    launch = plan.spec.launch
    parsed = hosts(plan)
    addr = master_addr(plan)
    g = plan.gpus_per_node
    first, last = node * g, node * g + g - 1
    where = f" on {comment_text(str(parsed[node]))}" if parsed else ""
    lines = [
        "#!/usr/bin/env bash",
        f"# dtrain-tui launch script for run {run_name(plan)}: node {node} of {plan.nodes}{where}, "
        f"global ranks {first}-{last}.",
        f"# Plan: {plan_summary(plan)}.",
        *(f"# {line}" for line in effective_batch_lines(plan)),
        *(f"# {line}" for line in lr_advice_lines(plan)),
    ]
    if plan.nodes > 1:
        lines.append(
            "# Start launch_node0.sh .. launch_node"
            f"{plan.nodes - 1}.sh, one per node, in any order; node 0 hosts the rendezvous."
        )
    overrides = "MASTER_ADDR, MASTER_PORT" if plan.nodes > 1 else "MASTER_PORT"
    lines += [
        f"# Environment overrides: {overrides}, TORCHRUN (e.g. 'python -m torch.distributed.run').",
        "set -euo pipefail",
        'cd "$(dirname "${BASH_SOURCE[0]}")"',
        "set -a",
        "# shellcheck source=nccl.env",
        "source ./nccl.env",
        "set +a",
    ]
    if plan.nodes > 1:
        if addr is None:
            lines.append(
                ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0 (no hosts in the spec)}"'
            )
        else:
            lines.append(
                f'if [[ -z "${{MASTER_ADDR:-}}" ]]; then MASTER_ADDR={shell_word(addr)}; fi'
            )
    lines.append(f'if [[ -z "${{MASTER_PORT:-}}" ]]; then MASTER_PORT={launch.master_port}; fi')
    lines.append("export MASTER_ADDR MASTER_PORT" if plan.nodes > 1 else "export MASTER_PORT")
    lines += ckpt_env_lines(plan)
    megatron = plan.recommended.framework == Framework.MEGATRON and launch.script is not None
    if megatron:
        lines += [
            "# Megatron-LM arguments for this plan (one flag and its value per line).",
            "MEGATRON_ARGS=()",
            "while read -r -a words; do",
            "  [[ ${#words[@]} -eq 0 || ${words[0]} == \\#* ]] && continue",
            '  MEGATRON_ARGS+=("${words[@]}")',
            "done < megatron_args.txt",
        ]
    lines.append("mkdir -p logs")
    argv = torchrun_argv(plan, node)
    # Options as "--flag value" per line, then the agent, the script and its arguments on the
    # last line.
    split = argv.index("--tee") + 2
    body = [" ".join(_render_word(w) for w in argv[i : i + 2]) for i in range(0, split, 2)]
    split += 1  # AGENT_SCRIPT
    lines += [
        f"# {PREFLIGHT_VAR}=1 (set by `dtrain-tui preflight`): this same world runs the bundle's",
        f"# {PREFLIGHT_SCRIPT} (all-reduce sweep, node pairs, GEMM) instead of the training script.",
        f"ENTRY={shell_word(argv[split])}",
        f'if [[ "${{{PREFLIGHT_VAR}:-}}" == 1 ]]; then ENTRY={PREFLIGHT_SCRIPT}; fi',
    ]
    tail = " ".join([AGENT_SCRIPT, '"$ENTRY"', *(shell_word(w) for w in argv[split + 1 :])])
    if megatron:
        tail += ' "${MEGATRON_ARGS[@]}"'
    body.append(tail)
    lines.append("exec ${TORCHRUN:-torchrun} \\")
    lines += [f"  {part} \\" for part in body[:-1]]
    lines.append(f"  {body[-1]}")
    return "\n".join(lines) + "\n"


def node_scripts(plan: Plan) -> dict[str, str]:
    """Every node's script, by file name."""
    return {node_script_name(i): node_script(plan, i) for i in range(plan.nodes)}
