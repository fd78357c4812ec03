"""``?`` / F1 in the monitor: every key the monitor answers to, read from the bindings it hands
over (a key another part adds shows up here by itself), with a longer word for the ones that
need it.

Pushed by :class:`tui.screens.monitor.MonitorScreen` with its bindings (this module imports no
screen); ``esc``, ``q``, ``?`` or F1 close it.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

MORE: dict[str, str] = {
    "cycle(1)": "next pane (across pages; the NCCL pane ends the cycle)",
    "cycle(-1)": "previous pane",
    "zoom": "full screen: the focused pane alone (again, or esc: back to the grid)",
    "toggle_view": "rank panes ↔ node panes (each view comes back as you left it)",
    "page(1)": "next page of panes",
    "page(-1)": "previous page of panes",
    "search": "filter every pane (text, or re:REGEX); esc clears it",
    "next_error": "jump to the next error line",
    "follow": "follow the end again after scrolling up (or End)",
    "toggle_side": "show / hide the rank table, chart and error list",
    "toggle_nccl": "show / hide the NCCL pane",
    "toggle_gpus": "show / hide the GPU panel: per node, each GPU's use, memory (plan marked ┃), "
    "power, temperature, throttling; flags a hot, throttled or slow GPU (CPU ranks: CPU, RSS)",
    "toggle_charts": "show / hide the charts: loss, throughput and step time per rank",
    "toggle_sideways": "long lines: cut at the edge ↔ scroll sideways with ← →",
    "stop_run": "stop the run on every node (press twice)",
    "diagnose": "ask every rank which collective it is in: names a stuck rank (the run goes on)",
    "calibrate": "fit the plan's estimates from this finished run and save them (calibrate)",
    "back": "back to the wizard; the run goes on (ctrl+g there reopens it)",
    "leave": "leave the monitor; the run goes on",
    "clear": "close the filter, clear it, leave full screen, then back to the wizard",
    "help": "this help",
}
"""Longer explanations by action; a binding not named here shows its own description."""

SKIP = {"cycle(-1)", "page(-1)", "quit", "stop_run_over"}
"""Shown together with their forward twin (``quit``: the footer's name for ``q`` where no
wizard lies beneath; the ``leave`` row explains ``q``; ``stop_run_over``: ``ctrl+x`` once the
run ended, the ``stop_run`` row's key)."""


def key_rows(bindings: list[Binding], *, can_go_back: bool) -> list[tuple[str, str]]:
    """(keys, what) for every binding: one row per action, its keys joined."""
    rows: dict[str, list[str]] = {}
    order: list[str] = []
    for b in bindings:
        if b.action == "back" and not can_go_back:
            continue
        if b.action not in rows:
            rows[b.action] = []
            order.append(b.action)
        rows[b.action].append(b.key_display or _key_name(b.key))
    out = []
    for action in order:
        if action in SKIP:
            continue
        keys = rows[action]
        twin = {"cycle(1)": "cycle(-1)", "page(1)": "page(-1)"}.get(action)
        if twin in rows:
            keys = keys + rows[twin]
        what = MORE.get(action, "")
        if action == "leave" and not can_go_back:
            what = "quit the monitor; the run goes on (ctrl+x stops it)"
        if action == "clear" and not can_go_back:
            what = "close the filter, clear it, leave full screen"
        desc = next(b.description for b in bindings if b.action == action)
        out.append((" / ".join(keys), what or desc))
    return out


def _key_name(key: str) -> str:
    names = {
        "question_mark": "?",
        "slash": "/",
        "right_square_bracket": "]",
        "left_square_bracket": "[",
        "escape": "esc",
        "shift+tab": "shift+tab",
    }
    return ", ".join(names.get(k, k) for k in key.split(","))


class MonitorHelp(ModalScreen[None]):
    """The monitor's keys: ``bindings``, the monitor's own. ``can_go_back``: a wizard lies
    beneath the monitor."""

    DEFAULT_CSS = """
    MonitorHelp { align: center middle; }
    MonitorHelp #monitor-help { width: 90; max-width: 100%; height: auto; max-height: 90%;
        border: round $accent; background: $panel; padding: 0 1; }
    """
    BINDINGS = [
        Binding("escape", "dismiss", "Close"),
        Binding("f1", "dismiss", "Close", show=False),
        Binding("question_mark", "dismiss", "Close", show=False),
        Binding("q", "dismiss", "Close", show=False),
    ]

    def __init__(self, bindings: list[Binding], *, can_go_back: bool = False) -> None:
        super().__init__()
        self.monitor_bindings = bindings
        self.can_go_back = can_go_back
        self.rows: list[tuple[str, str]] = []
        """(keys, what) as shown."""

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=False, padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        self.rows = key_rows(self.monitor_bindings, can_go_back=self.can_go_back)
        self.rows.append(("ctrl+p", "command palette: every monitor action by name"))
        for keys, what in self.rows:
            table.add_row(keys, what)
        with VerticalScroll(id="monitor-help"):
            yield Static(Text("Monitor keys", style="bold underline"))
            yield Static(table, id="monitor-help-keys")
            yield Static(Text("Esc closes this help.", style="dim"))
