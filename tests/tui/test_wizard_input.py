"""The wizard driven blind (issue 40): Ctrl+Q with unsaved changes asks (save / discard /
cancel) in the wizard and in the profiles dialog; an editor that cannot start is one line and
the app lives; a picked preset leaves the cursor at the end; the Launch step refuses a plan that
does not fit; the title follows the set-up."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Input, TabbedContent

from engine.plan.specs import demo_spec
from profiles.store import ProfileStore
from tests.tui.wizard_support import at_step, retype, settle, text_of, until
from tui.app import DtrainApp


def _app(tmp_path: Path, **kw: object) -> DtrainApp:
    return DtrainApp(
        demo_spec(),
        out_dir=tmp_path / "bundle",
        run_root=tmp_path / "runs",
        config_dir=tmp_path / "profiles",
        plan_delay_s=0.0,
        **kw,  # type: ignore[arg-type]
    )


def test_ctrl_q_with_unsaved_changes_asks_and_cancel_keeps_the_app(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await retype(pilot, "6")  # the Layers field: 4 -> 6
            await until(pilot, lambda: app.unsaved, "the edit never made the spec unsaved")
            await pilot.press("ctrl+q")
            await until(pilot, lambda: app.screen.id == "unsaved", "no unsaved-changes question")
            assert app.is_running
            await pilot.press("escape")  # cancel
            await until(pilot, lambda: app.screen.id == "wizard", "cancel did not go back")
            assert app.is_running and app.unsaved
            # In the profiles dialog too.
            await pilot.press("ctrl+o")
            await until(pilot, lambda: app.screen.id != "wizard", "no profiles dialog")
            await pilot.press("ctrl+q")
            await until(pilot, lambda: app.screen.id == "unsaved", "the dialog quit at once")
            await pilot.press("d")  # discard
            await until(pilot, lambda: not app.is_running, "discard did not quit")

    asyncio.run(go())


def test_ctrl_q_save_writes_the_loaded_profile_then_quits(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path / "profiles")
    store.save_spec("mine", demo_spec())

    async def go() -> None:
        app = _app(tmp_path, profile_name="mine")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await retype(pilot, "6")
            await until(pilot, lambda: app.unsaved, "the edit never made the spec unsaved")
            await pilot.press("ctrl+q")
            await until(pilot, lambda: app.screen.id == "unsaved", "no unsaved-changes question")
            await pilot.press("s")
            await until(pilot, lambda: not app.is_running, "save did not quit")

    asyncio.run(go())
    assert store.load("mine").spec.model.layers == 6


def test_ctrl_q_with_nothing_unsaved_quits_at_once(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("ctrl+q")
            await until(pilot, lambda: not app.is_running, "ctrl+q did not quit")

    asyncio.run(go())


def test_an_editor_that_cannot_start_is_one_line_and_the_app_lives(
    tmp_path: Path, monkeypatch: object
) -> None:
    import pytest

    mp = pytest.MonkeyPatch()
    mp.setenv("EDITOR", "no-such-editor-xyz")
    mp.setenv("VISUAL", "no-such-editor-xyz")

    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            for _ in range(5):
                await pilot.press("ctrl+n")
            await at_step(pilot, "configs")
            await settle(pilot)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: (tmp_path / "bundle" / "plan.json").exists(), "no write")
            await settle(pilot)
            await app.action_edit_file()
            await until(
                pilot,
                lambda: "no-such-editor-xyz" in text_of(app, "#write-result"),
                lambda: f"no word that the editor could not start: {text_of(app, '#write-result')}",
            )
            note = text_of(app, "#write-result")
            assert "\n" not in note.strip() and "EDITOR" in note
            assert app.is_running and app.screen.id == "wizard"

    try:
        asyncio.run(go())
    finally:
        mp.undo()


def test_the_hint_for_no_editor_names_one_that_exists(tmp_path: Path) -> None:
    import pytest

    from tui.screens.configs import editor_hint

    mp = pytest.MonkeyPatch()
    mp.setenv("PATH", str(tmp_path))  # nano is not installed here
    try:
        hint = editor_hint()
    finally:
        mp.undo()
    assert "nano" not in hint and "vi" in hint


def test_a_picked_preset_leaves_the_cursor_at_the_end(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            app.screen.query_one(TabbedContent).active = "src-preset"
            await pilot.pause()
            field = app.screen.query_one("#f-preset", Input)
            field.focus()
            await pilot.pause()
            await pilot.press(*"llama-3-70")
            await pilot.press("down", "enter")  # pick from the list
            await until(
                pilot,
                lambda: field.value.startswith("llama-3") and field.value != "llama-3-70",
                lambda: f"no preset picked: {field.value!r}",
            )
            field.focus()
            await pilot.pause()
            assert field.cursor_position == len(field.value)

    asyncio.run(go())


def test_launch_refuses_a_plan_that_does_not_fit_and_says_why(tmp_path: Path) -> None:
    from engine.plan.specs import ModelSpec

    unfit = demo_spec().model_copy(update={"model": ModelSpec(preset="llama-3-70b")})
    started: list[object] = []

    def factory(*args: object) -> object:
        started.append(args)
        raise AssertionError("a plan that does not fit was launched")

    async def go() -> None:
        app = DtrainApp(
            unfit,
            out_dir=tmp_path / "bundle",
            run_root=tmp_path / "runs",
            config_dir=tmp_path / "profiles",
            plan_delay_s=0.0,
            backend_factory=factory,  # type: ignore[arg-type]
        )
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert app.plan is not None and not app.plan.recommended.fits
            await pilot.press("ctrl+l")
            await at_step(pilot, "launch")
            await settle(pilot)
            start = app.screen.query_one("#start")
            assert "fit" in str(start.label).lower(), start.label  # not "Start run"
            await pilot.press("ctrl+l")
            await until(
                pilot,
                lambda: "does not fit" in text_of(app, "#launch-result"),
                lambda: f"no refusal: {text_of(app, '#launch-result')!r}",
            )
            assert text_of(app, "#launch-result").startswith("✗")
            assert not (tmp_path / "bundle").exists()

    asyncio.run(go())
    assert not started


def test_the_title_and_the_bundle_directory_follow_the_set_up(tmp_path: Path) -> None:
    from engine.plan.specs import HardwareSpec, ModelSpec

    big = demo_spec().model_copy(
        update={
            "model": ModelSpec(preset="llama-3-70b"),
            "hardware": HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        }
    )

    async def go() -> None:
        app = DtrainApp(config_dir=tmp_path / "profiles", plan_delay_s=0.0)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert "local CPU demo" in app.header_text()
            demo_dir = app.session.out_dir
            app.load_spec(big)
            await settle(pilot)
            title = app.header_text()
            assert "local CPU demo" not in title and "llama-3-70b" in title, title
            assert app.session.out_dir != demo_dir
            assert "llama-3-70b" in str(app.session.out_dir)

    asyncio.run(go())


def test_ctrl_e_says_when_the_file_on_disk_is_not_the_previewed_one(tmp_path: Path) -> None:
    import shutil

    import pytest

    mp = pytest.MonkeyPatch()
    mp.setenv("EDITOR", str(shutil.which("true")))  # a real program that changes nothing
    mp.delenv("VISUAL", raising=False)

    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            for _ in range(5):
                await pilot.press("ctrl+n")
            await at_step(pilot, "configs")
            await settle(pilot)
            await pilot.press("ctrl+s")
            await until(pilot, lambda: (tmp_path / "bundle" / "plan.json").exists(), "no write")
            await settle(pilot)
            # A new plan: the previews change, the files on disk do not.
            app.load_spec(
                demo_spec().model_copy(
                    update={"model": app.spec.model.model_copy(update={"layers": 6})}
                )
            )
            await settle(pilot)
            pane = app.wizard.pane("configs")  # type: ignore[union-attr]
            await until(
                pilot,
                lambda: (
                    pane is not None
                    and pane.highlighted_name() in pane.files
                    and (tmp_path / "bundle" / pane.highlighted_name()).read_text()
                    != pane.files[pane.highlighted_name()]
                ),
                "the highlighted file's preview never differed from the disk",
            )
            await app.action_edit_file()
            await until(
                pilot,
                lambda: "differs from the preview" in text_of(app, "#write-result"),
                lambda: f"no word of the difference: {text_of(app, '#write-result')!r}",
            )

    try:
        asyncio.run(go())
    finally:
        mp.undo()


def test_tab_from_the_gpu_field_goes_to_gpus_per_node_not_the_suggestion_list(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await pilot.press("ctrl+n")
            await at_step(pilot, "hardware")
            await until(
                pilot,
                lambda: app.focused is not None and app.focused.id == "f-gpu",
                lambda: f"focus is on {app.focused!r}",
            )
            await pilot.press("tab")
            await until(
                pilot,
                lambda: app.focused is not None and app.focused.id == "f-gpus_per_node",
                lambda: f"Tab went to {app.focused!r}, not GPUs per node",
            )
            await pilot.press("ctrl+a", "ctrl+k", "4")
            field = app.screen.query_one("#f-gpus_per_node", Input)
            await until(pilot, lambda: field.value == "4", lambda: f"reads {field.value!r}")

    asyncio.run(go())


def test_the_focused_field_and_panel_carry_an_accent_bar(tmp_path: Path) -> None:
    from tui.widgets.field_row import FieldRow

    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            focused = app.focused
            assert focused is not None
            rows = list(app.screen.query(FieldRow))
            mine = next(r for r in rows if focused in r.query("*"))
            other = next(r for r in rows if r is not mine)
            accent = app.theme_variables["accent"]
            _, colour = mine.styles.border_left
            assert colour.hex.lower() == accent.lower()[:7], (colour.hex, accent)
            assert other.styles.border_left[1].a == 0  # no bar: only the focus has one
            pane = app.screen.query_one("#step-model")
            assert pane.styles.border_left[1].hex.lower() == accent.lower()[:7]
            assert app.screen.query_one("#nav").styles.border_left[1].a == 0

    asyncio.run(go())
