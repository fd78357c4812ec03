"""A forward move from the Decision step typed while the plan is still being worked out (a
field just changed, the planner's quiet time not over) is not refused: the status line says
the next step opens when the plan is in, and it does. Waits on the app's state with deadlines."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, retype, settle, to_training, until
from tui.app import DtrainApp


async def _typed_ahead(tmp_path: Path) -> None:
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "bundle", plan_delay_s=1.5)
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        await until(pilot, lambda: app.plan is not None, "the first plan")
        await pilot.press("tab")
        await retype(pilot, "4")  # a new global batch: planning again after 1.5 s of quiet
        await pilot.press("ctrl+n", "ctrl+n")
        await at_step(pilot, "decision")
        await until(pilot, lambda: app.session.planning, "planning again")
        wiz = app.wizard
        assert wiz is not None
        status = wiz._status[0]
        assert status == "planning… configs opens when the plan is in", status
        await at_step(pilot, "configs")
        assert app.plan is not None and app.plan.spec.training.global_batch == 4
        assert not wiz._status[1], wiz._status  # no error was ever shown for it
        await settle(pilot)


def test_next_from_decision_while_planning_waits_for_the_plan(tmp_path: Path) -> None:
    asyncio.run(_typed_ahead(tmp_path))
