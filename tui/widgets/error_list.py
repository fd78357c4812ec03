"""The monitor's error list: the latest error lines (Traceback, CUDA OOM, NCCL WARN, watchdog
timeout, rendezvous failure, ChildFailedError…), each with its rank; ``e`` jumps to the next."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from engine.monitor.state import ErrorRecord
from engine.monitor.textsafe import safe_line

SHOWN = 50
"""Most recent errors listed; the jump key walks all that the state keeps."""


class ErrorList(Static):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"error-list--kind"}
    DEFAULT_CSS = """
    ErrorList {
        height: auto; max-height: 100%; overflow-y: auto; padding: 0 1;
        text-wrap: nowrap; text-overflow: ellipsis;
    }
    ErrorList > .error-list--kind { color: ansi_red; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__("no errors", id=id)
        self._count = -1
        self.current: int | None = None

    def show(self, errors: Sequence[ErrorRecord], current: int | None = None) -> None:
        if len(errors) == self._count and current == self.current:
            return
        self._count = len(errors)
        self.current = current
        if not errors:
            self.update(Text("no errors", "dim"))
            return
        kind = self.get_component_rich_style("error-list--kind", partial=True)
        out = Text(no_wrap=True, overflow="ellipsis")
        start = max(0, len(errors) - SHOWN)
        for i in range(len(errors) - 1, start - 1, -1):
            rec = errors[i]
            who = f"r{rec.rank}" if rec.rank is not None else f"node{rec.node}"
            style = Style(reverse=i == current or None)
            out.append(f"{who:>6} ", style + Style(bold=True))
            out.append(f"{rec.kind.value:<16} ", style + kind)
            out.append(safe_line(rec.text).strip()[:200] + "\n", style)
        out.rstrip()
        self.update(out)
