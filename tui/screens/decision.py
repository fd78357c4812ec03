"""Step 5, the decision: a headline (days to train, cost, MFU, memory margin), the seeds'
flowchart with the path the planner walked, each step's reason, the layouts compared one per row
(strategy, framework, degrees, ZeRO stage, offload: the plan, the flowchart's own pick and each
alternative), per-GPU memory bars against the usable limit, and warnings. Forcing a strategy or a
degree here re-plans at once (the planner runs in a worker thread, so typing never waits for
it); a degree the planner refuses is shown at its field."""

from __future__ import annotations

import re
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, ItemGrid
from textual.widget import Widget
from textual.widgets import Button, Select, Static

from engine.plan.annotate import NameForm, describe, recompute_text
from engine.plan.names import Offload, Recompute, Strategy
from engine.plan.result import Layout, Plan
from engine.plan.specs import LayoutSpec
from tui.format import count, money, seconds
from tui.screens.step import AUTO, StepPane
from tui.session import Step, WizardSession
from tui.widgets.field_row import FieldRow
from tui.widgets.flowchart import FlowChart
from tui.widgets.forced_badge import ForcedBadge
from tui.widgets.memory_bars import MemoryBars, gib

MAX_ALTERNATIVES = 3
"""Memory cards shown next to the recommended layout's (every alternative is in the table)."""

FLOW_PICK = "the flowchart's choice"
"""How the planner's ``rejected_because`` opens for the flowchart's own pick when a clearly
faster layout replaced it (``engine.plan.annotate``)."""

BATCH_WARNING = "training.global_batch:"
"""Warnings about the global batch: offered in the training step, where the batch is set."""

_FORCE_KINDS = {"tp": "int", "pp": "int", "dp": "int", "ep": "int", "micro_batch": "int"}
_FORCE_SELECTS = ("strategy", "offload")


def is_flow_pick(lay: Layout) -> bool:
    return (lay.rejected_because or "").startswith(FLOW_PICK)


def compared(plan: Plan) -> list[Layout]:
    """The plan's layout, then every alternative (the flowchart's own pick among them)."""
    return [plan.recommended, *plan.alternatives]


def metrics_table(plan: Plan) -> Text:
    """The layouts compared, one entry each: its full name (strategy, framework, degrees, ZeRO
    stage, offload) marked ★ for the plan and ◆ for the flowchart's own pick when a faster
    layout replaced it, its figures, and why it lost."""
    out = Text()
    for i, lay in enumerate(compared(plan)):
        flow = is_flow_pick(lay)
        mark = "★ " if i == 0 else ("◆ " if flow else "  ")
        out.append(mark, style="bold")
        out.append(describe(lay, NameForm.FULL), style="bold" if i == 0 else "")
        if i == 0:
            out.append("  the plan" + (" (forced)" if plan.forced else ""), style="dim")
        elif flow:
            out.append("  the flowchart's pick", style="dim")
        out.append("\n    ")
        out.append(
            f"step time {seconds(lay.step_time_s)} · {count(lay.tokens_per_s)} tokens/s · "
            f"MFU {100 * lay.mfu:.1f}% · {gib(lay.memory_per_gpu.total)}/GPU · "
            f"mb {lay.micro_batch}×{lay.grad_accum} · "
            + (f"{recompute_text(lay)} · " if lay.recompute != Recompute.NONE else "")
            + ("fits" if lay.fits else "does NOT fit")
        )
        if i and lay.rejected_because:
            why = lay.rejected_because
            if flow:
                why = why.removeprefix(FLOW_PICK).lstrip(", ")
            out.append(f"\n    {why}", style="dim italic")
        out.append("\n")
    out.rstrip()
    return out


def headline(plan: Plan) -> str:
    """Days to train the token budget, cost, MFU and memory margin of the plan, in one line."""
    lay = plan.recommended
    tokens = plan.spec.training.tokens
    parts: list[str] = []
    if tokens and lay.tokens_per_s > 0:
        days = tokens / lay.tokens_per_s / 86400
        parts.append(f"{_days(days)} to train {count(tokens)} tokens")
    else:
        parts.append("days to train: set a token budget in Training")
    price = plan.spec.training.price_per_gpu_hour or plan.gpu.price_per_gpu_hour
    if lay.cost_usd is not None:
        parts.append(f"cost {money(lay.cost_usd)} at ${price:g}/GPU-hour" if price else "")
    elif tokens and not price:
        parts.append("cost: no price for this GPU (set one in Training)")
    parts.append(f"MFU {100 * lay.mfu:.0f}%")
    usable = plan.usable_bytes
    margin = usable - lay.memory_per_gpu.total
    if margin >= 0:
        parts.append(f"memory margin {gib(margin)} of {gib(usable)} usable")
    else:
        parts.append(f"memory: over by {gib(-margin)} of {gib(usable)} usable")
    return " · ".join(p for p in parts if p)


