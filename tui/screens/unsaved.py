"""The question Ctrl+Q asks while the set-up has unsaved changes: save, discard or cancel.
:class:`tui.app.DtrainApp` opens it (over the wizard, the profiles dialog or any screen) and acts
on the answer it is dismissed with."""

from __future__ import annotations

from typing import Literal

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label

Answer = Literal["save", "discard", "cancel"]


class UnsavedScreen(ModalScreen[Answer]):
    """Quit with unsaved changes? ``s`` saves them (to ``where``), ``d`` quits without them,
    ``esc`` (or ``c``) goes back."""

    DEFAULT_CSS = """
    UnsavedScreen { align: center middle; }
    #unsaved-dialog {
        width: 64; height: auto; padding: 1 2;
        border: round $warning; background: $surface;
    }
    #unsaved-buttons { height: auto; margin-top: 1; }
    #unsaved-buttons Button { margin-right: 2; }
    """

    BINDINGS = [
        Binding("s", "answer('save')", "Save and quit"),
        Binding("d", "answer('discard')", "Discard and quit"),
        Binding("escape,c", "answer('cancel')", "Cancel"),
    ]

    def __init__(self, where: str) -> None:
        super().__init__(id="unsaved")
        self.where = where

    def compose(self) -> ComposeResult:
        with Vertical(id="unsaved-dialog"):
            yield Label("[b]Quit with unsaved changes?[/b]")
            yield Label(f"s saves them to {self.where}; d quits without them; esc goes back.")
            with Horizontal(id="unsaved-buttons"):
                yield Button("Save and quit (s)", id="save", variant="primary", compact=True)
                yield Button("Discard (d)", id="discard", variant="error", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_answer(event.button.id or "cancel")

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer if answer in ("save", "discard") else "cancel")  # type: ignore[arg-type]
