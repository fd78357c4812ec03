"""The command palette (Ctrl+P) on the monitor: its actions by name (back to the wizard, stop,
full screen, filter, next error, views, help). :class:`tui.screens.monitor.MonitorScreen` names
this provider in its ``COMMANDS``, so the palette offers these only while a monitor is shown."""

from __future__ import annotations

from typing import Protocol, cast

from tui.commands import Command, ListedCommands


class MonitorActions(Protocol):
    """What the monitor's palette calls on :class:`tui.screens.monitor.MonitorScreen`."""

    can_go_back: bool

    def action_back(self) -> None: ...
    def action_stop_run(self) -> None: ...
    def action_zoom(self) -> None: ...
    def action_search(self) -> None: ...
    def action_next_error(self) -> None: ...
    def action_toggle_view(self) -> None: ...
    def action_toggle_sideways(self) -> None: ...
    def action_toggle_side(self) -> None: ...
    def action_toggle_nccl(self) -> None: ...
    def action_help(self) -> None: ...


class MonitorCommands(ListedCommands):
    """The monitor's actions; "Back to the wizard" only when there is one."""

    def _commands(self) -> list[Command]:
        m = cast(MonitorActions, self.screen)
        cmds: list[Command] = []
        if m.can_go_back:
            cmds.append(
                (
                    "Monitor: back to the wizard",
                    "The run goes on; Open run… reopens it",
                    m.action_back,
                )
            )
        cmds += [
            (
                "Monitor: stop the run",
                "Stop every rank on every node (asks first)",
                m.action_stop_run,
            ),
            ("Monitor: full screen", "The focused pane alone (again: back)", m.action_zoom),
            ("Monitor: filter lines", "Show only matching lines in every pane", m.action_search),
            ("Monitor: next error", "Jump to the next error line", m.action_next_error),
            ("Monitor: rank / node view", "Panes per rank or per node", m.action_toggle_view),
            (
                "Monitor: long lines cut / sideways",
                "Scroll long lines with ← →",
                m.action_toggle_sideways,
            ),
            ("Monitor: rank table", "Show or hide the rank table and chart", m.action_toggle_side),
            ("Monitor: NCCL pane", "Show or hide the NCCL pane", m.action_toggle_nccl),
            ("Monitor: keys (help)", "Every key of the monitor", m.action_help),
        ]
        return cmds
