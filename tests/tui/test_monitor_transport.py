"""The NCCL pane shows the transport check: canned events of a 2-node run whose plan assumes
InfiniBand while NCCL falls back to sockets; the pane's title leads with the finding, its border
is flagged and a warning row with the cause and fix stays above the lines (no processes)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from engine.monitor.tail import ListSource
from engine.plan.planner import plan
from engine.plan.specs import Spec
from engine.rundir.events import Event, LineBatch, RunStateChanged
from engine.write.bundle import write_bundle
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.widgets.nccl_pane import NcclPane

CLOCK = 1_700_000_000.0


def run_dir_for_ib_plan(tmp: Path) -> Path:
    """A run directory as launch leaves it (plan.json, bundle/): 2 x 8 H100 on InfiniBand."""
    spec = Spec.model_validate(
        {
            "model": {"preset": "llama-3-8b"},
            "hardware": {"gpu": "h100", "gpus_per_node": 8, "nodes": 2},
            "network": {"tier": "ib"},
            "training": {"seq_len": 2048, "global_batch": 128},
        }
    )
    run = tmp / "run"
    write_bundle(plan(spec), run / "bundle")
    shutil.copy(run / "bundle" / "plan.json", run / "plan.json")
    return run


def nccl(node: int, dev: int, text: str) -> str:
    return f"gpu-{node}:{100 + dev}:{100 + dev} [{dev}] NCCL INFO {text}"


def socket_fallback() -> list[list[Event]]:
    batches: list[list[Event]] = [[RunStateChanged("running", "started", CLOCK)]]
    for node in (0, 1):
        lines = (
            nccl(node, 0, "Bootstrap : Using eth0:10.0.0.1<0>"),
            nccl(node, 0, "NET/Plugin: Using internal network plugin."),
            nccl(node, 0, "NET/IB : No device found."),
            nccl(node, 0, "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
            nccl(node, 0, "Using network Socket"),
            nccl(
                node, 0, f"comm 0x1 rank {8 * node} nranks 16 cudaDev 0 busId 1000 - Init COMPLETE"
            ),
        )
        batches.append([LineBatch(node, 8 * node, "stdout", lines, CLOCK, f"gpu-{node}")])
    batches.append([RunStateChanged("succeeded", "all 16 ranks exited 0", CLOCK)])
    return batches


async def settle(pilot: Pilot[Any]) -> MonitorScreen:
    app = pilot.app
    assert isinstance(app, MonitorApp)
    for _ in range(500):
        await pilot.pause(0.02)
        if app.monitor is not None and app.monitor.finished is not None:
            break
    assert app.monitor is not None and app.monitor.finished is not None
    await pilot.pause()  # the run's end redraws the chrome from the last batch's states
    return app.monitor


def test_nccl_pane_headline_and_warning_row_show_the_transport_finding(tmp_path: Path) -> None:
    run = run_dir_for_ib_plan(tmp_path)

    async def go() -> None:
        source = ListSource(socket_fallback())
        app = MonitorApp(source, run, world_size=16, clock=lambda: CLOCK)
        async with app.run_test(size=(160, 48)) as pilot:
            m = await settle(pilot)
            pane = m.query_one("#nccl-pane", NcclPane)
            title = str(pane.border_title)
            assert title.startswith("NCCL · ⚠ plan assumes InfiniBand, NCCL chose Socket")
            assert pane.has_class("-flagged")
            row = pane.render_line(0).text
            assert row.startswith(
                "⚠ plan assumes InfiniBand, NCCL chose Socket — likely cause: "
                "`NET/IB : No device found` on node 0 (gpu-0), node 1 (gpu-1)"
            )
            # Below the pinned row every NCCL line is still there, the last one reachable.
            assert len(m.pane_lines("nccl")) == 12
            assert pane.virtual_size.height == 13
            report = m.snapshot.transport
            assert report is not None and report.findings[0].nodes == (
                "node 0 (gpu-0)",
                "node 1 (gpu-1)",
            )

    asyncio.run(go())


def test_nccl_pane_without_a_finding_has_no_warning_row(tmp_path: Path) -> None:
    run = run_dir_for_ib_plan(tmp_path)
    batches = socket_fallback()
    for batch in batches:
        for i, ev in enumerate(batch):
            if isinstance(ev, LineBatch):  # NCCL found the HCAs this time
                lines = tuple(
                    x.replace("Socket", "IB").replace("No device found.", "Using [0]mlx5_0:1/IB")
                    for x in ev.lines
                )
                batch[i] = LineBatch(ev.node, ev.rank, ev.stream, lines, ev.ts, ev.host)

    async def go() -> None:
        app = MonitorApp(ListSource(batches), run, world_size=16, clock=lambda: CLOCK)
        async with app.run_test(size=(160, 48)) as pilot:
            m = await settle(pilot)
            pane = m.query_one("#nccl-pane", NcclPane)
            assert "⚠" not in str(pane.border_title) and "IB" in str(pane.border_title)
            assert pane.warning == "" and not pane.has_class("-flagged")
            assert pane.virtual_size.height == 12

    asyncio.run(go())
