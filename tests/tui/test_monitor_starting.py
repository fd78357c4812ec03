"""The monitor while a run starts: until the first rank line arrives (torchrun and Python's
imports take seconds) the header says what is happening ("starting: launching torchrun on 2
nodes…"), not "0 ranks · 0 lines"; a run directory reopened while it starts says the same."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from engine.monitor.tail import RunDirSource
from engine.rundir.events import Event, LineBatch, RunStateChanged
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.widgets.monitor_header import MonitorHeader

CLOCK = 1_700_000_000.0
DEADLINE_POLLS = 250


class Gated:
    """A live source: ``first`` at once, then nothing until ``release`` is set, then ``then``."""

    def __init__(self, first: list[Event], then: list[Event]) -> None:
        self.first, self.then = first, then
        self.release = threading.Event()
        self.stopped = False

    def start(self) -> None:
        return None

    def poll(self, timeout: float) -> list[Event]:
        if self.first:
            out, self.first = self.first, []
            return out
        if self.release.wait(timeout) and self.then:
            out, self.then = self.then, []
            return out
        return []

    def stop(self) -> None:
        self.stopped = True
        self.release.set()

    @property
    def done(self) -> bool:
        return self.stopped


def header_text(m: MonitorScreen) -> str:
    return str(m.query_one(MonitorHeader).render())


async def wait_header(pilot: Pilot[Any], m: MonitorScreen, text: str) -> str:
    """The header once it holds ``text`` (fails with what it showed after the deadline)."""
    shown = ""
    for _ in range(DEADLINE_POLLS):
        await pilot.pause(0.02)
        shown = header_text(m)
        if text in shown:
            return shown
    raise AssertionError(f"header never showed {text!r}: {shown!r}")


def test_a_starting_run_says_what_it_does_until_the_first_rank_line() -> None:
    starting = RunStateChanged("starting", "starting 4 ranks on 2 node(s)", CLOCK)
    source = Gated(
        [starting, RunStateChanged("running", "started in 0.10s", CLOCK)],
        [LineBatch(0, 0, "stdout", ("[dtrain] step=1/20 loss=2.9",))],
    )

    async def go() -> None:
        app = MonitorApp(source, world_size=4, nodes=2, clock=lambda: CLOCK)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 40)) as pilot:
            while app.monitor is None:
                await pilot.pause(0.01)
            m = app.monitor
            shown = await wait_header(pilot, m, "waiting for the first rank line")
            assert "● running: torchrun started on 2 nodes" in shown
            assert "0 lines" not in shown
            source.release.set()
            shown = await wait_header(pilot, m, "1 line")
            assert "waiting for the first rank line" not in shown and "4 ranks" in shown

    asyncio.run(go())


def test_the_starting_state_names_the_nodes_from_the_backend() -> None:
    class Manifest:
        nodes = 3

    source = Gated([RunStateChanged("starting", "starting 3 ranks on 3 node(s)", CLOCK)], [])
    source.manifest = Manifest()  # type: ignore[attr-defined]

    async def go() -> None:
        app = MonitorApp(source, clock=lambda: CLOCK)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 40)) as pilot:
            while app.monitor is None:
                await pilot.pause(0.01)
            shown = await wait_header(pilot, app.monitor, "● starting: ")
            assert "launching torchrun on 3 nodes…" in shown, shown

    asyncio.run(go())


def test_a_reopened_run_that_is_still_starting_says_so(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    launcher = {"pid": os.getpid()}  # alive: the run is not taken for a dead launcher's
    info = {"state": "starting", "nodes": 2, "world_size": 4, "launcher": launcher}
    (tmp_path / "run.json").write_text(json.dumps(info))
    source = RunDirSource(tmp_path)
    source.start()

    async def go() -> None:
        app = MonitorApp(source, tmp_path, world_size=source.world_size, clock=lambda: CLOCK)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.monitor is None:
                await pilot.pause(0.01)
            shown = await wait_header(pilot, app.monitor, "● starting: ")
            assert "launching torchrun on 2 nodes…" in shown, shown

    asyncio.run(go())


def test_a_slurm_job_pending_is_said_as_the_backend_says_it() -> None:
    source = Gated([RunStateChanged("starting", "slurm job 17 pending (Resources)", CLOCK)], [])

    async def go() -> None:
        app = MonitorApp(source, clock=lambda: CLOCK)  # type: ignore[arg-type]
        async with app.run_test(size=(120, 40)) as pilot:
            while app.monitor is None:
                await pilot.pause(0.01)
            await wait_header(pilot, app.monitor, "● starting: slurm job 17 pending (Resources)…")

    asyncio.run(go())


def test_at_80_columns_the_starting_word_fits_beside_a_long_run_name() -> None:
    source = Gated([RunStateChanged("running", "started in 0.10s", CLOCK)], [])

    async def go() -> None:
        title = "20261202-133306-llama-3-8b"
        app = MonitorApp(source, world_size=2, nodes=2, title=title, clock=lambda: CLOCK)  # type: ignore[arg-type]
        async with app.run_test(size=(80, 24)) as pilot:
            while app.monitor is None:
                await pilot.pause(0.01)
            shown = await wait_header(pilot, app.monitor, "● running: ")
            assert f" {title} ● running: waiting for rank output…" in shown, shown
            assert len(shown) <= 78, shown

    asyncio.run(go())
