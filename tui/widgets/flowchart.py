"""The decision flowchart of the seed documents, drawn in the terminal, with the path the planner
took highlighted and the planner's own reason for each step listed under it."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widget import Widget

from engine.plan.result import Plan
from engine.plan.specs import Offload, Strategy

# The flowchart ("Does model fit on 1 GPU? YES: DDP; NO: fits with ZeRO-2/FSDP? YES: ZeRO-2/FSDP;
# NO: ZeRO-3/FSDP full shard; still OOM: CPU offload or TP+PP") plus the scenario table's MoE and
# long-sequence rows. Each line: (text, outcome levels on which it is on the path, is an outcome).
_LINES: tuple[tuple[str, frozenset[int], bool], ...] = (
    ("Does the model fit on one GPU?", frozenset({1, 2, 3, 4}), False),
    ("├─ yes → DDP (+ gradient accumulation)", frozenset({1}), True),
    ("└─ no → fits with ZeRO-2 / FSDP (shard optimizer + grads)?", frozenset({2, 3, 4}), False),
    ("   ├─ yes → ZeRO-1/2 or FSDP SHARD_GRAD_OP", frozenset({2}), True),
    ("   └─ no → ZeRO-3 or FSDP FULL_SHARD", frozenset({3, 4}), True),
    ("      └─ still OOM? → CPU offload or TP + PP (3D)", frozenset({4}), True),
)


def outcome_level(plan: Plan) -> int:
    """Which outcome of the flowchart the recommended layout is (1 DDP … 4 offload / 3D)."""
    lay = plan.recommended
    if lay.offload != Offload.NONE or lay.strategy == Strategy.THREE_D or lay.pp > 1 or lay.tp > 1:
        return 4
    if lay.strategy == Strategy.DDP:
        return 1
    if lay.strategy in (Strategy.ZERO1, Strategy.ZERO2, Strategy.FSDP_GRAD_OP):
        return 2
    return 3


class FlowChart(Widget):
    """Renders the flowchart for a plan (or a placeholder until one is computed)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "flowchart--path",
        "flowchart--outcome",
        "flowchart--chosen",
    }
    DEFAULT_CSS = """
    FlowChart { height: auto; padding: 0 1; }
    FlowChart > .flowchart--path { text-style: bold; color: $accent; }
    FlowChart > .flowchart--outcome { text-style: bold reverse; color: $accent; }
    FlowChart > .flowchart--chosen { text-style: bold; color: $success; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.plan: Plan | None = None

    def show(self, plan: Plan | None) -> None:
        self.plan = plan
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        if self.plan is None:
            return Text("No plan yet.", style="dim")
        plan = self.plan
        level = outcome_level(plan)
        lay = plan.recommended
        path = self.get_component_rich_style("flowchart--path", partial=True)
        outcome = self.get_component_rich_style("flowchart--outcome", partial=True)
        chosen = self.get_component_rich_style("flowchart--chosen", partial=True)
        chart = Text(no_wrap=False)
        for text, levels, is_outcome in _LINES:
            on_path = level in levels
            chart.append(text, style=(outcome if is_outcome else path) if on_path else "dim")
            if on_path and is_outcome:
                chart.append(f"  ◀ {lay.strategy.value}", style=chosen)
            chart.append("\n")
        extras = [
            ("MoE model? → expert parallel (EP)", lay.ep > 1, f"ep={lay.ep}"),
            ("Very long sequences? → context parallel (CP)", lay.cp > 1, f"cp={lay.cp}"),
        ]
        for text, taken, note in extras:
            chart.append(text, style=path if taken else "dim")
            if taken:
                chart.append(f"  ◀ {note}", style=chosen)
            chart.append("\n")
        why = Text()
        if plan.path:
            why.append("Why\n", style="bold")
            for i, step in enumerate(plan.path, 1):
                why.append(f"{i}. {step.question} ", style="")
                why.append(f"→ {step.answer}", style=path)
                why.append(f"\n   {step.reason}\n", style="")
        return Group(chart, why)
