"""The monitor's NCCL pane: the lines of NCCL and torch.distributed of every rank, each tagged
with its rank, under a title that sums up what NCCL said (version, network, inits, warnings).

When the NCCL transport check (:mod:`engine.diagnose.transport`) finds something (the plan
assumes InfiniBand and NCCL chose Socket, a loopback interface, ...), its headline leads the
title, the border turns to the warning colour and a warning row stays pinned above the lines:
the finding, its likely cause and the fix.
"""

from __future__ import annotations

from rich.segment import Segment
from textual.geometry import Size
from textual.strip import Strip

from engine.diagnose.transport import TransportReport
from tui.format import plural
from tui.widgets.rank_pane import PaneBuffer, RankPane, component_style

NO_LINES_TITLE = "NCCL · no lines yet (gloo, or launch with NCCL_DEBUG=INFO)"


def warning_text(report: TransportReport | None) -> str:
    """The warning row: the worst finding, where, its likely cause and the fix (one line);
    "" when there is nothing to warn about."""
    if report is None or not report.findings:
        return ""
    top = report.findings[0]
    parts = [report.headline()]
    if top.nodes and not (top.causes and top.nodes[0] in top.causes[0]):  # said once is enough
        parts[0] += f" on {', '.join(top.nodes[:4])}" + (" …" if len(top.nodes) > 4 else "")
    if top.causes:
        parts.append(f"likely cause: {top.causes[0]}")
    parts.append(f"fix: {top.fix}")
    return " — ".join(parts)


class NcclPane(RankPane):
    """A :class:`RankPane` with its own tagged buffer; ``c`` hides it (class ``-hidden``)."""

    DEFAULT_CSS = """
    NcclPane { height: 7; }
    NcclPane.-hidden { display: none; }
    NcclPane.-empty { min-height: 1; border: none; border-top: round $panel-lighten-2; }
    """
    COMPONENT_CLASSES = RankPane.COMPONENT_CLASSES | {"nccl-pane--warning"}
    DEFAULT_CSS += """
    NcclPane > .nccl-pane--warning { color: $warning; text-style: bold; }
    """

    def __init__(self, max_lines: int, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(PaneBuffer(max_lines, tagged=True), "nccl", "NCCL", id=id)
        self.transport: TransportReport | None = None
        """The transport check's latest report (see :meth:`retitle`)."""
        self.warning = ""
        """The pinned warning row ("" when none)."""

    def retitle(self, headline: str, transport: TransportReport | None = None) -> None:
        """Title from the transport check's headline, the line count and ``headline``
        (:meth:`NcclSummary.headline`); the warning row from ``transport``."""
        self.transport = transport
        finding = transport.headline() if transport is not None else ""
        warning = warning_text(transport)
        if warning != self.warning:
            self.warning = warning
            self.set_class(bool(warning), "-flagged")
            self.sync(force=True)
        total = self.buffer.total
        parts: list[tuple[int, str]] = [(9, "NCCL")]
        if finding:
            parts.append((8, finding))
        if total:
            parts.append((5, plural(total, "line")))
            if headline:
                parts.append((4, headline))
        elif not finding:
            parts = [(9, NO_LINES_TITLE)]
        self.set_title_parts(parts)

    # ---- the pinned warning row ------------------------------------------------------------

    def validate_virtual_size(self, size: Size) -> Size:
        """One row more than the lines while the warning row is shown, so the last line is
        still reachable below it."""
        return Size(size.width, size.height + 1) if self.warning else size

    def render_line(self, y: int) -> Strip:
        if not self.warning:
            return super().render_line(y)
        if y == 0:
            width = self.scrollable_content_region.width
            style = self.rich_style + component_style(self, "nccl-pane--warning")
            return Strip([Segment(self.warning, style)]).crop_extend(0, width, self.rich_style)
        return super().render_line(y - 1)
