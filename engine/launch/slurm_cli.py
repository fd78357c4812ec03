"""Slurm's command-line tools, asked and parsed: what the Slurm backend
(:mod:`engine.launch.slurm`) and ``launch --hosts slurm`` need to know from Slurm.

Only the client commands every Slurm installation has (``sbatch``, ``scontrol``, ``sinfo``,
``scancel``) and no accounting database: a job is followed with ``scontrol show job -o``, which
keeps a finished job for ``MinJobAge`` seconds. Every call has a timeout; a failure is one
:class:`~engine.launch.errors.LaunchError` line naming the option to fix when Slurm says which.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from engine.launch.errors import LaunchError

CMD_TIMEOUT_S = 30.0
"""Seconds one Slurm command may take (slurmctld answers in milliseconds when healthy)."""

FINAL_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
    }
)
"""``JobState`` values after which nothing of the job runs (``COMPLETING`` is not one: its
processes are still being cleaned up)."""

NEVER_REASONS = {
    "PartitionTimeLimit": "the time limit is above the partition's MaxTime",
    "PartitionNodeLimit": "the node count is outside the partition's limits",
    "BadConstraints": "no node has the features asked for (constraint)",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QoS is not valid",
    "QOSMaxWallDurationPerJobLimit": "the time limit is above the QoS's maximum",
    "AssocMaxWallDurationPerJobLimit": "the time limit is above the association's maximum",
    "QOSMaxNodePerJobLimit": "the node count is above the QoS's maximum",
    "AssocMaxNodesPerJobLimit": "the node count is above the association's maximum",
}
"""Pending reasons Slurm keeps a job waiting on until a person changes the job or the cluster:
the run fails naming it instead of waiting forever."""

_FIELD_WORDS = (
    ("partition", "launch.slurm_partition"),
    ("time", "launch.slurm_time_limit"),
    ("account", "launch.slurm_account"),
    ("qos", "launch.slurm_qos"),
    ("feature", "launch.slurm_constraint"),
    ("constraint", "launch.slurm_constraint"),
    ("reservation", "launch.slurm_reservation"),
)
_SRUN_TASK_RE = re.compile(
    r"^srun: error: (?P<node>\S+): tasks? (?P<tasks>[0-9,\-]+): (?P<what>.+?)\s*$"
)
_EXIT_RE = re.compile(r"Exited with exit code (\d+)")


def slurm_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the ``SLURM_*`` variables of an allocation it may run
    in (a job submitted from inside another must not inherit its ids), ``SLURM_CONF`` kept."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(extra or {})
    return env


def run_slurm(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run one Slurm command; a missing command or a timeout is a :class:`LaunchError`."""
    if shutil.which(argv[0], path=(env or os.environ).get("PATH")) is None:
        raise LaunchError(
            f"{argv[0]} not found: this machine is not a Slurm login node (install the Slurm "
            "client, or run dtrain-tui on a login node)",
            field="--backend",
        )
    try:
        return subprocess.run(
            list(argv),
            env=dict(env) if env is not None else slurm_env(),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LaunchError(
            f"{argv[0]} did not answer within {CMD_TIMEOUT_S:.0f}s (is slurmctld up?)",
            field="--backend",
        ) from None


RunSlurm = Callable[..., "subprocess.CompletedProcess[str]"]
"""How a Slurm command is run: :func:`run_slurm` here, or a runner's ``run`` on a login node
over SSH (:mod:`engine.launch.slurm_runner`); called as ``run(argv, env=…, cwd=…)``."""


def slurm_message(stderr: str) -> str:
    """Slurm's error lines as one line (``sbatch: error: `` prefixes dropped)."""
    parts = []
    for line in stderr.splitlines():
        line = re.sub(r"^\w+: error: ", "", line.strip())
        if line and line not in parts:
            parts.append(line)
    return "; ".join(parts) or "no message"


def field_of(message: str) -> str:
    """The spec field a Slurm error is about (``launch.slurm_partition`` …), else ``--backend``."""
    low = message.lower()
    for word, fld in _FIELD_WORDS:
        if word in low:
            return fld
    return "--backend"


def partitions(env: Mapping[str, str] | None = None, run: RunSlurm = run_slurm) -> list[str]:
    """The partitions ``sinfo`` lists (the default one marked ``*`` by sinfo is unmarked)."""
    r = run(["sinfo", "-h", "-o", "%R"], env=env)
    if r.returncode != 0:
        return []
    return sorted({p.strip() for p in r.stdout.split() if p.strip()})


def parse_job(text: str) -> dict[str, str]:
    """``scontrol show job -o`` output as {key: value} (values never hold spaces there, except
    a few free-text keys at the end, which are not needed)."""
    out: dict[str, str] = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in out:
            out[key] = value
    return out


@dataclass(frozen=True)
class JobInfo:
    """What ``scontrol show job`` says of a job, the parts a launch needs."""

    job_id: str
    state: str
    """``JobState``: PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, TIMEOUT, …"""
    reason: str
    restarts: int
    nodelist: str
    exit_code: int
    exit_signal: int
    time_limit: str

    @property
    def final(self) -> bool:
        return self.state in FINAL_JOB_STATES

    @classmethod
    def parse(cls, text: str) -> JobInfo:
        d = parse_job(text)
        code, _, sig = d.get("ExitCode", "0:0").partition(":")
        restarts = d.get("Restarts", "0")
        return cls(
            job_id=d.get("JobId", ""),
            state=d.get("JobState", "UNKNOWN"),
            reason=d.get("Reason", "None"),
            restarts=int(restarts) if restarts.isdigit() else 0,
            nodelist=d.get("NodeList", "(null)"),
            exit_code=int(code) if code.isdigit() else 0,
            exit_signal=int(sig) if sig.isdigit() else 0,
            time_limit=d.get("TimeLimit", ""),
        )


def show_job(
    job_id: str, env: Mapping[str, str] | None = None, run: RunSlurm = run_slurm
) -> JobInfo | None:
    """The job as slurmctld knows it; None once it forgot it (``MinJobAge`` after its end).
    A slurmctld that does not answer is a :class:`LaunchError`."""
    r = run(["scontrol", "show", "job", "-o", job_id], env=env)
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            return None
        raise LaunchError(f"scontrol show job {job_id}: {slurm_message(r.stderr)}")
    return JobInfo.parse(r.stdout)


def hostnames(
    nodelist: str, env: Mapping[str, str] | None = None, run: RunSlurm = run_slurm
) -> list[str]:
    """``n[1-2]`` → ``["n1", "n2"]`` (``scontrol show hostnames``)."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    r = run(["scontrol", "show", "hostnames", nodelist], env=env)
    if r.returncode != 0:
        raise LaunchError(f"scontrol show hostnames {nodelist}: {slurm_message(r.stderr)}")
    return r.stdout.split()


def node_addr(node: str, env: Mapping[str, str] | None = None) -> str:
    """The node's ``NodeAddr`` (node names need not resolve), else the name itself."""
    r = run_slurm(["scontrol", "show", "node", "-o", node], env=env)
    if r.returncode == 0:
        addr = parse_job(r.stdout).get("NodeAddr")
        if addr and addr != "(null)":
            return addr
    return node


def allocation_hosts(env: Mapping[str, str] | None = None) -> list[str]:
    """``--hosts slurm``: the address of each node of the allocation this process runs in
    (``SLURM_JOB_NODELIST`` from ``salloc`` or a batch script), in Slurm's node order."""
    source = env if env is not None else os.environ
    nodelist = source.get("SLURM_JOB_NODELIST") or source.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError(
            "slurm: not inside a Slurm allocation (no SLURM_JOB_NODELIST); run under "
            "salloc or in a batch script, or pass the hosts",
            field="--hosts",
        )
    return [node_addr(n, env) for n in hostnames(nodelist, env)]


def task_exits(line: str) -> dict[int, int]:
    """{task: exit code} from one of srun's ``srun: error: n2: task 1: Killed`` lines: a signal
    as its negative number (Killed -9, Terminated -15), else the exit code."""
    m = _SRUN_TASK_RE.match(line)
    if not m:
        return {}
    what = m.group("what")
    me = _EXIT_RE.search(what)
    if me:
        code = int(me.group(1))
    elif what.startswith("Killed"):
        code = -9
    elif what.startswith("Terminated"):
        code = -15
    else:
        code = 1
    tasks: list[int] = []
    for part in m.group("tasks").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            tasks.extend(range(int(lo), int(hi) + 1 if hi.isdigit() else int(lo) + 1))
    return dict.fromkeys(tasks, code)
