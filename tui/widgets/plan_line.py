"""One line under the monitor's header: the plan against what the run measures (step time, peak
memory, MFU; :mod:`engine.monitor.compare`), with "press k to calibrate" when they disagree by
more than the margin. Hidden while there is nothing to compare (no plan, no step yet)."""

from __future__ import annotations

from textual.widgets import Static

from engine.monitor.compare import PlanVsMeasured


class PlanLine(Static):
    DEFAULT_CSS = """
    PlanLine { height: 1; padding: 0 1; color: $text-muted; }
    PlanLine.-off { color: $warning; }
    PlanLine.-none { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__("", id=id, classes="-none")
        self.line = ""
        """What the line says ('' while hidden)."""

    def show(self, pvm: PlanVsMeasured | None) -> None:
        line = pvm.line() if pvm is not None else ""
        self.set_class(not line, "-none")
        self.set_class(pvm is not None and pvm.disagrees, "-off")
        if line != self.line:
            self.line = line
            self.update(line, layout=False)
