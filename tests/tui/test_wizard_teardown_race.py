"""A plan (or a rendered bundle) that arrives while the app tears the wizard down draws
nothing: Textual marks the screen ``_pruning`` and removes its widgets one by one, and CI saw
NoMatches('StepNav') from a PlanComputed handled in that moment (test_training_fp8, under load)."""

from __future__ import annotations

import asyncio

from engine.plan.planner import plan
from engine.plan.specs import demo_spec
from tui.app import DtrainApp
from tui.messages import BundleRendered, PlanComputed
from tui.widgets.step_nav import StepNav


def test_a_plan_arriving_while_the_wizard_is_half_removed_is_not_a_crash() -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            wizard = app.wizard
            assert wizard is not None and not wizard.torn_down
            nav = wizard.query_one(StepNav)
            removal = app._prune(wizard)  # what App._close_all does to each screen on exit
            await nav.remove()
            assert wizard.torn_down and app.wizard is None
            generation = app.session.generation
            app.on_plan_computed(PlanComputed(plan(app.session.spec), generation, 0.01))
            app.on_bundle_rendered(BundleRendered({}, generation))
            wizard.show_nav()  # called directly, the screen itself draws nothing either
            wizard.set_status("late")
            await removal

    asyncio.run(go())
