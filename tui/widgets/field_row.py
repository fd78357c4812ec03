"""One labelled input with the engine's message for it shown right below, as typed."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.suggester import Suggester
from textual.widget import Widget
from textual.widgets import Input, Label, Static


class FieldRow(Widget):
    """``label  [input]`` plus an error line, shown only when the value is invalid.

    The input's id is ``f-<name>``, so a step finds its fields by spec field name."""

    DEFAULT_CSS = """
    FieldRow {
        height: auto; layout: grid; grid-size: 2; grid-columns: 20 1fr; grid-rows: auto;
    }
    FieldRow .field-label { width: 20; padding-right: 1; color: $text-muted; }
    FieldRow Input { width: 1fr; }
    FieldRow .field-error {
        column-span: 2; color: $text-error; padding-left: 20; height: auto; display: none;
    }
    FieldRow.-invalid .field-error { display: block; }
    FieldRow.-invalid .field-label { color: $text-error; }
    """

    def __init__(
        self,
        name: str,
        label: str,
        value: str = "",
        *,
        placeholder: str = "",
        suggester: Suggester | None = None,
        max_length: int = 4096,
    ) -> None:
        super().__init__(id=f"row-{name}")
        self.field_name = name
        self._label = label
        self._value = value
        self._placeholder = placeholder
        self._suggester = suggester
        self._max_length = max_length
        self._error: str | None = None

    def compose(self) -> ComposeResult:
        yield Label(self._label, classes="field-label")
        yield Input(
            self._value,
            placeholder=self._placeholder,
            id=f"f-{self.field_name}",
            compact=True,
            suggester=self._suggester,
            max_length=self._max_length,
            select_on_focus=False,
        )
        yield Static("", classes="field-error", markup=False)

    @property
    def input(self) -> Input:
        return self.query_one(Input)

    @property
    def value(self) -> str:
        return self.input.value

    @value.setter
    def value(self, text: str) -> None:
        self.input.value = text

    def set_quietly(self, text: str) -> None:
        """Set the text without posting ``Input.Changed`` (a value the program fills in is not
        an edit by the user)."""
        with self.input.prevent(Input.Changed):
            self.input.value = text

    def set_error(self, message: str | None) -> None:
        message = message or None
        if message == self._error:
            return  # typing re-validates on every key: touch the DOM only on a change
        self._error = message
        self.set_class(bool(message), "-invalid")
        self.query_one(".field-error", Static).update(f"✗ {message}" if message else "")

    @property
    def error(self) -> str:
        """The message shown under the field ("" when valid)."""
        return self._error or ""
