"""The sidebar never shows a ✓ on Decision for a plan that does not fit in memory: ``!`` in the
warning colour instead (70B on the two CPU ranks of the demo)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.plan.specs import ModelSpec, demo_spec
from tests.tui.wizard_support import settle
from tui.app import DtrainApp
from tui.widgets.step_nav import StepNav


def _decision_mark(app: DtrainApp) -> str:
    text = app.screen.query_one(StepNav).render().plain
    line = next(ln for ln in text.splitlines() if "Decision" in ln)
    return line.split()[-1]


def test_decision_is_marked_when_the_plan_does_not_fit(tmp_path: Path) -> None:
    async def go() -> None:
        unfit = demo_spec().model_copy(update={"model": ModelSpec(preset="llama-3-70b")})
        for spec, fits, mark in ((demo_spec(), True, "✓"), (unfit, False, "!")):
            app = DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.01)
            async with app.run_test(size=(120, 40)) as pilot:
                await settle(pilot)
                assert app.plan is not None and app.plan.recommended.fits is fits
                assert _decision_mark(app) == mark

    asyncio.run(go())
