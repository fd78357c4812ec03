"""``slurm.sbatch``: a Slurm batch script that runs the bundle's node scripts, one Slurm task per
node, so a user can ``sbatch slurm.sbatch`` from the bundle directory by hand and
``dtrain-tui launch --backend slurm`` submits the very same file.

Called by :func:`engine.write.bundle.render_bundle` (every bundle has one) and by the Slurm
launch backend (:mod:`engine.launch.slurm`), which adds the launch's overrides as ``sbatch``
options built by :func:`sbatch_options` (options on the command line win over ``#SBATCH`` lines).

The script asks for ``--nodes`` nodes with one task each (torchrun starts the node's ranks), GPUs
per node for GPU plans (CPUs per task for CPU plans), and the spec's time limit, partition,
account, QoS, constraint and reservation. The head node is the first of
``scontrol show hostnames "$SLURM_JOB_NODELIST"``; its address is the node's ``NodeAddr`` from
``scontrol show node`` (node names need not resolve), unless ``MASTER_ADDR`` is given. ``srun
--kill-on-bad-exit=1`` starts ``launch_node$SLURM_NODEID.sh`` on every node, each task's stdout
and stderr in ``logs/slurm-<job>_<task>.out`` / ``.err`` (appended: a requeued job keeps the first
attempt's lines). The batch script's own output (``slurm-<job>.out``) ends with a line
``[dtrain-tui] srun exit code N``. Every spec value is shell-quoted or checked by
:class:`engine.plan.specs.LaunchSpec`.
"""

from __future__ import annotations

from engine.plan.result import Plan
from engine.plan.specs import LaunchSpec
from engine.write.launch_scripts import node_script_name
from engine.write.naming import run_name
from engine.write.quoting import comment_text, shell_line, shell_word
from engine.write.summary import effective_batch_lines, plan_summary

SBATCH_NAME = "slurm.sbatch"
TASK_LOG_DIR = "logs"
"""Where srun writes each task's output, relative to the bundle directory."""
NODE_REAPER = ".dtrain-reaper.py"
"""The child subreaper (``engine/launch/reaper.py --node``) as the launcher puts it beside a
node's script (Slurm: in the run's bundle; SSH: in the tar each node gets). Each node's script
runs under it when it is there and python3 can run it: a daemon the script leaves in a session of
its own (``setsid env -i``) is stopped at its end, as on a local node."""
REAPER_PYTHON_OK = 'python3 -I -c "import sys; sys.exit(sys.version_info < (3, 11))" 2>/dev/null'
"""Shell: a python3 the reaper runs on is there (stdlib only, 3.11+)."""
NO_REAPER = (
    "[dtrain-tui] node {node}: no python3 >= 3.11 or no node reaper there: a daemon the run "
    "leaves in a session of its own (setsid env -i) is not stopped at its end"
)
"""The one line a node says when its script runs without the reaper."""
END_MARK = "[dtrain-tui] srun exit code "
"""The batch output's last line starts with this, then srun's exit code."""


def task_log_name(job_id: str | int, task: int, stream: str) -> str:
    """``logs/slurm-<job>_<task>.out`` (stdout) or ``.err`` (stderr), as srun names them."""
    ext = "out" if stream == "stdout" else "err"
    return f"{TASK_LOG_DIR}/slurm-{job_id}_{task}.{ext}"


def batch_log_name(job_id: str | int) -> str:
    """The batch script's own output file (``#SBATCH --output``)."""
    return f"slurm-{job_id}.out"


_OPTIONAL = (
    ("partition", "slurm_partition"),
    ("account", "slurm_account"),
    ("qos", "slurm_qos"),
    ("constraint", "slurm_constraint"),
    ("reservation", "slurm_reservation"),
    ("time", "slurm_time_limit"),
)


def sbatch_options(launch: LaunchSpec) -> list[str]:
    """``--partition=…``, ``--time=…``, … for each Slurm field the launch spec sets, in the
    order the script writes them."""
    out = []
    for opt, fld in _OPTIONAL:
        value = getattr(launch, fld)
        if value is not None:
            out.append(f"--{opt}={shell_line(str(value), f'launch.{fld}')}")
    return out


def _directives(plan: Plan) -> list[str]:
    opts = [
        f"--job-name={run_name(plan)}",
        f"--nodes={plan.nodes}",
        "--ntasks-per-node=1",
    ]
    if plan.gpu.dist_backend == "gloo":
        # One task per node runs torchrun, which starts gpus_per_node CPU ranks.
        opts.append(f"--cpus-per-task={plan.gpus_per_node}")
    else:
        opts.append(f"--gpus-per-node={plan.gpus_per_node}")
    opts += sbatch_options(plan.spec.launch)
    if plan.spec.launch.max_restarts:
        # The script requeues itself on a failed srun (see _requeue), so a plain sbatch run
        # survives too; the batch output is appended across restarts.
        opts += ["--requeue", "--open-mode=append"]
    opts.append(f"--output={batch_log_name('%j')}")
    # sbatch reads #SBATCH lines literally (no shell): the values are checked words.
    return [f"#SBATCH {o}" for o in opts]


