"""Issue 40, instant steps: a step is built once and kept (a later visit only switches to it);
in a terminal the steps are built ahead, in idle time, and validate nothing until entered; the
footer is rebuilt only when the keys it shows change; Configs redraws its list and preview on
entry only when what they show changed, and highlights a file once, not on every visit."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp
from tui.screens.configs import ConfigsStep
from tui.screens.step import StepPane
from tui.screens.wizard import STEP_PANES, WizardScreen
from tui.session import Step
from tui.widgets.steady_footer import SteadyFooter


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times each step pane was composed."""
    counts: dict[str, int] = {}
    for step, cls in STEP_PANES.items():
        original = cls.compose

        def counting(self: StepPane, _original=original, _step=str(step)):  # type: ignore[no-untyped-def]
            counts[_step] = counts.get(_step, 0) + 1
            return _original(self)

        monkeypatch.setattr(cls, "compose", counting)
    return counts


@pytest.fixture
def build_ahead(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The wizard builds its steps ahead, as in a terminal (it freezes the collector once
    they are built: thawed again for the next tests)."""
    monkeypatch.setattr(WizardScreen, "build_ahead", True)
    yield
    gc.unfreeze()


def test_a_second_visit_to_a_step_does_not_build_it_again(
    tmp_path: Path, composed: dict[str, int]
) -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            seen: dict[str, StepPane] = {}
            for step in [*Step, *reversed(list(Step))]:
                assert await wiz.go(step)
                await at_step(pilot, step)
                pane = wiz.pane(step)
                assert pane is not None
                assert seen.setdefault(step, pane) is pane, f"{step} was built again"
            await settle(pilot)
            assert composed == {str(s): 1 for s in Step}

    asyncio.run(go())


def test_in_a_terminal_the_steps_are_built_ahead_and_validated_only_once_entered(
    tmp_path: Path, composed: dict[str, int], build_ahead: None
) -> None:
    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            await until(
                pilot,
                lambda: all(wiz.pane(s) is not None and wiz.pane(s).ready for s in Step),  # type: ignore[union-attr]
                lambda: f"built: {[s for s in Step if wiz.pane(s) is not None]}",
            )
            await settle(pilot)
            # Built, hidden, and no verdict recorded for a step not visited yet (the session
            # records the Decision step's with each plan itself).
            not_visited = {Step.HARDWARE, Step.NETWORK, Step.TRAINING, Step.CONFIGS, Step.LAUNCH}
            assert not not_visited & set(app.session.step_errors), app.session.step_errors
            for step in list(Step)[1:]:
                pane = wiz.pane(step)
                assert pane is not None and pane.ahead and not pane.display
            for step in list(Step)[1:]:
                pane = wiz.pane(step)
                await pilot.press("ctrl+n")
                await at_step(pilot, step)
                assert wiz.pane(step) is pane and pane is not None
                assert not pane.ahead and pane.display
                assert step in app.session.step_errors  # validated once entered
                await settle(pilot)
                focused = app.focused
                assert focused is not None and pane in (focused, *focused.ancestors)
            assert composed == {str(s): 1 for s in Step}
            assert app.return_code is None

    asyncio.run(go())


def test_moving_to_a_step_still_being_built_ahead_waits_for_its_fields(
    tmp_path: Path, build_ahead: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A move (with keys typed after it) to the step being built ahead at that moment: the
    move waits for its widgets, focuses its first field, and the keys land in it."""
    monkeypatch.setattr("tui.screens.step_panes.BUILD_AHEAD_AFTER_S", 30.0)  # built by hand here

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None and wiz.pane(Step.HARDWARE) is None
            building = asyncio.ensure_future(wiz._build_one_ahead())
            await asyncio.sleep(0)  # the build has started: mounted, not composed yet
            pane = wiz.pane(Step.HARDWARE)
            assert pane is not None and not pane.ready
            await pilot.press("ctrl+n", "end", "9")
            await at_step(pilot, "hardware")
            await building
            await settle(pilot)
            assert wiz.pane(Step.HARDWARE) is pane and pane.ready and not pane.ahead
            focused = app.focused
            assert focused is not None and pane in focused.ancestors
            assert getattr(focused, "value", "").endswith("9"), focused
            assert app.return_code is None

    asyncio.run(go())


def test_the_footer_is_not_rebuilt_while_the_keys_it_shows_stay_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    composes: list[int] = []
    original = SteadyFooter.compose

    def counting(self: SteadyFooter):  # type: ignore[no-untyped-def]
        composes.append(1)
        return original(self)

    monkeypatch.setattr(SteadyFooter, "compose", counting)

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            assert await wiz.go("hardware")
            await at_step(pilot, "hardware")
            await settle(pilot)
            before = len(composes)
            footer = wiz.query_one(SteadyFooter)
            keys = [k.key for k in footer.children]
            for step in ("network", "training", "hardware"):
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
            await pilot.press("tab", "tab")
            await settle(pilot)
            assert len(composes) == before, "the footer was rebuilt"
            assert [k.key for k in footer.children] == keys
            assert "ctrl+s" in keys

    asyncio.run(go())


def test_entering_configs_again_redraws_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.syntax import Syntax

    previews: list[str] = []
    original = ConfigsStep.show_preview

    def spy(self: ConfigsStep, name: str) -> None:
        previews.append(name)
        original(self, name)

    monkeypatch.setattr(ConfigsStep, "show_preview", spy)
    highlighted: list[str] = []
    highlight = Syntax.highlight

    def counting(self: Syntax, code: str, line_range=None):  # type: ignore[no-untyped-def]
        highlighted.append(code[:20])
        return highlight(self, code, line_range)

    monkeypatch.setattr(Syntax, "highlight", counting)
    out = tmp_path / "out"

    async def go() -> None:
        app = DtrainApp(demo_spec(), out_dir=out, show_timings=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await settle(pilot)
            wiz = app.wizard
            assert wiz is not None
            for step in ("decision", "configs", "launch", "configs"):
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
            pane = wiz.pane("configs")
            assert isinstance(pane, ConfigsStep) and pane.current is not None
            drawn, lit = len(previews), len(highlighted)
            for step in ("launch", "configs", "decision", "configs"):
                assert await wiz.go(step)
                await at_step(pilot, step)
                await settle(pilot)
            assert len(previews) == drawn, "the preview was drawn again, nothing changed"
            assert len(highlighted) == lit, "the preview was highlighted again"
            # A file written meanwhile: the next visit shows it as it is on disk.
            assert await wiz.go("launch")
            await at_step(pilot, "launch")
            out.mkdir(parents=True, exist_ok=True)
            (out / pane.current).write_text("changed on disk\n", encoding="utf-8")
            assert await wiz.go("configs")
            await at_step(pilot, "configs")
            await settle(pilot)
            assert len(previews) > drawn

    asyncio.run(go())
