"""The monitor's ``d`` key on a real live launch (LocalBackend, 2 gloo ranks of the example
trainer, rank 1 never enters the all-reduce of step 3): the notification names rank 1 and the
collective; the run keeps going until stopped, and nothing is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from tests.e2e.launch_util import make_bundle, wait_no_pids
from tui.screens.monitor import MonitorApp
from tui.screens.monitor_diagnose import ASKED

pytestmark = pytest.mark.slow

SKIP = ["--skip-collective-at-step", "3", "--skip-rank", "1", "--steps", "6"]


def test_d_names_the_stuck_rank_in_a_notification(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", script_args=SKIP)
    backend = LocalBackend(bundle, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    stalled = tmp_path / "run" / "logs" / "rank1.stderr.log"

    async def go() -> list[str]:
        app = MonitorApp(backend, backend.run.path, world_size=2)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(2400):  # up to 120 s for the run to reach the skipped collective
                if stalled.exists() and "stalls" in stalled.read_text(errors="replace"):
                    break
                await pilot.pause(0.05)
            else:
                raise AssertionError("rank 1 never reached the skipped collective")
            found: list[str] = []
            # Rank 0 enters the extra all-reduce right after rank 1 stalls; a diagnosis
            # taken before that names nobody: press again until one does (bounded).
            for _ in range(5):
                app.clear_notifications()
                await pilot.press("d")
                for _ in range(700):  # the launcher answers within its 15 s dump wait
                    notes = [str(n.message) for n in app._notifications]
                    done = [n for n in notes if n != ASKED]
                    if done:
                        break
                    await pilot.pause(0.05)
                found = [str(n.message) for n in app._notifications]
                if any("never entered" in n for n in found):
                    break
            return found

    try:
        notes: Any = asyncio.run(go())
    finally:
        backend.stop()
    assert ASKED in notes
    (line,) = [n for n in notes if "never entered" in n]
    assert line.startswith("rank 1 (node 0, host localhost) never entered all_reduce #"), line
    assert "[1024] float32" in line and "rank 0 waiting in it" in line
    assert wait_no_pids(backend.run_id) == []
