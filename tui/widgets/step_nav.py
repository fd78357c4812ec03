"""The sidebar: every wizard step, where the user is, and which steps are still invalid.
Clicking a step asks the wizard to go there (the wizard decides whether it may)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widget import Widget


class StepNav(Widget):
    """Steps as lines: ``› 1 Model  ✓``; invalid steps carry ``✗`` in the error colour."""

    DEFAULT_CSS = """
    StepNav { width: 18; height: 1fr; padding: 1 1; background: $panel; }
    """

    @dataclass
    class Picked(Message):
        """The user clicked the step ``step``."""

        step: str

    def __init__(self, steps: list[tuple[str, str]], *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.steps = steps
        self.current = steps[0][0]
        self.invalid: dict[str, bool] = {}
        self.pending: set[str] = set()

    def set_state(self, current: str, invalid: dict[str, bool], pending: set[str]) -> None:
        if (current, invalid, pending) == (self.current, self.invalid, self.pending):
            return
        self.current = current
        self.invalid = dict(invalid)
        self.pending = set(pending)
        self.refresh()

    def render(self) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        styles = self.app.theme_variables
        for i, (key, title) in enumerate(self.steps, 1):
            here = key == self.current
            bad = self.invalid.get(key, False)
            mark = "✗" if bad else ("…" if key in self.pending else "✓")
            line = Text(f"{'›' if here else ' '} {i} {title:<9}", no_wrap=True)
            if here:
                line.stylize(f"bold {styles.get('accent', '')}".strip())
            line.append(" ")
            line.append(mark, style=styles.get("error", "") if bad else styles.get("success", ""))
            text.append_text(line)
            text.append("\n")
        text.append("\n")
        text.append("^n next  ^b back\nF1 help", style="dim")
        return text

    def on_click(self, event: events.Click) -> None:
        row = event.y - 1  # padding-top
        if 0 <= row < len(self.steps):
            self.post_message(self.Picked(self.steps[row][0]))
