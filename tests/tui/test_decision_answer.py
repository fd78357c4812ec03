"""The decision step puts the answer first (issue 40): the plan in one line with its margin,
step time and cost, its memory card beside it, then the alternatives as a compact table with
one short reason each (a layout that fits never carries ✗), then the flowchart; a forced layout
says what the planner would have chosen and what forcing costs; small sizes read in MiB; one
rule for step times and counts with their plurals."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engine.plan.names import Strategy
from engine.plan.specs import LayoutSpec, demo_spec
from tests.tui.test_decision_ux import _app, _open_decision, llama70b_over_tcp
from tests.tui.wizard_support import text_of
from tui.format import plural, size, step_time
from tui.widgets.memory_bars import MemoryBars

SIZE = (120, 40)


def test_one_rule_for_step_times_sizes_and_plurals() -> None:
    assert step_time(0.0843) == "84.3 ms/step"
    assert step_time(0.084) == "84 ms/step"
    assert step_time(57.07) == "57.1 s/step"
    assert step_time(121.0) == "2.0 min/step"
    assert size(79 * 1024**2) == "79.0 MiB"
    assert size(80 * 1024**3) == "80.0 GiB"
    assert plural(1, "line") == "1 line" and plural(3, "match") == "3 matches"
    assert plural(1200, "line") == "1,200 lines"


def test_the_answer_comes_first_with_its_memory_card_beside_it(tmp_path: Path) -> None:
    asyncio.run(_answer_first(tmp_path))


async def _answer_first(tmp_path: Path) -> None:
    app = _app(llama70b_over_tcp(tokens=None), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None
        answer = text_of(app, "#plan-status")
        assert answer.startswith("★ 3D (megatron)"), answer
        assert f" · {plan.margin_text()} · " in answer  # as the CLI says it
        assert "min/step" in answer or " s/step" in answer
        # No nag first: the token budget note comes last, short.
        head = text_of(app, "#headline")
        assert not head.startswith("days") and head.endswith("days: set a token budget in Training")
        # The plan's memory card sits beside the answer, above the table and the flowchart.
        screen = app.screen
        card = screen.query_one("#plan-card").query_one(MemoryBars)
        assert card.recommended
        top = screen.query_one("#plan-status").region.y
        assert card.region.y <= top + 2
        assert card.region.y < screen.query_one("#metrics").region.y
        assert screen.query_one("#metrics").region.y < screen.query_one("#flowchart").region.y
        assert card.region.bottom <= SIZE[1], "the plan's bars are not on the first page"


def test_alternatives_are_a_compact_table_with_short_reasons(tmp_path: Path) -> None:
    asyncio.run(_table(tmp_path))


async def _table(tmp_path: Path) -> None:
    app = _app(llama70b_over_tcp(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None
        rows = text_of(app, "#metrics").splitlines()
        assert "step time" in rows[0] and "why not the plan" in rows[0]
        assert len(rows) == 2 + len(plan.alternatives)
        # The figures and the reason come first: they fit in 76 columns (an 80-column screen).
        reason_end = rows[0].index("why not the plan") + max(len(r.split("  ")[-2]) for r in rows)
        assert reason_end <= 76, rows
        table = "\n".join(rows)
        assert "about as fast" not in table and "fewer moving parts" not in table
        for alt, row in zip(plan.alternatives, rows[2:], strict=True):
            assert ("✗" in row) == (not alt.fits), row
        for card in app.screen.query(MemoryBars):
            text = str(card.render())
            assert card.layout_.fits == ("✗" not in text), text


def test_small_models_read_in_mib_on_the_cards(tmp_path: Path) -> None:
    asyncio.run(_mib(tmp_path))


async def _mib(tmp_path: Path) -> None:
    app = _app(demo_spec(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        for card in app.screen.query(MemoryBars):
            text = str(card.render())
            assert "0.0 GiB" not in text and "MiB" in text, text


def test_a_forced_layout_says_what_forcing_costs(tmp_path: Path) -> None:
    asyncio.run(_forcing(tmp_path))


async def _forcing(tmp_path: Path) -> None:
    spec = llama70b_over_tcp().model_copy(update={"layout": LayoutSpec(strategy=Strategy.ZERO3)})
    app = _app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None and plan.forced
        line = text_of(app, "#forcing")
        assert line.startswith("auto plan: 3D (megatron)"), line
        assert "forcing costs +" in line and line.endswith(" %")
        chart = text_of(app, "#flowchart")
        assert "no such layout applies to this world size" not in chart
        assert "the forced strategy=zero3 rules it out" in chart
        assert "the forced strategy=zero3 allows, none is" in chart
