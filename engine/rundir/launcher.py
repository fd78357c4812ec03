"""Who launched a run, whether that launcher is still there, and how a reader asks it to stop.

A launch backend records itself in ``RUN/run.json`` (:func:`launcher_record`: pid, the process's
start time in clock ticks since boot from ``/proc/<pid>/stat`` field 22, boot id and host name), so
a reader of the directory (:meth:`engine.rundir.record.RunRecord.as_read`) can tell a run
still going from one whose launcher was killed outright: a pid that is gone, or that now belongs
to a process started at another time (pid reuse), is a launcher that died. A reader on another
machine (another host name or boot) cannot tell, and believes run.json.

A reader stops a run through the directory (:func:`request_stop` writes ``RUN/stop.request``
atomically); the launcher's supervisor polls for that file and stops the run as the user's stop.

Stdlib only: the monitor and the launcher both import this, and neither should pay for more.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the check only reads its fields: no pydantic for this module's importers
    from engine.rundir.record_parts import LauncherRecord

STOP_REQUEST = "stop.request"
"""``RUN/stop.request``: written by a monitor to ask the launcher to stop the run."""
LAUNCHER_DIED = "launcher died"
"""How a run whose launcher is gone reads (the start of its reason)."""


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return ""


def proc_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None when
    there is no such process (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 2 (the command name) may hold spaces and parentheses: count from the last ")".
    fields = stat.rsplit(b")", 1)[-1].split()
    try:
        # fields[0] is field 3 (state); field 22 is fields[19]. A zombie has exited: gone.
        return None if fields[0] == b"Z" else int(fields[19])
    except (IndexError, ValueError):
        return None


def launcher_record(pid: int | None = None) -> dict[str, Any]:
    """What run.json's ``launcher`` holds for this process (or ``pid``), as JSON values
    (:class:`engine.rundir.record.RunRecord` takes them as a
    :class:`~engine.rundir.record_parts.LauncherRecord`)."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "start_ticks": proc_start_ticks(pid),
        "boot_id": _boot_id(),
        "host": socket.gethostname(),
    }


def launcher_gone(rec: LauncherRecord | None) -> str:
    """Why the launcher ``rec`` (run.json's ``launcher``) is known to be gone, or "" when it is
    alive, or when this machine cannot tell (another host or boot, no record or pid)."""
    if rec is None or rec.pid is None:
        return ""
    if rec.host != socket.gethostname() or rec.boot_id != _boot_id():
        return ""
    pid = rec.pid
    started = proc_start_ticks(pid)
    if started is None:
        return f"{LAUNCHER_DIED} (pid {pid} is gone)"
    if rec.start_ticks is not None and started != rec.start_ticks:
        return f"{LAUNCHER_DIED} (pid {pid} is now another process)"
    return ""


def request_stop(run_dir: Path) -> None:
    """Ask the launcher of the run in ``run_dir`` to stop it (atomically: the launcher never
    sees half a file)."""
    run_dir = Path(run_dir)
    tmp = run_dir / f".{STOP_REQUEST}.{os.getpid()}.tmp"
    body = json.dumps({"requested_at": time.time(), "by_pid": os.getpid()})
    try:
        tmp.write_text(body + "\n", encoding="utf-8")
        os.replace(tmp, run_dir / STOP_REQUEST)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def take_stop_request(run_dir: Path) -> bool:
    """True (once) when a stop was requested through ``run_dir``; the request is consumed."""
    path = Path(run_dir) / STOP_REQUEST
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError:
        return path.exists()  # cannot remove it (read-only?): still a request
    return True
