"""Issue 40, step switches under 100 ms: in a terminal the steps built ahead are also laid out
ahead, hidden (and again when a plan or a bundle redraws them), so that the first visit to
Decision or Configs only switches; and the profiles dialog's first open restyles none of the
wizard's widgets.

The layout tests fail on the code before the change (a step built ahead was laid out by the
move that first showed it, every container of it arranged then); the dialog test fails on it
too (pushing the dialog read its CSS file, re-parsed every rule and restyled the whole app)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import textual.widget
from textual.css.stylesheet import Stylesheet
from textual.widgets import Static

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp
from tui.screens.configs import ConfigsStep
from tui.screens.profiles import ProfilesScreen
from tui.screens.wizard import WizardScreen
from tui.session import Step


@pytest.fixture
def build_ahead(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The wizard builds (and lays out) its steps ahead, as in a terminal (it freezes the
    collector once they are built: thawed again for the next tests)."""
    monkeypatch.setattr(WizardScreen, "build_ahead", True)
    yield
    gc.unfreeze()


async def _all_laid_out(pilot: Any, wiz: WizardScreen) -> None:
    await until(
        pilot,
        lambda: (
            all(wiz.pane(s) is not None and wiz.pane(s).ready for s in Step)  # type: ignore[union-attr]
            and not wiz._unlaid
            and wiz._ahead_timer is None
        ),
        lambda: f"built: {[s for s in Step if wiz.pane(s) is not None]}, to lay out: {wiz._unlaid}",
    )
    await settle(pilot)


def _arranged_in(monkeypatch: pytest.MonkeyPatch) -> list[textual.widget.Widget]:
    """Every container arranged from now on (its arrangement worked out, not reused)."""
    arranged: list[textual.widget.Widget] = []
    original = textual.widget.arrange

    def spy(widget, *args, **kwargs):  # type: ignore[no-untyped-def]
        arranged.append(widget)
        return original(widget, *args, **kwargs)

    monkeypatch.setattr(textual.widget, "arrange", spy)
    return arranged


def test_steps_built_ahead_are_laid_out_hidden_and_shown_without_a_layout(
    tmp_path: Path, build_ahead: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None and wiz._switcher is not None
            await _all_laid_out(pilot, wiz)
            configs = wiz.pane(Step.CONFIGS)
            assert isinstance(configs, ConfigsStep)
            # Built ahead, the configs step asked for the bundle and drew its preview hidden.
            assert app.session.bundle and configs.files == app.session.bundle
            body = configs.query_one("#preview-body", Static)
            assert body.outer_size.width > 0 and body.outer_size.height > 0
            for step in (Step.DECISION, Step.CONFIGS, Step.LAUNCH):
                pane = wiz.pane(step)
                assert pane is not None and not pane.display and pane.ahead
                assert pane.outer_size == wiz._switcher.size, step
            arranged = _arranged_in(monkeypatch)
            for step in (Step.DECISION, Step.CONFIGS):
                pane = wiz.pane(step)
                assert pane is not None
                arranged.clear()
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
                # Only the step itself and the containers holding the focus are arranged again
                # (showing the step and moving the focus refresh their layout), from what every
                # other container inside the step kept.
                focused = app.focused
                assert focused is not None
                holding = {id(w) for w in (focused, *focused.ancestors)}
                again = [w for w in arranged if pane in w.ancestors and id(w) not in holding]
                assert not again, f"{step}: arranged again when shown: {again}"

    asyncio.run(go())


def _screen_text(app: DtrainApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


def test_a_step_laid_out_ahead_looks_as_one_built_on_its_visit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def shots(ahead: bool) -> dict[str, str]:
        monkeypatch.setattr(WizardScreen, "build_ahead", ahead)
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        seen: dict[str, str] = {}
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            if ahead:
                await _all_laid_out(pilot, wiz)
            for step in (Step.DECISION, Step.CONFIGS, Step.LAUNCH):
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
                seen[step] = _screen_text(app)
        return seen

    try:
        built_on_visit = asyncio.run(shots(ahead=False))
        laid_out_ahead = asyncio.run(shots(ahead=True))
    finally:
        gc.unfreeze()
    for step, text in built_on_visit.items():
        assert laid_out_ahead[step] == text, step


def test_the_profiles_dialog_first_open_restyles_none_of_the_wizard(
    tmp_path: Path, build_ahead: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reparsed: list[int] = []
    restyled: list[int] = []
    reparse, update = Stylesheet.reparse, Stylesheet.update

    def counting_reparse(self: Stylesheet) -> None:
        reparsed.append(1)
        reparse(self)

    def counting_update(self: Stylesheet, root: Any, animate: bool = False) -> None:
        restyled.append(1)
        update(self, root, animate=animate)

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", config_dir=tmp_path / "cfg")
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            await _all_laid_out(pilot, wiz)
            monkeypatch.setattr(Stylesheet, "reparse", counting_reparse)
            monkeypatch.setattr(Stylesheet, "update", counting_update)
            await pilot.press("ctrl+o")
            await until(pilot, lambda: isinstance(app.screen, ProfilesScreen), "no dialog")
            await settle(pilot)
            dialog = app.screen.query_one("#profiles-dialog")
            assert dialog.styles.width is not None and dialog.styles.width.value == 110
            assert not reparsed and not restyled, (len(reparsed), len(restyled))

    asyncio.run(go())
