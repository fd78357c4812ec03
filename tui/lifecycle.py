"""Whether a screen or widget is still there to draw on. Results reach the UI from workers and
threads after the fact: a plan, a batch of rank lines, a preflight's verdict may arrive while
the app tears a screen down. Textual marks the screen and every widget in it ``_pruning`` when
it starts removing them and then removes the children one by one, so a header still in place is
no proof that the sidebar is (CI saw NoMatches for 'RankChart', 'MonitorSide' and 'StepNav').
At exit Textual prunes the screens on its stacks, but a screen that is installed and not shown
(the wizard's live monitor after ``esc``) is closed node by node from its registry, in no order:
its chart's labels can be gone while the screen still handles a batch of lines (CI saw
NoMatches('#chart-loss-label') so). The app stops running before it closes anything."""

from __future__ import annotations

from textual._context import NoActiveAppError
from textual.dom import DOMNode


def torn_down(node: DOMNode) -> bool:
    """True once the app has begun removing ``node`` (a removed widget is closed too) or has
    begun shutting down (``App._running`` is false before its first node closes)."""
    if node._pruning or node._closing or node._closed:
        return True
    try:
        return not node.app._running
    except NoActiveAppError:
        return True
