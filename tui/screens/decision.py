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
from textual.containers import Horizontal, ItemGrid, Vertical
from textual.widget import Widget
from textual.widgets import Button, Select, Static

from engine.plan.annotate import NameForm, describe, short_reason
from engine.plan.names import Offload, Strategy
from engine.plan.result import Layout, Plan
from engine.plan.specs import LayoutSpec
from tui.format import count, money, size, step_time
from tui.screens.step import AUTO, StepPane
from tui.session import Step, WizardSession
from tui.widgets.failure_cost import FailureCost
from tui.widgets.field_row import FieldRow
from tui.widgets.flowchart import FlowChart
from tui.widgets.forced_badge import ForcedBadge
from tui.widgets.memory_bars import MemoryBars

gib = size
"""Memory as the step shows it: GiB, MiB below 1 GiB (one rule with the cards)."""

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
    """The layouts compared as a fixed-width table, one row each: ★ the plan, ◆ the
    flowchart's own pick when a faster layout replaced it; its step time, memory per GPU, one
    short reason it is not the plan (the full sentence is in the plan's JSON and the CLI
    report), then its full name (strategy, framework, degrees, ZeRO stage, offload), last so a
    narrow screen cuts the name's tail, not the figures. A layout that fits is never marked ✗."""
    rec = plan.recommended
    rows: list[tuple[Layout, str, str]] = []
    for i, lay in enumerate(compared(plan)):
        if i == 0:
            why = "the plan" + (" (forced)" if plan.forced else "")
            if not lay.fits:
                why += ", does NOT fit"
        else:
            why = ("✗ " if not lay.fits else "") + short_reason(
                rec, lay, flow_pick=is_flow_pick(lay)
            )
        rows.append((lay, why, describe(lay, NameForm.FULL)))
    why_w = max(len("why not the plan"), *(len(why) for _, why, _ in rows))
    out = Text(no_wrap=True, overflow="ellipsis")
    out.append(
        f"  {'step time':>13} {'mem/GPU':>10}  {'why not the plan':<{why_w}}  layout\n",
        style="bold",
    )
    for i, (lay, why, name) in enumerate(rows):
        mark = "★ " if i == 0 else ("◆ " if is_flow_pick(lay) else "  ")
        out.append(mark, style="bold")
        out.append(f"{step_time(lay.step_time_s):>13} {gib(lay.memory_per_gpu.total):>10}  ")
        out.append(f"{why:<{why_w}}  ", style="dim" if i else "bold")
        out.append(name, style="bold" if i == 0 else "")
        out.append("\n")
    out.rstrip()
    return out


def answer(plan: Plan) -> str:
    """The plan in one line: its layout, whether it fits and by what margin, its step time and
    its cost (or what it needs for one)."""
    lay = plan.recommended
    margin = plan.usable_bytes - lay.memory_per_gpu.total
    if lay.fits:
        fit = plan.margin_text(lay)
    elif margin < 0:
        fit = f"does NOT fit: over by {gib(-margin)}"
    else:
        fit = "does NOT fit"
    forced = " (forced)" if plan.forced else ""
    parts = [
        f"★ {describe(lay)}{forced}",
        fit,
        step_time(lay.step_time_s),
        f"{count(lay.tokens_per_s)} tokens/s",
    ]
    if lay.cost_usd is not None:
        parts.append(f"cost {money(lay.cost_usd)}")
    return " · ".join(parts)


def headline(plan: Plan) -> str:
    """Days to train the token budget, cost, MFU and memory margin of the plan, in one line;
    without a token budget it ends on a short note of where to set one."""
    lay = plan.recommended
    tokens = plan.spec.training.tokens
    parts: list[str] = []
    if tokens and lay.tokens_per_s > 0:
        days = tokens / lay.tokens_per_s / 86400
        parts.append(f"{_days(days)} to train {count(tokens)} tokens")
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
    if not (tokens and lay.tokens_per_s > 0):
        parts.append("days: set a token budget in Training")
    return " · ".join(p for p in parts if p)


def _days(days: float) -> str:
    if days < 1:
        return f"{days * 24:.1f} hours"
    return f"{days:.1f} days" if days < 100 else f"{days:,.0f} days"


