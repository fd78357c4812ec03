"""The monitor's GPU panel (``g``): per node, one row per rank with utilisation and memory bars
(the plan's per-GPU estimate marked ``┃`` on the memory bar), power, temperature and the
throttle reason; CPU ranks show their process's CPU use and resident memory in the same rows.
Above the rows, every flag :mod:`engine.monitor.machines` raises (hot, throttled, far below its
peers), each naming its GPU and node.

Drawn by :class:`tui.screens.monitor.MonitorScreen` from its snapshot; it judges nothing itself.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from engine.monitor.machines import FlagKind, MachineRow, NodeMachines, all_flags

BAR = 10
"""Cells in each bar."""
GIB = 1024**3


def bar(frac: float | None, mark: float | None = None, width: int = BAR) -> Text:
    """``██████░░░░`` for ``frac`` of ``width`` (None: all dim); ``mark``: a fraction marked
    ``┃`` (the plan's estimate; at the last cell when it is past the bar's end)."""
    out = Text()
    filled = 0 if frac is None else round(max(0.0, min(1.0, frac)) * width)
    at = None if mark is None else min(width - 1, max(0, int(mark * width)))
    for i in range(width):
        if i == at:
            out.append("┃", style="bold yellow")
        elif i < filled:
            out.append("█", style="green" if (frac or 0) < 0.9 else "red")
        else:
            out.append("░", style="dim")
    return out


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.1f}"


def row_text(row: MachineRow, plan_mem_bytes: int | None) -> Text:
    """One rank's row."""
    t = Text("  ")
    t.append(f"{row.name:<11}", style="bold" if row.flags else "")
    t.append(f" r{row.rank:<3}")
    if not row.sampled:
        t.append(" no sample yet", style="dim")
        return t
    if not row.gpu:
        cpu = row.cpu_pct
        t.append(" cpu ")
        t.append_text(bar(None if cpu is None else cpu / 100))
        t.append(f" {'-' if cpu is None else f'{cpu:.0f}'} %".ljust(7))
        t.append(f" rss {_gib(row.rss_bytes)} GiB")
        return t
    util = row.util_pct
    t.append(" util ")
    t.append_text(bar(None if util is None else util / 100))
    t.append(f" {'-' if util is None else f'{util:.0f}'} %".ljust(7))
    total = row.mem_total_bytes
    used = row.mem_used_bytes
    frac = used / total if used is not None and total else None
    mark = plan_mem_bytes / total if plan_mem_bytes and total else None
    t.append(" mem ")
    t.append_text(bar(frac, mark))
    t.append(f" {_gib(used)}/{_gib(total)} GiB")
    if row.power_w is not None:
        limit = f"/{row.power_limit_w:.0f}" if row.power_limit_w else ""
        t.append(f"  {row.power_w:.0f}{limit} W")
    if row.temp_c is not None:
        t.append(
            f"  {row.temp_c:.0f} °C",
            style="red" if any(f.kind is FlagKind.HOT for f in row.flags) else "",
        )
    if row.throttle:
        t.append("  " + ",".join(row.throttle), style="red")
    return t


def panel_text(nodes: list[NodeMachines], plan_mem_bytes: int | None) -> Text:
    """The flags, then each node's rows."""
    out = Text()
    for f in all_flags(nodes):
        out.append(f"⚠ {f.text}\n", style="bold red")
    for n in nodes:
        host = f" ({n.host})" if n.host else ""
        out.append(f"node {n.node}{host}\n", style="bold")
        for row in n.rows:
            out.append_text(row_text(row, plan_mem_bytes))
            out.append("\n")
    if plan_mem_bytes:
        out.append(f"┃ plan's estimate: {plan_mem_bytes / GIB:.1f} GiB per GPU", style="dim")
    out.rstrip()
    return out


class GpuPanel(VerticalScroll):
    """``show(nodes, plan_mem_bytes)`` redraws; hidden (class ``-hidden``) until ``g``."""

    DEFAULT_CSS = """
    GpuPanel { height: auto; max-height: 45%; border-top: hkey $panel-lighten-2; padding: 0 1; }
    GpuPanel.-hidden { display: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002
        super().__init__(id=id, classes="-hidden")
        self.can_focus = False  # a view: Tab walks the panes, never into this panel
        self.text = Text()
        """What the panel shows (for tests)."""

    def compose(self) -> ComposeResult:
        yield Static(id="gpu-rows")

    def show(self, nodes: list[NodeMachines], plan_mem_bytes: int | None) -> None:
        text = panel_text(nodes, plan_mem_bytes)
        flagged = len(all_flags(nodes))
        gpus = sum(r.gpu for n in nodes for r in n.rows)
        what = f"{gpus} GPU(s)" if gpus else f"{sum(len(n.rows) for n in nodes)} CPU rank(s)"
        title = f"machines: {what} on {len(nodes)} node(s)" + (
            f", {flagged} flagged" if flagged else ""
        )
        self.border_title = title
        self.set_class(bool(flagged), "-flagged")
        if text.plain != self.text.plain:
            self.text = text
            self.query_one("#gpu-rows", Static).update(text)
