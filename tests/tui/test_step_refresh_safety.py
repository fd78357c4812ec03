"""A step's ``session_changed`` is safe at any moment, by construction in the step base: before
the step's widgets exist (it is still being mounted) and while they are being removed, it draws
nothing, whoever calls it. CI saw ``wizard._enter -> show_nav -> TrainingStep.session_changed
-> query_one(ForcedBadge)`` raise NoMatches on a step whose children were not mounted yet."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import ContentSwitcher

from engine.plan.specs import demo_spec
from tui.app import DtrainApp
from tui.screens.wizard import step_class
from tui.session import Step
from tui.widgets.forced_badge import ForcedBadge


@pytest.mark.parametrize("step", [Step.TRAINING, Step.DECISION])
def test_session_changed_before_the_step_is_mounted_draws_nothing(step: Step) -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            wizard = app.wizard
            assert wizard is not None and wizard.pane(step) is None
            pane = step_class(step)(app.session)
            mounting = wizard.query_one(ContentSwitcher).mount(pane)
            assert not pane.query(ForcedBadge)  # its children are not there yet
            pane.session_changed()  # called directly: no guard at the call site
            await mounting
            await pilot.pause()
            assert pane.ready and pane.query(ForcedBadge)
            pane.session_changed()  # mounted: it draws
            assert app.return_code is None

    asyncio.run(go())


def test_session_changed_while_the_step_is_removed_draws_nothing() -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            wizard = app.wizard
            assert wizard is not None
            pane = step_class(Step.TRAINING)(app.session)
            await wizard.query_one(ContentSwitcher).mount(pane)
            await pilot.pause()
            assert pane.ready
            removal = pane.remove()  # Textual removes the children first, then the pane
            await pane.query_one(ForcedBadge).remove()
            pane.session_changed()
            await removal
            pane.session_changed()  # removed: nothing to draw on
            assert app.return_code is None

    asyncio.run(go())
