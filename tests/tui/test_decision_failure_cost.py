"""The decision step says what failures will cost the plan (issue 37, point 4): the same lines
as ``dtrain-tui plan``, from the plan's resilience figures."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.plan.resilience import summary_lines
from tests.tui.test_decision_ux import _app, _open_decision, llama70b_over_tcp
from tui.widgets.failure_cost import FailureCost


def test_decision_step_shows_what_failures_cost(tmp_path: Path) -> None:
    asyncio.run(_shown(tmp_path))


async def _shown(tmp_path: Path) -> None:
    app = _app(llama70b_over_tcp(tokens=None), tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None and plan.resilience is not None
        widget = app.screen.query_one(FailureCost)
        assert widget.lines == summary_lines(plan.resilience)
        assert widget.display and not widget.has_class("-none")
        assert any("goodput" in line for line in widget.lines)
