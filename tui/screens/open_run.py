""" "Open run…" (``ctrl+g`` in the wizard, or the command palette): the runs under the runs
directory the app launches into, newest first, with their state; Enter opens the monitor on one
(a finished run is replayed from its files, a running one followed live).

Pushed by :class:`tui.app.DtrainApp`, which gets the chosen run directory back (None: closed).
Reading is :func:`engine.rundir.record.read_record`'s (it bounds what an untrusted run.json may
ask for, and reads a run whose launcher vanished as failed); a directory it refuses is listed as
unreadable, never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from engine.errors import DtrainError
from engine.monitor.textsafe import safe_line
from engine.rundir.record import RUN_JSON, read_record

MAX_RUNS = 200
"""Runs listed (the newest); older ones stay on disk, ``dtrain-tui monitor RUN_DIR`` opens any."""


@dataclass(frozen=True, slots=True)
class RunRow:
    """One run directory as the list shows it."""

    path: Path
    state: str
    """The run's state (``running``, ``succeeded``, ``failed``, ``stopped``…), or ``unreadable``."""
    started: str
    ranks: int
    reason: str

    @property
    def live(self) -> bool:
        return self.state in ("starting", "running")


def list_runs(root: Path, limit: int = MAX_RUNS) -> list[RunRow]:
    """The run directories under ``root`` (those with a ``run.json``), newest first."""
    try:
        dirs = [d for d in root.iterdir() if (d / RUN_JSON).is_file()]
    except OSError:
        return []
    dirs.sort(key=lambda d: d.name, reverse=True)  # <local time>-<name>: newest first
    rows = []
    for d in dirs[:limit]:
        try:
            rec = read_record(d)
        except DtrainError as e:
            rows.append(RunRow(d, "unreadable", "", 0, safe_line(e.message)))
            continue
        started = (rec.started_at or "")[:19].replace("T", " ")
        rows.append(RunRow(d, str(rec.state), started, rec.world_size, safe_line(rec.reason)))
    return rows


_STATE_STYLE = {
    "running": "bold cyan",
    "starting": "cyan",
    "succeeded": "green",
    "failed": "bold red",
    "stopped": "yellow",
    "unreadable": "dim",
}


class OpenRunScreen(ModalScreen[Path | None]):
    """Pick a run under ``root``; dismissed with its directory (None: esc)."""

    DEFAULT_CSS = """
    OpenRunScreen { align: center middle; }
    OpenRunScreen #open-run { width: 110; max-width: 100%; height: auto; max-height: 90%;
        border: round $accent; background: $panel; padding: 0 1; }
    OpenRunScreen #open-run-list { height: auto; max-height: 30; }
    """
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.rows = list_runs(root)

    def compose(self) -> ComposeResult:
        with Vertical(id="open-run"):
            yield Label(Text(f"Open run: {self.root}", style="bold"))
            if not self.rows:
                yield Label(f"no runs yet under {self.root}: ctrl+l starts one", id="open-run-none")
                return
            yield OptionList(
                *[self._option(i, r) for i, r in enumerate(self.rows)], id="open-run-list"
            )
            yield Label(Text("⏎ opens the monitor (a running run live) · esc closes", style="dim"))

    @staticmethod
    def _option(i: int, row: RunRow) -> Option:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(f"{row.state:<10} ", _STATE_STYLE.get(row.state, ""))
        text.append(f"{row.path.name:<44} ")
        text.append(f"{row.started:<19} ", "dim")
        if row.ranks:
            text.append(f"{row.ranks} rank{'s' if row.ranks > 1 else ''}  ")
        if row.reason:
            text.append(row.reason, "dim")
        return Option(text, id=f"run-{i}")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.rows[event.option_index].path)
