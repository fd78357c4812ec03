"""Step 6, the configs: every file of the bundle previewed with syntax highlighting, a diff
against what is already in the output directory, and a write action with a clear result.

Writing never replaces or deletes a file on disk before the user saw the list (the app asks for
a second ^s); files of the previous bundle that this plan drops are listed too. A written file
opens in ``$VISUAL`` / ``$EDITOR`` (Ctrl+E; the app is suspended meanwhile): the edit is then
the user's, protected by the manifest's hashes like any hand edit. Ctrl+Y copies the command
that starts the highlighted script (or the whole run) to the clipboard.
"""

from __future__ import annotations

import difflib
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.segment import Segment
from rich.text import Text
from textual import on
from textual.app import ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.widget import Widget
from textual.widgets import Button, Input, OptionList, Static
from textual.widgets.option_list import Option

from tui.screens.step import StepPane
from tui.session import Step, WizardSession
from tui.widgets.field_row import FieldRow

if TYPE_CHECKING:
    from engine.write.bundle import WritePreview

_LEXERS = {
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".sh": "bash",
    ".env": "bash",
    ".py": "python",
    ".md": "markdown",
    ".txt": "text",
    ".toml": "toml",
}

NEW, CHANGED, SAME = "new", "changed", "same"
YOURS, STALE, KEPT = "yours", "stale", "kept"
"""Edited by the user (or never written by dtrain-tui); dropped by this plan and removed by the
next write; dropped by this plan but edited, so kept."""
_MARK = {NEW: "+", CHANGED: "~", SAME: "=", YOURS: "!", STALE: "-", KEPT: "k"}
LEGEND = "+ new  ~ changed  = same  ! yours  - to remove  k kept"
"""Fits the step at 80 columns; each file's preview heading says the rest."""

RENDERING = "Rendering the bundle…"
"""The file list while the writers run for the plan shown."""

EDITOR_VARS = ("VISUAL", "EDITOR")
"""Where the editor command is read, in git's order."""


def lexer_for(name: str) -> str:
    return _LEXERS.get(Path(name).suffix.lower(), "text")


def file_state(out_dir: Path, name: str, text: str) -> str:
    try:
        on_disk = (out_dir / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return NEW
    return SAME if on_disk == text else CHANGED


def diff_text(out_dir: Path, name: str, text: str) -> str:
    try:
        old = (out_dir / name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            text.splitlines(keepends=True),
            fromfile=f"{out_dir.name}/{name} (on disk)",
            tofile=f"{name} (new)",
        )
    )


FALLBACK_EDITORS = ("nano", "vim", "vi", "emacs", "micro")
"""Editors a hint may suggest, the first one installed here (``vi`` when none is)."""


def editor_hint() -> str:
    """How to set an editor, naming one that is installed here (never one that is not)."""
    found = next((e for e in FALLBACK_EDITORS if shutil.which(e)), "vi")
    return (
        f"set $EDITOR (or $VISUAL) to your editor, e.g. export EDITOR={found}, "
        "and start dtrain-tui again"
    )


def editor_command() -> list[str] | None:
    """``$VISUAL`` or ``$EDITOR`` split into words (None: neither is set)."""
    for var in EDITOR_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            try:
                words = shlex.split(value)
            except ValueError:
                continue
            if words:
                return words
    return None


def launch_command(out_dir: Path, name: str | None, run_name: str = "RUN") -> str:
    """The shell command that starts ``name`` from the bundle in ``out_dir`` (a node script,
    the Megatron-LM command, the Slurm or SkyPilot file), else the whole run through
    dtrain-tui (every backend)."""
    where = shlex.quote(str(out_dir.expanduser().absolute()))
    if name and name.startswith("launch_node") and name.endswith(".sh"):
        return f"cd {where} && ./{shlex.quote(name)}"
    if name == "pretrain_gpt.sh":
        return f"cd {where} && MEGATRON_LM=/path/to/Megatron-LM NODE_RANK=0 ./pretrain_gpt.sh"
    if name == "slurm.sbatch":
        return f"cd {where} && sbatch slurm.sbatch"
    if name == "sky.yaml":
        return f"cd {where} && sky launch -c {shlex.quote(run_name)} sky.yaml"
    return f"dtrain-tui launch {where}"


