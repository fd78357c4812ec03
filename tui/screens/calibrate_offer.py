"""The monitor's "calibrate from this run" (key ``k``): when a run ends the monitor says the key
exists; pressing it fits the cluster's efficiency factors from the run directory
(:func:`engine.monitor.calibrate.calibrate_run`) in a worker thread and saves them as a
calibration named after the run (``-2``, ``-3``… when that name is taken: never replaced), in the
config directory the app uses. The result, or the one-line reason a run cannot be used, comes
back as a notification.

Called from :class:`tui.screens.monitor.MonitorScreen` (its ``k`` binding, its
``on_run_finished`` and its ``on_screen_resume``); kept here so the monitor screen holds only the
hooks. The offer belongs to its run: another run's monitor opening withdraws it, so it never shows
over a monitor where ``k`` would calibrate from a different run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from textual.app import App
from textual.notifications import Notification, Notify
from textual.screen import Screen

KEY = "k"
OFFER_TIMEOUT_S = 8.0

_offers: WeakKeyDictionary[App[Any], tuple[Screen[Any], Notification]] = WeakKeyDictionary()
"""Per app: the monitor that made the standing offer, and its notification."""


def end_of_run_hint(state: str) -> str:
    """What the monitor says when a run ends and it has a run directory to calibrate from."""
    return f"Run {state}: press {KEY} to calibrate the plan's estimates from this run"


def offer_calibration(screen: Screen[Any], state: str, run_dir: Path | None) -> None:
    """At the end of a run with a run directory and steps enough to calibrate from (the
    monitor's snapshot knows each rank's last step): say that ``k`` calibrates from it."""
    from engine.plan.calibration import min_run_steps

    snap = getattr(screen, "snapshot", None)
    ranks = getattr(snap, "ranks", {})
    steps = max((r.step or 0 for r in ranks.values()), default=0)
    if run_dir is not None and steps >= min_run_steps():
        # Built here (not screen.notify) to keep a handle on it for withdraw_offer.
        note = Notification(end_of_run_hint(state), timeout=OFFER_TIMEOUT_S)
        _offers[screen.app] = (screen, note)
        screen.app.post_message(Notify(note))


def withdraw_offer(screen: Screen[Any]) -> None:
    """``screen`` (a monitor) is shown: an offer another monitor made is stale here; drop it."""
    app = screen.app
    offer = _offers.get(app)
    if offer is None or offer[0] is screen:
        return
    del _offers[app]
    # Textual has no public call to drop one notification; _unnotify is what a toast's own
    # timeout and click use (tests/tui/test_polish.py pins the behaviour).
    app._unnotify(offer[1])


def calibrate_from_run(screen: Screen[Any], run_dir: Path | None) -> None:
    """``k``: fit and save in a worker; a notification says what came of it."""
    if run_dir is None:
        screen.notify("no run directory to calibrate from", severity="warning")
        return
    config_dir = getattr(screen.app, "config_dir", None)
    screen.notify(f"calibrating from {run_dir.name}…", timeout=3)
    screen.run_worker(
        lambda: _calibrate(screen, run_dir, config_dir),
        thread=True,
        exclusive=True,
        exit_on_error=False,
        group="monitor-calibrate",
        description="calibrate from this run",
    )


def _calibrate(screen: Screen[Any], run_dir: Path, config_dir: Path | None) -> None:
    from engine.errors import DtrainError
    from engine.monitor.calibrate import calibrate_run
    from profiles.calibrations import CalibrationStore, safe_name

    try:
        store = CalibrationStore(config_dir)
        base = safe_name(run_dir.resolve().name)
        name, n = base, 1
        while store.exists(name):
            n += 1
            name = f"{base[:60]}-{n}"
        result = calibrate_run(run_dir, name=name)
        path = store.save(result.calibration)
    except DtrainError as e:
        screen.app.call_from_thread(screen.notify, str(e), severity="warning", timeout=10)
        return
    cal = result.calibration
    src = cal.source
    text = (
        f"Saved calibration {cal.name!r} ({path.parent}): compute ×{cal.compute:.2g}, "
        f"network ×{cal.network:.2g}; step {src.measured_step_time_s:.3g} s measured, "
        f"{src.predicted_step_time_s:.3g} s predicted before, "
        f"{src.calibrated_step_time_s:.3g} s after. Plans use it with --calibration {cal.name}"
    )
    screen.app.call_from_thread(screen.notify, text, timeout=15)
