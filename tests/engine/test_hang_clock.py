"""The hang clock (engine.launch.policy.HangClock): the ranks' silence on the launcher's own
clock. A gap between supervisor ticks (the launcher was stopped) is not silence, a hang needs two
overdue ticks in a row, and no hang is declared once every node script ended. Until a rank's
first line the run is starting: the start timeout, counted from the nodes' start, is the limit."""

from __future__ import annotations

from engine.launch.policy import (
    LAST_LINE_CHARS,
    SUPERVISE_INTERVAL_S,
    HangClock,
    NodeState,
    RankStarts,
    blame_unstarted,
    rank_ranges,
    telemetry_off,
)


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


# ---------------------------------------------------------------- each rank's start

NODES = [NodeState(0, "h0"), NodeState(1, "h1")]


def _starting(clock: FakeClock) -> tuple[HangClock, RankStarts]:
    """Two nodes of two ranks each; the clock's nodes just started."""
    starts = RankStarts(2, 2)
    hang = HangClock(clock, starts=starts)
    return hang, starts


def _run_nodes(clock: FakeClock, hang: HangClock, seconds: float, start: float) -> str | None:
    end = clock.t + seconds
    while clock.t < end:
        clock.t += SUPERVISE_INTERVAL_S
        hang.activity()  # rank 0 goes on printing: no hang of the run as a whole
        hang.tick()
        reason = hang.overdue(5, start_timeout_s=start, nodes=NODES)
        if reason is not None:
            return reason
    return None


def test_ranks_that_never_started_fail_the_run_at_the_start_timeout() -> None:
    clock = FakeClock()
    hang, starts = _starting(clock)
    starts.seen(0, 0, ["step 1"])
    starts.seen(0, 1, ["step 1"])
    starts.seen(1, None, ["[W socket.cpp] waiting for rendezvous on node 1"])
    assert _run_nodes(clock, hang, 59, start=60) is None
    reason = _run_nodes(clock, hang, 2, start=60)
    assert reason == (
        "ranks 2-3 never started in 60 s (--start-timeout); "
        "last line from node 1 (h1): [W socket.cpp] waiting for rendezvous on node 1"
    )
    assert hang.unstarted == [2, 3]
    assert blame_unstarted(hang.unstarted, 2, 2) == (None, 1)


def test_one_rank_on_a_node_that_printed_nothing() -> None:
    clock = FakeClock()
    starts = RankStarts(2, 1)
    hang = HangClock(clock, starts=starts)
    starts.seen(0, 0, ["hello"])
    reason = _run_nodes(clock, hang, 61, start=60)
    assert reason == "rank 1 never started in 60 s (--start-timeout); node 1 (h1) printed nothing"
    assert blame_unstarted(hang.unstarted, 1, 2) == (1, 1)


def test_agent_lines_start_a_rank_but_are_no_activity() -> None:
    clock = FakeClock()
    hang, starts = _starting(clock)
    hang.activity()
    for rank in range(4):
        starts.seen(rank // 2, rank, ['[dtrain] telemetry {"rank": 0}'])
    assert starts.all_started()
    reason = None
    while reason is None and clock.t < 1100:  # only telemetry from now on
        clock.t += SUPERVISE_INTERVAL_S
        hang.tick()
        reason = hang.overdue(5, start_timeout_s=60, nodes=NODES)
    assert reason is not None and reason.startswith("hang: no output from any rank for 5s")


def test_the_last_line_is_the_script_s_not_the_agent_s() -> None:
    starts = RankStarts(2, 2)
    starts.seen(1, None, ["torchrun: starting workers"])
    starts.seen(1, 2, ['[dtrain] telemetry {"rank": 2}', '[dtrain] fr {"rank": 2}'])
    assert starts.node_said(1, "h1") == "last line from node 1 (h1): torchrun: starting workers"
    only_agent = RankStarts(1, 1)
    only_agent.seen(0, 0, ['[dtrain] telemetry {"rank": 0}'])
    assert only_agent.node_said(0, "h0").endswith('[dtrain] telemetry {"rank": 0}')


def test_the_last_line_is_bounded_and_terminal_safe() -> None:
    starts = RankStarts(2, 2)
    starts.seen(1, None, ["\x1b]0;owned\x07\x1b[2J" + "x" * 5000 + "\udcff"])
    said = starts.node_said(1, "h1")
    line = said.removeprefix("last line from node 1 (h1): ")
    assert len(line) <= LAST_LINE_CHARS and line.endswith("…"), line
    assert all(c.isprintable() for c in said), repr(said)


def test_without_the_per_rank_check_a_printing_rank_0_keeps_the_run() -> None:
    clock = FakeClock()
    hang, starts = _starting(clock)
    starts.seen(0, 0, ["step 1"])
    end = clock.t + 200
    while clock.t < end:  # telemetry off: ranks 1-3 are silent, not missing
        clock.t += SUPERVISE_INTERVAL_S
        hang.activity()
        hang.tick()
        assert hang.overdue(5, start_timeout_s=60, nodes=None) is None


def test_no_rank_started_names_them_all() -> None:
    clock = FakeClock()
    hang, _ = _starting(clock)
    reason = None
    while reason is None and clock.t < 1100:
        clock.t += SUPERVISE_INTERVAL_S
        hang.tick()
        reason = hang.overdue(5, start_timeout_s=60, nodes=NODES)
    assert reason == (
        "ranks 0-3 never started in 60 s (--start-timeout); "
        "node 0 (h0) printed nothing; node 1 (h1) printed nothing"
    )
    assert blame_unstarted(hang.unstarted, 2, 2) == (None, None)


def test_rank_ranges() -> None:
    assert rank_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert rank_ranges(list(range(0, 40, 2)), limit=3) == "0, 2, 4, …"


def test_telemetry_off() -> None:
    assert telemetry_off({"DTRAIN_TELEMETRY_S": "0"})
    assert telemetry_off({}, {"DTRAIN_TELEMETRY_S": "-1"})
    assert not telemetry_off({}, {"DTRAIN_TELEMETRY_S": "5"}, {"DTRAIN_TELEMETRY_S": "soon"})
