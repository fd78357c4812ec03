"""Ask the ranks of a running run for their Flight Recorder dumps, and read the answers.

Called by the run's diagnosis (:mod:`engine.launch.diagnosis`, on the supervisor's thread) when
a run hangs, before it is stopped, and when a monitor asks (``RUN/diagnose.request``,
:mod:`engine.diagnose.request`), through a node driver's ``ask_dumps``
(:class:`engine.launch.driver.NodeDriver`): it sends the request signal (:func:`dump_signal`,
``SIGRTMIN+7``) to a node's rank processes and returns how many it signalled (local:
:func:`signal_local`; SSH: :func:`remote_dump_command` over a fresh channel), or one request
reaches every node (Slurm: one ``srun --overlap`` step in the job running :func:`dump_script`
on each node). Only processes that block the signal are signalled (``SigBlk`` in
/proc/PID/status): every rank started through the bundle's rank agent
(``engine/trainer/agent.py``, whatever its script) blocks it and takes it in a thread of its
own; any other program would be killed by it. A real-time signal, not SIGUSR1: that one is the
script's (Lightning's Slurm requeue installs a handler for it).

The ranks answer on stdout with one ``[dtrain] fr {json}`` line each, which reaches the run
directory like any other line on every backend: the answers are read from each rank's stdout log
past where it stood when asked (:func:`log_sizes`, :func:`new_dumps`). NCCL's own dumps on a
collective timeout (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, in the bundle's ``logs/``,
:func:`nccl_trace_dumps`) fill in for ranks that did not answer where the run's bundle is on
this machine. The stream readers look for a rank's own collective-timeout line
(:func:`find_timeout_line`)"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.diagnose.flight import (
    FR_PREFIX,
    RankDump,
    dump_from_trace,
    parse_fr_line,
    read_trace_file,
)
from engine.launch.reaper import node_of, pids_with_env
from engine.rundir.events import STDOUT
from engine.rundir.files import rank_log

DUMP_WAIT_S = 15.0
"""Longest wait for the ranks' answers (each answers in milliseconds when it can)."""
DUMP_SIGNAL_OFFSET = 7
"""The request is ``SIGRTMIN + DUMP_SIGNAL_OFFSET``: the rank agent's constant of the same name
(``engine/trainer/agent.py``, which cannot import this module; a test checks they agree). A
remote node's bash names it ``RTMIN+7``, so its own C library's SIGRTMIN counts there."""
DUMP_SIGNAL_NAME = f"RTMIN+{DUMP_SIGNAL_OFFSET}"
"""The request signal as ``kill -s`` names it."""
_RTMIN = 34
"""glibc's SIGRTMIN, where Python has none (not Linux): no rank runs there anyway."""


def dump_signal() -> int:
    """The request signal's number on this machine."""
    return int(getattr(signal, "SIGRTMIN", _RTMIN)) + DUMP_SIGNAL_OFFSET


def dump_signal_mask() -> int:
    """The request signal's bit in /proc/PID/status's SigBlk."""
    return 1 << (dump_signal() - 1)


NCCL_TRACE_PREFIX = "nccl_trace_rank_"
"""File name prefix of NCCL's dumps in the bundle's logs/ (nccl.env's
TORCH_NCCL_DEBUG_INFO_TEMP_FILE); the rank number follows."""


def takes_dump_signal(pid: int) -> bool:
    """True when ``pid`` blocks the request signal (the rank agent takes it with sigwait)."""
    mask = dump_signal_mask()
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigBlk:"):
                    return bool(int(line.split()[1], 16) & mask)
    except (OSError, ValueError, IndexError):
        return False
    return False


