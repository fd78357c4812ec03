"""A plan (or any session change) that arrives while a step is still being built must not reach
that step's widgets before they exist: the wizard redraws built steps only, and a step draws the
session itself once it is ready. (Seen in CI: NoMatches 'ForcedBadge' on DecisionStep.)"""

from __future__ import annotations

import asyncio

from textual.widgets import ContentSwitcher

from engine.plan.specs import demo_spec
from tui.app import DtrainApp
from tui.screens.wizard import step_class
from tui.session import Step


def test_a_session_change_while_a_step_mounts_is_drawn_once_it_is_ready() -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            wizard = app.wizard
            assert wizard is not None and wizard.pane(Step.DECISION) is None
            pane = step_class(Step.DECISION)(app.session)
            mounting = wizard.query_one(ContentSwitcher).mount(pane)
            wizard.show_nav()  # the plan arrives while the step is being built
            await mounting
            await pilot.pause()
            assert pane.ready
            wizard.show_nav()
            await pilot.pause()
            assert app.return_code is None  # nothing crashed

    asyncio.run(go())
