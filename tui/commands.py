"""The command palette (Ctrl+P): the wizard's main actions by name, and the one provider every
palette shares (:class:`ListedCommands`; the monitor's lists its own in
``tui/screens/monitor_commands.py``). The providers name what they call through protocols, so
nothing here imports the app or a screen (they import this, when the palette first opens)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from tui.session import Step

Command = tuple[str, str, Callable[[], object]]
"""(name shown, help line, what it runs)."""


class ListedCommands(Provider):
    """A provider over a list of :data:`Command`: every one on discovery, fuzzy-matched by
    name on search. Subclasses list them in :meth:`_commands`."""

    def _commands(self) -> list[Command]:
        raise NotImplementedError

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)


class WizardActions(Protocol):
    """What the wizard's palette calls on the app (:class:`tui.app.DtrainApp`)."""

    def goto(self, step: Step) -> None: ...
    def action_write_bundle(self) -> None: ...
    def action_launch(self) -> None: ...
    async def action_edit_file(self) -> None: ...
    async def action_copy_command(self) -> None: ...
    def action_open_run(self) -> None: ...
    def action_replan(self) -> None: ...
    def action_profiles(self) -> None: ...
    def action_toggle_dark(self) -> None: ...
    def action_help(self) -> None: ...


class WizardCommands(ListedCommands):
    """Go to a step, write, launch, re-plan, profiles, theme, help."""

    def _commands(self) -> list[Command]:
        app = cast(WizardActions, self.app)
        cmds: list[Command] = [
            (
                f"Go to step {step.number}: {step.label}",
                f"Open the {step} step",
                partial(app.goto, step),
            )
            for step in Step
        ]
        cmds += [
            (
                "Write bundle",
                "Write every config file to the output directory",
                app.action_write_bundle,
            ),
            ("Start run", "Write the bundle, launch it and open the monitor", app.action_launch),
            (
                "Edit a bundle file in $EDITOR",
                "Open the highlighted file of the configs step (as written) in your editor",
                app.action_edit_file,
            ),
            (
                "Copy the launch command",
                "Copy the command that starts the highlighted script (or the run)",
                app.action_copy_command,
            ),
            ("Open run…", "Watch a past or running run (ctrl+g)", app.action_open_run),
            ("Re-plan", "Run the planner again on the current spec", app.action_replan),
            (
                "Profiles: save or load",
                "Save the whole spec as a profile, or load one",
                app.action_profiles,
            ),
            (
                "Toggle light/dark theme",
                "Switch between Textual's dark and light themes",
                app.action_toggle_dark,
            ),
            ("Help: keys and steps", "Show every key binding", app.action_help),
        ]
        return cmds
