"""engine.monitor.state: rank states, steps, errors, hang and straggler flags."""

from __future__ import annotations

from engine.monitor.logparse import ErrorKind
from engine.monitor.state import MonitorState, RankStatus, exit_text
from engine.rundir.events import LineBatch, LineEvent, RankExit, RunStateChanged


def step(n: int, loss: float = 2.0, t: float = 0.5, total: int = 10) -> str:
    return (
        f"[dtrain] step={n}/{total} loss={loss} tokens_per_s={1000 / t} step_time_s={t} mem_gb=1.0"
    )


def test_states_from_start_to_exit() -> None:
    s = MonitorState(3)
    assert [st.status for st in s.ranks.values()] == [RankStatus.STARTING] * 3
    s.apply([LineBatch(0, 0, "stdout", ("hello", step(1, 2.5), step(2, 2.25)))], now=10.0)
    s.apply([LineEvent(0, 1, "stdout", step(1, 2.4))], now=10.0)
    r0, r1, r2 = s.ranks[0], s.ranks[1], s.ranks[2]
    assert r0.status is RankStatus.RUNNING and r0.step == 2 and r0.loss == 2.25
    assert list(r0.loss_history) == [2.5, 2.25] and r0.tokens_per_s == 2000.0
    assert r0.label(10.0) == "running" and r0.label(25.0) == "idle 15s"
    assert r2.label(25.0) == "starting"
    s.apply([RankExit(0, 0, 0), RankExit(0, 1, -9), RankExit(0, 2, None)], now=30.0)
    assert r0.label(30.0) == "exited 0"
    assert r1.status is RankStatus.FAILED and r1.label(30.0) == "failed SIGKILL"
    assert r2.label(30.0) == "failed (lost)"
    assert exit_text(1) == "1" and exit_text(137) == "137 (SIGKILL)"


def test_errors_are_listed_with_rank_and_line_number() -> None:
    s = MonitorState(2)
    lines = (
        "ok",
        "Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB",
    )
    found = s.apply([LineBatch(1, 1, "stderr", lines)], now=1.0)
    assert [(e.rank, e.kind, e.line_no) for e in found] == [
        (1, ErrorKind.TRACEBACK, 1),
        (1, ErrorKind.CUDA_OOM, 2),
    ]
    s.apply([LineBatch(0, None, "stdout", ("h:1:1 [0] NCCL WARN boom",))], now=2.0)
    assert s.errors[-1].rank is None and s.errors[-1].kind is ErrorKind.NCCL_WARN
    assert s.ranks[1].errors == 2 and s.ranks[1].first_error is not None
    assert s.ranks[0].errors == 0


def test_hang_is_silence_while_others_progress() -> None:
    s = MonitorState(3, hang_after_s=30.0)
    for r in range(3):
        s.apply([LineEvent(0, r, "stdout", step(1))], now=0.0)
    s.apply([LineEvent(0, 0, "stdout", step(2)), LineEvent(0, 1, "stdout", step(2))], now=40.0)
    s.evaluate(45.0)
    assert [s.ranks[r].hung for r in range(3)] == [False, False, True]
    # Everyone silent: nobody is flagged (a global stall is not one hung rank).
    s.evaluate(200.0)
    assert not any(st.hung for st in s.ranks.values())
    # An exited rank is never hung.
    s.apply([RankExit(0, 2, 0)], now=46.0)
    s.evaluate(46.0)
    assert not s.ranks[2].hung


def test_straggler_is_step_time_well_above_the_others_median() -> None:
    s = MonitorState(4)
    for n in range(1, 4):
        for r in range(4):
            s.apply([LineEvent(0, r, "stdout", step(n, t=1.0 if r == 2 else 0.4))], now=float(n))
    snap = s.snapshot(4.0)
    assert [snap.ranks[r].straggler for r in range(4)] == [False, False, True, False]
    # Close to the median is not a straggler.
    s2 = MonitorState(2)
    s2.apply(
        [LineEvent(0, 0, "stdout", step(1, t=0.5)), LineEvent(0, 1, "stdout", step(1, t=0.6))], 1.0
    )
    s2.evaluate(1.0)
    assert not any(st.straggler for st in s2.ranks.values())


def test_run_state_and_failed_ranks() -> None:
    s = MonitorState(2)
    s.apply([RunStateChanged("running")], 0.0)
    assert s.run_state == "running"
    s.apply([RunStateChanged("failed", "rank 1 exited 1", failed_ranks=(1,))], 1.0)
    assert s.run_state == "failed" and s.ranks[1].status is RankStatus.FAILED
    assert s.ranks[0].status is RankStatus.STARTING


def test_snapshot_is_a_copy() -> None:
    s = MonitorState(1)
    s.apply([LineEvent(0, 0, "stdout", step(1, 3.0))], 0.0)
    snap = s.snapshot(0.0)
    s.apply([LineEvent(0, 0, "stdout", step(2, 2.0))], 1.0)
    assert snap.ranks[0].step == 1 and list(snap.ranks[0].loss_history) == [3.0]
    assert snap.total_lines == 1 and s.total_lines == 2


def test_a_tqdm_bar_never_hides_the_framework_seen_for_the_rank() -> None:
    """The HF Trainer logs dicts on stdout and draws its tqdm bar on stderr: the rank stays an
    HF Trainer rank whichever stream is read last (a replay reads one file after the other)."""
    from engine.monitor.logparse import StepSource

    s = MonitorState(1)
    s.apply([LineEvent(0, 0, "stdout", "{'loss': 2.5, 'learning_rate': 1e-05, 'epoch': 0.5}")], 1.0)
    s.apply([LineEvent(0, 0, "stderr", " 50%|█████     | 10/20 [00:05<00:05,  2.00it/s]")], 2.0)
    st = s.snapshot(3.0).ranks[0]
    assert st.step_source is StepSource.HF_TRAINER and st.step == 10
    bare = MonitorState(1)
    bare.apply([LineEvent(0, 0, "stderr", " 50%|█████     | 10/20 [00:05<00:05,  2.00it/s]")], 2.0)
    assert bare.snapshot(3.0).ranks[0].step_source is StepSource.TQDM
