"""The monitor's defaults (issue 40): the focus starts on the root-cause rank (or rank 0), never
the NCCL pane, which collapses to its title line while it has no lines (a gloo run); the first
``e`` goes to the root-cause rank's error, not torchrun's ``ChildFailedError`` wrapper, which
is not counted as an NCCL line; ``ctrl+x Stop run`` leaves the footer once the run ended;
counts agree with their nouns. Canned event sources and Pilot: no processes."""

from __future__ import annotations

from typing import Any

from engine.monitor.logparse import is_nccl
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from tests.tui.test_monitor import CLOCK, canned, settle, step, sync
from tests.tui.test_monitor_ux import until
from tui.screens.monitor import MonitorApp
from tui.widgets.nccl_pane import NcclPane
from tui.widgets.rank_pane import RankPane

CHILD_FAILED = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "


def gloo_failure() -> list[list[Event]]:
    """Two gloo ranks step (no NCCL line at all); torchrun's ChildFailedError wrapper comes
    first, then rank 1's own error: rank 1 is the root cause."""
    return [
        [RunStateChanged("running", "started", CLOCK)],
        *([LineEvent(0, r, "stdout", step(r, n)) for r in (0, 1)] for n in (1, 2)),
        [
            LineBatch(0, None, "stderr", (CHILD_FAILED, "train.py FAILED")),
            LineBatch(
                0,
                1,
                "stderr",
                ("Traceback (most recent call last):", "ValueError: bad batch at step 3"),
            ),
            RankExit(0, 1, 1, reason="rank 1 exited 1"),
            RankExit(0, 0, -15),
            RunStateChanged("failed", "rank 1 exited 1", CLOCK, (1,)),
        ],
    ]


def _app(batches: list[list[Event]], world: int) -> MonitorApp:
    return MonitorApp(_Source(batches), world_size=world, clock=lambda: CLOCK)


def _Source(batches: list[list[Event]]) -> Any:  # noqa: N802
    from engine.monitor.tail import ListSource

    return ListSource(batches)


def test_torchruns_child_failed_line_is_not_nccl() -> None:
    assert not is_nccl(CHILD_FAILED)
    assert not is_nccl("torch.distributed.elastic.multiprocessing.api:WARNING: Sending process 7")
    assert is_nccl("[rank0]:[W ProcessGroupNCCL.cpp:1250] Warning: destroy_process_group()")


@sync
async def test_focus_starts_on_the_root_cause_and_the_empty_nccl_pane_is_one_line() -> None:
    app = _app(gloo_failure(), world=2)
    async with app.run_test(size=(120, 40)) as pilot:
        m = await settle(pilot)
        await until(pilot, lambda: isinstance(app.focused, RankPane), "no pane focused")
        focused = app.focused
        assert isinstance(focused, RankPane) and not isinstance(focused, NcclPane)
        assert focused.key == "r1", focused.key
        nccl = m.query_one(NcclPane)
        assert m.pane_lines("nccl") == [], m.pane_lines("nccl")
        assert nccl.region.height == 1 and not nccl.can_focus
        # The first e goes to rank 1's own error, not the wrapper above it.
        await pilot.press("e")
        errors = m.snapshot.errors
        assert m.error_cursor is not None and errors[m.error_cursor].rank == 1
        assert "ChildFailedError" not in errors[m.error_cursor].text
        # The run is over: nothing to stop, and the footer says so by leaving ctrl+x out.
        assert m.check_action("stop_run", ()) is False
        await pilot.pause(0.1)
        descriptions = {w.description for w in m.query("FooterKey")}  # type: ignore[attr-defined]
        assert "Next error" in descriptions and "Stop run" not in descriptions


@sync
async def test_focus_starts_on_rank_0_and_the_nccl_pane_opens_for_its_lines() -> None:
    app = _app(canned(fail=False), world=4)
    async with app.run_test(size=(120, 40)) as pilot:
        m = await settle(pilot)
        await until(pilot, lambda: isinstance(app.focused, RankPane), "no pane focused")
        assert getattr(app.focused, "key", None) == "r0"
        nccl = m.query_one(NcclPane)
        await until(pilot, lambda: nccl.region.height >= 5, "the NCCL pane stayed shut")
        assert nccl.can_focus
        title = str(nccl.border_title)
        assert "16 lines" in title


def test_one_line_reads_one_line() -> None:
    from tui.format import plural

    assert plural(1, "line") == "1 line" and plural(2, "match") == "2 matches"
