"""A plan (or a rendered bundle) that arrives while the app tears the wizard down draws
nothing: Textual marks the screen ``_pruning`` and removes its widgets one by one, and CI saw
NoMatches('StepNav') from a PlanComputed handled in that moment (test_training_fp8, under load)."""

from __future__ import annotations

import asyncio

from engine.plan.planner import plan
from engine.plan.specs import demo_spec
from tui.app import DtrainApp
from tui.lifecycle import torn_down
from tui.messages import BundleRendered, PlanComputed
from tui.widgets.step_nav import StepNav


def test_a_plan_arriving_while_the_wizard_is_half_removed_is_not_a_crash() -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            wizard = app.wizard
            assert wizard is not None and not torn_down(wizard)
            nav = wizard.query_one(StepNav)
            removal = app._prune(wizard)  # what App._close_all does to each screen on exit
            await nav.remove()
            assert torn_down(wizard) and app.wizard is None
            generation = app.session.generation
            app.on_plan_computed(PlanComputed(plan(app.session.spec), generation, 0.01))
            app.on_bundle_rendered(BundleRendered({}, generation))
            wizard.show_nav()  # called directly, the screen itself draws nothing either
            wizard.set_status("late")
            await removal

    asyncio.run(go())


def test_worker_results_for_a_removed_step_are_dropped() -> None:
    # The Training step's nearest-batch search and the Launch step's preflight finish in
    # threads; their results reach the UI through call_from_thread and may find the step gone.
    from textual.widgets import ContentSwitcher

    from tui.screens.launch import LaunchStep
    from tui.screens.training import TrainingStep
    from tui.screens.wizard import step_class
    from tui.session import Step

    async def go() -> None:
        app = DtrainApp(demo_spec(), plan_delay_s=0.01)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            wizard = app.wizard
            assert wizard is not None
            training = step_class(Step.TRAINING)(app.session)
            assert isinstance(training, TrainingStep)
            launch = step_class(Step.LAUNCH)(app.session)
            assert isinstance(launch, LaunchStep)
            switcher = wizard.query_one(ContentSwitcher)
            await switcher.mount(training)
            await switcher.mount(launch)
            await training.remove()
            await launch.remove()
            training.batch_state = ("refused", 7)
            training._nearest_found([], 7)
            launch.preflight_done("preflight: ok", True)
            await pilot.pause()
            assert app.return_code is None

    asyncio.run(go())
