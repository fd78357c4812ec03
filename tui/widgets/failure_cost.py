"""What failures will cost the plan, in the wizard's decision step: the checkpoint's size and
save time, the interruptions to expect, the interval the bundle saves at and the goodput
(:func:`engine.plan.resilience.summary_lines`, the lines ``dtrain-tui plan`` prints). Hidden
while there is no plan."""

from __future__ import annotations

from textual.widgets import Static

from engine.plan.resilience import summary_lines
from engine.plan.result import Plan


class FailureCost(Static):
    DEFAULT_CSS = """
    FailureCost { height: auto; padding: 0 1; margin: 0 0 1 0; color: $text-muted; }
    FailureCost.-none { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__("", id=id, classes="-none", markup=False)
        self.lines: list[str] = []
        """What it says (empty while hidden)."""

    def show(self, plan: Plan | None) -> None:
        res = plan.resilience if plan is not None else None
        lines = summary_lines(res) if res is not None else []
        self.set_class(not lines, "-none")
        if lines != self.lines:
            self.lines = lines
            self.update("\n".join(["What failures cost", *(f"  {x}" for x in lines)]))
