"""dtrain-tui's decision flowchart, drawn in the terminal, with the path the planner
walked highlighted (read from ``Plan.path``, never guessed from the chosen strategy) and the
planner's own reason for each step listed under it.

One outcome of the memory questions is marked: the flowchart's pick. When the planner replaced
it with a nearby layout that is clearly faster, the "a nearby layout is clearly faster" branch is
highlighted too and names the layout taken."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widget import Widget

from engine.plan.annotate import NameForm, describe
from engine.plan.result import Plan

# The questions of ``engine.plan.flowchart`` as the path names them (their opening words).
Q_ONE_GPU = "Does the model fit on one GPU"
Q_SHARD_OG = "Does it fit with optimizer and gradient sharding"
Q_SHARD_ALL = "Does it fit with full sharding"
Q_OOM = "Still out of memory"
Q_FASTER = "Is a nearby layout clearly faster"

DDP, SHARD_OG, SHARD_ALL, LAST_RESORT, NOTHING = 1, 2, 3, 4, 5
"""The flowchart's outcomes, in the order it asks about them (NOTHING: not even the last resort
fits)."""


@dataclass(frozen=True)
class Walk:
    """What ``Plan.path`` says about the flowchart: the questions asked (their answers), the
    outcome reached (0: the path has no memory questions) and the faster layout taken, if any."""

    answers: dict[str, str]
    outcome: int
    faster: str
    """The answer's layout when a nearby layout replaced the flowchart's pick; "" otherwise."""


def walk_of(plan: Plan) -> Walk:
    """Read the walked flowchart from the plan's path."""
    answers: dict[str, str] = {}
    for step in plan.path:
        for q in (Q_ONE_GPU, Q_SHARD_OG, Q_SHARD_ALL, Q_OOM, Q_FASTER):
            if step.question.startswith(q):
                answers[q] = step.answer
    outcome = 0
    if answers.get(Q_ONE_GPU) == "yes":
        outcome = DDP
    elif answers.get(Q_SHARD_OG) == "yes":
        outcome = SHARD_OG
    elif answers.get(Q_SHARD_ALL) == "yes":
        outcome = SHARD_ALL
    elif Q_OOM in answers:
        outcome = NOTHING if answers[Q_OOM] == "none fits" else LAST_RESORT
    fast = answers.get(Q_FASTER, "")
    faster = fast.removeprefix("yes:").strip() if fast.startswith("yes") else ""
    return Walk(answers, outcome, faster)


def outcome_level(plan: Plan) -> int:
    """Which outcome of the flowchart the walked path reached (1 DDP … 4 offload / 3D, 5
    nothing fits; 0 when the path asked no memory question)."""
    return walk_of(plan).outcome


# Each line: (text, the outcomes whose path runs through it, the outcome it is, or 0).
_LINES: tuple[tuple[str, frozenset[int], int], ...] = (
    ("Does the model fit on one GPU?", frozenset({1, 2, 3, 4, 5}), 0),
    ("├─ yes → DDP (+ gradient accumulation)", frozenset({1}), DDP),
    ("└─ no → fits with ZeRO-1/2 / FSDP SHARD_GRAD_OP?", frozenset({2, 3, 4, 5}), 0),
    ("   ├─ yes → ZeRO-1/2 or FSDP SHARD_GRAD_OP", frozenset({2}), SHARD_OG),
    ("   └─ no → fits with ZeRO-3 / FSDP FULL_SHARD?", frozenset({3, 4, 5}), 0),
    ("      ├─ yes → ZeRO-3 or FSDP FULL_SHARD", frozenset({3}), SHARD_ALL),
    ("      └─ no, still OOM → TP + PP (3D) or CPU offload", frozenset({4}), LAST_RESORT),
)


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
        walk = walk_of(plan)
        lay = plan.recommended
        path = self.get_component_rich_style("flowchart--path", partial=True)
        outcome = self.get_component_rich_style("flowchart--outcome", partial=True)
        chosen = self.get_component_rich_style("flowchart--chosen", partial=True)
        chart = Text(no_wrap=False)
        for text, levels, is_outcome in _LINES:
            on_path = walk.outcome in levels
            reached = on_path and is_outcome == walk.outcome
            chart.append(text, style=(outcome if reached else path) if on_path else "dim")
            if reached:
                note = (
                    "the flowchart's pick"
                    if walk.faster
                    else f"{describe(lay, NameForm.FULL)} (the plan)"
                )
                chart.append(f"  ◀ {note}", style=chosen)
            chart.append("\n")
        if walk.outcome == NOTHING:
            chart.append("      └─ nothing fits: ", style=path)
            chart.append("add GPUs, shorten the sequence or use a smaller model", style=outcome)
            chart.append("\n")
        if Q_FASTER in walk.answers:
            chart.append("Is a nearby layout clearly faster?", style=path)
            chart.append("\n")
            if walk.faster:
                chart.append("└─ yes → take it", style=outcome)
                chart.append(f"  ◀ {describe(lay, NameForm.FULL)} (the plan)", style=chosen)
            else:
                chart.append("└─ no → keep the flowchart's pick", style=path)
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
        if not plan.path:
            return chart
        # Number and text in two columns: a wrapped line stays under its item (hanging indent).
        why = Table.grid()
        why.add_column(no_wrap=True)
        why.add_column()
        for i, step in enumerate(plan.path, 1):
            item = Text(f"{step.question} ")
            item.append(f"→ {step.answer}", style=path)
            item.append(f"\n{step.reason}")
            why.add_row(f"{i}. ", item)
        return Group(chart, Text("Why", style="bold"), why)
