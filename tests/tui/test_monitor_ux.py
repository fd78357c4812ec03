"""The monitor you can navigate (issue 15): back to the wizard and reopen the run, ``?`` help, the
palette's monitor actions, ``q`` the same in both monitors, ``z`` full screen, long lines that
scroll sideways, pane titles cut by whole fields, ``v`` twice, the side table after widening, the
root cause of a failure, a stopped run, SLOW kept on replay, Open run….

Canned event sources and Pilot: no processes. Every test here fails on the monitor before
issue 15 (no ``b``/``?``/``w`` keys, no palette provider, no classes, no Open run…)."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from engine.monitor.tail import ListSource, RunDirSource
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from tests.tui.test_monitor import CLOCK, Endless, canned, step
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.widgets.monitor_header import MonitorHeader
from tui.widgets.monitor_side import MonitorSide
from tui.widgets.pane_grid import pane_title
from tui.widgets.rank_pane import RankPane
from tui.widgets.rank_strip import RankStrip


def sync(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    return run


async def until(
    pilot: Pilot[Any], cond: Callable[[], bool], what: str, timeout: float = 20.0
) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"after {timeout:g} s: {what}"
        await pilot.pause(0.02)


def app_for(batches: list[list[Event]], world: int = 4) -> MonitorApp:
    return MonitorApp(ListSource(batches), world_size=world, clock=lambda: CLOCK)


async def finished(pilot: Pilot[Any]) -> MonitorScreen:
    app = pilot.app
    assert isinstance(app, MonitorApp)
    await until(
        pilot,
        lambda: app.monitor is not None and app.monitor.finished is not None,
        "run never ended",
    )
    await pilot.pause(0.1)
    assert app.monitor is not None
    return app.monitor


def header_text(m: MonitorScreen) -> str:
    return str(m.query_one(MonitorHeader).render())


# ---- help, palette, q ---------------------------------------------------------------------------


@sync
async def test_question_mark_and_f1_show_the_monitor_keys() -> None:
    from tui.screens.monitor_help import MonitorHelp

    app = app_for(canned())
    async with app.run_test(size=(120, 40)) as pilot:
        await finished(pilot)
        for key in ("question_mark", "f1"):
            await pilot.press(key)
            await until(pilot, lambda: isinstance(app.screen, MonitorHelp), f"{key}: no help")
            help_screen = app.screen
            assert isinstance(help_screen, MonitorHelp)
            text = "\n".join(f"{k}: {w}" for k, w in help_screen.rows)
            for want in ("full screen", "ctrl+x", "stop the run", "quit the monitor", "sideways"):
                assert want in text, (want, text)
            assert "back to the wizard" not in text  # no wizard behind this one
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "help stayed")


@sync
async def test_the_palette_offers_the_monitor_actions() -> None:
    app = app_for(canned())
    async with app.run_test(size=(120, 40)) as pilot:
        m = await finished(pilot)
        from textual.command import CommandPalette
        from textual.widgets import OptionList

        m.grid.focus_key("r1")
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "no palette")
        await pilot.press(*"monitor: full")
        palette = app.screen
        await until(
            pilot,
            lambda: (
                "Monitor: full screen"
                in str(palette.query_one(OptionList).get_option_at_index(0).prompt)
            ),
            "the palette does not offer Monitor: full screen",
        )
        await pilot.press("enter")
        await until(pilot, lambda: m.grid.zoomed == "r1", "the palette did not zoom")
        assert m.has_class("-fullscreen")


@sync
async def test_q_quits_the_standalone_monitor_and_leaves_the_run_alone() -> None:
    src = Endless()
    app = MonitorApp(src, world_size=1, clock=lambda: CLOCK, stop_source_on_exit=False)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(
            pilot, lambda: app.monitor is not None and app.monitor.delivered > 0, "no lines"
        )
        await pilot.press("b")  # no wizard here: b does nothing, the monitor stays
        await pilot.pause(0.1)
        assert app.screen is app.monitor
        await pilot.press("q")
        await pilot.pause(0.1)
    assert app.return_code == 0
    assert not src.stopped


# ---- back to the wizard and reopen --------------------------------------------------------------


class Gentle(Endless):
    """A live run printing a line every 20 ms (``Endless`` spins a reader thread flat out)."""

    def poll(self, timeout: float) -> list[Event]:
        import time

        time.sleep(min(timeout, 0.02))
        return super().poll(timeout)


def _run_json(run: Path, state: str = "running", world: int = 1) -> None:
    run.mkdir(parents=True, exist_ok=True)
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r, "host": "h"} for r in range(world)]
    rec = {"name": run.name, "state": state, "world_size": world, "ranks": ranks}
    rec["started_at"] = "2026-11-25T01:00:00.000+00:00"
    (run / "run.json").write_text(json.dumps(rec))


@sync
async def test_back_to_the_wizard_keeps_the_run_going_and_open_run_reopens_it(
    tmp_path: Path,
) -> None:
    from engine.plan.specs import demo_spec
    from tui.app import DtrainApp
    from tui.messages import RunStarted
    from tui.screens.open_run import OpenRunScreen
    from tui.screens.wizard import WizardScreen

    runs = tmp_path / "runs"
    live_dir = runs / "20261125-010000-live"
    _run_json(live_dir)
    _run_json(runs / "20261124-120000-old", state="succeeded")
    src = Gentle()
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", run_root=runs, plan_delay_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(RunStarted(src, live_dir))  # what a launch posts
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor")
        m: MonitorScreen = app.live_monitor
        assert isinstance(m, MonitorScreen) and app.screen is m
        await until(pilot, lambda: m.delivered > 0, "no lines")
        # esc clears a filter first, and only then goes back.
        await pilot.press("slash", *"tick", "enter")
        await until(pilot, lambda: m.grid.pattern is not None, "no filter")
        await pilot.press("escape")
        await until(pilot, lambda: m.grid.pattern is None, "esc did not clear the filter")
        assert app.screen is m
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, WizardScreen), "esc did not go back")
        assert not src.stopped
        seen = m.delivered
        await until(pilot, lambda: m.delivered > seen, "the monitor stopped reading the run")
        # Open run… lists both runs, newest first; Enter on the live one shows the same monitor.
        await pilot.press("ctrl+g")
        await until(pilot, lambda: isinstance(app.screen, OpenRunScreen), "ctrl+g: no Open run")
        picker = app.screen
        assert isinstance(picker, OpenRunScreen)
        assert [r.path.name for r in picker.rows] == [live_dir.name, "20261124-120000-old"]
        assert [r.state for r in picker.rows] == ["running", "succeeded"]
        await pilot.press("enter")
        await until(pilot, lambda: app.screen is m, "the live run's monitor did not come back")
        # b goes back too; q does the same as in `dtrain-tui monitor`: leaves, the run goes on.
        await pilot.press("b")
        await until(pilot, lambda: isinstance(app.screen, WizardScreen), "b did not go back")
        await pilot.press("ctrl+g")
        await until(pilot, lambda: isinstance(app.screen, OpenRunScreen), "no Open run")
        await pilot.press("enter")
        await until(pilot, lambda: app.screen is m, "no monitor")
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, WizardScreen), "q did not leave")
        assert not src.stopped
        src.stop()


@sync
async def test_open_run_replays_a_finished_run_from_its_directory(tmp_path: Path) -> None:
    from engine.plan.specs import demo_spec
    from tui.app import DtrainApp
    from tui.screens.open_run import OpenRunScreen

    runs = tmp_path / "runs"
    run = runs / "20261124-120000-done"
    _run_json(run, state="succeeded", world=2)
    (run / "logs").mkdir()
    for r in (0, 1):
        (run / "logs" / f"rank{r}.stdout.log").write_text(f"hello {r}\n")
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", run_root=runs, plan_delay_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.2)
        app.action_open_run()  # what the palette's "Open run…" calls
        await until(pilot, lambda: isinstance(app.screen, OpenRunScreen), "no Open run")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor")
        m = app.screen
        assert isinstance(m, MonitorScreen)
        await until(pilot, lambda: m.finished == "succeeded", "the replay never ended")
        assert m.pane_lines("r1") == ["hello 1"]


def test_open_run_lists_nothing_under_a_missing_root_and_names_unreadable_runs(
    tmp_path: Path,
) -> None:
    from tui.screens.open_run import list_runs

    assert list_runs(tmp_path / "none") == []
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "run.json").write_text("{not json")
    rows = list_runs(tmp_path)
    assert [(r.path.name, r.state) for r in rows] == [("bad", "unreadable")]
    assert rows[0].reason  # one line saying why


# ---- z, long lines, titles, v, side -------------------------------------------------------------


@sync
async def test_z_is_full_screen_for_the_focused_pane_and_esc_returns() -> None:
    app = app_for(canned())
    async with app.run_test(size=(160, 48)) as pilot:
        m = await finished(pilot)
        # The focus starts on the root cause (r3); Tab: the NCCL pane, r0, r1.
        await until(pilot, lambda: m.grid.focused_key == "r3", "focus not on the root cause")
        await pilot.press("tab", "tab", "tab")
        await pilot.press("z")
        await until(pilot, lambda: [p.key for p in m.grid.panes()] == ["r1"], "not zoomed")
        await pilot.pause(0.1)
        for w in (
            m.query_one(MonitorHeader),
            m.query_one(RankStrip),
            m.query_one(MonitorSide),
            m.nccl,
        ):
            assert w.region.height == 0, w
        pane = m.grid.pane("r1")
        assert pane is not None and pane.region.height >= 48 - 2  # all but the footer
        await pilot.press("escape")
        await until(pilot, lambda: len(m.grid.panes()) == 4, "esc did not leave full screen")
        await pilot.pause(0.1)
        assert m.query_one(MonitorHeader).region.height == 1
        # The NCCL pane has a full screen too.
        m.nccl.focus()
        await pilot.press("z")
        await pilot.pause(0.2)
        assert m.grid.region.height == 0 and m.nccl.region.height >= 40
        await pilot.press("z")
        await pilot.pause(0.2)
        assert m.grid.region.height > 0


@sync
async def test_w_scrolls_long_lines_sideways_instead_of_cutting_them() -> None:
    tail = "the end of a very long line"
    long_line = "x" * 150 + tail
    batches: list[list[Event]] = [
        [LineEvent(0, 0, "stdout", long_line)],
        [RunStateChanged("succeeded")],
    ]
    app = app_for(batches, world=1)
    async with app.run_test(size=(100, 30)) as pilot:
        m = await finished(pilot)
        pane = m.grid.pane("r0")
        assert pane is not None
        assert pane.virtual_size.width <= pane.size.width  # cut: nothing to scroll to
        await pilot.press("w")
        await pilot.pause(0.1)
        assert pane.sideways and pane.virtual_size.width > len(long_line)
        pane.focus()
        await pilot.press("end")
        pane.scroll_to(x=pane.max_scroll_x, animate=False, immediate=True)
        await pilot.pause(0.1)
        assert tail in pane.render_line(0).text
        await pilot.press("w")
        await pilot.pause(0.1)
        assert not pane.sideways and pane.scroll_x == 0


def test_pane_titles_drop_whole_fields_never_cut_numbers() -> None:
    from engine.monitor.state import MonitorState
    from tui.widgets.pane_grid import title_parts
    from tui.widgets.rank_pane import fit_title

    st = MonitorState(1)
    st.apply([LineEvent(0, 0, "stdout", step(0, 78).replace("/20", "/300"))], CLOCK)
    snap = st.snapshot(CLOCK)
    full = pane_title("r0", snap, 10.0)
    assert full == "rank 0 · running · step 78/300 · loss -4.800"
    assert pane_title("r0", snap, 10.0, width=30) == "rank 0 · running · step 78/300"
    assert pane_title("r0", snap, 10.0, width=20) == "rank 0 · running"
    assert pane_title("r0", snap, 10.0, width=3) == "rank 0"
    parts = title_parts("r0", snap, 10.0)
    for width in range(0, 60):
        title = fit_title(parts, width)
        assert all(f in [t for _, t in parts] for f in title.split(" · ")), title


@sync
async def test_titles_at_80x24_fit_their_panes_by_whole_fields() -> None:
    app = app_for(canned())
    async with app.run_test(size=(80, 24)) as pilot:
        m = await finished(pilot)
        for pane in m.grid.panes():
            title = str(pane.border_title)
            fields = [t for _, t in pane.title_parts]
            assert all(f in fields for f in title.split(" · ")), title
            assert len(title) <= pane.size.width - 4, (title, pane.size.width)


@sync
async def test_v_twice_returns_to_the_same_layout() -> None:
    app = app_for(canned())
    async with app.run_test(size=(160, 48)) as pilot:
        m = await finished(pilot)
        await until(pilot, lambda: m.grid.focused_key == "r3", "focus not on the root cause")
        await pilot.press("tab", "tab", "tab", "tab", "z")  # r3 -> NCCL, r0, r1, r2
        await until(pilot, lambda: m.grid.zoomed == "r2", "no zoom")
        before = ([p.key for p in m.grid.panes()], m.grid.page, m.grid.focused_key)
        await pilot.press("v")
        await until(pilot, lambda: m.grid.view == "node", "no node view")
        await pilot.pause(0.1)
        await pilot.press("v")
        await until(pilot, lambda: m.grid.view == "rank", "no rank view")
        await pilot.pause(0.2)
        assert ([p.key for p in m.grid.panes()], m.grid.page, m.grid.focused_key) == before
        assert isinstance(m.focused, RankPane) and m.focused.key == "r2"


@sync
async def test_the_side_table_comes_back_after_widening() -> None:
    app = app_for(canned())
    async with app.run_test(size=(90, 30)) as pilot:
        m = await finished(pilot)
        side = m.query_one(MonitorSide)
        assert side.has_class("-hidden")
        await pilot.resize_terminal(160, 48)
        await until(pilot, lambda: not side.has_class("-hidden"), "the side stayed hidden")
        await pilot.resize_terminal(90, 30)
        await until(pilot, lambda: side.has_class("-hidden"), "the side stayed at 90 columns")
        await pilot.press("t")  # the user's choice wins over the width from now on
        await pilot.pause(0.1)
        assert not side.has_class("-hidden")


# ---- root cause, stopped run, SLOW on replay ----------------------------------------------------


@sync
async def test_the_root_cause_rank_stands_out_and_its_peers_are_dimmed() -> None:
    app = app_for(canned())
    async with app.run_test(size=(160, 48)) as pilot:
        m = await finished(pilot)
        await pilot.pause(0.3)
        panes = {p.key: p for p in m.grid.panes()}
        assert panes["r3"].has_class("-root-cause") and "ROOT CAUSE" in str(
            panes["r3"].border_title
        )
        for key in ("r1", "r2"):  # ended by SIGTERM after rank 3 failed
            assert panes[key].has_class("-peer") and not panes[key].has_class("-failed")
            assert "stopped by peer" in str(panes[key].border_title)
        assert not panes["r0"].has_class("-peer")
        assert "root cause: rank 3" in header_text(m)
        table = str(m.query_one("#rank-table").render())
        assert "ROOT" in table and "stopped (peer)" in table


def stopped_run() -> list[list[Event]]:
    """Two ranks stepping, then the user's stop: torchrun's own traceback on SIGTERM (node
    lines), each rank ``stopped``, the run ``stopped``."""
    return [
        [RunStateChanged("running", "started", CLOCK)],
        [LineEvent(0, r, "stdout", step(r, 1)) for r in (0, 1)],
        [
            LineBatch(
                0,
                None,
                "stderr",
                (
                    "Traceback (most recent call last):",
                    '    raise SignalException(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)',
                    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 7 got signal: 15",
                ),
            ),
            RankExit(0, 0, None, reason="stopped"),
            RankExit(0, 1, None, reason="stopped"),
            RunStateChanged("stopped", "stopped from the monitor", CLOCK),
        ],
    ]


@sync
async def test_a_run_the_user_stopped_reads_stopped_with_no_errors() -> None:
    app = app_for(stopped_run(), world=2)
    async with app.run_test(size=(160, 48)) as pilot:
        m = await finished(pilot)
        await pilot.pause(0.2)
        assert m.finished == "stopped"
        assert {r: st.label(CLOCK) for r, st in m.snapshot.ranks.items()} == {
            0: "stopped",
            1: "stopped",
        }
        assert m.snapshot.errors == ()
        text = header_text(m)
        assert "● stopped" in text and "error" not in text
        assert all("failed" not in str(p.border_title) for p in m.grid.panes())


def test_monitor_follow_prints_stopped_ranks_as_stopped(tmp_path: Path) -> None:
    import io

    from cli.monitor_cmd import follow

    _run_json(tmp_path, state="stopped", world=1)
    data = json.loads((tmp_path / "run.json").read_text())
    data["ranks"][0]["reason"] = "stopped"
    (tmp_path / "run.json").write_text(json.dumps(data))
    out = io.StringIO()
    assert follow(tmp_path, out) == 1
    assert "[rank 0] stopped\n" in out.getvalue() and "lost" not in out.getvalue()


@sync
async def test_slow_flags_stay_when_a_finished_run_is_replayed(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir(parents=True)
    for r in range(3):
        t = 1.5 if r == 2 else 0.5
        (logs / f"rank{r}.stdout.log").write_text(
            "".join(step(r, n, t) + "\n" for n in range(1, 7))
        )
    ranks = [
        {"rank": r, "node_rank": 0, "local_rank": r, "host": "h", "exit_code": 0} for r in range(3)
    ]
    (tmp_path / "run.json").write_text(
        json.dumps({"state": "succeeded", "world_size": 3, "ranks": ranks})
    )
    source = RunDirSource(tmp_path)
    source.start()
    app = MonitorApp(source, tmp_path, world_size=3, clock=lambda: CLOCK)
    async with app.run_test(size=(160, 48)) as pilot:
        m = await finished(pilot)
        await pilot.pause(0.2)
        assert [m.snapshot.ranks[r].straggler for r in range(3)] == [False, False, True]
        pane = m.grid.pane("r2")
        assert pane is not None and "SLOW" in str(pane.border_title)


def test_state_keeps_slow_after_every_rank_ended_and_names_the_root_cause() -> None:
    from engine.monitor.state import MonitorState

    st = MonitorState(3)
    for n in range(1, 6):
        st.apply(
            [LineEvent(0, r, "stdout", step(r, n, 1.5 if r == 1 else 0.5)) for r in range(3)], CLOCK
        )
    st.apply([RankExit(0, r, 0) for r in range(3)], CLOCK)
    assert [st.snapshot(CLOCK).ranks[r].straggler for r in range(3)] == [False, True, False]
    assert st.root_cause is None
    st.apply([RunStateChanged("failed", "rank 2 exited 1", CLOCK, (2,))], CLOCK)
    assert st.root_cause == 2


def test_a_run_ending_while_the_monitor_has_no_widgets_is_not_a_crash(tmp_path: Path) -> None:
    # A run can finish while the app tears the monitor down (the user quit, a test ends): the
    # message reaches a screen whose widgets are gone. It used to raise NoMatches
    # ('MonitorHeader') from the handler; now the state is kept and nothing is drawn.
    from textual.app import App

    from engine.rundir.record import RunState
    from tui.messages import RunFinished

    async def go() -> None:
        async with App().run_test() as pilot:
            m = MonitorScreen(ListSource([]), tmp_path)  # never pushed: no widgets
            m.on_run_finished(RunFinished(RunState.FAILED, "rank 1 exited 1"))
            await pilot.pause()
            assert m.finished == RunState.FAILED

    asyncio.run(go())


def test_a_run_ending_while_the_monitor_is_half_removed_is_not_a_crash() -> None:
    # CI saw the second form of the teardown race: Textual had begun removing the monitor (its
    # header still there, the side panel's chart already gone) when RunFinished arrived, and the
    # handler raised NoMatches('RankChart'). Here the removal is begun and the chart removed
    # first, as the teardown does, before the message is handled.
    from engine.rundir.record import RunState
    from tui.messages import RunFinished
    from tui.widgets.rank_chart import RankChart

    async def go() -> None:
        app = app_for([canned(4)], world=4)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            m = app.screen
            assert isinstance(m, MonitorScreen)
            chart = m.query_one(RankChart)
            removal = app._prune(m)  # what App._close_all does to each screen on exit
            await chart.remove()
            assert m.query(MonitorHeader) and not m.query(RankChart)
            m.on_run_finished(RunFinished(RunState.FAILED, "rank 1 exited 1"))
            assert m.finished == RunState.FAILED
            await removal

    asyncio.run(go())


def test_a_resize_while_the_monitor_is_half_removed_is_not_a_crash() -> None:
    # The same teardown race through on_resize: the side panel removed before the screen, a
    # resize arriving then used to query it (NoMatches('MonitorSide')).
    from tui.widgets.monitor_side import MonitorSide

    async def go() -> None:
        app = app_for([canned(4)], world=4)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            m = app.screen
            assert isinstance(m, MonitorScreen)
            removal = app._prune(m)
            await m.query_one(MonitorSide).remove()
            m.on_resize()
            await removal

    asyncio.run(go())
