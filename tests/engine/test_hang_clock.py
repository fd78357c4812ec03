"""The hang clock (engine.launch.policy.HangClock): the ranks' silence on the launcher's own
clock. A gap between supervisor ticks (the launcher was stopped) is not silence, a hang needs two
overdue ticks in a row, and no hang is declared once every node script ended. Until a rank's
first line the run is starting: the start timeout, counted from the nodes' start, is the limit."""

from __future__ import annotations

from engine.launch.policy import SUPERVISE_INTERVAL_S, HangClock


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _run(
    clock: FakeClock,
    hang: HangClock,
    seconds: float,
    timeout: float,
    start: float = 600.0,
    chatter: bool = False,
) -> str | None:
    """Tick as the supervisor does for ``seconds``; the first hang reason, or None.
    ``chatter``: torchrun's own lines (not a rank's) arrive on every tick."""
    end = clock.t + seconds
    while clock.t < end:
        clock.t += SUPERVISE_INTERVAL_S
        if chatter:
            hang.activity(rank_line=False)
        hang.tick()
        reason = hang.overdue(timeout, start_timeout_s=start)
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


def test_before_the_first_rank_line_the_start_timeout_is_the_limit() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    hang.activity(rank_line=False)  # torchrun's own chatter: the ranks are still importing
    assert _run(clock, hang, 59, timeout=5, start=60) is None  # far past the hang timeout
    reason = _run(clock, hang, 2, timeout=5, start=60)
    assert reason is not None and "since the start" in reason, reason
    assert "(--start-timeout 60)" in reason and "--hang-timeout" not in reason, reason


def test_launcher_chatter_does_not_extend_the_start() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    reason = _run(clock, hang, 61, timeout=5, start=60, chatter=True)
    assert reason is not None and "--start-timeout 60" in reason, reason


def test_the_hang_timer_starts_at_the_first_rank_line() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    assert _run(clock, hang, 50, timeout=5, start=60) is None
    hang.activity()  # a rank's first line, 50 s in
    assert _run(clock, hang, 4.5, timeout=5, start=60) is None
    reason = _run(clock, hang, 1, timeout=5, start=60)  # 5 s silent: before the start timeout
    assert reason is not None and reason.startswith("hang: no output from any rank for 5s")


def test_a_started_run_is_not_held_to_the_start_timeout() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    end = clock.t + 30
    while clock.t < end:  # a rank prints every second, for longer than the start timeout
        clock.t += 1.0
        hang.activity()
        hang.tick()
        assert hang.overdue(5, start_timeout_s=10) is None


def test_a_stopped_launcher_gap_does_not_count_against_the_start() -> None:
    clock = FakeClock()
    hang = HangClock(clock)
    assert _run(clock, hang, 30, timeout=5, start=60) is None
    clock.t += 600  # SIGSTOP for ten minutes: no tick
    hang.tick()
    assert hang.overdue(5, start_timeout_s=60) is None
    assert _run(clock, hang, 29, timeout=5, start=60) is None
    assert _run(clock, hang, 2, timeout=5, start=60) is not None
