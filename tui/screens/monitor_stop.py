"""``ctrl+x`` in the monitor: stop the run on every node, but only on a second press within
:data:`STOP_CONFIRM_S`, and never for a run that is already over (or whose launcher is gone).

Used by :class:`tui.screens.monitor.MonitorScreen`; no widgets here, so the rules are plain to
read and to test. The stop itself runs in the screen's worker (:func:`engine.rundir.events.stop_run`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from textual.notifications import SeverityLevel

STOP_CONFIRM_S = 3.0
"""A second ``ctrl+x`` within this many seconds stops the run."""


@dataclass(frozen=True, slots=True)
class StopAnswer:
    """What a press gets: a notification, and whether to stop the run now."""

    message: str
    severity: SeverityLevel = "information"
    stop: bool = False


class StopGuard:
    """Counts ``ctrl+x`` presses. ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._armed_at = 0.0

    def press(self, *, run_over: bool, run_message: str) -> StopAnswer:
        """One press. ``run_over``: the run ended (or the watching did); ``run_message``: the
        run's last word (a dead launcher's reason starts ``launcher died``)."""
        if run_over:
            if run_message.startswith("launcher died"):
                return StopAnswer(f"nothing to stop: the {run_message}", "warning")
            return StopAnswer("the run has already ended")
        now = self.clock()
        if now - self._armed_at > STOP_CONFIRM_S:
            self._armed_at = now
            return StopAnswer("press ctrl+x again to stop the run on every node", "warning")
        self._armed_at = 0.0
        return StopAnswer("stopping the run…", stop=True)
