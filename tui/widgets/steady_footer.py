"""The wizard's and the monitor's key footer: Textual's :class:`~textual.widgets.Footer`,
rebuilt only when the keys it shows change.

Textual's footer rebuilds all its keys each time the screen's bindings are updated, which is on
every focus change: a step switch moves the focus two or three times, and rebuilding the keys
(and restyling each one) was the largest single cost of a switch. The keys shown are the same
on almost every move (the fields' own bindings are not shown), so the rebuild is skipped while
they are."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer


class SteadyFooter(Footer):
    """A :class:`Footer` that recomposes only when the shown keys (key, action, description,
    enabled, tooltip, group) differ from the ones it shows."""

    _shown: tuple[object, ...] | None = None
    """What the last compose drew (None: nothing yet)."""

    def _wanted(self) -> tuple[object, ...]:
        bindings = self.screen.active_bindings
        keys = tuple(
            (b.key, b.action, b.description, enabled, tooltip, b.group)
            for (_, b, enabled, tooltip) in bindings.values()
            if b.show
        )
        palette = bindings.get(self.app.COMMAND_PALETTE_BINDING)
        extra = None if palette is None else (palette[1].key, palette[1].action, palette[2])
        return (keys, extra, self.show_command_palette, self.app.ENABLE_COMMAND_PALETTE)

    def compose(self) -> ComposeResult:
        if self._bindings_ready:
            self._shown = self._wanted()
        return super().compose()

    def bindings_changed(self, screen: Screen[object]) -> None:
        if (
            self._shown is not None
            and self.is_attached
            and screen is self.screen
            and self._wanted() == self._shown
        ):
            return  # the same keys: the footer already shows them
        super().bindings_changed(screen)
