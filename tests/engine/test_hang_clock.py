"""The hang clock (engine.launch.policy.HangClock): the ranks' silence on the launcher's own
clock. A gap between supervisor ticks (the launcher was stopped) is not silence, a hang needs two
overdue ticks in a row, and no hang is declared once every node script ended."""

from __future__ import annotations

from engine.launch.policy import STARTUP_S, SUPERVISE_INTERVAL_S, HangClock


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _run(clock: FakeClock, hang: HangClock, seconds: float, timeout: float) -> str | None:
    """Tick as the supervisor does for ``seconds``; the first hang reason, or None."""
    end = clock.t + seconds
    while clock.t < end:
        clock.t += SUPERVISE_INTERVAL_S
        hang.tick()
        reason = hang.overdue(timeout)
        if reason is not None:
            return reason
    return None


def test_silence_while_the_launcher_ticks_is_a_hang() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity()
    reason = _run(clock, hang, 20, timeout=5)
    assert reason is not None and reason.startswith("hang: no output from any rank for 5s")


def test_a_stopped_launcher_gap_is_not_silence() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity()
    assert _run(clock, hang, 3, timeout=5) is None
    clock.t += 60  # SIGSTOP for a minute: no tick
    hang.tick()
    assert hang.overdue(5) is None
    assert hang.credited_s >= 60
    # The silence before the stop still counts: 3s + 2.5s more is past the 5s timeout.
    assert _run(clock, hang, 2.5, timeout=5) is not None


def test_a_hang_waits_one_tick_for_the_readers() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity()
    for _ in range(51):
        clock.t += SUPERVISE_INTERVAL_S
        hang.tick()
    assert hang.overdue(5) is None  # first overdue tick: suspect only
    hang.activity()  # the readers delivered what was in the pipes
    clock.t += SUPERVISE_INTERVAL_S
    hang.tick()
    assert hang.overdue(5) is None


def test_no_hang_once_every_node_script_ended() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity()
    for _ in range(100):
        clock.t += SUPERVISE_INTERVAL_S
        hang.tick()
        assert hang.overdue(5, nodes_running=False) is None


def test_before_the_first_rank_line_start_up_gets_its_allowance() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity(rank_line=False)  # torchrun's own chatter: the ranks are still importing
    assert _run(clock, hang, STARTUP_S, timeout=5) is None
    reason = _run(clock, hang, 10, timeout=5)
    assert reason is not None and "since the start" in reason and "start-up" in reason
