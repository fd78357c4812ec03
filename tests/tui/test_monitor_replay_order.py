"""A reopened run replays its logs in the order they were written: with ``logs/order.idx``
(every :meth:`RunDir.append` records its chunk) ranks and streams interleave as they were
written, in the rank panes and the node view. An older run without the index: a rank's Traceback
(its stderr, written as it died) after the steps its stdout printed before, the node's torchrun
summary after the ranks; files come whole, in the order they were last written (their mtime)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from engine.monitor.tail import RunDirSource, replay_order
from engine.rundir.events import LineBatch, per_line
from engine.rundir.files import RunDir
from tui.screens.monitor import MonitorApp

CLOCK = 1_700_000_000.0
T0 = 1_700_000_000_000_000_000
"""An mtime (ns) the files are dated from; one second apart each."""
STEPS = ["[dtrain] step=1/20 loss=2.9", "[dtrain] step=2/20 loss=2.8"]
TRACEBACK = ["Traceback (most recent call last):", "ZeroDivisionError: division by zero"]
SUMMARY = ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]


def failed_run(tmp_path: Path) -> Path:
    """Rank 0 printed two steps, rank 1 one, then rank 0 died (Traceback), then torchrun said
    so on node 0: written in that order, dated in that order."""
    logs = tmp_path / "logs"
    logs.mkdir()
    written = [
        ("node0.log", ["launcher: node 0 up"], 0),
        ("rank0.stdout.log", STEPS, 1),
        ("rank1.stdout.log", ["[dtrain] step=1/20 loss=2.91"], 2),
        ("rank0.stderr.log", TRACEBACK, 3),
    ]
    for name, lines, t in written:
        (logs / name).write_text("\n".join(lines) + "\n")
        os.utime(logs / name, ns=(T0 + t * 10**9, T0 + t * 10**9))
    with open(logs / "node0.log", "a") as f:  # torchrun's summary: the node log's last write
        f.write("\n".join(SUMMARY) + "\n")
    os.utime(logs / "node0.log", ns=(T0 + 4 * 10**9, T0 + 4 * 10**9))
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "exit_code": 1 - r} for r in (0, 1)]
    info = {"state": "failed", "world_size": 2, "ranks": ranks, "failed_rank": 0, "reason": "x"}
    (tmp_path / "run.json").write_text(json.dumps(info))
    return tmp_path


def test_files_are_replayed_in_the_order_they_were_last_written(tmp_path: Path) -> None:
    run = failed_run(tmp_path)
    names = os.listdir(run / "logs")
    assert replay_order(run / "logs", names) == [
        "rank0.stdout.log",
        "rank1.stdout.log",
        "rank0.stderr.log",
        "node0.log",
    ]
    source = RunDirSource(run)
    source.start()
    events = []
    while not source.done:
        events += source.poll(0.05)
    lines = [(ev.rank, ev.line) for ev in per_line(events) if hasattr(ev, "line")]
    assert lines == [
        *((0, x) for x in STEPS),
        (1, "[dtrain] step=1/20 loss=2.91"),
        *((0, x) for x in TRACEBACK),
        (None, "launcher: node 0 up"),
        *((None, x) for x in SUMMARY),
    ]


def test_same_mtime_puts_stdout_before_stderr_and_ranks_before_the_node(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    names = ["node0.log", "rank1.stdout.log", "rank0.stderr.log", "rank0.stdout.log"]
    for name in names:
        (logs / name).write_text("x\n")
        os.utime(logs / name, ns=(T0, T0))
    assert replay_order(logs, names) == [
        "rank0.stdout.log",
        "rank0.stderr.log",
        "rank1.stdout.log",
        "node0.log",
    ]


def test_the_reopened_monitor_shows_the_traceback_after_the_steps(tmp_path: Path) -> None:
    run = failed_run(tmp_path)
    source = RunDirSource(run)
    source.start()

    async def go() -> None:
        app = MonitorApp(source, run, world_size=source.world_size, clock=lambda: CLOCK)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(250):
                await pilot.pause(0.02)
                if app.monitor is not None and app.monitor.finished is not None:
                    break
            m = app.monitor
            assert m is not None and m.finished == "failed"
            assert m.pane_lines("r0") == [*STEPS, *TRACEBACK]
            await pilot.press("v")
            await pilot.pause(0.1)
            assert m.grid.view == "node"
            assert m.pane_lines("n0") == [
                *(f"r0: {x}" for x in STEPS),
                "r1: [dtrain] step=1/20 loss=2.91",
                *(f"r0: {x}" for x in TRACEBACK),
                "node: launcher: node 0 up",
                *(f"node: {x}" for x in SUMMARY),
            ]

    asyncio.run(go())


def test_events_are_line_batches_per_file(tmp_path: Path) -> None:
    """Replay stays cheap: one batch per file read, not an event per line."""
    source = RunDirSource(failed_run(tmp_path))
    source.start()
    events = []
    while not source.done:
        events += source.poll(0.05)
    assert sum(isinstance(ev, LineBatch) for ev in events) == 4


def indexed_run(tmp_path: Path) -> Path:
    """The same failure written through a real :meth:`RunDir.append` (so with its order index),
    the ranks' lines interleaved: r0 step 1, r1 step 1, r0 step 2, r0's Traceback, torchrun."""
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    rd = RunDir(run)
    writes = [
        (None, "stdout", ["launcher: node 0 up"]),
        (0, "stdout", STEPS[:1]),
        (1, "stdout", ["[dtrain] step=1/20 loss=2.91"]),
        (0, "stdout", STEPS[1:]),
        (0, "stderr", TRACEBACK),
        (None, "stdout", SUMMARY),
    ]
    for rank, stream, lines in writes:
        rd.append(0, rank, stream, "".join(x + "\n" for x in lines).encode())
    rd.close()
    os.utime(run / "logs" / "node0.log", ns=(T0, T0))  # mtimes that would say otherwise
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "exit_code": 1 - r} for r in (0, 1)]
    info = {"state": "failed", "world_size": 2, "ranks": ranks, "failed_rank": 0, "reason": "x"}
    (run / "run.json").write_text(json.dumps(info))
    return run


def test_the_node_view_of_a_reopened_run_is_in_write_order(tmp_path: Path) -> None:
    run = indexed_run(tmp_path)
    source = RunDirSource(run)
    source.start()

    async def go() -> None:
        app = MonitorApp(source, run, world_size=source.world_size, clock=lambda: CLOCK)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(250):
                await pilot.pause(0.02)
                if app.monitor is not None and app.monitor.finished is not None:
                    break
            m = app.monitor
            assert m is not None and m.finished == "failed"
            assert m.pane_lines("r0") == [*STEPS, *TRACEBACK]
            await pilot.press("v")
            await pilot.pause(0.1)
            assert m.grid.view == "node"
            assert m.pane_lines("n0") == [
                "node: launcher: node 0 up",
                f"r0: {STEPS[0]}",
                "r1: [dtrain] step=1/20 loss=2.91",
                f"r0: {STEPS[1]}",
                *(f"r0: {x}" for x in TRACEBACK),
                *(f"node: {x}" for x in SUMMARY),
            ]

    asyncio.run(go())
