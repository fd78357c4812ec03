"""The badge that says a layout is forced (``forced: tp=4 pp=2``) with a button to clear it,
shown in the training and decision steps: a forced layout outlives a change of model, and
without it a person would not know why the plan keeps that shape."""

from __future__ import annotations

from dataclasses import dataclass

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Button, Static

from engine.plan.specs import LayoutSpec


def forced_text(layout: LayoutSpec) -> str:
    """``tp=4 pp=2 strategy=3d``: what the layout fixes ("" when nothing is forced)."""
    return layout.given_text()


class ForcedBadge(Horizontal):
    """``forced: tp=4 pp=2 [clear]``; hidden while nothing is forced."""

    DEFAULT_CSS = """
    ForcedBadge { height: auto; display: none; }
    ForcedBadge.-forced { display: block; }
    ForcedBadge > Static { width: auto; color: $warning; text-style: bold; padding-right: 1; }
    """

    @dataclass
    class Cleared(Message):
        """The user asked to clear the forced layout."""

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id)
        self.text = ""

    def compose(self) -> ComposeResult:
        yield Static("", classes="forced-text", markup=False)
        yield Button("clear", id="clear-forced-badge", compact=True)

    def show(self, layout: LayoutSpec) -> None:
        text = forced_text(layout)
        if text == self.text:
            return
        self.text = text
        self._apply()

    def on_mount(self) -> None:
        self._apply()  # a show() before the children were composed

    def _apply(self) -> None:
        text = self.text
        self.set_class(bool(text), "-forced")
        buttons = self.query(Button)
        statics = self.query(".forced-text")
        if not buttons or not statics:
            return  # not composed yet: on_mount applies it
        buttons.first().can_focus = bool(text)  # hidden: not a Tab stop
        statics.first(Static).update(f"forced: {text} —" if text else "")

    @on(Button.Pressed, "#clear-forced-badge")
    def _clear(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.Cleared())