def _days(days: float) -> str:
    if days < 1:
        return f"{days * 24:.1f} hours"
    return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"


class DecisionStep(StepPane):
    STEP = Step.DECISION

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        self.failure = ""
        """The planner's refusal shown; while set, the step counts as invalid."""
        self._force_errors: dict[str, str] = {}
        """The refusal shown at each force field (cleared when a plan arrives)."""

    def compose(self) -> ComposeResult:
        yield Static("Decision", classes="step-title")
        yield ForcedBadge(id="forced-badge")
        yield Static("", id="headline", markup=False)
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
        yield Static("", id="force-error", markup=False).set_styles("display: none;")
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

    def draw_session(self) -> None:
        self.query_one(ForcedBadge).show(self.session.forced_layout)
        if self.session.planning or self.session.plan is not None:
            return  # the refusal is stale: a new plan is on its way or here
        rows = self.rows()
        for name, msg in self._force_errors.items():
            if not rows[name].error and rows[name].value.strip():
                rows[name].set_error(msg)  # re-validating the fields cleared it

    @on(ForcedBadge.Cleared)
    def _badge_cleared(self, event: ForcedBadge.Cleared) -> None:
        event.stop()
        self.clear_forced()

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
        self.query_one("#headline", Static).update("")
        self.query_one(FlowChart).show(None)
        self.query_one("#metrics", Static).update("")
        self.query_one("#warnings", Static).update("")
        self.query_one("#mem-cards", ItemGrid).remove_children()
        self._show_force_errors(message)

    def _show_force_errors(self, message: str) -> None:
        """A refusal of the forced layout, at the fields it names (``layout.tp: …``, or
        ``layout: tp(3) * pp(1) …`` naming the degrees the user set)."""
        rows = self.rows()
        for name in self._force_errors:
            if name in rows and rows[name].error == self._force_errors[name]:
                rows[name].set_error(None)
        self._force_errors = {}
        field, _, text = message.partition(": ")
        shown = ""
        if field == "layout":
            for name, row in rows.items():
                if row.value.strip() and re.search(rf"\b{name}\(", text):
                    self._force_errors[name] = text
        elif field.startswith("layout."):
            name = field.removeprefix("layout.")
            if name in rows:
                self._force_errors[name] = text
            elif name in _FORCE_SELECTS:
                shown = f"✗ {name}: {text}"
        for name, msg in self._force_errors.items():
            rows[name].set_error(msg)
        self.query_one("#force-error", Static).update(shown)
        self.query_one("#force-error", Static).display = bool(shown)

    def show_plan(self, plan: Plan, elapsed_s: float) -> None:
        self.failure = ""
        self._show_force_errors("")
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
        self.query_one("#headline", Static).update(Text(headline(plan), style="bold"))
        self.query_one(FlowChart).show(plan)
        self.query_one("#metrics", Static).update(metrics_table(plan))
        warnings = [w for w in plan.warnings if not w.startswith(BATCH_WARNING)]
        if len(warnings) < len(plan.warnings):
            warnings.append("the global batch: see the Training step for a batch to pick")
        warn = "\n".join(f"⚠ {w}" for w in warnings) if warnings else "No warnings."
        self.query_one("#warnings", Static).update(warn)
        self.query_one("#warnings", Static).set_class(bool(warnings), "-warn")
        cards = self.query_one("#mem-cards", ItemGrid)
        cards.remove_children()
        usable = plan.usable_bytes
        memory = plan.gpu.memory_bytes
        shown = plan.alternatives[:MAX_ALTERNATIVES]
        pick = next((a for a in plan.alternatives if is_flow_pick(a)), None)
        if pick is not None and pick not in shown:
            shown = [*shown[: MAX_ALTERNATIVES - 1], pick]
        widgets: list[Any] = [MemoryBars(lay, memory, recommended=True, usable=usable)]
        widgets += [
            MemoryBars(
                alt,
                memory,
                recommended=False,
                usable=usable,
                mark="◆ flowchart's pick" if alt is pick else "",
            )
            for alt in shown
        ]
        cards.mount_all(widgets)
