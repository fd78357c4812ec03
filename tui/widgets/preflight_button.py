"""The Launch step's "Preflight" button: a press posts
:class:`~tui.messages.PreflightRequested`; the step (:class:`tui.screens.launch.LaunchStep`)
writes the bundle, runs its preflight in a thread worker and shows the verdict. The widget
knows nothing of the step, the session or the launch."""

from __future__ import annotations

from textual.widgets import Button

from tui.messages import PreflightRequested


class PreflightButton(Button):
    """Asks for the bundle's preflight (all-reduce busbw, node pairs, GEMM per GPU)."""

    def __init__(self) -> None:
        super().__init__("Preflight", id="preflight", compact=True)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(PreflightRequested())
