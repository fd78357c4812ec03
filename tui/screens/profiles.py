"""The profiles dialog: every profile (the user's and the built-ins) with its model, cluster and
last use, and the actions load, save, save as, delete and rename.

Pushed by the wizard (``push_screen(ProfilesScreen(store, spec=..., current=...), callback)``).
It dismisses with the chosen :class:`~profiles.schema.Profile` on load, with the freshly saved
profile after a save or save-as (so the wizard learns the new name), and with ``None`` when
closed; ``current`` then holds the wizard's profile after any rename or delete made here (the
wizard reads it, so its header and the next save dialog never show a stale name). All file work goes through :class:`~profiles.store.ProfileStore`; errors (a broken file,
a secret, a taken name) are shown in the dialog as one line and the dialog stays open.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Literal

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, DataTable, Input, Label, Static

from engine.errors import DtrainError
from engine.plan.specs import Spec
from profiles.schema import Profile, ProfileError, check_name
from profiles.store import ProfileEntry, ProfileStore

Prompt = Literal["save_as", "rename", "delete"]

_LISTINGS: dict[tuple[Path, Path], tuple[tuple[object, ...], list[ProfileEntry]]] = {}
"""The last listing of each store (config and presets directory) with the fingerprint of the
files it was read from: the app lists the store in a thread after start-up, so the dialog opens
without reading and checking every profile file on the UI thread."""


def _fingerprint(store: ProfileStore) -> tuple[object, ...]:
    """What the listing depends on: every file of the profiles and presets directories (the
    usage file included), by name, inode, size and time. Every write is a temp file renamed
    into place (a new inode), so an overwrite of the same size in the same tick still shows."""
    marks: list[object] = []
    for folder in (store.profiles_dir, store.presets_dir):
        try:
            with os.scandir(folder) as it:
                for entry in it:
                    st = entry.stat(follow_symlinks=True)
                    marks.append((str(folder), entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
        except OSError:
            marks.append((str(folder), None))
    return tuple(sorted(marks, key=repr))


def list_profiles(store: ProfileStore) -> list[ProfileEntry]:
    """``store.list()``, from the last listing while no file under it changed. Safe in a
    thread (the app warms it up in one)."""
    key = (store.profiles_dir, store.presets_dir)
    mark = _fingerprint(store)  # before reading: a change while reading is seen next time
    cached = _LISTINGS.get(key)
    if cached is not None and cached[0] == mark:
        return list(cached[1])
    entries = store.list()
    _LISTINGS[key] = (mark, entries)
    return list(entries)


def _home(path: Path) -> str:
    """``path`` with the home directory written as ``~``."""
    try:
        return f"~/{path.relative_to(Path.home())}"
    except ValueError:
        return str(path)


def _when(t: datetime | None, now: datetime | None = None) -> str:
    """The "Used" column: how long ago, in at most 7 characters (the built-ins' table fits 80
    columns; the detail line below gives the exact time)."""
    if t is None:
        return "never"
    age = ((now or datetime.now(t.tzinfo)) - t).total_seconds()
    if age < 60:
        return "now"
    if age < 3600:
        return f"{int(age // 60)}m ago"
    if age < 86400:
        return f"{int(age // 3600)}h ago"
    if age < 60 * 86400:
        return f"{int(age // 86400)}d ago"
    return t.astimezone().strftime("%b %y")


class ProfilesScreen(ModalScreen[Profile | None]):
    """Load, save, save as, delete and rename profiles."""

    CSS_PATH = "profiles.tcss"
    """Also read by the wizard's app at start-up (see ``DtrainApp.CSS_PATH``): pushing the
    screen then reads nothing, and restyles none of the app's widgets."""

    BINDINGS = [
        Binding("escape", "cancel", "Close"),
        Binding("l", "load", "Load"),
        Binding("s", "save", "Save"),
        Binding("a", "save_as", "Save as"),
        Binding("d", "delete", "Delete"),
        Binding("r", "rename", "Rename"),
        Binding("y", "confirm", "Yes", show=False),
        Binding("n", "cancel_prompt", "No", show=False),
    ]

    def __init__(
        self,
        store: ProfileStore,
        *,
        spec: Spec | None = None,
        current: str | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.spec = spec
        """The wizard's current spec: what save and save-as write (None: nothing to save)."""
        self.current = current
        """The profile the wizard was loaded from, if any: where save writes."""
        self._entries: dict[str, ProfileEntry] = {}
        self._prompt: Prompt | None = None
        self._prompt_target: str | None = None

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        with Vertical(id="profiles-dialog"):
            yield Label(
                "[b]Profiles[/b]  [dim]enter load · s save · a save as · r rename · d delete · "
                "esc close[/dim]",
                id="profiles-title",
            )
            table: DataTable[str] = DataTable(
                id="profiles-table", cursor_type="row", zebra_stripes=True
            )
            yield table
            yield Static("", id="profiles-detail")
            yield Input(id="profiles-prompt")
            with Horizontal(id="profiles-buttons"):
                yield Button("Load", id="btn-load", variant="primary")
                yield Button("Save", id="btn-save", disabled=self.spec is None)
                yield Button("Save as", id="btn-save-as", disabled=self.spec is None)
                yield Button("Rename", id="btn-rename")
                yield Button("Delete", id="btn-delete", variant="error")
                yield Button("Close", id="btn-close")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_column("Name", key="name")
        table.add_column("Model", key="model")
        table.add_column("Cluster", key="cluster")
        table.add_column("Used", key="last_used")  # where it comes from: the detail line
        self.refresh_table(select=self.current)
        if self.current is None:
            # The last-used profile is highlighted: "rerun last week's job" is one keystroke.
            used = [(e.last_used, e.name) for e in self._entries.values() if e.last_used]
            if used:
                table.move_cursor(row=table.get_row_index(max(used)[1]))
        table.focus()

    def refresh_table(self, select: str | None = None) -> None:
        """Re-read the store and redraw the list, keeping ``select`` highlighted."""
        table: DataTable[str] = self.query_one(DataTable)
        table.clear()
        self._entries = {}
        for e in list_profiles(self.store):
            self._entries[e.name] = e
            if e.profile is None:
                table.add_row(e.name, "BROKEN", "", "", key=e.name)
            else:
                table.add_row(
                    e.name,
                    e.profile.model_summary(),
                    e.profile.cluster_summary(),
                    _when(e.last_used),
                    key=e.name,
                )
        if select and select in self._entries:
            table.move_cursor(row=table.get_row_index(select))
        self._show_detail()

    # ------------------------------------------------------------------ helpers

    @property
    def selected(self) -> str | None:
        """The name of the highlighted profile."""
        table: DataTable[str] = self.query_one(DataTable)
        if table.row_count == 0:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None

    def _status(self, text: str, *, error: bool = False) -> None:
        detail = self.query_one("#profiles-detail", Static)
        detail.update(text)
        detail.set_class(error, "-error")

    def _show_detail(self) -> None:
        name = self.selected
        e = self._entries.get(name) if name else None
        if e is None:
            self._status("No profiles yet: save the current set-up with 'a' (save as).")
            return
        if e.profile is None:
            self._status(f"{e.error}", error=True)
            return
        where = "built-in preset" if e.source == "builtin" else _home(e.path)
        if e.shadows_builtin:
            where += " (replaces the built-in of this name)"
        if e.last_used:
            where += f" · last used {e.last_used.astimezone():%Y-%m-%d %H:%M}"
        self._status(f"{e.description or '(no description)'}\n{where}")

    def _open_prompt(self, kind: Prompt, value: str, placeholder: str) -> None:
        self._prompt = kind
        prompt = self.query_one("#profiles-prompt", Input)
        prompt.placeholder = placeholder
        prompt.value = value
        prompt.add_class("-shown")
        prompt.focus()

    def _close_prompt(self) -> None:
        self._prompt = None
        self._prompt_target = None
        prompt = self.query_one("#profiles-prompt", Input)
        prompt.remove_class("-shown")
        prompt.value = ""
        self.query_one(DataTable).focus()

    # ------------------------------------------------------------------ events

    @on(DataTable.RowHighlighted)
    def _highlighted(self) -> None:
        if self._prompt is None:
            self._show_detail()

    @on(DataTable.RowSelected)
    def _selected(self) -> None:
        self.action_load()

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        actions = {
            "btn-load": self.action_load,
            "btn-save": self.action_save,
            "btn-save-as": self.action_save_as,
            "btn-rename": self.action_rename,
            "btn-delete": self.action_delete,
            "btn-close": self.action_cancel,
        }
        action = actions.get(event.button.id or "")
        if action is not None:
            action()

    @on(Input.Submitted, "#profiles-prompt")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        value = event.value.strip()
        kind, target = self._prompt, self._prompt_target
        try:
            check_name(value)
        except ProfileError as e:
            self._status(str(e), error=True)
            return
        if kind == "save_as":
            if self.store.is_user(value) and value != self.current:
                self._status(
                    f"{value!r} already exists: pick another name (or load it and save)",
                    error=True,
                )
                return
            self._close_prompt()
            self._do_save(value)
        elif kind == "rename" and target:
            self._close_prompt()
            try:
                self.store.rename(target, value)
            except DtrainError as e:
                self._status(str(e), error=True)
                return
            if self.current == target:
                self.current = value
            self.refresh_table(select=value)
            self._status(f"Renamed {target!r} to {value!r}.")

    # ------------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # While a name is being typed, only escape acts (the letters go to the Input).
        if self._prompt in ("save_as", "rename") and action not in ("cancel",):
            return False
        if self._prompt == "delete" and action not in ("confirm", "cancel_prompt", "cancel"):
            return False
        if self._prompt != "delete" and action in ("confirm", "cancel_prompt"):
            return False
        if action in ("save", "save_as") and self.spec is None:
            return False
        return True

    def action_cancel(self) -> None:
        if self._prompt is not None:
            self._close_prompt()
            self._show_detail()
            return
        self.dismiss(None)

    def action_cancel_prompt(self) -> None:
        self._close_prompt()
        self._show_detail()

    def action_load(self) -> None:
        name = self.selected
        if name is None:
            return
        try:
            prof = self.store.load(name)
        except DtrainError as e:
            self._status(str(e), error=True)
            return
        self.store.mark_used(name)
        self.dismiss(prof)

    def action_save(self) -> None:
        if self.spec is None:
            return
        if self.current and self.store.is_user(self.current):
            self._do_save(self.current)
        else:
            self.action_save_as()

    def action_save_as(self) -> None:
        if self.spec is None:
            return
        self._open_prompt(
            "save_as", self.current or "", "name for the new profile, e.g. my-cluster"
        )
        self._status("Save the current set-up as… (Enter to save, Escape to cancel)")

    def action_rename(self) -> None:
        name = self.selected
        if name is None:
            return
        e = self._entries.get(name)
        if e is not None and e.source == "builtin":
            self._status(f"{name!r} is a built-in preset: load it and use save as", error=True)
            return
        self._prompt_target = name
        self._open_prompt("rename", name, "new name")
        self._status(f"Rename {name!r} to… (Enter to rename, Escape to cancel)")

    def action_delete(self) -> None:
        name = self.selected
        if name is None:
            return
        e = self._entries.get(name)
        if e is not None and e.source == "builtin":
            self._status(f"{name!r} is a built-in preset and cannot be deleted", error=True)
            return
        self._prompt = "delete"
        self._prompt_target = name
        self._status(f"Delete {name!r}? This removes {self.store.user_path(name)}.  y / n")

    def action_confirm(self) -> None:
        if self._prompt != "delete" or not self._prompt_target:
            return
        name = self._prompt_target
        self._close_prompt()
        try:
            self.store.delete(name)
        except DtrainError as e:
            self._status(str(e), error=True)
            return
        if self.current == name:
            self.current = None
        self.refresh_table()
        self._status(f"Deleted {name!r}.")

    def _do_save(self, name: str) -> None:
        assert self.spec is not None
        try:
            self.store.save_spec(name, self.spec)
            prof = self.store.load(name)
        except DtrainError as e:
            self._status(str(e), error=True)
            return
        self.current = name
        self.dismiss(prof)
