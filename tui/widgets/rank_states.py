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


def state_class(st: RankState, label: str, root_cause: int | None = None) -> str:
    """``root`` (the rank a failed run is blamed on), ``peer`` (a rank stopped after it),
    ``failed``, ``exited``, ``flagged`` (hung, or idle: ``label`` says so), ``starting`` or
    ``plain`` (running, or stopped by the user): what colours a rank's state."""
    if st.status is RankStatus.FAILED:
        if root_cause is None:
            return "failed"
        if st.rank == root_cause:
            return "root"
        if st.exit_code is None or st.exit_code < 0 or st.exit_code > 128:
            return "peer"
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
        "rank-state--root",
        "rank-state--peer",
    }
    DEFAULT_CSS = """
    RankStateView > .rank-state--failed { color: ansi_red; text-style: bold; }
    RankStateView > .rank-state--exited { color: ansi_green; }
    RankStateView > .rank-state--flagged { color: ansi_yellow; }
    RankStateView > .rank-state--starting { text-style: dim; }
    RankStateView > .rank-state--root { color: ansi_red; text-style: bold reverse; }
    RankStateView > .rank-state--peer { text-style: dim; }
    """

    def style_of(self, component: str) -> Style:
        """The style a component class sets (only what it sets, to add to a span's)."""
        return self.get_component_rich_style(component, partial=True)

    def state_style(self, st: RankState, label: str, root_cause: int | None = None) -> Style | None:
        name = state_class(st, label, root_cause)
        return None if name == "plain" else self.style_of(f"rank-state--{name}")
