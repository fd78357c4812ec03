"""The monitor's GPU panel, charts and plan-against-measured line over a canned run directory
(plan.json) and canned events: telemetry samples and step lines of 8 ranks on 2 nodes, one GPU
throttled, one hot; ``g`` shows the panel with the flags named and the plan's estimate marked,
``p`` the plotext charts; CPU ranks show CPU use and RSS in the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from textual_plotext import PlotextPlot

from engine.monitor.tail import ListSource
from engine.rundir.events import Event, LineBatch, RunStateChanged
from tests.engine.test_machines import PLAN, tel
from tests.tui.test_monitor import CLOCK, settle, step, sync
from tui.screens.monitor import MonitorApp
from tui.widgets.charts import RankCharts
from tui.widgets.gpu_panel import GpuPanel
from tui.widgets.plan_line import PlanLine


def run_dir(tmp: Path) -> Path:
    (tmp / "plan.json").write_text(json.dumps(PLAN))  # 1.2 s a step, 40 GiB a GPU, MFU 50 %
    return tmp


def batches(world: int, gpu: bool) -> list[list[Event]]:
    out: list[list[Event]] = [[RunStateChanged("running", "started", CLOCK)]]
    for r in range(world):
        extra: dict[str, Any] = {}
        if gpu:
            extra = {"temp_c": 70.0}
            if r == 7:
                extra["throttle"] = ["hw_slowdown"]
            if r == 2:
                extra["temp_c"] = 91.0
        lines = (tel(r, r // 4, **extra), *(step(r, n, 1.8) for n in range(1, 7)))
        out.append([LineBatch(r // 4, r, "stderr", lines, CLOCK, f"h{r // 4}")])
    out.append([RunStateChanged("succeeded", "all ranks exited 0", CLOCK)])
    return out


@sync
async def test_gpu_panel_flags_and_plan_marker_then_charts(tmp_path: Path) -> None:
    app = MonitorApp(
        ListSource(batches(8, gpu=True)), run_dir(tmp_path), world_size=8, clock=lambda: CLOCK
    )
    async with app.run_test(size=(160, 48)) as pilot:
        m = await settle(pilot)
        panel = m.query_one(GpuPanel)
        assert not panel.display  # hidden until g
        line = m.query_one(PlanLine).line
        assert line.startswith("plan vs measured (±15 %): step 1.80 s vs 1.20 s planned (+50 %)")
        assert line.endswith("press k to calibrate")
        await pilot.press("g")
        await pilot.pause(0.1)
        assert panel.display
        text = panel.text.plain
        assert "⚠ GPU 2 on node 0: hot (91 °C, ≥ 85)" in text
        assert "⚠ GPU 3 on node 1: throttled (HW slowdown)" in text
        assert "node 1 (h1)" in text and "┃ plan's estimate: 40.0 GiB per GPU" in text
        row = next(x for x in text.splitlines() if " r7 " in x)
        assert "util ██████████ 97 %" in row and "60.0/80.0 GiB" in row and "650/700 W" in row
        assert "┃" in row.split("mem ")[1][:10]  # the plan's 40 of 80 GiB, marked mid-bar
        assert panel.border_title == "machines: 8 GPU(s) on 2 node(s), 2 flagged"
        await pilot.press("p")
        await pilot.pause(0.1)
        charts = m.query_one(RankCharts)
        assert charts.display and set(charts.drawn) == {"loss", "throughput", "step"}
        assert sorted(charts.drawn["step"]) == [0, 1, 2, 3, 4, 5]  # MAX_SERIES of 8
        assert charts.drawn["step"][0] == [1.8] * 6
        assert charts.drawn["loss"][1][0] == 2.91  # step 1 of rank 1
        plot = m.query_one("#chart-throughput", PlotextPlot)
        drawn = plot.render().plain  # type: ignore[union-attr]
        assert "tokens/s" in drawn and "r0" in drawn
        await pilot.press("g", "p")
        await pilot.pause(0.1)
        assert not panel.display and not charts.display


@sync
async def test_cpu_ranks_show_cpu_use_and_rss(tmp_path: Path) -> None:
    app = MonitorApp(ListSource(batches(2, gpu=False)), tmp_path, world_size=2, clock=lambda: CLOCK)
    async with app.run_test(size=(120, 40)) as pilot:
        m = await settle(pilot)
        assert m.query_one(PlanLine).line == ""  # no plan.json: nothing to compare
        await pilot.press("g")
        await pilot.pause(0.1)
        text = m.query_one(GpuPanel).text.plain
        assert "CPU rank 0  r0   cpu ██████████ 99 %" in text
        assert "rss 3.0 GiB" in text and "⚠" not in text
        assert m.query_one(GpuPanel).border_title == "machines: 2 CPU rank(s) on 1 node(s)"
