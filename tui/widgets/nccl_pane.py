"""The monitor's NCCL pane: the lines of NCCL and torch.distributed of every rank, each tagged
with its rank, under a title that sums up what NCCL said (version, network, inits, warnings)."""

from __future__ import annotations

from tui.widgets.rank_pane import PaneBuffer, RankPane

NO_LINES_TITLE = "NCCL · no lines yet (gloo, or launch with NCCL_DEBUG=INFO)"


class NcclPane(RankPane):
    """A :class:`RankPane` with its own tagged buffer; ``c`` hides it (class ``-hidden``)."""

    DEFAULT_CSS = """
    NcclPane { height: 7; }
    NcclPane.-hidden { display: none; }
    """

    def __init__(self, max_lines: int, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(PaneBuffer(max_lines, tagged=True), "nccl", "NCCL", id=id)

    def retitle(self, headline: str) -> None:
        """Title from the line count and ``headline`` (:meth:`NcclSummary.headline`)."""
        total = self.buffer.total
        if total:
            self.border_title = f"NCCL · {total:,} lines" + (f" · {headline}" if headline else "")
        else:
            self.border_title = NO_LINES_TITLE
