"""Whether a screen or widget is still there to draw on. Results reach the UI from workers and
threads after the fact: a plan, a batch of rank lines, a preflight's verdict may arrive while
the app tears a screen down. Textual marks the screen and every widget in it ``_pruning`` when
it starts removing them and then removes the children one by one, so a header still in place is
no proof that the sidebar is (CI saw NoMatches for 'RankChart', 'MonitorSide' and 'StepNav')."""

from __future__ import annotations

from textual.dom import DOMNode


def torn_down(node: DOMNode) -> bool:
    """True once the app has begun removing ``node`` (a removed widget is closed too)."""
    return bool(node._pruning or node._closing or node._closed)
