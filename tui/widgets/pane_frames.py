"""Show a batch's new lines a few panes per frame: a frame that repaints every pane of a 160x48
grid holds the event loop for tens of ms, several small ones let key presses in between.

Used by the monitor screen for each batch; ``done`` runs once the last pane is on screen (the
screen tells its reader then that the next batch may come), also when a pane fails to sync.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from textual.message_pump import MessagePump

from tui.widgets.rank_pane import RankPane

PANES_PER_FRAME = 6
"""Panes that take in new lines per frame (a batch's panes are spread over several frames)."""


def sync_in_frames(host: MessagePump, panes: Sequence[RankPane], done: Callable[[], None]) -> None:
    """Sync :data:`PANES_PER_FRAME` of ``panes`` now, the rest after the next refreshes of
    ``host``; then ``done`` (at once when ``host`` no longer runs)."""
    try:
        for pane in panes[:PANES_PER_FRAME]:
            if pane.is_attached:
                pane.sync()
    except BaseException:
        done()
        raise
    rest = panes[PANES_PER_FRAME:]
    if rest:
        if not host.call_after_refresh(sync_in_frames, host, rest, done):
            sync_in_frames(host, rest, done)
    elif not host.call_after_refresh(done):
        done()
