"""How rank states are coloured, shared by the widgets that list ranks: the rank table and the
rank strip under the monitor's header.

The colours live in CSS (component classes), not in Python: a state maps to a class name here
(:func:`state_class`), the class to a style in :class:`RankStateView`'s ``DEFAULT_CSS``. The
colours are the terminal's ANSI ones the monitor always drew these states in.
"""

from __future__ import annotations

from rich.style import Style
from textual.widgets import Static

from engine.monitor.state import RankState, RankStatus


def state_class(st: RankState, label: str) -> str:
    """``failed``, ``exited``, ``flagged`` (hung, or idle: ``label`` says so), ``starting`` or
    ``plain`` (running, or stopped by the user): what colours a rank's state."""
    if st.status is RankStatus.FAILED:
        return "failed"
    if st.status is RankStatus.EXITED:
        return "exited"
    if st.hung or label.startswith("idle"):
        return "flagged"
    if st.status is RankStatus.STARTING:
        return "starting"
    return "plain"


class RankStateView(Static):
    """A ``Static`` that draws rank states: :meth:`state_style` is the style of a state (None
    for a ``plain`` one: each subclass decides how to draw that)."""

    COMPONENT_CLASSES = {
        "rank-state--failed",
        "rank-state--exited",
        "rank-state--flagged",
        "rank-state--starting",
    }
    DEFAULT_CSS = """
    RankStateView > .rank-state--failed { color: ansi_red; text-style: bold; }
    RankStateView > .rank-state--exited { color: ansi_green; }
    RankStateView > .rank-state--flagged { color: ansi_yellow; }
    RankStateView > .rank-state--starting { text-style: dim; }
    """

    def style_of(self, component: str) -> Style:
        """The style a component class sets (only what it sets, to add to a span's)."""
        return self.get_component_rich_style(component, partial=True)

    def state_style(self, st: RankState, label: str) -> Style | None:
        name = state_class(st, label)
        return None if name == "plain" else self.style_of(f"rank-state--{name}")
