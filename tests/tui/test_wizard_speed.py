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


def _labels(pane: ConfigsStep) -> list[str]:
    ol = pane.query_one("#file-list", OptionList)
    return [str(ol.get_option_at_index(i).prompt) for i in range(ol.option_count)]


def test_first_visit_to_configs_never_says_no_plan_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    original = ConfigsStep.refresh_files

    def spy(self: ConfigsStep) -> None:
        original(self)
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
