"""The monitor screen driven by a canned event source: panes per rank, lines in the right pane,
NCCL pane, states on exit and failure, focus / zoom / pages / node view / filter / next error,
tail pause on scroll-up; SVG snapshots at 80x24 and 160x48 (fixed clock, canned source)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from textual.pilot import Pilot

from engine.monitor.tail import ListSource
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.widgets.pane_grid import grid_shape
from tui.widgets.rank_pane import LinePattern, PaneBuffer, RankPane

CLOCK = 1_700_000_000.0


def sync(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async Pilot test with asyncio (no async pytest plugin in this project)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    return run


def step(r: int, n: int, t: float = 0.5) -> str:
    return (
        f"[dtrain] step={n}/20 loss={3.0 - 0.1 * n + 0.01 * r:.4f} "
        f"tokens_per_s={4096 / t:.1f} step_time_s={t} mem_gb=1.25"
    )


def nccl(r: int, text: str) -> str:
    return f"node{r // 2}:{100 + r}:{100 + r} [{r % 2}] NCCL INFO {text}"


def canned(world: int = 4, steps: int = 6, fail: bool = True) -> list[list[Event]]:
    """A 2-node run: NCCL init, steps (rank 2 slower), then rank 3 hits CUDA OOM and fails."""
    batches: list[list[Event]] = [[RunStateChanged("running", "started", CLOCK)]]
    batches.append(
        [
            LineBatch(
                r // 2,
                r,
                "stdout",
                (
                    nccl(r, "Bootstrap : Using lo:127.0.0.1<0>"),
                    "NCCL version 2.21.5+cuda12.4"
                    if r == 0
                    else nccl(r, "cudaDriverVersion 12080"),
                    nccl(r, "Using network Socket"),
                    nccl(
                        r,
                        f"comm 0x1 rank {r} nranks {world} cudaDev {r % 2} busId 1000 - Init COMPLETE",
                    ),
                ),
            )
            for r in range(world)
        ]
    )
    batches.append([LineBatch(0, None, "stdout", ("launcher: all nodes up",))])
    batches.extend(
        [LineEvent(r // 2, r, "stdout", step(r, n, 1.5 if r == 2 else 0.5)) for r in range(world)]
        for n in range(1, steps + 1)
    )
    if fail:
        batches.append(
            [
                LineBatch(
                    1,
                    3,
                    "stderr",
                    (
                        "Traceback (most recent call last):",
                        '  File "train.py", line 80, in <module>',
                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                    ),
                ),
                RankExit(1, 3, 1, reason="rank 3 exited 1"),
                RankExit(0, 0, 0),
                RankExit(0, 1, -15),
                RankExit(1, 2, -15),
                RunStateChanged("failed", "rank 3 exited 1", CLOCK, (3,)),
            ]
        )
    return batches


def app_for(batches: list[list[Event]], world: int = 4, **kw: Any) -> MonitorApp:
    return MonitorApp(ListSource(batches), world_size=world, clock=lambda: CLOCK, **kw)


async def settle(pilot: Pilot[Any]) -> MonitorScreen:
    app = pilot.app
    assert isinstance(app, MonitorApp)
    for _ in range(200):
        await pilot.pause(0.02)
        if app.monitor is not None and app.monitor.finished is not None:
            break
    await pilot.pause(0.05)
    assert app.monitor is not None and app.monitor.finished is not None
    return app.monitor


def keys(m: MonitorScreen) -> list[str]:
    return [p.key for p in m.grid.panes()]


@sync
async def test_panes_lines_nccl_and_states() -> None:
    app = app_for(canned())
    async with app.run_test(size=(160, 48)) as pilot:
        m = await settle(pilot)
        assert keys(m) == ["r0", "r1", "r2", "r3"]
        for r in range(4):
            lines = m.pane_lines(f"r{r}")
            assert lines[-6:] == [step(r, n, 1.5 if r == 2 else 0.5) for n in range(1, 7)] or r == 3
            assert all(f"[{r % 2}] NCCL" in x for x in lines[:4] if "NCCL INFO" in x)
        assert m.pane_lines("r3")[-1].startswith("torch.OutOfMemoryError")
        nccl_pane = m.pane_lines("nccl")
        assert len(nccl_pane) == 16 and nccl_pane[0].startswith("r0: ")
        assert any(x.startswith("r3: ") and "Init COMPLETE" in x for x in nccl_pane)
        assert m.pane_lines("n0")[-1] == "None: launcher: all nodes up" or any(
            "launcher" in x for x in m.pane_lines("n0")
        )
        snap = m.snapshot
        labels = {r: st.label(CLOCK) for r, st in snap.ranks.items()}
        assert labels == {0: "exited 0", 1: "failed SIGTERM", 2: "failed SIGTERM", 3: "failed 1"}
        assert snap.ranks[3].errors == 2 and snap.ranks[0].step == 6
        assert m.finished == "failed"
        p3 = m.grid.pane("r3")
        assert p3 is not None and p3.has_class("-failed") and "failed 1" in str(p3.border_title)
        assert "Socket" in str(m.query_one("#nccl-pane", RankPane).border_title)


@sync
async def test_straggler_flag_shows_while_running() -> None:
    app = app_for(canned(fail=False))
    async with app.run_test(size=(160, 48)) as pilot:
        m = await settle(pilot)
        assert m.snapshot.ranks[2].straggler and not m.snapshot.ranks[0].straggler
        p2 = m.grid.pane("r2")
        assert p2 is not None and "SLOW" in str(p2.border_title) and p2.has_class("-flagged")


@sync
async def test_focus_cycle_zoom_filter_and_next_error() -> None:
    app = app_for(canned())
    async with app.run_test(size=(160, 48)) as pilot:
        m = await settle(pilot)
        # The focus starts on the root cause (rank 3); Tab goes on to the NCCL pane, then r0.
        await until(pilot, lambda: getattr(app.focused, "key", None) == "r3")
        await pilot.press("tab", "tab")
        assert isinstance(app.focused, RankPane) and app.focused.key == "r0"
        await pilot.press("tab", "tab")
        assert app.focused.key == "r2"
        await pilot.press("z")
        await pilot.pause(0.05)
        assert keys(m) == ["r2"] and m.grid.zoomed == "r2"
        await pilot.press("tab")
        await pilot.pause(0.05)
        assert keys(m) == ["r3"]
        await pilot.press("escape")
        await pilot.pause(0.05)
        assert keys(m) == ["r0", "r1", "r2", "r3"]
        # filter across panes
        await pilot.press("slash", *"step=6/", "enter")
        await pilot.pause(0.05)
        for r in range(4):
            pane = m.grid.pane(f"r{r}")
            assert pane is not None
            assert [x for x in pane.lines] == [step(r, 6, 1.5 if r == 2 else 0.5)]
        nccl_pane = m.query_one("#nccl-pane", RankPane)
        assert len(nccl_pane.lines) == 0
        await pilot.press("escape")
        pane0 = m.grid.pane("r0")
        assert pane0 is not None and len(pane0.lines) > 1 and m.grid.pattern is None
        # regex filter, and a bad regex is a message, not a crash
        await pilot.press("slash", *"re:Init COMPLETE|version", "enter")
        await pilot.pause(0.05)
        assert len(m.query_one("#nccl-pane", RankPane).lines) == 5
        await pilot.press("slash", "ctrl+u", *"re:([", "enter")
        await pilot.pause(0.05)
        assert m.grid.pattern is not None and m.grid.pattern.text == "re:Init COMPLETE|version"
        await pilot.press("escape", "escape")
        # next error: rank 3's traceback, its pane focused and scrolled to it
        await pilot.press("e")
        await pilot.pause(0.1)
        assert isinstance(app.focused, RankPane) and app.focused.key == "r3"
        assert app.focused._highlight_row is not None
        assert "Traceback" in str(app.focused.lines[app.focused._highlight_row])
        await pilot.press("e")
        await pilot.pause(0.1)
        assert "OutOfMemoryError" in str(app.focused.lines[app.focused._highlight_row])


@sync
async def test_pages_and_node_view_with_many_ranks() -> None:
    world = 64
    batches: list[list[Event]] = [
        [
            LineBatch(r // 8, r, "stdout", (f"hello from {r}", nccl(r, "Init COMPLETE")))
            for r in range(world)
        ]
    ]
    app = app_for(batches, world=world)
    async with app.run_test(size=(80, 24)) as pilot:
        m = await settle(pilot)
        first = keys(m)
        assert 1 < len(first) < world and m.grid.pages == -(-world // len(first))
        assert first[0] == "r0"
        await pilot.press("right_square_bracket")
        await pilot.pause(0.05)
        assert keys(m)[0] == f"r{len(first)}"
        # cycling focus walks across pages
        await pilot.press("left_square_bracket")
        await pilot.pause(0.05)
        for _ in range(len(first)):  # from rank 0, where the focus starts
            await pilot.press("tab")
        await pilot.pause(0.05)
        assert isinstance(app.focused, RankPane) and app.focused.key == f"r{len(first)}"
        assert m.grid.page == 1
        await pilot.press("v")
        await pilot.pause(0.05)
        assert m.grid.view == "node"
        assert keys(m)[0] == "n0" and sum(m.grid.pages for _ in [0]) >= 1
        assert m.pane_lines("n0")[0] == "r0: hello from 0"
        assert len(m.pane_lines("n7")) == 16


@sync
async def test_scroll_up_pauses_tail_and_counts_new_lines() -> None:
    buf = PaneBuffer(1000)

    class Host(MonitorApp):
        pass

    app = app_for([[]], world=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        pane = RankPane(buf, "x")
        await app.screen.mount(pane)
        pane.write_lines([f"line {i}" for i in range(200)])
        await pilot.pause(0.05)
        assert pane.follow and pane.scroll_y == pane.max_scroll_y > 0
        pane.focus()
        await pilot.press("pageup")
        await pilot.pause(0.05)
        assert not pane.follow
        y = pane.scroll_y
        pane.write_lines([f"more {i}" for i in range(37)])
        await pilot.pause(0.05)
        assert pane.scroll_y == y and pane.waiting == 37
        assert "37 new lines" in str(pane.border_subtitle)
        # past the cap, old lines fall off and the view stays on what the reader looks at
        row_text = pane.lines[int(pane.scroll_y)]
        pane.write_lines([f"flood {i}" for i in range(900)])
        await pilot.pause(0.05)
        assert pane.lines[int(pane.scroll_y)] == row_text
        assert len(pane.lines) == 1000
        await pilot.press("end")
        await pilot.pause(0.05)
        assert pane.follow and pane.border_subtitle == ""
        assert pane.scroll_y == pane.max_scroll_y


def test_grid_shape_adapts_to_size_and_count() -> None:
    assert grid_shape(1, 80, 15) == (1, 1)
    assert grid_shape(2, 160, 30) == (2, 1)
    assert grid_shape(4, 160, 30) == (2, 2)
    c, r = grid_shape(64, 80, 15)
    assert c * r < 64 and c == 2
    c, r = grid_shape(8, 240, 60)
    assert c * r >= 8 and c * r - 8 < c


def test_line_pattern() -> None:
    assert LinePattern("nccl warn").search("x NCCL WARN y")
    assert not LinePattern("re:^a").search("ba")
    assert LinePattern("re:b+").spans("abbc") == [(1, 3)]
    with pytest.raises(Exception):  # noqa: B017, PT011 - re.error
        LinePattern("re:(")


def test_pane_buffer_keeps_the_same_tail_and_count_when_a_batch_overflows_it() -> None:
    # A batch bigger than the pane skips the lines it would push out at once: the kept
    # lines, their tags and the count must be those of feeding every line in turn.
    chunks: list[tuple[int | None, list[str]]] = [
        (r % 3 if r % 4 else None, [f"r{r} line {i}" for i in range(n)])
        for r, n in enumerate([3, 0, 7, 1, 12, 5, 9, 2])
    ]
    for keep in (1, 4, 10, 25, 100):
        fast, slow = PaneBuffer(keep, tagged=True), PaneBuffer(keep, tagged=True)
        fast.extend_chunks(chunks)
        for tag, lines in chunks:
            for line in lines:
                slow.extend([line], tag)
        assert (list(fast.texts), fast.tags, fast.total) == (
            list(slow.texts),
            slow.tags,
            slow.total,
        )
        one = PaneBuffer(keep)
        one.extend([x for _, lines in chunks for x in lines])
        assert list(one.texts) == list(slow.texts) and one.total == slow.total


# ---- snapshots ----------------------------------------------------------------------------------


async def _settle_for_snapshot(pilot: Pilot[Any]) -> None:
    await settle(pilot)
    m = pilot.app.monitor  # type: ignore[attr-defined]
    m.app.clear_notifications()


def test_snapshot_80x24(snap_compare: Any) -> None:
    assert snap_compare(app_for(canned()), terminal_size=(80, 24), run_before=_settle_for_snapshot)


def test_snapshot_160x48(snap_compare: Any) -> None:
    assert snap_compare(app_for(canned()), terminal_size=(160, 48), run_before=_settle_for_snapshot)


@sync
async def test_reopen_a_finished_run_directory(tmp_path: Any) -> None:
    import json

    from engine.monitor.tail import RunDirSource

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.stdout.log").write_text(step(0, 1) + "\n" + nccl(0, "Using network IB") + "\n")
    (logs / "rank1.stderr.log").write_text("h:1:1 [1] NCCL WARN Net : Connection closed\n")
    ranks = [
        {"rank": r, "node_rank": 0, "local_rank": r, "host": "h", "exit_code": r} for r in (0, 1)
    ]
    info = {"state": "failed", "world_size": 2, "ranks": ranks, "failed_rank": 1, "reason": "x"}
    (tmp_path / "run.json").write_text(json.dumps(info))
    source = RunDirSource(tmp_path)
    source.start()
    app = MonitorApp(source, tmp_path, world_size=source.world_size, clock=lambda: CLOCK)
    async with app.run_test(size=(120, 40)) as pilot:
        m = await settle(pilot)
        assert keys(m) == ["r0", "r1"]
        assert m.pane_lines("r0")[0] == step(0, 1)
        assert m.pane_lines("nccl") == [
            "r0: " + nccl(0, "Using network IB"),
            "r1: h:1:1 [1] NCCL WARN Net : Connection closed",
        ]
        assert m.snapshot.ranks[1].label(CLOCK) == "failed 1"
        assert m.snapshot.errors[0].kind.value == "nccl_warn"
        assert m.finished == "failed" and m.run_title == tmp_path.name


class Endless:
    """A live source that never ends on its own (a run still going)."""

    def __init__(self) -> None:
        self.stopped = False

    def start(self) -> None:
        return None

    def poll(self, timeout: float) -> list[Event]:
        return [] if self.stopped else [LineEvent(0, 0, "stdout", "tick")]

    def stop(self) -> None:
        self.stopped = True

    @property
    def done(self) -> bool:
        return self.stopped


@sync
async def test_stop_run_asks_first_and_leaving_the_screen_does_not_stop_it() -> None:
    src = Endless()
    app = MonitorApp(src, world_size=1, clock=lambda: CLOCK)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.3)
        assert app.monitor is not None and app.monitor.delivered > 0
        await pilot.press("ctrl+x")
        await pilot.pause(0.1)
        assert not src.stopped
        await pilot.press("ctrl+x")
        for _ in range(50):
            await pilot.pause(0.02)
            if src.stopped:
                break
        assert src.stopped
    # The screen alone (as the wizard pushes it) leaves a live run alone when it closes.
    src2 = Endless()
    screen = MonitorScreen(src2)
    assert screen.stop_source_on_exit is False


class FailsToStart(Endless):
    def start(self) -> None:
        from engine.errors import DtrainError

        raise DtrainError("node 1 (10.0.0.2): connection refused", field="--hosts")


@sync
async def test_a_source_that_fails_to_start_is_one_line_not_a_crash() -> None:
    app = MonitorApp(FailsToStart(), world_size=2, clock=lambda: CLOCK)
    async with app.run_test(size=(100, 30)) as pilot:
        m = await settle(pilot)
        assert m.finished == "failed"
        notes = [n.message for n in app._notifications]
        assert notes == ["could not start: --hosts: node 1 (10.0.0.2): connection refused"]


def _launch_stubborn(tmp_path: Any) -> tuple[Any, Any]:
    """A live local run (bash ranks that ignore SIGTERM) started by the CLI, as a user does."""
    from tests.e2e.test_run_ends import Launcher, stubborn_bundle

    lau = Launcher(stubborn_bundle(tmp_path), tmp_path / "run")
    lau.wait_stdout("[rank 1] hello\n")
    return lau, tmp_path / "run"


@pytest.mark.slow
@sync
async def test_ctrl_x_on_a_run_directory_stops_the_run_for_real(tmp_path: Any) -> None:
    """`dtrain-tui monitor RUN_DIR`: Ctrl+X twice stops the launcher's run (not just the
    watching); its ranks then read `stopped`, not `failed (lost)`."""
    from engine.monitor.tail import RunDirSource
    from engine.rundir.files import read_run
    from tests.e2e.launch_util import wait_no_pids

    lau, run = _launch_stubborn(tmp_path)
    try:
        source = RunDirSource(run)
        source.start()
        app = MonitorApp(source, run, world_size=source.world_size, clock=lambda: CLOCK)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.monitor is not None and app.monitor.delivered > 0)
            await pilot.press("ctrl+x")
            await pilot.press("ctrl+x")
            m = await settle_within(pilot, 60.0)
            assert m.finished == "stopped"
            labels = {r: st.label(CLOCK) for r, st in m.snapshot.ranks.items()}
            assert labels == {0: "stopped", 1: "stopped"}
            assert not m.snapshot.errors
        assert lau.finish() == 1  # the launcher ended the run: stopped from the monitor
        assert read_run(run)["state"] == "stopped"
        assert wait_no_pids(read_run(run)["run_id"]) == []
    finally:
        lau.kill()


@pytest.mark.slow
@sync
async def test_ctrl_x_when_the_launcher_is_gone_offers_nothing_to_stop(tmp_path: Any) -> None:
    from engine.monitor.tail import RunDirSource

    lau, run = _launch_stubborn(tmp_path)
    lau.kill()  # SIGKILL: only the reaper and the reader know
    source = RunDirSource(run)
    source.start()
    app = MonitorApp(source, run, world_size=source.world_size, clock=lambda: CLOCK)
    async with app.run_test(size=(120, 40)) as pilot:
        m = await settle_within(pilot, 30.0)
        assert m.finished == "failed"
        await pilot.press("ctrl+x")

        def told() -> bool:
            notes = [n.message for n in app._notifications]
            return any(n.startswith("nothing to stop: the launcher died") for n in notes)

        await until(pilot, told)
    assert not (run / "stop.request").exists()


async def until(pilot: Pilot[Any], cond: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait (polling) until ``cond()`` holds."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition never held"
        await pilot.pause(0.02)


async def settle_within(pilot: Pilot[Any], timeout: float) -> MonitorScreen:
    """Wait (polling the screen's state) until the run shown has ended."""
    import time

    app = pilot.app
    assert isinstance(app, MonitorApp)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if app.monitor is not None and app.monitor.finished is not None:
            await pilot.pause(0.05)
            return app.monitor
    raise AssertionError("the run shown never ended")
