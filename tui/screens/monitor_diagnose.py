"""The monitor's ``d`` key: name the stuck rank now.

:meth:`tui.screens.monitor.MonitorScreen.action_diagnose` calls :func:`diagnose_in_worker`: on a
thread worker it asks the run's launcher through the run directory
(:func:`engine.diagnose.request.request_diagnosis`; the launcher asks every rank for its
Flight Recorder dump, :mod:`engine.launch.frdump`), waits for the answer in run.json and shows
its one line as a notification. Works for a run directory being watched and for a live launch
(whose backend has the run directory too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.diagnose.request import WAIT_S, request_diagnosis, wait_diagnosis
from engine.errors import DtrainError

ASKED = "asking every rank for its Flight Recorder dump…"


def run_dir_of(screen: Any) -> Path | None:
    """The watched run's directory: the screen's, else the live backend's."""
    if getattr(screen, "run_dir", None) is not None:
        return Path(screen.run_dir)
    run = getattr(getattr(screen, "source", None), "run", None)
    path = getattr(run, "path", None)
    return Path(path) if path is not None else None


def diagnose_in_worker(screen: Any) -> None:
    """Start the worker (one at a time); results come back as notifications."""
    run_dir = run_dir_of(screen)
    if run_dir is None:
        screen.notify("diagnose needs a run directory (this source has none)", severity="warning")
        return
    screen.notify(ASKED)
    screen.run_worker(
        lambda: _diagnose(screen, run_dir),
        thread=True,
        exclusive=True,
        exit_on_error=False,
        group="monitor-diagnose",
        description="diagnose the run",
    )


def _diagnose(screen: Any, run_dir: Path) -> None:
    app = screen.app
    try:
        asked = request_diagnosis(run_dir)
    except DtrainError as e:
        app.call_from_thread(screen.notify, e.message, severity="warning")
        return
    diag = wait_diagnosis(run_dir, asked, WAIT_S)
    if diag is None:
        app.call_from_thread(
            screen.notify,
            f"no answer from the launcher in {WAIT_S:g}s (is it still running?)",
            severity="warning",
        )
        return
    stuck = bool(diag.stuck_ranks or diag.no_dump)
    app.call_from_thread(
        screen.notify,
        diag.summary or "no diagnosis",
        title="Diagnosis",
        severity="error" if stuck else "information",
        timeout=30,
    )
