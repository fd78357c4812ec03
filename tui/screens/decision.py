"""Step 5, the decision: the seeds' flowchart with the path the planner took, each step's reason,
per-GPU memory bars for the chosen layout and the alternatives side by side, step time, tokens/s,
MFU, GPU-hours, cost and warnings. Forcing a strategy or a degree here re-plans at once (the
planner runs in a worker thread, so typing never waits for it)."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, ItemGrid
from textual.widget import Widget
from textual.widgets import Button, Select, Static

from engine.plan.result import Layout, Plan
from engine.plan.specs import LayoutSpec, Offload, Strategy
from tui.format import count, hours, money, seconds
from tui.screens.step import AUTO, StepPane
from tui.session import Step
from tui.widgets.field_row import FieldRow
from tui.widgets.flowchart import FlowChart
from tui.widgets.memory_bars import MemoryBars

MAX_ALTERNATIVES = 3
"""Alternatives shown next to the recommended layout (the rest are in ``plan --json``)."""

_FORCE_KINDS = {"tp": "int", "pp": "int", "dp": "int", "ep": "int", "micro_batch": "int"}


def metrics_table(plan: Plan) -> Table:
    layouts: list[Layout] = [plan.recommended, *plan.alternatives[:MAX_ALTERNATIVES]]
    table = Table(box=None, padding=(0, 1), show_edge=False, expand=False, header_style="bold")
    table.add_column("", style="dim", no_wrap=True)
    for i, lay in enumerate(layouts):
        title = f"★ {lay.strategy.value}" if i == 0 else lay.strategy.value
        table.add_column(title, no_wrap=True, justify="right")

    def row(label: str, values: list[str]) -> None:
        table.add_row(label, *values)

    row("layout", [f"t{x.tp}·p{x.pp}·d{x.dp}" + (f"·e{x.ep}" if x.ep > 1 else "") for x in layouts])
    row("micro×acc", [f"{x.micro_batch}×{x.grad_accum}" for x in layouts])
    row("step time", [seconds(x.step_time_s) for x in layouts])
    row("tokens/s", [count(x.tokens_per_s) for x in layouts])
    row("MFU", [f"{100 * x.mfu:.1f}%" for x in layouts])
    row("GPU-hours", [hours(x.gpu_hours) for x in layouts])
    row("cost", [money(x.cost_usd) for x in layouts])
    row("fits", ["yes" if x.fits else "NO" for x in layouts])
    return table


class DecisionStep(StepPane):
    STEP = Step.DECISION

    def __init__(self) -> None:
        super().__init__()
        self.failure = ""
        """The planner's refusal shown; while set, the step counts as invalid."""

    def compose(self) -> ComposeResult:
        yield Static("Decision", classes="step-title")
        yield Static("Planning…", id="plan-status", classes="summary", markup=False)
        yield FlowChart(id="flowchart")
        yield Static("", id="metrics")
        yield Static("", id="warnings", markup=False)
        yield ItemGrid(id="mem-cards", min_column_width=36)
        yield Static("Force a layout (empty or auto: the planner chooses)", classes="section-title")
        yield Static("Strategy", classes="select-label")
        yield Select(
            [("auto", AUTO)] + [(s.value, s.value) for s in Strategy],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-strategy",
        )
        yield FieldRow("tp", "Tensor parallel", placeholder="auto")
        yield FieldRow("pp", "Pipeline stages", placeholder="auto")
        yield FieldRow("dp", "Data parallel", placeholder="auto")
        yield FieldRow("ep", "Expert parallel", placeholder="auto (MoE)")
        yield FieldRow("micro_batch", "Micro-batch", placeholder="auto")
        yield Static("CPU offload", classes="select-label")
        yield Select(
            [("auto", AUTO)] + [(o.value, o.value) for o in Offload],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-offload",
        )
        with Horizontal(classes="buttons"):
            yield Button("Clear forced layout", id="clear-forced", compact=True)

    def first_focus(self) -> Widget | None:
        """The pane itself: arrows scroll the report; Tab reaches the force controls below."""
        return self

    def on_mount(self) -> None:
        super().on_mount()
        s = self.session
        if s.plan is not None:
            self.show_plan(s.plan, s.plan_elapsed_s)
        elif s.plan_failure:
            self.show_failure(s.plan_failure)

    def load(self) -> None:
        lay = self.session.forced_layout
        rows = self.rows()
        for name in _FORCE_KINDS:
            value = getattr(lay, name)
            rows[name].value = "" if value is None else str(value)
        self.query_one("#f-strategy", Select).value = lay.strategy.value if lay.strategy else AUTO
        self.query_one("#f-offload", Select).value = lay.offload.value if lay.offload else AUTO

    def check(self) -> list[str]:
        data, errs = self.read_fields(_FORCE_KINDS)
        for name in ("strategy", "offload"):
            value = self.select_value(name)
            if value:
                data[name] = value
        old = self.session.forced_layout
        for name in (
            "framework",
            "cp",
            "zero_stage",
            "sequence_parallel",
            "recompute",
            "virtual_stages",
        ):
            if getattr(old, name) is not None:
                data[name] = getattr(old, name)
        model, problems = self.build(LayoutSpec, data, errs)
        if model is None:
            return problems
        self.session.set_section("layout", model)
        if self.failure:
            return [self.failure]
        return []

    @on(Button.Pressed, "#clear-forced")
    def clear_forced(self, event: Button.Pressed | None = None) -> None:
        if event is not None:
            event.stop()
        self._loading = True
        try:
            for row in self.rows().values():
                row.value = ""
            self.query_one("#f-strategy", Select).value = AUTO
            self.query_one("#f-offload", Select).value = AUTO
        finally:
            self._loading = False
        self.call_after_refresh(self.revalidate)

    # --- plan display -------------------------------------------------------------------------
    def show_pending(self, message: str = "Planning…") -> None:
        self.query_one("#plan-status", Static).update(message)

    def show_failure(self, message: str) -> None:
        self.failure = message
        self.query_one("#plan-status", Static).update(Text(f"✗ {message}", style="bold"))
        self.query_one(FlowChart).show(None)
        self.query_one("#metrics", Static).update("")
        self.query_one("#warnings", Static).update("")
        self.query_one("#mem-cards", ItemGrid).remove_children()

    def show_plan(self, plan: Plan, elapsed_s: float) -> None:
        self.failure = ""
        lay = plan.recommended
        forced = " (forced)" if plan.forced else ""
        status = (
            f"{plan.model.name}: {lay.strategy.value} with {lay.framework.value}{forced} on "
            f"{plan.world_size} × {plan.gpu.name} · {seconds(lay.step_time_s)}/step · "
            f"{count(lay.tokens_per_s)} tokens/s · MFU {100 * lay.mfu:.1f}%"
        )
        if self.session.show_timings:
            status += f" · planned in {elapsed_s * 1000:.0f} ms"
        self.query_one("#plan-status", Static).update(status)
        self.query_one(FlowChart).show(plan)
        self.query_one("#metrics", Static).update(metrics_table(plan))
        warn = "\n".join(f"⚠ {w}" for w in plan.warnings) if plan.warnings else "No warnings."
        self.query_one("#warnings", Static).update(warn)
        self.query_one("#warnings", Static).set_class(bool(plan.warnings), "-warn")
        cards = self.query_one("#mem-cards", ItemGrid)
        cards.remove_children()
        widgets: list[Any] = [MemoryBars(lay, plan.gpu.memory_bytes, recommended=True)]
        widgets += [
            MemoryBars(alt, plan.gpu.memory_bytes, recommended=False)
            for alt in plan.alternatives[:MAX_ALTERNATIVES]
        ]
        cards.mount_all(widgets)
