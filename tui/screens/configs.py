"""Step 6, the configs: every file of the bundle previewed with syntax highlighting, a diff
against what is already in the output directory, and a write action with a clear result."""

from __future__ import annotations

import difflib
from pathlib import Path

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Button, Input, OptionList, Static
from textual.widgets.option_list import Option

from tui.screens.step import StepPane
from tui.session import Step
from tui.widgets.field_row import FieldRow

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
_MARK = {NEW: "+", CHANGED: "~", SAME: "="}


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


class ConfigsStep(StepPane):
    STEP = Step.CONFIGS

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, str] = {}
        self.render_error = "No plan yet: finish the earlier steps."
        self.current: str | None = None

    def compose(self) -> ComposeResult:
        yield Static("Configs", classes="step-title")
        yield FieldRow("out_dir", "Output directory", placeholder="where the bundle is written")
        yield Static("", id="write-result", classes="summary", markup=False)
        with Horizontal(classes="buttons"):
            yield Button("Write bundle  ^s", id="write", variant="primary", compact=True)
        with Horizontal(id="configs-body"):
            yield OptionList(id="file-list", compact=True)
            with VerticalScroll(id="preview"):
                yield Static("", id="preview-body")

    def load(self) -> None:
        self.rows()["out_dir"].value = str(self.session.out_dir)
        if self.session.bundle:
            self.files = dict(self.session.bundle)
            self.render_error = ""
        elif self.session.bundle_error:
            self.render_error = self.session.bundle_error

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
        self.refresh_files()
        return []

    @on(Input.Submitted, "#f-out_dir")
    @on(Button.Pressed, "#write")
    async def _write(self, event: Input.Submitted | Button.Pressed) -> None:
        event.stop()
        await self.run_action("app.write_bundle")

    # --- bundle display -----------------------------------------------------------------------
    def show_files(self, files: dict[str, str]) -> None:
        self.files = dict(files)
        self.render_error = ""
        self.refresh_files()

    def show_error(self, message: str) -> None:
        self.files = {}
        self.render_error = message
        self.refresh_files()

    def refresh_files(self) -> None:
        if not self.is_mounted:
            return
        ol = self.query_one("#file-list", OptionList)
        keep = self.current
        ol.clear_options()
        if not self.files:
            ol.add_option(
                Option(Text(self.render_error or "no files", style="italic"), disabled=True)
            )
            self.query_one("#preview-body", Static).update("")
            return
        out = self.out_dir
        for name in sorted(self.files):
            state = file_state(out, name, self.files[name])
            label = Text(f"{_MARK[state]} ", style="bold")
            label.append(name)
            ol.add_option(Option(label, id=name))
        names = sorted(self.files)
        self.current = keep if keep in self.files else names[0]
        ol.highlighted = names.index(self.current)
        self.show_preview(self.current)

    @on(OptionList.OptionHighlighted, "#file-list")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        event.stop()
        if event.option.id and event.option.id != self.current:
            self.current = event.option.id
            self.show_preview(event.option.id)

    def show_preview(self, name: str) -> None:
        text = self.files.get(name, "")
        out = self.out_dir
        state = file_state(out, name, text)
        head = {
            NEW: f"{name} · new file (not in {out})",
            CHANGED: f"{name} · differs from {out / name} (diff below)",
            SAME: f"{name} · identical to {out / name}",
        }[state]
        from rich.syntax import Syntax  # pygments is heavy: import it when a file is shown

        theme = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        parts: list[RenderableType] = [
            Text(head, style="bold"),
            Syntax(text, lexer_for(name), theme=theme, line_numbers=True, word_wrap=False),
        ]
        if state == CHANGED:
            parts.append(Text("\nDiff against the output directory", style="bold"))
            parts.append(Syntax(diff_text(out, name, text), "diff", theme=theme, word_wrap=False))
        self.query_one("#preview-body", Static).update(Group(*parts))

    def show_result(self, message: str, *, ok: bool) -> None:
        res = self.query_one("#write-result", Static)
        res.update(("✓ " if ok else "✗ ") + message)
        res.add_class("-shown")
        res.set_class(ok, "-ok")
        res.set_class(not ok, "-error")
        self.refresh_files()
