"""The Launch step's Ctrl+F runs the fault drill (engine.launch.drill, as ``dtrain-tui drill``)
on the demo plan's real bundle in a thread worker: torchrun over gloo, a rank SIGKILLed, the
restart checked; the verdict lands on the step's result line. Waits on the worker, not a clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Static

from engine.plan.specs import demo_spec
from tui.app import DtrainApp
from tui.session import Step

pytestmark = pytest.mark.slow


def test_ctrl_f_on_the_launch_step_runs_the_drill(tmp_path: Path) -> None:
    async def go() -> str:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            app.session.out_dir = tmp_path / "bundle"
            app.session.run_root = tmp_path / "runs"
            wizard = app.wizard
            assert wizard is not None
            await wizard.go(Step.LAUNCH.value)
            await app.workers.wait_for_complete()  # the plan
            await pilot.press("ctrl+f")
            await pilot.pause()
            await asyncio.wait_for(app.workers.wait_for_complete(), 400)
            await pilot.pause()
            return str(app.screen.query_one("#launch-result", Static).render())

    text = asyncio.run(go())
    assert text.startswith("✓ drill passed"), text
    assert (tmp_path / "bundle" / "bundle.json").is_file()
