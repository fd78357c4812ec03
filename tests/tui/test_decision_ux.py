"""The decision step as a careful engineer reads it (issue 15): the flowchart drawn from the path
the planner walked, every layout compared named in full with the flowchart's own pick marked,
memory in GiB against the usable limit with the margin, a headline (days, cost, MFU, margin),
and a refused forced degree shown at its field."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rich.console import Group
from rich.text import Text

from engine.plan.names import NetworkTier
from engine.plan.specs import (
    HardwareSpec,
    LayoutSpec,
    ModelSpec,
    NetworkSpec,
    Spec,
    TrainingSpec,
    demo_spec,
)
from tests.tui.wizard_support import retype, settle, text_of, until
from tui.app import DtrainApp
from tui.widgets.field_row import FieldRow
from tui.widgets.flowchart import FlowChart

SIZE = (120, 40)


def llama70b_over_tcp(tokens: float | None = 1e12) -> Spec:
    """Llama-3-70B on 4 x 8 H100 over plain TCP: ZeRO-3 / FULL_SHARD fits (the flowchart's
    pick), and a 3D layout is clearly faster, so the plan takes it."""
    return Spec(
        model=ModelSpec(preset="llama-3-70b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        network=NetworkSpec(tier=NetworkTier.TCP),
        training=TrainingSpec(seq_len=4096, global_batch=256, tokens=tokens),
    )


def tiny_on_two_nodes() -> Spec:
    """The 3.67M-parameter demo model on 2 x 2 H100: it fits on one GPU (DDP), and a pipeline
    is faster across the two nodes."""
    spec = demo_spec()
    return spec.model_copy(
        update={"hardware": HardwareSpec(gpu="h100-sxm", gpus_per_node=2, nodes=2)}
    )


def _app(spec: Spec, tmp_path: Path) -> DtrainApp:
    return DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.01, show_timings=False)


async def _open_decision(app: DtrainApp, pilot) -> None:  # type: ignore[no-untyped-def]
    await settle(pilot)
    assert app.wizard is not None
    assert await app.wizard.go("decision")
    await settle(pilot)
    assert app.plan is not None


def _chart_lines(app: DtrainApp) -> list[str]:
    rendered = app.screen.query_one(FlowChart).render()
    assert isinstance(rendered, Group)
    chart = rendered.renderables[0]
    assert isinstance(chart, Text)
    return chart.plain.splitlines()


def _line(lines: list[str], start: str) -> str:
    found = [line for line in lines if line.strip().startswith(start)]
    assert len(found) == 1, (start, lines)
    return found[0]


def test_flowchart_marks_the_walked_outcome_and_the_faster_branch(tmp_path: Path) -> None:
    asyncio.run(_flowchart(tmp_path))


async def _flowchart(tmp_path: Path) -> None:
    # 70B: the path says ZeRO-3 fits and a 3D layout is clearly faster. One outcome is marked
    # (ZeRO-3, the flowchart's pick), "still OOM" is not, and the faster branch names the plan.
    app = _app(llama70b_over_tcp(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        lines = _chart_lines(app)
        memory = lines[: lines.index(_line(lines, "Is a nearby layout clearly faster?"))]
        assert sum("◀" in line for line in memory) == 1, memory
        assert "◀ the flowchart's pick" in _line(lines, "├─ yes → ZeRO-3")
        assert "◀" not in _line(lines, "└─ no, still OOM")
        r = app.plan.recommended if app.plan else None
        assert r is not None and r.strategy == "3d"
        assert f"◀ 3d · megatron · tp{r.tp} pp{r.pp} dp{r.dp}" in _line(lines, "└─ yes → take it")
    # The tiny demo model fits on one GPU: DDP is the flowchart's outcome, never "still OOM",
    # whatever layout the plan then takes across the two nodes.
    app = _app(tiny_on_two_nodes(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        assert app.plan is not None
        lines = _chart_lines(app)
        assert "◀" in _line(lines, "├─ yes → DDP")  # the pick (and the plan, when it kept it)
        assert "◀" not in _line(lines, "└─ no, still OOM")
        assert "◀" not in _line(lines, "├─ yes → ZeRO-3")


def test_layouts_are_named_in_full_with_the_flowcharts_pick_and_gib(tmp_path: Path) -> None:
    asyncio.run(_layouts(tmp_path))


async def _layouts(tmp_path: Path) -> None:
    app = _app(llama70b_over_tcp(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None
        # The table's first line is its header (step time, memory, why not the plan, layout);
        # each row ends on the layout's full name.
        rows = text_of(app, "#metrics").splitlines()[1:]
        table = "\n".join(row[:2] + row[2:].rsplit("  ", 1)[-1].strip() for row in rows)
        names = [line[2:].split("  ")[0] for line in table.splitlines() if line[:1] in "★◆ "]
        names = [n for n in names if n and not n.startswith(" ")]
        assert len(names) == 1 + len(plan.alternatives)
        assert len(set(names)) == len(names), names  # no two rows read the same
        # Offload variants are rows of their own, each naming its offload.
        assert "fsdp-full · fsdp · tp1 pp1 dp32 · ZeRO-3 · offload optimizer+params" in names
        assert "fsdp-full · fsdp · tp1 pp1 dp32 · ZeRO-3 · no offload" in names
        flow = [line for line in table.splitlines() if line.startswith("◆ ")]
        assert len(flow) == 1 and "fsdp-full · fsdp · tp1 pp1 dp32 · ZeRO-3 · no offload" in flow[0]
        r = plan.recommended
        assert table.splitlines()[0].startswith(f"★ 3d · megatron · tp{r.tp} pp{r.pp} dp{r.dp}")
        # Memory in GiB, the usable limit marked and named, the margin shown.
        cards = list(app.screen.query("MemoryBars"))
        assert any(c.border_subtitle == "◆ flowchart's pick" for c in cards)
        card = text_of(app, "#plan-card MemoryBars")
        assert " GB" not in card and "GiB" in card
        # 76.1 GiB after the named reserves, less the plan's 3 % headroom.
        assert "│ usable 73.8 GiB of 80.0 GiB" in card
        total = next(line for line in card.splitlines() if line.startswith("total"))
        assert "│" in total  # the usable limit on the total bar
        assert "margin " in card


def test_headline_days_cost_mfu_margin(tmp_path: Path) -> None:
    asyncio.run(_headline(tmp_path))


async def _headline(tmp_path: Path) -> None:
    app = _app(llama70b_over_tcp(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        plan = app.plan
        assert plan is not None
        lay = plan.recommended
        head = text_of(app, "#headline")
        days = 1e12 / lay.tokens_per_s / 86400
        assert days > 100 and f"{days:,.0f} days to train 1 T tokens" in head
        assert "cost $" in head and "/GPU-hour" in head
        assert f"MFU {100 * lay.mfu:.0f}%" in head
        assert "memory margin" in head and "GiB usable" in head
    app = _app(llama70b_over_tcp(tokens=None), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        assert "set a token budget in Training" in text_of(app, "#headline")


def test_a_refused_forced_degree_is_shown_at_its_field(tmp_path: Path) -> None:
    asyncio.run(_forced(tmp_path))


async def _forced(tmp_path: Path) -> None:
    app = _app(demo_spec(), tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        for name in ("tp", "pp"):
            await _refused_at_field(pilot, app, name)
        assert app.spec.layout == LayoutSpec()


async def _refused_at_field(pilot, app: DtrainApp, name: str) -> None:  # type: ignore[no-untyped-def]
    """Force ``name`` = 3 on two ranks: the refusal is at the field; clearing it re-plans."""
    row = app.screen.query_one(f"#row-{name}", FieldRow)
    row.input.focus()
    await until(pilot, lambda: app.focused is row.input, f"{name} never got focus")
    await retype(pilot, "3")
    await settle(pilot)
    assert app.plan is None
    await until(pilot, lambda: bool(row.error), f"no error at the {name} field")
    assert f"{name}(3)" in row.error and "does not divide world size 2" in row.error
    await pilot.press("ctrl+a", "ctrl+k")
    await settle(pilot)
    assert app.plan is not None
    assert row.error == ""


def test_the_bars_judge_by_the_planners_usable_memory(tmp_path: Path) -> None:
    asyncio.run(_calibrated_usable(tmp_path))


async def _calibrated_usable(tmp_path: Path) -> None:
    """A calibration's measured memory overhead shrinks what the planner lets a layout use
    (76.1 GiB of an H100's 80 less 8 GiB, less the plan's 3 % headroom of what is left): the bars
    mark and measure against that same figure."""
    from engine.plan.calibration import Calibration, CalibrationSource

    src = CalibrationSource(run="r1", run_dir="/runs/r1", date="2026-01-01T00:00:00Z")
    cal = Calibration(name="m", gpu="h100-sxm", memory_overhead_gib=8.0, source=src)
    spec = llama70b_over_tcp().model_copy(update={"calibration": cal})
    app = _app(spec, tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await _open_decision(app, pilot)
        assert app.plan is not None and app.plan.calibration == cal
        card = text_of(app, "#plan-card MemoryBars")
        assert "│ usable 66.0 GiB of 80.0 GiB" in card
        assert "of 66.0 GiB usable" in text_of(app, "#headline")
