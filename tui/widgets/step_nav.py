"""The sidebar: every wizard step, where the user is, and which steps are still invalid.
Clicking a step asks the wizard to go there (the wizard decides whether it may). The steps that
show the plan (decision, configs, launch) carry no ✓ while there is no plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widget import Widget

from tui.session import NEEDS_PLAN, Step


class StepNav(Widget):
    """Steps as lines: ``› 1 Model  ✓``; invalid steps carry ``✗`` in the error colour, steps
    waiting for a plan ``…`` (planning) or ``·`` (no plan), and Decision ``!`` in the warning
    colour when the plan does not fit."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "step-nav--current",
        "step-nav--valid",
        "step-nav--invalid",
        "step-nav--warning",
    }
    DEFAULT_CSS = """
    StepNav { width: 18; height: 1fr; padding: 1 1; background: $panel; }
    StepNav > .step-nav--current { text-style: bold; color: $accent; }
    StepNav > .step-nav--valid { color: $success; }
    StepNav > .step-nav--invalid { color: $error; }
    StepNav > .step-nav--warning { color: $warning; text-style: bold; }
    """

    @dataclass
    class Picked(Message):
        """The user clicked the step ``step``."""

        step: Step

    def __init__(self, steps: list[Step], *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.steps = steps
        self.current = steps[0]
        self.invalid: dict[Step, bool] = {}
        self.pending: set[Step] = set()
        self.planned = True
        self.unfit = False

    def set_state(
        self,
        current: Step,
        invalid: dict[Step, bool],
        pending: set[Step],
        *,
        planned: bool = True,
        unfit: bool = False,
    ) -> None:
        """``planned`` False: there is no plan, so the steps that show one get no ✓; ``unfit``:
        the plan does not fit in memory, so Decision gets ``!``, not ✓."""
        state = (current, invalid, pending, planned, unfit)
        if state == (self.current, self.invalid, self.pending, self.planned, self.unfit):
            return
        self.unfit = unfit
        self.current = current
        self.invalid = dict(invalid)
        self.pending = set(pending)
        self.planned = planned
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        style = self.get_component_rich_style
        for step in self.steps:
            here = step == self.current
            bad = self.invalid.get(step, False)
            kind = "invalid" if bad else "valid"
            if bad:
                mark = "✗"
            elif step in self.pending:
                mark = "…"
            elif not self.planned and step in (Step.DECISION, *NEEDS_PLAN):
                mark = "·"
            elif self.unfit and step == Step.DECISION:
                mark, kind = "!", "warning"
            else:
                mark = "✓"
            line = Text(f"{'›' if here else ' '} {step.number} {step.label:<9}", no_wrap=True)
            if here:
                line.stylize(style("step-nav--current", partial=True))
            line.append(" ")
            line.append(mark, style=style(f"step-nav--{kind}", partial=True))
            text.append_text(line)
            text.append("\n")
        text.append("\n")
        # One key a line: "^n next  ^b back" is wider than the sidebar and wrapped mid-hint.
        text.append("^n next\n^b back\nF1 help", style="dim")
        return text

    def on_click(self, event: events.Click) -> None:
        row = event.y - 1  # padding-top
        if 0 <= row < len(self.steps):
            self.post_message(self.Picked(self.steps[row]))
