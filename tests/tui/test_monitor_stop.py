"""The monitor's ``ctrl+x`` rules (tui.screens.monitor_stop), without a screen: a second press
within the window stops the run, a late one asks again, an ended run has nothing to stop."""

from __future__ import annotations

from tui.screens.monitor_stop import STOP_CONFIRM_S, StopGuard


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_second_press_within_the_window_stops() -> None:
    clock = Clock()
    guard = StopGuard(clock)
    first = guard.press(run_over=False, run_message="")
    assert not first.stop and first.severity == "warning" and "again" in first.message
    clock.now += STOP_CONFIRM_S / 2
    second = guard.press(run_over=False, run_message="")
    assert second.stop and second.message == "stopping the run…"
    # armed again from scratch after a stop
    assert not guard.press(run_over=False, run_message="").stop


def test_a_late_second_press_asks_again() -> None:
    clock = Clock()
    guard = StopGuard(clock)
    guard.press(run_over=False, run_message="")
    clock.now += STOP_CONFIRM_S + 0.1
    assert not guard.press(run_over=False, run_message="").stop
    clock.now += 0.1
    assert guard.press(run_over=False, run_message="").stop


def test_an_ended_run_has_nothing_to_stop() -> None:
    guard = StopGuard(Clock())
    ended = guard.press(run_over=True, run_message="rank 3 exited 1")
    assert (ended.message, ended.severity, ended.stop) == (
        "the run has already ended",
        "information",
        False,
    )
    died = guard.press(run_over=True, run_message="launcher died (pid 42 gone)")
    assert died.message == "nothing to stop: the launcher died (pid 42 gone)"
    assert died.severity == "warning" and not died.stop