def signal_local(run_id: str, node: int) -> int:
    """The request signal to the rank processes of ``node`` of the run on this machine; how
    many."""
    sig = dump_signal()
    sent = 0
    for pid in pids_with_env("DTRAIN_RUN_ID", run_id):
        if node_of(pid) == node and takes_dump_signal(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                sent += 1
    return sent


def dump_script(
    run_id: str, node: int | None, *, node_var: str = "DTRAIN_NODE", here_var: str = "SLURM_NODEID"
) -> str:
    """Bash: the request signal (``RTMIN+7`` by the node's own numbering) to every rank process
    of the run on ``node`` that blocks it (found through /proc by ``DTRAIN_RUN_ID`` and
    ``node_var``, compared as whole strings, and a ``LOCAL_RANK``: torchrun and DeepSpeed's
    launcher give one to each rank, never to themselves); prints how many. A process that
    blocks it without being a rank is left alone: srun blocks every signal in its main thread
    and forwards what it gets to its tasks (torchrun, which dies of it).

    ``node_var`` is the variable that numbers the node in the ranks' environment: the SSH
    backend's ``DTRAIN_NODE``, Slurm's ``SLURM_NODEID``, SkyPilot's ``SKYPILOT_NODE_RANK``.
    ``node`` None: the node the script runs on, as the script's own ``here_var`` says (an srun
    task's ``$SLURM_NODEID``, a SkyPilot job's ``$SKYPILOT_NODE_RANK``), so one job step over
    every node asks each node for its own ranks."""
    for var in (node_var, here_var):
        if not var.isidentifier():
            raise ValueError(f"not a variable name: {var!r}")
    where = str(node) if node is not None else f'"${{{here_var}:-none}}"'
    return (
        f"RID={shlex.quote(run_id)}; NODE={where}; n=0; "
        f"S=$(kill -l {DUMP_SIGNAL_NAME}) || exit 1; M=$((1 << (S - 1))); "
        "for e in /proc/[0-9]*/environ; do p=${e#/proc/}; p=${p%/environ}; r=; m=; l=; "
        "while IFS= read -r -d '' v; do "
        f'[[ "$v" == "DTRAIN_RUN_ID=$RID" ]] && r=1; [[ "$v" == "{node_var}=$NODE" ]] && m=1; '
        '[[ "$v" == LOCAL_RANK=* ]] && l=1; '
        'done 2>/dev/null < "$e"; '
        '[ -n "$r" ] && [ -n "$m" ] && [ -n "$l" ] || continue; '
        "blk=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/$p/status 2>/dev/null); "
        '[ -n "$blk" ] || continue; '
        'if (( 0x$blk & M )); then kill -s "$S" "$p" 2>/dev/null && n=$((n+1)); fi; '
        'done; echo "$n"'
    )


def remote_dump_command(run_id: str, node: int, *, node_var: str = "DTRAIN_NODE") -> str:
    """:func:`dump_script` as one shell command line, run by bash whatever the login shell."""
    return f"bash -c {shlex.quote(dump_script(run_id, node, node_var=node_var))}"


def log_sizes(run_path: Path, world: int) -> dict[int, int]:
    """Each rank's stdout log size now: where its answers will start."""
    sizes: dict[int, int] = {}
    for rank in range(world):
        try:
            sizes[rank] = rank_log(run_path, rank, STDOUT).stat().st_size
        except OSError:
            sizes[rank] = 0
    return sizes


def new_dumps(run_path: Path, offsets: dict[int, int], got: dict[int, RankDump]) -> None:
    """Read each rank's stdout log past its offset; whole lines only (the offset advances to
    the last newline read)."""
    for rank, off in offsets.items():
        try:
            with open(rank_log(run_path, rank, STDOUT), "rb") as f:
                f.seek(off)
                data = f.read()
        except OSError:
            continue
        cut = data.rfind(b"\n") + 1
        if not cut:
            continue
        offsets[rank] = off + cut
        for raw in data[:cut].split(b"\n"):
            if FR_PREFIX.encode() in raw:
                d = parse_fr_line(raw.decode("utf-8", "replace"))
                if d is not None:
                    got[d.rank] = d


def nccl_trace_dumps(logs: Path, world: int) -> dict[int, RankDump]:
    """NCCL's dump-on-timeout files in ``logs`` (pickles), by rank."""
    out: dict[int, RankDump] = {}
    for rank in range(world):
        path = logs / f"{NCCL_TRACE_PREFIX}{rank}"
        if path.is_file():
            data = read_trace_file(path)
            if data is not None:
                out[rank] = dump_from_trace(data, rank)
    return out


TIMEOUT_LINE_RE = re.compile(
    r"Watchdog caught collective operation timeout|Timed out waiting \d+ ?ms for \w+ operation"
)
"""A rank's own report of a collective that timed out: NCCL's watchdog (``[Rank 1] Watchdog
caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, …)``) and gloo's
(``RuntimeError: [.../unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to
complete``)."""
TIMEOUT_GATE = ("Watchdog caught", "Timed out waiting")
"""Substrings one of which every :data:`TIMEOUT_LINE_RE` line holds (the streams' cheap gate)."""


def find_timeout_line(
    groups: Mapping[tuple[int, int | None], Sequence[str]],
) -> tuple[int, int | None, str] | None:
    """For the stream readers (:mod:`engine.launch.pump`), on lines that passed
    :data:`TIMEOUT_GATE`: the first collective-timeout line with its node and rank, which the
    pump keeps for the supervisor's diagnosis (its thread: a reader must not wait for
    the dumps, which may come through its own stream); None when there is none."""
    for (node, rank), lines in groups.items():
        for line in lines:
            if TIMEOUT_LINE_RE.search(line):
                return node, rank, line.strip()
    return None


__all__ = [
    "TIMEOUT_GATE",
    "TIMEOUT_LINE_RE",
    "dump_script",
    "dump_signal",
    "dump_signal_mask",
    "find_timeout_line",
    "DUMP_SIGNAL_NAME",
    "DUMP_SIGNAL_OFFSET",
    "DUMP_WAIT_S",
    "log_sizes",
    "new_dumps",
    "nccl_trace_dumps",
    "remote_dump_command",
    "signal_local",
    "takes_dump_signal",
]
