"""The root-cause rank's own error line, for a failed run's one-line summary: what ``launch``
prints last (``run failed: rank 1 … exited with exit code 1; rank 1: ZeroDivisionError:
division by zero``), so the exit code comes with the reason the rank gave.

Called by ``cli/launch_cmd.py`` once a run ended failed. Reads the run directory only:
``run.json``'s failed rank (:func:`engine.rundir.record.read_record`) and the end of that rank's
logs (``logs/rank<R>.stderr.log``, then ``.stdout.log``), regular files inside the run
directory, at most :data:`TAIL_BYTES` of each. Anything it cannot read gives no line, never an
error: the summary stands without it.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import DtrainError
from engine.fsio import open_regular
from engine.monitor.logparse import ErrorKind, classify_error, strip_ansi
from engine.monitor.textsafe import safe_line
from engine.rundir.record import read_record

TAIL_BYTES = 64 << 10
"""How much of the end of a rank's log is searched: a Traceback's last line is near the end."""
MAX_SHOWN = 300
"""Characters of the error line kept in a summary line (a longer one is cut with …)."""
BLAMED_LAST = frozenset({ErrorKind.TRACEBACK, ErrorKind.CHILD_FAILED, ErrorKind.NCCL_WARN})
"""Kinds that only announce or echo an error ("Traceback (most recent call last):", torchrun's
wrapper, an NCCL warning): taken only where the log holds no line that states one."""


def rank_error_line(run_dir: Path | str, rank: int) -> str:
    """The last line of ``rank``'s logs that states an error (the exception a Traceback ends
    with, a CUDA OOM, an NCCL error), else its last error-like line; "" when none."""
    fallback = ""
    for stream in ("stderr", "stdout"):
        for line in reversed(_tail_lines(Path(run_dir), rank, stream)):
            kind = classify_error(line)
            if kind is None:
                continue
            if kind not in BLAMED_LAST:
                return _shown(line)
            fallback = fallback or _shown(line)
    return fallback


def failure_line(run_dir: Path | str) -> str:
    """``rank R: <its error line>`` for the rank run.json blames; "" when none is blamed or it
    printed no error line."""
    try:
        rank = read_record(run_dir).failed_rank
    except DtrainError:
        return ""
    if rank is None:
        return ""
    line = rank_error_line(run_dir, rank)
    return f"rank {rank}: {line}" if line else ""


def _tail_lines(run_dir: Path, rank: int, stream: str) -> list[str]:
    path = run_dir / "logs" / f"rank{rank}.{stream}.log"
    try:
        fd = open_regular(path, within=run_dir, label=f"logs/{path.name}")
    except (DtrainError, OSError):
        return []
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - TAIL_BYTES)
        data = os.pread(fd, TAIL_BYTES, start)
    except OSError:
        return []
    finally:
        os.close(fd)
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[1:] if start > 0 else lines  # the first may be cut mid-line


def _shown(line: str) -> str:
    text = safe_line(strip_ansi(line)).strip()
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 1] + "…"
