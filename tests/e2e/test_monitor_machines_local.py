"""A real local 2-rank CPU run (the example trainer through the rank agent, torchrun over gloo):
reopened from its run directory, the monitor's GPU panel shows each rank's CPU use and resident
memory, its charts the steps, and ``--export json`` holds the steps and the telemetry samples."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from engine.launch.local import LocalBackend
from engine.launch.options import LaunchOptions
from engine.monitor.export import export_text, read_series
from engine.monitor.tail import RunDirSource
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, make_bundle, wait_no_pids
from tests.tui.test_monitor import settle
from tui.screens.monitor import MonitorApp
from tui.widgets.charts import RankCharts
from tui.widgets.gpu_panel import GpuPanel

TELEMETRY = {"DTRAIN_TELEMETRY_S": "0.2"}
"""Often enough that each rank samples while importing torch, however fast the steps go."""


async def _panel(run: Path) -> tuple[str, dict[int, list[float]]]:
    source = RunDirSource(run)
    source.start()
    app = MonitorApp(source, run, world_size=source.world_size)
    async with app.run_test(size=(140, 44)) as pilot:
        m = await settle(pilot)
        await pilot.press("g", "p")
        await pilot.pause(0.1)
        return m.query_one(GpuPanel).text.plain, m.query_one(RankCharts).drawn["loss"]


def test_cpu_telemetry_of_a_real_run_in_the_gpu_panel(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b", steps=8)
    backend = LocalBackend(bundle, tmp_path / "run", LaunchOptions(env=TELEMETRY))
    backend.start()
    collect(backend, timeout=240)
    run = tmp_path / "run"
    assert read_run(run)["state"] == "succeeded"
    assert wait_no_pids(backend.run_id) == []
    text, loss = asyncio.run(_panel(run))
    for rank in (0, 1):
        row = next(x for x in text.splitlines() if x.startswith(f"  CPU rank {rank} "))
        assert " cpu " in row and " %" in row and " GiB" in row.split("rss ")[1], row
        assert "no sample yet" not in row, row
    assert sorted(loss) == [0, 1] and all(len(v) == 8 for v in loss.values()), loss
    data = json.loads(export_text(read_series(run), "json"))
    assert {s["rank"] for s in data["steps"]} == {0, 1} and len(data["steps"]) == 16
    assert {t["rank"] for t in data["telemetry"]} == {0, 1}
    assert all(t["rss_bytes"] > 1 << 20 and t["gpu"] is None for t in data["telemetry"])
