"""The launch step for real: Ctrl+L writes the bundle, starts two CPU ranks with torchrun over
gloo (the local backend) and opens the monitor screen, which watches the run to its end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle
from tui.app import DtrainApp


@pytest.mark.slow
def test_ctrl_l_launches_locally_and_opens_the_monitor(tmp_path: Path) -> None:
    asyncio.run(_launch(tmp_path))


async def _launch(tmp_path: Path) -> None:
    from tui.screens.monitor import MonitorScreen

    spec = demo_spec()
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": 3})})
    app = DtrainApp(
        spec, out_dir=tmp_path / "bundle", run_root=tmp_path / "runs", plan_delay_s=0.05
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press(*["ctrl+n"] * 6)
        await settle(pilot)
        await at_step(pilot, "launch")
        await pilot.press("ctrl+l")
        for _ in range(300):
            await pilot.pause(0.1)
            if isinstance(app.screen, MonitorScreen):
                break
        assert isinstance(app.screen, MonitorScreen)
        runs = list((tmp_path / "runs").iterdir())
        assert len(runs) == 1
        run_json = runs[0] / "run.json"
        for _ in range(900):
            await pilot.pause(0.1)
            if run_json.exists() and json.loads(run_json.read_text()).get("state") in (
                "succeeded",
                "failed",
                "stopped",
            ):
                break
        state = json.loads(run_json.read_text())
        assert state["state"] == "succeeded", state
        assert (tmp_path / "bundle" / "bundle.json").exists()
        assert "step=3/3" in (runs[0] / "logs" / "rank1.stdout.log").read_text()