class DecisionStep(StepPane):
    """The answer first (the plan in one line, what forcing costs, the headline and warnings,
    with the plan's memory card beside them), then the alternatives' table, the flowchart with
    each step's reason, the alternatives' memory cards and the force controls."""

    STEP = Step.DECISION
    DEFAULT_CSS = """
    DecisionStep #answer-row { height: auto; }
    DecisionStep #answer { width: 1fr; height: auto; }
    DecisionStep #plan-card { width: 46; height: auto; }
    DecisionStep #forcing { color: $warning; }
    DecisionStep #metrics { margin: 1 0; }
    """

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        self.failure = ""
        """The planner's refusal shown; while set, the step counts as invalid."""
        self._force_errors: dict[str, str] = {}
        """The refusal shown at each force field (cleared when a plan arrives)."""

    def compose(self) -> ComposeResult:
        yield Static("Decision", classes="step-title")
        yield ForcedBadge(id="forced-badge")
        with Horizontal(id="answer-row"):
            with Vertical(id="answer"):
                yield Static("Planning…", id="plan-status", classes="summary", markup=False)
                yield Static("", id="forcing", markup=False)
                yield Static("", id="headline", markup=False)
                yield Static("", id="warnings", markup=False)
            yield Vertical(id="plan-card")
        yield Static("", id="metrics")
        yield FailureCost(id="failure-cost")
        yield FlowChart(id="flowchart")
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

    def allow_focus(self) -> bool:
        # Always a stop, scrolling or not: the step's first focus is the report itself.
        return self.can_focus

    def watch_has_focus(self, _has_focus: bool) -> None:
        # Only the pane's own style follows its focus (no rule styles a widget inside it by
        # the pane's focus): Textual's default restyles every widget of the report as well,
        # a third of the time of entering the step.
        self.app.stylesheet.update_nodes([self], animate=True)

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
        self.query_one("#forcing", Static).update("")
        self.query_one("#plan-card", Vertical).remove_children()
        self.query_one(FlowChart).show(None)
        self.query_one("#metrics", Static).update("")
        self.query_one(FailureCost).show(None)
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
        status = answer(plan)
        if self.session.show_timings:
            status += f" · planned in {elapsed_s * 1000:.0f} ms"
        self.query_one("#plan-status", Static).update(Text(status, style="bold"))
        forcing = self.session.forcing if plan.forced else ""
        self.query_one("#forcing", Static).update(forcing)
        self.query_one("#forcing", Static).display = bool(forcing)
        self.query_one("#headline", Static).update(headline(plan))
        self.query_one(FlowChart).show(plan)
        self.query_one("#metrics", Static).update(metrics_table(plan))
        self.query_one(FailureCost).show(plan)
        warnings = [w for w in plan.warnings if not w.startswith(BATCH_WARNING)]
        if len(warnings) < len(plan.warnings):
            warnings.append("the global batch: see the Training step for a batch to pick")
        warn = "\n".join(f"⚠ {w}" for w in warnings) if warnings else "No warnings."
        self.query_one("#warnings", Static).update(warn)
        self.query_one("#warnings", Static).set_class(bool(warnings), "-warn")
        usable = plan.usable_bytes
        memory = plan.gpu.memory_bytes
        card = self.query_one("#plan-card", Vertical)
        card.remove_children()
        card.mount(MemoryBars(lay, memory, recommended=True, usable=usable))
        cards = self.query_one("#mem-cards", ItemGrid)
        cards.remove_children()
        shown = plan.alternatives[:MAX_ALTERNATIVES]
        pick = next((a for a in plan.alternatives if is_flow_pick(a)), None)
        if pick is not None and pick not in shown:
            shown = [*shown[: MAX_ALTERNATIVES - 1], pick]
        widgets: list[Any] = [
            MemoryBars(
                alt,
                memory,
                recommended=False,
                usable=usable,
                mark="◆ flowchart's pick" if alt is pick else "",
                reason=short_reason(lay, alt, flow_pick=alt is pick),
            )
            for alt in shown
        ]
        cards.mount_all(widgets)