def _body(plan: Plan) -> list[str]:
    launch = plan.spec.launch
    lines = [
        "set -euo pipefail",
        *(['export DTRAIN_RESUME="${DTRAIN_RESUME:-auto}"'] if launch.max_restarts else []),
        "# sbatch runs a copy of this script in the job's working directory: the bundle.",
        f"if [[ ! -f {node_script_name(0)} ]]; then",
        '  echo "slurm.sbatch: no launch_node0.sh in $PWD; run sbatch from the bundle directory" >&2',
        "  exit 2",
        "fi",
    ]
    if launch.remote_setup:
        lines += [
            "# remote_setup from the spec, verbatim (srun's tasks inherit what it sets).",
            shell_line(launch.remote_setup, "launch.remote_setup"),
        ]
    lines += [
        'HEAD_NODE="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
        "# Node names need not resolve: the rendezvous address is the head node's NodeAddr.",
        'if [[ -z "${MASTER_ADDR:-}" ]]; then',
        '  MASTER_ADDR="$(scontrol show node "$HEAD_NODE" | tr " " "\\n" | sed -n "s/^NodeAddr=//p" | head -n1)"',
        '  MASTER_ADDR="${MASTER_ADDR:-$HEAD_NODE}"',
        "fi",
        f'if [[ -z "${{MASTER_PORT:-}}" ]]; then MASTER_PORT={launch.master_port}; fi',
        "export MASTER_ADDR MASTER_PORT",
        f"mkdir -p {TASK_LOG_DIR}",
        'echo "[dtrain-tui] slurm job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on '
        '$SLURM_JOB_NODELIST; rendezvous $MASTER_ADDR:$MASTER_PORT on $HEAD_NODE"',
        "# One task per node; the first task to fail ends every other one.",
        'srun --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 \\',
        "  --open-mode=append \\",
        f"  --output={shell_word(task_log_name('%j', 0, 'stdout').replace('_0.', '_%t.'))} \\",
        f"  --error={shell_word(task_log_name('%j', 0, 'stderr').replace('_0.', '_%t.'))} \\",
        # Under the child subreaper the launcher puts beside the scripts (daemons a script
        # leaves behind are stopped at its end), else the script alone, said in one line.
        f'  bash -c \'n="./launch_node${{SLURM_NODEID}}.sh"; if [[ -f {NODE_REAPER} ]] && '
        f'{REAPER_PYTHON_OK}; then exec python3 -I {NODE_REAPER} --node bash "$n"; fi; '
        f'echo "{NO_REAPER.format(node="$SLURM_NODEID")}" >&2; exec bash "$n"\' '
        "&& rc=0 || rc=$?",
        *_requeue(launch.max_restarts),
        f'echo "{END_MARK}$rc"',
        'exit "$rc"',
    ]
    return lines


def _requeue(max_restarts: int) -> list[str]:
    """A failed srun requeues the job itself up to ``max_restarts`` times (Slurm counts them in
    SLURM_RESTART_COUNT); the requeued job's ranks resume from the newest complete checkpoint
    in the bundle (DTRAIN_RESUME=auto, the trainer's default)."""
    if not max_restarts:
        return []
    return [
        f'if [[ "$rc" -ne 0 && "${{SLURM_RESTART_COUNT:-0}}" -lt {max_restarts} ]]; then',
        '  echo "[dtrain-tui] srun failed (exit $rc): requeueing job $SLURM_JOB_ID (restart '
        f"$(( ${{SLURM_RESTART_COUNT:-0}} + 1 )) of {max_restarts}), resuming from the newest "
        'complete checkpoint"',
        '  if scontrol requeue "$SLURM_JOB_ID"; then exit "$rc"; fi',
        '  echo "[dtrain-tui] scontrol requeue failed; the job ends here" >&2',
        "fi",
    ]


def slurm_sbatch(plan: Plan) -> str:
    """``slurm.sbatch`` text."""
    header = [
        "#!/usr/bin/env bash",
        f"# Slurm batch script written by dtrain-tui for run {comment_text(run_name(plan))}. "
        "From the bundle directory:",
        f"#   sbatch {SBATCH_NAME}",
        f"# Plan: {plan_summary(plan)}.",
        *(f"# {line}" for line in effective_batch_lines(plan)),
        "# Each node's output: logs/slurm-<job>_<node>.out and .err; options given to sbatch on",
        "# the command line (e.g. --partition, --time) override the lines below.",
    ]
    return "\n".join([*header, *_directives(plan), *_body(plan)]) + "\n"