def preview_source(out_dir: Path, name: str, state: str, files: dict[str, str]) -> tuple[str, str]:
    """The preview's heading for ``name`` in ``state`` and the text shown under it: the plan's
    text, or for a file this plan no longer uses, what is on disk."""
    if state in (STALE, KEPT):
        why = (
            "the next write removes it (unedited)"
            if state == STALE
            else "you edited it: the next write keeps it"
        )
        try:
            text = (out_dir / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        return f"{name} · no longer used by this plan; {why}", text
    head = {
        NEW: f"{name} · new file (not in {out_dir})",
        CHANGED: f"{name} · differs from {out_dir / name} (diff below)",
        SAME: f"{name} · identical to {out_dir / name}",
        YOURS: f"{name} · yours on disk (edited, or not written by dtrain-tui): "
        "the next write backs it up first (diff below)",
    }[state]
    return head, files.get(name, "")


def drawn_from_key(
    out: Path, files: dict[str, str], message: str, dark: bool
) -> tuple[object, ...]:
    """What the file list and the preview are drawn from: the output directory and what is in
    it (name, inode, size, time of each entry: a write renames into place), the files (their
    texts' hashes, which Python keeps with each string), the message, the theme."""
    marks: list[object] = []
    try:
        with os.scandir(out) as it:
            for entry in it:
                st = entry.stat(follow_symlinks=True)
                marks.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
    except OSError:
        marks.append(None)
    texts = tuple(sorted((name, hash(text)) for name, text in files.items()))
    return (str(out), texts, message, dark, tuple(sorted(marks, key=repr)))


class RenderedOnce:
    """A renderable drawn once per width: the preview's syntax highlighting (pygments) ran
    again each time the step was shown (its height is measured, then it is drawn), tens of
    milliseconds a visit for a long file. The segments are the renderable's own."""

    MAX_DRAWN = 12
    """Drawings kept: a width and whether measured or drawn (a switch lays the preview out at
    two or three widths as the scrollbars settle; a resize draws it afresh)."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable
        self._drawn: dict[tuple[object, ...], list[Segment]] = {}

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        key = (
            options.size,
            options.min_width,
            options.max_width,
            options.max_height,
            options.height,
            options.justify,
            options.overflow,
            options.no_wrap,
            options.highlight,
            options.markup,
            options.is_terminal,
            options.encoding,
            options.ascii_only,
            options.legacy_windows,
        )
        segments = self._drawn.get(key)
        if segments is None:
            segments = list(console.render(self.renderable, options))
            if len(self._drawn) >= self.MAX_DRAWN:
                self._drawn.clear()
            self._drawn[key] = segments
        yield from segments

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.renderable)


def _run_of(session: WizardSession) -> str:
    """The run's name in the commands Configs copies (``RUN`` before there is a plan)."""
    if session.plan is None:
        return "RUN"
    from engine.write.naming import run_name

    return run_name(session.plan)


class ConfigsStep(StepPane):
    STEP = Step.CONFIGS

    BINDINGS = [
        # Shown on their buttons ("Edit in $EDITOR ^e", "Copy command ^y"), not in the footer.
        Binding("ctrl+e", "edit", "Edit", show=False),
        Binding("ctrl+y", "copy_command", "Copy cmd", show=False),
    ]

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        # What the session holds now: the first visit with a plan says the bundle is on its
        # way (or shows it), never "No plan yet".
        self.files: dict[str, str] = dict(session.bundle)
        self.render_error = session.bundle_error or (
            RENDERING if session.plan is not None else "No plan yet: finish the earlier steps."
        )
        self.current: str | None = None
        self.preview: WritePreview | None = None
        """What writing now would do to the output directory (None: not known)."""
        self._drawn: tuple[object, ...] | None = None
        """What the list and the preview were last drawn from (see :func:`drawn_from_key`)."""

    def compose(self) -> ComposeResult:
        yield Static("Configs", classes="step-title")
        yield FieldRow("out_dir", "Output directory", placeholder="where the bundle is written")
        yield Static("", id="write-result", classes="summary", markup=False)
        with Horizontal(classes="buttons", id="configs-buttons"):
            yield Button("Write bundle ^s", id="write", variant="primary", compact=True)
            yield Button("Edit in $EDITOR ^e", id="edit", compact=True)
            yield Button("Copy command ^y", id="copy", compact=True)
        yield Static(LEGEND, id="file-legend", markup=False)
        with Horizontal(id="configs-body"):
            yield OptionList(id="file-list", compact=True)
            with VerticalScroll(id="preview"):
                yield Static("", id="preview-body")

    def load(self) -> None:
        self.rows()["out_dir"].value = str(self.session.out_dir)

    def draw_session(self) -> None:
        # A directory no one chose follows the set-up (a new model gets its own, not a diff
        # against the last one's bundle).
        if self.session.out_dir_follows_setup:
            row = self.rows()["out_dir"]
            shown = str(self.session.out_dir)
            if row.value != shown:
                row.set_quietly(shown)
                self.refresh_files()
        if self.session.bundle:
            self.files = dict(self.session.bundle)
            self.render_error = ""
        elif self.session.bundle_error:
            self.render_error = self.session.bundle_error

    def draw_ahead(self) -> None:
        # Entering the step draws the list and the preview if they changed: drawn ahead, the
        # preview (highlighted, diffed) is laid out ahead as well. The bundle is wanted from
        # now on (as from the decision step on): the step is drawn again when it arrives.
        want_bundle = getattr(self.app, "want_bundle", None)
        if want_bundle is not None:
            want_bundle()
        self.refresh_files(if_changed=True)

    @property
    def out_dir(self) -> Path:
        text = self.rows()["out_dir"].value.strip()
        return Path(text).expanduser() if text else self.session.out_dir

    def check(self) -> list[str]:
        row = self.rows()["out_dir"]
        text = row.value.strip()
        if not text:
            row.set_error("type a directory to write the bundle into")
            return ["out_dir: type a directory"]
        if "\0" in text:
            row.set_error("a path cannot contain NUL")
            return ["out_dir: invalid path"]
        p = Path(text).expanduser()
        if p.exists() and not p.is_dir():
            row.set_error(f"{p} is a file; choose a directory")
            return [f"out_dir: {p} is a file"]
        row.set_error(None)
        self.session.out_dir = p
        self.refresh_files(if_changed=True)  # typing in another directory redraws
        return []

    def first_focus(self) -> Widget | None:
        # The file list: ^e and ^y act on the highlighted file (in the directory field, ^e is
        # "end of line"); Shift+Tab reaches the directory.
        return self.query_one("#file-list", OptionList)

    @on(Input.Submitted, "#f-out_dir")
    @on(Button.Pressed, "#write")
    async def _write(self, event: Input.Submitted | Button.Pressed) -> None:
        event.stop()
        await self.run_action("app.write_bundle")

    @on(Button.Pressed, "#edit")
    def _edit_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_edit()

    @on(Button.Pressed, "#copy")
    def _copy_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_copy_command()

    # --- editing and copying ------------------------------------------------------------------
    def action_edit(self) -> None:
        """Open the highlighted file, as written in the output directory, in the user's editor."""
        name = self.highlighted_name()
        if not name or name not in self.files and not self._is_listed_stale(name):
            self.show_result("pick a file in the list first", ok=False)
            return
        path = self.out_dir / name
        if not path.is_file():
            self.show_result(
                f"{name} is not written yet: write the bundle (^s) first; "
                "the editor opens the file in the output directory",
                ok=False,
            )
            return
        editor = editor_command()
        if editor is None:
            self.show_result(editor_hint(), ok=False)
            return
        if shutil.which(editor[0]) is None:
            # Checked before the terminal is handed over: a missing program must not leave
            # the screen blank and the app waiting.
            missing = f"cannot start {editor[0]}: not installed; "
            self.show_result(missing + editor_hint(), ok=False)
            return
        before = path.read_bytes()
        previewed = self.files.get(name)
        stale = previewed is not None and before != previewed.encode("utf-8")
        try:
            with self.app.suspend():
                rc = subprocess.call([*editor, str(path)])
        except SuspendNotSupported:
            if not self.app.is_headless:
                self.show_result(
                    f"this terminal cannot hand itself to an editor; edit {path} yourself",
                    ok=False,
                )
                return
            # Headless (tests): nothing owns the terminal, run the editor as it is.
            rc = subprocess.call([*editor, str(path)], stdin=subprocess.DEVNULL)
        except OSError as e:
            self.show_result(f"cannot start {editor[0]}: {e.strerror or e}", ok=False)
            return
        self.refresh_files()
        if rc != 0:
            self.show_result(
                f"{editor[0]} exited with status {rc}; {name} is as it left it", ok=False
            )
        elif stale:
            # What was opened is the file on disk, not the preview the user was looking at.
            self.show_result(
                f"opened {path} as written, which differs from the preview of the current plan; "
                "^s writes the preview (and lists what it would replace)",
                ok=path.read_bytes() == before,
                confirm=True,
            )
        elif path.read_bytes() == before:
            self.show_result(f"{name}: no change", ok=True)
        else:
            self.show_result(
                f"edited {path}: it is yours now; a write lists it and backs it up as "
                f"{name}.bak-<time> before replacing it, never silently",
                ok=True,
            )

    def action_copy_command(self) -> None:
        """Copy the command that starts the highlighted script (else the run) and show it."""
        command = launch_command(self.out_dir, self.highlighted_name(), _run_of(self.session))
        self.app.copy_to_clipboard(command)
        self.app.notify(command, title="Copied to the clipboard", timeout=8)
        self.show_result(f"copied: {command}", ok=True)

    def highlighted_name(self) -> str | None:
        """The file highlighted in the list now (the list moves before its message arrives:
        a key that acts on the file reads the list, not the last message)."""
        if not self.is_mounted:
            return self.current
        ol = self.query_one("#file-list", OptionList)
        if ol.highlighted is not None and ol.highlighted < ol.option_count:
            option_id = ol.get_option_at_index(ol.highlighted).id
            if option_id:
                return option_id
        return self.current

    def _is_listed_stale(self, name: str) -> bool:
        p = self.preview
        return p is not None and (name in p.removed or name in p.kept)

    # --- bundle display -----------------------------------------------------------------------
    def show_files(self, files: dict[str, str]) -> None:
        self.files = dict(files)
        self.render_error = ""
        self.refresh_files()

    def show_error(self, message: str) -> None:
        self.files = {}
        self.render_error = message
        self.refresh_files()

    def refresh_files(self, *, if_changed: bool = False) -> None:
        """Redraw the file list and the preview; ``if_changed`` (entering the step): only if
        what they are drawn from changed since they were drawn (a preview is highlighted and
        diffed afresh, which was most of entering the step)."""
        if not self.is_mounted:
            return
        out = self.out_dir
        drawn_from = drawn_from_key(out, self.files, self.render_error, self.app.current_theme.dark)
        if if_changed and drawn_from == self._drawn:
            return
        self._drawn = drawn_from
        ol = self.query_one("#file-list", OptionList)
        keep = self.highlighted_name()
        ol.clear_options()
        if not self.files:
            ol.add_option(
                Option(Text(self.render_error or "no files", style="italic"), disabled=True)
            )
            self.query_one("#preview-body", Static).update("")
            return
        self.preview = self._preview(out)
        names = sorted(self.files)
        for name in names:
            state = self._state(name)
            label = Text(f"{_MARK[state]} ", style="bold")
            label.append(name)
            ol.add_option(Option(label, id=name))
        p = self.preview
        stale = [(n, STALE) for n in p.removed] + [(n, KEPT) for n in p.kept] if p else []
        for name, state in stale:
            label = Text(f"{_MARK[state]} {name}", style="dim strike" if state == STALE else "dim")
            ol.add_option(Option(label, id=name))
            names.append(name)
        self.current = keep if keep in names else names[0]
        ol.highlighted = names.index(self.current)
        self.show_preview(self.current)

    def _preview(self, out: Path) -> WritePreview | None:
        from tui import services

        try:
            return services.preview_write(self.files, out)
        except Exception:  # noqa: BLE001 - the write itself reports a bad directory
            return None

    def _state(self, name: str) -> str:
        p = self.preview
        if p is not None:
            if name in p.conflicts:
                return YOURS
            if name in p.removed:
                return STALE
            if name in p.kept:
                return KEPT
        return file_state(self.out_dir, name, self.files.get(name, ""))

    @on(OptionList.OptionHighlighted, "#file-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id and event.option.id != self.current:
            self.current = event.option.id
            self.show_preview(event.option.id)

    def show_preview(self, name: str) -> None:
        out = self.out_dir
        state = self._state(name)
        head, text = preview_source(out, name, state, self.files)
        from rich.syntax import Syntax  # pygments is heavy: import it when a file is shown

        theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        parts: list[RenderableType] = [
            Text(head, style="bold"),
            Syntax(text, lexer_for(name), theme=theme, line_numbers=True, word_wrap=False),
        ]
        if state in (CHANGED, YOURS):
            parts.append(Text("\nDiff against the output directory", style="bold"))
            parts.append(Syntax(diff_text(out, name, text), "diff", theme=theme, word_wrap=False))
        self.query_one("#preview-body", Static).update(RenderedOnce(Group(*parts)))

    def show_result(self, message: str, *, ok: bool, confirm: bool = False) -> None:
        res = self.query_one("#write-result", Static)
        mark = "✓ " if ok and not confirm else ("⚠ " if ok else "✗ ")
        res.update(mark + message)
        res.add_class("-shown")
        res.set_class(ok and not confirm, "-ok")
        res.set_class(ok and confirm, "-confirm")
        res.set_class(not ok, "-error")
        self.refresh_files()
        self.scroll_home(animate=False)  # the result is read where it appears
