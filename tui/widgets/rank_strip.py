"""The monitor's rank strip: every rank in one or two rows under the header, ``r3✗1`` style,
coloured by state (failed, exited, idle or hung, starting, running), underlined when the rank
reported errors or is a straggler. The glance that says which ranks to look at."""

from __future__ import annotations

from rich.text import Text

from engine.monitor.state import RankStatus, Snapshot, exit_text
from tui.widgets.rank_states import RankStateView

GLYPHS = {
    RankStatus.STARTING: "○",
    RankStatus.RUNNING: "●",
    RankStatus.EXITED: "✓",
    RankStatus.FAILED: "✗",
    RankStatus.STOPPED: "■",
}
HUNG_GLYPH = "?"


class RankStrip(RankStateView):
    """``show(snap)`` redraws the strip (a layout only when its length changed)."""

    COMPONENT_CLASSES = {"rank-strip--running", "rank-strip--marked"}
    DEFAULT_CSS = """
    RankStrip { height: auto; max-height: 2; padding: 0 1; }
    RankStrip > .rank-strip--running { color: ansi_cyan; }
    RankStrip > .rank-strip--marked { text-style: underline; }
    """

    def __init__(self, *, idle_after_s: float = 10.0, id: str | None = None) -> None:  # noqa: A002
        super().__init__("", id=id)
        self.idle_after_s = idle_after_s
        self._length = -1

    def show(self, snap: Snapshot, root_cause: int | None = None) -> None:
        strip = Text(overflow="fold")
        running, marked = self.style_of("rank-strip--running"), self.style_of("rank-strip--marked")
        for r in sorted(snap.ranks):
            st = snap.ranks[r]
            label = st.label(snap.now, self.idle_after_s)
            glyph = HUNG_GLYPH if st.hung else GLYPHS[st.status]
            style = self.state_style(st, label, root_cause) or running
            if st.errors or st.straggler:
                style += marked
            if st.status is RankStatus.FAILED:
                strip.append(f"r{r}{glyph}{exit_text(st.exit_code)} ", style)
            else:
                strip.append(f"r{r}{glyph} ", style)
        # The strip wraps to at most two rows: a layout only when its length changed.
        length = len(strip.plain)
        self.update(strip, layout=length != self._length)
        self._length = length
