"""``dtrain-tui`` with no subcommand: the wizard. ``cli.main`` calls :func:`run_app`.

:class:`DtrainApp` holds one :class:`~tui.session.WizardSession` (the spec being edited, the plan
and bundle computed from it, where the user is); each step edits one part of it. Planning is the
job of :class:`~tui.planning.PlanningApp`, writing and launching (through an injectable backend
factory, so tests hand it a canned backend) of :class:`~tui.running.RunningApp`, its bases;
here are the header, profiles, help, theme and the configs step's actions from the palette. Nothing here imports torch, deepspeed or sky; the engine modules that
need them are imported when the user asks for what needs them.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, ClassVar

from textual import events, work
from textual.app import App
from textual.binding import Binding
from textual.message_pump import MessagePump
from textual.screen import Screen

from engine.errors import one_line
from engine.plan.specs import Spec, demo_spec
from tui import services
from tui.messages import (
    StepValidated,
)
from tui.planning import PLAN_DELAY_S
from tui.running import BackendFactory, RunningApp
from tui.session import DEFAULT_OUT_DIR, Step, WizardSession, default_out_dir, setup_name

if TYPE_CHECKING:
    from profiles.schema import Profile

_NEVER_HELD = frozenset({"ctrl+q", "ctrl+c"})
"""Keys that go through at once even while a step is being entered."""

DEFAULT_PROFILE = "local-cpu-demo"
"""The built-in profile the wizard opens on when no ``--profile`` is given."""


class DtrainApp(RunningApp):
    """The wizard. ``spec`` is the starting spec (None: the built-in default profile, else the
    embedded demo); ``out_dir`` where the bundle is written; ``run_root`` where launched runs
    keep their logs; ``backend_factory`` makes the backend a launch runs."""

    CSS_PATH: ClassVar[list[str | PurePath]] = ["app.tcss", "screens/profiles.tcss"]
    """The profiles dialog's CSS is read with the app's, at start-up: a screen's own CSS file,
    read when the screen is first pushed, made Textual parse every rule again and restyle every
    widget of the app (all the steps built: 0.1-0.2 s the first time ^o opened the dialog)."""
    TITLE = "dtrain-tui"
    COMMANDS: ClassVar[set[Any]] = App.COMMANDS | {lambda: _wizard_commands()}
    BINDINGS: ClassVar[list[Any]] = [
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        spec: Spec | None = None,
        *,
        out_dir: Path | None = None,
        run_root: Path | None = None,
        config_dir: Path | None = None,
        profile_name: str | None = None,
        plan_delay_s: float = PLAN_DELAY_S,
        show_timings: bool = True,
        backend_factory: BackendFactory = services.start_run,
    ) -> None:
        session = WizardSession(
            spec,
            lambda: initial_spec(None, config_dir),
            out_dir=out_dir,  # None: a directory named after the set-up
            run_root=run_root,
            show_timings=show_timings,
        )
        super().__init__(session, plan_delay_s, backend_factory)
        self.config_dir = config_dir
        self.profile_name = profile_name
        self._starts_on_demo = spec is None and profile_name is None
        """Opened on the built-in local CPU demo (no spec, no profile given)."""
        self._saved_spec: Spec | None = spec
        self._type_ahead: list[events.Key] = []
        self._replaying = False
        self._keys_released = asyncio.Event()
        """Keys that arrived while the wizard was entering a step, in order (see on_event)."""
        """The spec as loaded or last saved: the header says "unsaved changes" when the
        session's differs (None: the session's first spec, read after the first frame)."""

    def get_default_screen(self) -> Screen[Any]:
        from tui.screens.wizard import WizardScreen

        return WizardScreen(self.session)

    # --- type-ahead -------------------------------------------------------------------------
    async def on_event(self, event: events.Event) -> None:
        """Keys that arrive while the wizard builds or enters a step are held, then handed in
        order to the field that gets the focus (:meth:`_replay_type_ahead`); Ctrl+Q and Ctrl+C
        are never held."""
        if (
            isinstance(event, events.Key)
            and not event.is_forwarded
            and event.key not in _NEVER_HELD
            and (self._replaying or self._wizard_holds_keys())
        ):
            self._type_ahead.append(event)
            if not self._replaying:
                self._replaying = True
                self.run_worker(self._replay_type_ahead(), group="type-ahead", exit_on_error=False)
            return
        await super().on_event(event)

    def _wizard_holds_keys(self) -> bool:
        screens = self.screen_stack
        wiz = self.wizard
        return wiz is not None and bool(screens) and screens[-1] is wiz and wiz.holding_keys

    def release_type_ahead(self) -> None:
        """The wizard's step has the focus now (called by the wizard screen)."""
        self._keys_released.set()

    async def _replay_type_ahead(self) -> None:
        """Hand the held keys on one at a time, each once it has been handled in full (a key
        a binding handles reaches it only after bubbling up: the next key must not overtake
        it); a key that enters another step holds the rest until that step has the focus."""
        try:
            while self._type_ahead:
                if self._wizard_holds_keys():
                    self._keys_released.clear()
                    await self._keys_released.wait()
                    continue
                key = self._type_ahead.pop(0)
                target = self.focused or self.screen
                await super().on_event(key)
                await _handled(target)
        finally:
            self._replaying = False

    # --- the header ---------------------------------------------------------------------------
    @property
    def unsaved(self) -> bool:
        """The spec differs from the loaded (or last saved) profile's, or from the start."""
        if self._saved_spec is None:
            self._saved_spec = self.session.spec
        return self.session.spec != self._saved_spec

    def header_text(self) -> str:
        """The header's second line: the loaded profile and whether the spec has unsaved
        changes; on the untouched demo, how to run it."""
        dirty = self.unsaved
        if self.profile_name:
            text = f"profile {self.profile_name}"
        elif self._starts_on_demo and default_out_dir(self.spec) != DEFAULT_OUT_DIR:
            text = setup_name(self.spec)  # no longer the demo: the title follows the set-up
        elif self._starts_on_demo:
            text = "local CPU demo" if dirty else "local CPU demo — Ctrl+L twice runs it"
        else:
            text = "no profile"
        if dirty:
            text += " · ● unsaved changes (Ctrl+O saves)"
        return text

    def update_header(self) -> None:
        wiz = self.wizard
        if wiz is not None:
            wiz.sub_title = self.header_text()

    def on_step_validated(self, message: StepValidated) -> None:
        super().on_step_validated(message)
        self.update_header()

    # --- quitting ---------------------------------------------------------------------------
    async def action_quit(self) -> None:
        """Ctrl+Q: at once when nothing is unsaved, else ask (save / discard / cancel)."""
        from tui.screens.unsaved import UnsavedScreen

        if isinstance(self.screen, UnsavedScreen):
            return
        if not self.unsaved:
            self.exit()
            return
        where = f"profile {self.profile_name}" if self._saves_in_place() else "a new profile"
        self.push_screen(UnsavedScreen(where), self._quit_answered)

    def _saves_in_place(self) -> bool:
        from profiles.store import ProfileStore

        if not self.profile_name:
            return False
        try:
            return ProfileStore(self.config_dir).is_user(self.profile_name)
        except Exception:  # noqa: BLE001 - an unreadable store: save as a new one
            return False

    def _quit_answered(self, answer: str | None) -> None:
        if answer == "discard":
            self.exit()
        elif answer == "save":
            if self._saves_in_place():
                self._save_then_quit()
            else:
                self._save_as_then_quit()

    def _save_then_quit(self) -> None:
        from profiles.store import ProfileStore

        assert self.profile_name
        try:
            ProfileStore(self.config_dir).save_spec(self.profile_name, self.spec)
        except Exception as e:  # noqa: BLE001 - say it, stay: nothing of the user's is lost
            self.notify(f"not saved: {one_line(e)}", severity="error")
            return
        self._saved_spec = self.spec
        self.exit()

    def _save_as_then_quit(self) -> None:
        """The profiles dialog, asking for a name; the app quits once the set-up is saved."""
        from profiles.store import ProfileStore
        from tui.screens.profiles import ProfilesScreen

        screen = ProfilesScreen(
            ProfileStore(self.config_dir), spec=self.spec, current=self.profile_name
        )

        def closed(profile: Profile | None) -> None:
            self._profile_chosen(profile, screen.current)
            if profile is not None and not self.unsaved:
                self.exit()

        self.push_screen(screen, closed)
        screen.call_after_refresh(screen.action_save_as)

    # --- moving, help, theme, profiles --------------------------------------------------------
    def action_replan(self) -> None:
        self.replan()

    def action_toggle_dark(self) -> None:
        self.theme = "textual-light" if self.current_theme.dark else "textual-dark"

    def action_help(self) -> None:
        from tui.screens.help import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def warm_up(self) -> None:
        self._list_profiles()

    @work(thread=True, group="warm-up", exit_on_error=False, description="listing profiles")
    def _list_profiles(self) -> None:
        """The profiles dialog then opens on this listing (re-read only if a file changed)."""
        from profiles.store import ProfileStore
        from tui.screens.profiles import list_profiles

        with contextlib.suppress(Exception):  # the dialog reads (and reports) it again
            list_profiles(ProfileStore(self.config_dir))

    def action_profiles(self) -> None:
        from profiles.store import ProfileStore
        from tui.screens.profiles import ProfilesScreen

        screen = ProfilesScreen(
            ProfileStore(self.config_dir), spec=self.spec, current=self.profile_name
        )
        self.push_screen(screen, lambda profile: self._profile_chosen(profile, screen.current))

    def _profile_chosen(self, profile: Profile | None, current: str | None = None) -> None:
        """The profiles dialog closed: with the profile loaded or saved, or None (closed; a
        rename or delete in it may still have changed the current profile's name)."""
        if profile is None:
            self.profile_name = current
            self.update_header()
            return
        self.profile_name = profile.name or None
        self._saved_spec = profile.spec
        if profile.spec != self.spec:
            self.load_spec(profile.spec)
        self.update_header()

    def load_spec(self, spec: Spec) -> None:
        """Replace the whole spec (a loaded profile) and refill every step from it."""
        self.session.spec = spec
        wiz = self.wizard
        if wiz is None:
            return
        wiz.reload_steps()
        self.replan()

    async def action_edit_file(self) -> None:
        """The configs step's "edit in $EDITOR" (from the palette): on its highlighted file."""
        await self._configs_action("edit")

    async def action_copy_command(self) -> None:
        """The configs step's "copy the launch command" (from the palette)."""
        await self._configs_action("copy_command")

    async def _configs_action(self, action: str) -> None:
        wiz = self.wizard
        if wiz is None:
            return
        if wiz.current != Step.CONFIGS:
            while len(self.screen_stack) > 1 and self.screen is not wiz:
                self.pop_screen()
            if not await wiz.go(Step.CONFIGS):
                return
        pane = wiz.pane(Step.CONFIGS)
        if pane is not None:
            await pane.run_action(action)


