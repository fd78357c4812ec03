"""Helpers shared by the wizard's Pilot tests: wait for planning and writing, type into fields."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from rich.console import Console
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import Input, Static

from tui.app import DtrainApp


async def settle(pilot: Pilot[int], rounds: int = 200) -> None:
    """Wait until no plan is pending and no worker (plan, write) is running."""
    app = pilot.app
    assert isinstance(app, DtrainApp)
    for _ in range(rounds):
        await pilot.pause(0.02)
        if app.idle and not any(w.is_running for w in app.workers):
            await pilot.pause()
            return
    raise AssertionError("the wizard did not settle (planning or writing never finished)")


async def until(
    pilot: Pilot[int],
    cond: Callable[[], bool],
    what: str | Callable[[], str],
    timeout: float = 15.0,
) -> None:
    """Wait until ``cond()`` holds, with a deadline (a busy machine can take longer than Pilot's
    pause after a key or click); ``what`` says in the failure what never happened."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:g} s: {what() if callable(what) else what}")
        await pilot.pause(0.01)


async def at_step(pilot: Pilot[int], step: str, timeout: float = 15.0) -> None:
    """Wait until the wizard shows ``step``. A move is done only once the step's pane is
    mounted, which can take longer than Pilot's pause after a key or click on a busy machine:
    wait for the state, with a deadline (a refused move is checked at once: it stays)."""
    app = pilot.app
    assert isinstance(app, DtrainApp)
    await until(
        pilot,
        lambda: app.session.current == step and app.wizard is not None,
        lambda: f"the wizard is at {app.session.current!r}, not {step!r}",
        timeout,
    )


async def to_training(pilot: Pilot[int]) -> None:
    """From the first step to the Training step (three steps forward), the app settled."""
    await settle(pilot)
    for _ in range(3):
        await pilot.press("ctrl+n")
    await at_step(pilot, "training")


async def retype(pilot: Pilot[int], text: str) -> None:
    """Clear the focused input (Ctrl+A, Ctrl+K) and type ``text``."""
    assert isinstance(pilot.app.focused, Input), f"focus is on {pilot.app.focused!r}"
    await pilot.press("ctrl+a", "ctrl+k", *list(text))


def text_of(app: DtrainApp, selector: str) -> str:
    """The plain text a widget shows (its renderable drawn at its own width)."""
    widget = app.screen.query_one(selector)
    renderable = widget.content if isinstance(widget, Static) else widget.render()
    if isinstance(renderable, str):
        return renderable
    if isinstance(renderable, Text):
        return renderable.plain
    console = Console(file=io.StringIO(), width=max(widget.size.width, 40), color_system=None)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def focused_id(app: DtrainApp) -> str | None:
    return app.focused.id if app.focused is not None else None
