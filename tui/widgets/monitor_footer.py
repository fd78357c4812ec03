"""The monitor's key footer: Textual's :class:`~textual.widgets.Footer`, fitted to its width
so that no key it shows is cut at the row's end. Where the full labels do not fit, in turn: the
labels shorten (``e Error``, not ``e Next error``; "Back to wizard" last), the row turns
compact, and the lowest-priority keys are left off its end (the app's own, then ``t``, ``c``,
``]``...: the screen lists its bindings most needed first). A key left off still works; ``?``
lists every key. At 80 columns every key a person needs in trouble is on the row.

The monitor screen (:mod:`tui.screens.monitor`) composes it; it knows the bindings only by
action name.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.app import ComposeResult
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from tui.widgets.steady_footer import SteadyFooter

PALETTE_COLUMNS = (12, 11)
"""What the palette key takes at the row's right end (``▏ ^p palette``), normal and compact."""
SHORT: dict[str, str] = {
    "stop_run": "Stop",
    "next_error": "Error",
    "toggle_view": "View",
    "page(1)": "Page",
    "toggle_nccl": "NCCL",
    "toggle_side": "Table",
}
"""Action -> its label on a narrow footer (a label not named here is short already); the
full one stays the key's tooltip."""
SHORT_LAST: dict[str, str] = {"back": "Back"}
"""Shortened only where the other short labels are not enough."""
MIN_KEYS = 4
"""Keys never left off (the first ones: back or quit, help, stop, next error)."""


@dataclass(frozen=True, slots=True)
class Fit:
    """How the row is drawn: the labels to use instead, compact or not, actions left off."""

    labels: dict[str, str]
    compact: bool = False
    hidden: frozenset[str] = frozenset()


def fit_keys(keys: list[tuple[str, str, str]], width: int) -> Fit:
    """The first way ``keys`` (action, key shown, label), most needed first, fit ``width``
    columns (the palette key at their right): as they are; short labels; "Back" too and
    compact; then keys left off the end."""

    def columns(labels: dict[str, str], compact: bool, hidden: frozenset[str] = frozenset()) -> int:
        pad = 2 if compact else 3  # key and label padding (compact: a margin after the key)
        shown = [(k, labels.get(a, d)) for a, k, d in keys if a not in hidden]
        return sum(len(k) + len(d) + pad for k, d in shown) + PALETTE_COLUMNS[compact]

    for fit in (Fit({}), Fit(SHORT), Fit(SHORT | SHORT_LAST, compact=True)):
        if width <= 0 or columns(fit.labels, fit.compact) <= width:
            return fit
    hidden: list[str] = []
    for action, _, _ in reversed(keys[MIN_KEYS:]):
        hidden.append(action)
        if columns(fit.labels, True, frozenset(hidden)) <= width:
            break
    return Fit(fit.labels, compact=True, hidden=frozenset(hidden))


class MonitorFooter(SteadyFooter):
    """The footer, drawn as :func:`fit_keys` says for its width, rebuilt only when its keys or
    its width's fit change (not on every focus move: each key press under a firehose did)."""

    fit = Fit({})

    def compose(self) -> ComposeResult:
        if self._bindings_ready:
            self._set_fit(fit_keys(self._keys(), self.size.width))
        fit = self.fit
        for widget in super().compose():
            if isinstance(widget, FooterKey) and widget.action in fit.hidden:
                continue
            if isinstance(widget, FooterKey) and widget.action in fit.labels:
                widget.tooltip = widget.tooltip or widget.description
                widget.description = fit.labels[widget.action]
            yield widget

    def on_resize(self, event: events.Resize) -> None:
        if self._bindings_ready and fit_keys(self._keys(), event.size.width) != self.fit:
            self.call_after_refresh(self.recompose)

    def _keys(self) -> list[tuple[str, str, str]]:
        """(action, key shown, label) of the keys the footer shows, in its order."""
        keys: dict[str, tuple[str, str, str]] = {}
        for _, binding, _, _ in self.screen.active_bindings.values():
            if binding.show and binding.action not in keys:
                shown = self.app.get_key_display(binding)
                keys[binding.action] = (binding.action, shown, binding.description)
        return list(keys.values())

    def _set_fit(self, fit: Fit) -> None:
        """Before the keys are made (they take ``compact`` when made): no watcher runs."""
        self.fit = fit
        self.set_reactive(Footer.compact, fit.compact)
        self.set_class(fit.compact, "-compact")
