"""The reaper: a small process the local backend starts beside its node scripts, so that no rank
outlives a launcher killed outright (SIGKILL, the OOM killer), where no signal handler runs.

It runs in a session of its own (a closed terminal or a Ctrl-C to the launcher's group does not
reach it) and blocks reading a pipe whose only writer is the launcher. When that pipe closes, for
whatever reason, it stops every process tagged ``DTRAIN_RUN_ID=<run id>`` in its environment
(SIGTERM, then SIGKILL after a grace period, until none is left: torchrun puts ranks in sessions
of their own and a script may ``setsid``, so a process group or a parent-death signal would miss
some). A run submitted to Slurm (``RUN/slurm.json`` names its job) is cancelled with ``scancel``:
its ranks may be on other nodes. If the launcher died before writing a final state, it writes one
into run.json: ``failed``, "launcher died".

Stdlib only, and run as a file (``python -I reaper.py RUN_ID RUN_DIR LAUNCHER_PID``): it starts
in a few milliseconds and does not import the package. :func:`pids_with_env` and
:func:`kill_run_processes` are also the launcher's own sweep.

``python -I reaper.py --node CMD...`` is the other use, the parent of each local node script: a
child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), so a daemon the run leaves behind in a
session of its own and without the run's environment (``setsid env -i …``), which no sweep by
DTRAIN_RUN_ID can find, is re-parented to it when its parent exits; once the script ended it
stops every such process, says which on stderr, and exits as the script did (:func:`node_main`).
A daemon on another machine (an SSH node's double fork under sshd) is out of its reach.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

GRACE_S = 3.0
"""Seconds between SIGTERM and SIGKILL once the launcher is gone."""
SWEEP_S = 10.0
"""How long to go on killing what appears (a process forking as it dies)."""
FINAL_STATES = ("succeeded", "failed", "stopped")
"""engine.rundir.record.RunState's final states (this script cannot import the package)."""
DONE = b"done\n"
"""What the launcher writes before closing the pipe when it ended the run itself."""


def pids_with_env(key: str, value: str) -> list[int]:
    """Processes of this user whose environment holds ``key=value`` (Linux /proc)."""
    needle = f"{key}={value}".encode()
    out: list[int] = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            out.append(int(entry.name))
    return out


def node_of(pid: int) -> int | None:
    """``GROUP_RANK`` (torchrun's node rank) from a process's environment, if it has one."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"GROUP_RANK="):
                    return int(item[11:])
    except (OSError, ValueError):
        return None
    return None


def kill_run_processes(run_id: str, sig: int = signal.SIGKILL) -> list[int]:
    """Signal every process tagged with ``DTRAIN_RUN_ID=run_id``; returns their pids."""
    pids = pids_with_env("DTRAIN_RUN_ID", run_id)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return pids


def sweep(run_id: str, grace_s: float = GRACE_S, sweep_s: float = SWEEP_S) -> None:
    """SIGTERM every process of the run, SIGKILL what is left after ``grace_s``, and go on
    killing for up to ``sweep_s`` until none is left."""
    if not kill_run_processes(run_id, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while pids_with_env("DTRAIN_RUN_ID", run_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the process table, bounded by the grace period
    deadline = time.monotonic() + sweep_s
    while kill_run_processes(run_id, signal.SIGKILL) and time.monotonic() < deadline:
        time.sleep(0.05)


def cancel_slurm_job(run_dir: Path) -> None:
    """``scancel`` the run's Slurm job, if it has one (``RUN/slurm.json``, written by
    :mod:`engine.launch.slurm` right after ``sbatch``) that is not over yet."""
    try:
        info = json.loads((Path(run_dir) / "slurm.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    job = info.get("job_id") if isinstance(info, dict) else None
    if not isinstance(job, str) or not job.isdigit():
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["scancel", job], capture_output=True, timeout=30, check=False)


def mark_launcher_died(run_dir: Path, pid: int) -> None:
    """Give run.json a final state when the launcher did not write one. A patch of the file with
    the stdlib, keeping every other key: the fields it sets (``state``, ``reason``, ``ended_at``,
    ``launcher_died``, each rank's ``reason``) are :class:`engine.rundir.record.RunRecord`'s, in
    the same JSON layout as its writer's (indent 2, a final newline)."""
    path = Path(run_dir) / "run.json"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if not isinstance(info, dict) or info.get("state") in FINAL_STATES:
        return
    reason = f"launcher died (pid {pid}); every rank was stopped"
    ended = datetime.now(tz=UTC).isoformat(timespec="milliseconds")
    info.update(state="failed", reason=reason, ended_at=ended, launcher_died=True)
    for r in info.get("ranks") or []:
        if isinstance(r, dict) and r.get("exit_code") is None:
            r["reason"] = "stopped"
    data = (json.dumps(info, indent=2) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".run.json.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


PR_SET_CHILD_SUBREAPER = 36
"""prctl(2) option (linux/prctl.h)."""


def set_child_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); False where it cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _children() -> list[int]:
    """Living children of this process (orphans re-parented to it among them)."""
    me = str(os.getpid())
    out: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":  # state, ppid
            out.append(int(entry.name))
    return out


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:80]
    except OSError:
        return "?"


def _reap() -> None:
    """Collect every child that ended (zombies of re-parented orphans)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def stop_leftovers(grace_s: float = GRACE_S, sweep_s: float = SWEEP_S) -> list[str]:
    """SIGTERM every child left (the script's orphans, re-parented here), SIGKILL after
    ``grace_s``, until none is left or ``sweep_s`` passed; ``pid N (command)`` of each."""
    _reap()
    found: dict[int, str] = {}
    start = time.monotonic()
    sig = signal.SIGTERM
    while (left := _children()) and time.monotonic() - start < grace_s + sweep_s:
        for pid in left:
            found.setdefault(pid, _name(pid))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        time.sleep(0.05)  # polling the process table, bounded
        _reap()
        if time.monotonic() - start > grace_s:
            sig = signal.SIGKILL
    return [f"pid {pid} ({name})" for pid, name in found.items()]


def node_main(argv: list[str]) -> int:
    """Run ``argv`` (a node's launch script) as this subreaper's child, then stop what it left
    behind; exit as it did. The launcher's signals reach the script through the process group
    they share; this process only waits for it."""
    if not set_child_subreaper():
        os.execvp(argv[0], argv)  # nothing to catch orphans with: just the script
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # A handler, not SIG_IGN: the script gets the default back when it is exec'd.
        signal.signal(sig, lambda signum, frame: None)
    child = subprocess.Popen(argv)
    code = child.wait()
    left = stop_leftovers()
    if left:
        with contextlib.suppress(OSError):
            sys.stderr.write(
                f"[dtrain-tui] stopped {len(left)} process(es) the run left behind: "
                + ", ".join(left)
                + "\n"
            )
            sys.stderr.flush()
    if code < 0:  # killed by a signal: end the same way, so the launcher sees it
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code if code >= 0 else 128 - code


def main(argv: list[str]) -> int:
    run_id, run_dir, launcher_pid = argv[0], Path(argv[1]), int(argv[2])
    # Only the pipe ends this process's wait: not the terminal's signals.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTSTP):
        signal.signal(sig, signal.SIG_IGN)
    said = b""
    while True:
        try:
            chunk = os.read(0, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not chunk:
            break
        said += chunk
    died = DONE not in said  # the launcher did not say goodbye: it died
    if died:
        cancel_slurm_job(run_dir)
    sweep(run_id)
    if died:
        mark_launcher_died(run_dir, launcher_pid)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--node"]:
        sys.exit(node_main(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
