"""Asking a running launch for a diagnosis through its run directory (as a stop is asked).

A monitor (the TUI's ``d`` key, or a script) calls :func:`request_diagnosis`: it writes
``RUN/diagnose.request`` atomically; the launcher's supervisor takes it
(:func:`take_diagnose_request`), asks every rank for its Flight Recorder dump and writes the
answer into run.json's ``diagnosis`` (:mod:`engine.launch.frdump`); :func:`wait_diagnosis`
waits for that answer with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from engine.errors import DtrainError
from engine.rundir.record import read_record
from engine.rundir.record_parts import DiagnosisRecord

DIAGNOSE_REQUEST = "diagnose.request"
"""``RUN/diagnose.request``: written by a monitor to ask the launcher for a diagnosis."""
WAIT_S = 30.0
"""How long a monitor waits for the launcher's answer (the launcher waits at most 15 s for
the ranks' dumps)."""


def request_diagnosis(run_dir: Path) -> float:
    """Ask the launcher of the run in ``run_dir`` for a diagnosis; returns when it was asked
    (``time.time()``). A finished run is a one-line :class:`DtrainError`."""
    run_dir = Path(run_dir)
    rec = read_record(run_dir)
    if rec.state.final:
        raise DtrainError(
            f"the run has ended ({rec.state}); diagnose works while it runs", field="RUN_DIR"
        )
    asked = time.time()
    tmp = run_dir / f".{DIAGNOSE_REQUEST}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"requested_at": asked, "by_pid": os.getpid()}) + "\n")
        os.replace(tmp, run_dir / DIAGNOSE_REQUEST)
    except OSError as e:
        raise DtrainError(f"cannot ask for a diagnosis: {e}", field="RUN_DIR") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return asked


def take_diagnose_request(run_dir: Path) -> bool:
    """True (once) when a diagnosis was asked for through ``run_dir``; the request is consumed."""
    try:
        (Path(run_dir) / DIAGNOSE_REQUEST).unlink()
    except OSError:
        return False
    return True


def diagnosis_of(run_dir: Path) -> DiagnosisRecord | None:
    """run.json's ``diagnosis`` (None: none yet, or run.json unreadable right now)."""
    try:
        return read_record(run_dir).diagnosis
    except DtrainError:
        return None


def wait_diagnosis(
    run_dir: Path, since: float, timeout: float = WAIT_S, poll_s: float = 0.2
) -> DiagnosisRecord | None:
    """The diagnosis written at or after ``since`` (wall time), waiting up to ``timeout``; None
    when none came (the launcher is gone, or the run ended first)."""
    deadline = time.monotonic() + timeout
    while True:
        diag = diagnosis_of(run_dir)
        # A diagnosis without a time reads at 0.0: always an earlier one.
        if diag is not None and diag.at >= since - 1.0:
            return diag
        if time.monotonic() > deadline:
            return None
        time.sleep(poll_s)  # polling run.json, as the run tail does
