"""The monitor's filter box: ``/`` opens it at the bottom of the screen; Enter filters every pane
to the lines that match (plain text, case-insensitive, or ``re:REGEX``), an empty box shows
everything again. A bad regular expression is a message, never a crash."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message
from textual.widgets import Input

from tui.widgets.rank_pane import LinePattern

PLACEHOLDER = "filter all panes: text, or re:REGEX  (Esc clears)"


class FilterBox(Input):
    """Hidden until :meth:`open`; posts :class:`FilterBox.Applied` when the user submits."""

    DEFAULT_CSS = """
    FilterBox { dock: bottom; layer: filter; display: none; }
    FilterBox.-open { display: block; }
    """

    @dataclass
    class Applied(Message):
        """The user set the filter (None: no filter)."""

        pattern: LinePattern | None

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(placeholder=PLACEHOLDER, id=id)

    @property
    def is_open(self) -> bool:
        return self.has_class("-open")

    def open(self, current: LinePattern | None) -> None:
        """Show the box, holding the ``current`` filter's text, and focus it."""
        self.add_class("-open")
        if current is not None:
            self.value = current.text
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close()
        if not event.value:
            self.post_message(self.Applied(None))
            return
        try:
            pattern = LinePattern(event.value)
        except Exception as e:  # noqa: BLE001 - a bad regex is a message, not a crash
            self.notify(f"filter: {e}; fix the pattern or drop the re: prefix", severity="error")
            return
        self.post_message(self.Applied(pattern))