_SETTLE_S = 2.0
"""How long a held key may take to be handled before the next one goes anyway (a widget
removed meanwhile never runs the callback that says it is done)."""


async def _handled(target: MessagePump) -> None:
    """Until ``target`` and each node above it has handled what was posted to it so far: a
    key forwarded to ``target`` has then been handled, bubbling included."""
    node: MessagePump | None = target
    while node is not None:
        done = asyncio.Event()
        node.call_later(done.set)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), _SETTLE_S)
        node = node._parent


def _wizard_commands() -> Any:
    """The palette's provider, imported when the palette first opens (start-up speed)."""
    from tui.commands import WizardCommands

    return WizardCommands


def initial_spec(profile: str | None, config_dir: Path | None) -> Spec:
    """The spec the wizard opens on: ``profile`` if given, else the built-in demo profile,
    else the embedded demo spec."""
    if profile:
        return services.load_profile_spec(profile, config_dir)
    try:
        return services.load_profile_spec(DEFAULT_PROFILE, config_dir)
    except Exception:  # noqa: BLE001 - the embedded default always works
        return demo_spec()


def run_app(profile: str | None = None, config_dir: Path | None = None) -> int:
    """Run the wizard in this terminal; returns the process exit code."""
    # An explicit profile is read now, so a bad name is one line on the terminal, not a screen.
    spec = initial_spec(profile, config_dir) if profile else None
    app = DtrainApp(spec, config_dir=config_dir, profile_name=profile)
    result = app.run()
    # Textual's App.run returns (None) after an unhandled exception, once it has printed the
    # traceback; a crash must never look like success to the shell.
    if app._exception is not None or (app.return_code or 0) != 0:
        return app.return_code or 1
    return int(result or 0)
