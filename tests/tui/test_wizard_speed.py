"""Issue 40, the wizard's speed: what a person sees while a step is being entered.

The first visit to Configs with a valid plan says the bundle is being rendered, never "No plan
yet" (it flashed for 0.3–1 s); the bundle is rendered in the background from the Decision step
on, so Configs opens on its files. Both fail on the code before the fix (the list started on "No
plan yet" and the writers ran only once Configs was opened)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import OptionList

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp
from tui.screens.configs import ConfigsStep
from tui.widgets.field_row import FieldRow


def _labels(pane: ConfigsStep) -> list[str]:
    ol = pane.query_one("#file-list", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


def test_first_visit_to_configs_never_says_no_plan_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    original = ConfigsStep.refresh_files

    def spy(self: ConfigsStep, *, if_changed: bool = False) -> None:
        original(self, if_changed=if_changed)
        if self.is_mounted:
            shown.extend(_labels(self))

    monkeypatch.setattr(ConfigsStep, "refresh_files", spy)

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert app.session.plan is not None
            assert app.wizard is not None
            assert await app.wizard.go("configs")
            await at_step(pilot, "configs")
            await settle(pilot)
            assert any("train.py" in s or ".sh" in s for s in shown), shown

    asyncio.run(go())
    assert shown, "the configs list was never drawn"
    assert not [s for s in shown if "No plan" in s], shown


def test_the_bundle_is_rendered_from_the_decision_step_on(tmp_path: Path) -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            assert app.wizard is not None
            assert await app.wizard.go("decision")
            await at_step(pilot, "decision")
            await until(pilot, lambda: bool(app.session.bundle), "no bundle rendered at Decision")
            assert app.wizard.pane("configs") is None
            assert await app.wizard.go("configs")
            await at_step(pilot, "configs")
            pane = app.wizard.pane("configs")
            assert isinstance(pane, ConfigsStep)
            assert pane.files == app.session.bundle
            assert not [s for s in _labels(pane) if "No plan" in s or "Rendering" in s]

    asyncio.run(go())


def test_a_step_switch_moves_the_focus_bar_without_restyling_the_step_left(
    tmp_path: Path,
) -> None:
    """The accent bar follows the focus to the step entered; the fields of the step left are
    not restyled (a ``.step:focus-within`` rule restyled both steps whole on every move, most
    of a switch's time)."""

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            assert await wiz.go("hardware")
            await at_step(pilot, "hardware")
            await settle(pilot)
            left = wiz.pane("hardware")
            assert left is not None
            # Only the row that held the focus may be restyled (its own :focus-within bar).
            row = next(a for a in app.focused.ancestors if isinstance(a, FieldRow))  # type: ignore[union-attr]
            fields = {id(w) for w in left.walk_children()} - {
                id(w) for w in row.walk_children(with_self=True)
            }
            restyled: list[object] = []
            original = app.stylesheet.update_nodes

            def spy(nodes, animate=False):  # type: ignore[no-untyped-def]
                nodes = list(nodes)
                restyled.extend(n for n in nodes if id(n) in fields)
                return original(nodes, animate=animate)

            app.stylesheet.update_nodes = spy  # type: ignore[method-assign]
            assert await wiz.go("network")
            await at_step(pilot, "network")
            await settle(pilot)
            entered = wiz.pane("network")
            assert entered is not None
            assert not restyled, f"{len(restyled)} widgets of the step left restyled"
            accent = app.get_css_variables()["accent"].lower()
            assert entered.styles.border_left[1].hex.lower() == accent
            assert left.styles.border_left[1].a == 0

    asyncio.run(go())


def test_the_profiles_dialog_opens_without_reading_the_store_on_the_ui_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app lists the profiles in a thread after the first plan; ^o then opens on that
    listing, and a profile saved meanwhile is still listed (the files are checked)."""
    import threading

    from profiles.store import ProfileStore
    from tui.screens.profiles import ProfilesScreen

    read_on: list[str] = []
    original = ProfileStore.list

    def spy(self: ProfileStore):  # type: ignore[no-untyped-def]
        read_on.append(threading.current_thread().name)
        return original(self)

    monkeypatch.setattr(ProfileStore, "list", spy)
    cfg = tmp_path / "cfg"

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", config_dir=cfg)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            await until(pilot, lambda: bool(read_on), "the profiles were never listed")
            await settle(pilot)
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(app.screen, ProfilesScreen), "no dialog")
            await pilot.pause()
            main = threading.main_thread().name
            assert main not in read_on, read_on
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, ProfilesScreen), "still open")
            ProfileStore(cfg).save_spec("saved-meanwhile", demo_spec())
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(app.screen, ProfilesScreen), "no dialog")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, ProfilesScreen)
            assert "saved-meanwhile" in screen._entries

    asyncio.run(go())


def test_entering_the_decision_step_again_restyles_none_of_its_report(tmp_path: Path) -> None:
    """The decision pane takes the focus itself; only its own style follows (Textual's default
    restyled every widget of the report on each visit)."""

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            for step in ("decision", "training"):
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
            pane = wiz.pane("decision")
            assert pane is not None
            inside = {id(w) for w in pane.walk_children()}
            restyled: list[object] = []
            original = app.stylesheet.update_nodes

            def spy(nodes, animate=False):  # type: ignore[no-untyped-def]
                nodes = list(nodes)
                restyled.extend(n for n in nodes if id(n) in inside)
                return original(nodes, animate=animate)

            app.stylesheet.update_nodes = spy  # type: ignore[method-assign]
            assert await wiz.go("decision")
            await at_step(pilot, "decision")
            await settle(pilot)
            assert app.focused is pane
            assert not restyled, f"{len(restyled)} widgets of the report restyled"

    asyncio.run(go())
