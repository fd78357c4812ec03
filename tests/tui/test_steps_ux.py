"""The model, hardware and training steps as a new user meets them (issue 15): a model source
chosen explicitly, a config.json the engine can't read turned into filled-in dimensions, bad
numbers told in words at the field, no ✓ on steps that need a plan while there is none, a forced
layout shown as a badge that clears it, and a global batch that can't be split refused at the
field with the nearest batches to pick."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from textual.widgets import Button, Input

from engine.plan.specs import LayoutSpec, ModelSpec, demo_spec
from tests.tui.wizard_support import at_step, retype, settle, text_of, until
from tui.app import DtrainApp
from tui.session import Step
from tui.widgets.field_row import FieldRow
from tui.widgets.forced_badge import ForcedBadge

SIZE = (120, 40)


def _app(tmp_path: Path, **training: object) -> DtrainApp:
    spec = demo_spec()
    if training:
        spec = spec.model_copy(update={"training": spec.training.model_copy(update=training)})
    return DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.01, show_timings=False)


def _row(app: DtrainApp, name: str) -> FieldRow:
    return app.screen.query_one(f"#row-{name}", FieldRow)


async def _type_into(pilot, app: DtrainApp, name: str, text: str) -> None:  # type: ignore[no-untyped-def]
    field = app.screen.query_one(f"#f-{name}", Input)
    field.focus()
    await until(pilot, lambda: app.focused is field, f"{name} never got focus")
    await retype(pilot, text)


async def _press(pilot, app: DtrainApp, selector: str) -> None:  # type: ignore[no-untyped-def]
    """Press a button from the keyboard (focus, Enter): a button just mounted or moved by a
    re-layout is pressed for sure, where a click at its old place could miss."""
    button = app.screen.query_one(selector, Button)
    button.focus()
    await until(pilot, lambda: app.focused is button, f"{selector} never got focus")
    await pilot.press("enter")


def test_switching_model_tabs_keeps_the_model_until_a_source_is_chosen(tmp_path: Path) -> None:
    asyncio.run(_tabs(tmp_path))


async def _tabs(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.spec.model.layers == 4  # the demo's dimensions
        await pilot.click("#--content-tab-src-preset")
        await _type_into(pilot, app, "preset", "mixtral-8x7")
        await pilot.press("b", "enter")
        await settle(pilot)
        assert app.spec.model == ModelSpec(preset="mixtral-8x7b")
        # Looking at the Dimensions tab again does not bring the demo model back.
        await pilot.click("#--content-tab-src-dims")
        await settle(pilot)
        assert app.spec.model == ModelSpec(preset="mixtral-8x7b")
        assert "still comes from the Preset tab" in text_of(app, "#model-summary")
        assert "mixtral" in text_of(app, "#model-summary")
        # Choosing it is explicit: the button makes the dimensions the model.
        await _press(pilot, app, "#use-src-dims")
        await settle(pilot)
        assert app.spec.model.layers == 4 and app.spec.model.preset is None
        assert "still comes from" not in text_of(app, "#model-summary")


def test_unsupported_model_type_fills_the_dimensions_tab(tmp_path: Path) -> None:
    asyncio.run(_unsupported(tmp_path))


async def _unsupported(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "model_type": "mamba-like",
                "num_hidden_layers": 6,
                "hidden_size": 512,
                "num_attention_heads": 8,
                "vocab_size": 2048,
            }
        )
    )
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.click("#--content-tab-src-config")
        await _type_into(pilot, app, "config_path", str(cfg))
        await pilot.press("enter")
        await settle(pilot)
        error = _row(app, "config_path").error
        assert "'mamba-like' is not supported" in error
        assert "--layers" not in error and "CLI" not in error
        assert "Dimensions tab is filled in" in error and "Use these dimensions" in error
        for name, value in (("layers", "6"), ("hidden", "512"), ("heads", "8"), ("vocab", "2048")):
            assert _row(app, name).value == value
        await pilot.click("#--content-tab-src-dims")
        await _press(pilot, app, "#use-src-dims")
        await settle(pilot)
        assert app.spec.model.layers == 6 and app.spec.model.config_path is None
        assert not app.session.errors(Step.MODEL)


def test_bad_gpu_counts_are_one_human_line_at_the_field(tmp_path: Path) -> None:
    asyncio.run(_gpus(tmp_path))


async def _gpus(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.wizard is not None and await app.wizard.go("hardware")
        await at_step(pilot, "hardware")
        cases = [
            ("gpus_per_node", "0", "must be at least 1, not 0"),
            ("gpus_per_node", "99999", "must be at most 64, not 99999; a node holds 1 to 64"),
            ("nodes", "0", "must be at least 1, not 0"),
        ]
        for name, text, message in cases:
            await _type_into(pilot, app, name, text)
            error = _row(app, name).error
            assert error.startswith(message), error
            assert "Input should" not in error and "\n" not in error
            await retype(pilot, "2")
            assert _row(app, name).error == ""


def test_no_checkmarks_without_a_plan_and_the_forced_badge(tmp_path: Path) -> None:
    asyncio.run(_badge(tmp_path))


async def _badge(tmp_path: Path) -> None:
    spec = demo_spec().model_copy(update={"layout": LayoutSpec(dp=2, micro_batch=2)})
    app = DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.01, show_timings=False)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.plan is not None
        nav = text_of(app, "#nav")
        assert "Configs   ✓" in nav and "Launch    ✓" in nav
        # An invalid model: no plan, so the steps that show one lose their ✓.
        await _type_into(pilot, app, "heads", "7")
        await settle(pilot)
        assert app.plan is None
        nav = text_of(app, "#nav")
        for step in ("Decision", "Configs", "Launch"):
            line = next(line for line in nav.splitlines() if step in line)
            assert "✓" not in line, nav
        await retype(pilot, "4")
        await settle(pilot)
        assert app.plan is not None and "Launch    ✓" in text_of(app, "#nav")
        # The forced layout carried over shows as a badge in Training, and clears from there.
        assert app.wizard is not None and await app.wizard.go("training")
        await at_step(pilot, "training")
        badge = app.screen.query_one("#step-training ForcedBadge", ForcedBadge)
        assert badge.display and badge.text == "dp=2 micro_batch=2"
        assert "forced: dp=2 micro_batch=2" in text_of(app, "#step-training .forced-text")
        await _press(pilot, app, "#step-training #clear-forced-badge")
        await settle(pilot)
        assert app.spec.layout == LayoutSpec()
        assert app.plan is not None and not app.plan.forced
        assert not badge.display


def test_a_batch_that_cannot_be_split_is_refused_at_the_field_with_choices(
    tmp_path: Path,
) -> None:
    asyncio.run(_batch(tmp_path))


async def _batch(tmp_path: Path) -> None:
    app = _app(tmp_path, global_batch=7)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.plan is None
        assert app.wizard is not None and await app.wizard.go("training")
        await at_step(pilot, "training")
        await settle(pilot)
        row = _row(app, "global_batch")
        await until(pilot, lambda: "use 8" in _buttons(app), lambda: f"buttons {_buttons(app)}")
        assert "no layout of 2 GPU(s) trains a global batch of 7" in row.error
        assert "pick one of the nearest batches" in row.error and "--global-batch" not in row.error
        assert set(_buttons(app)) == {"use 8", "use 6"}
        # Training is at fault: it cannot be left forward until a batch is picked.
        assert not await app.wizard.go("decision")
        assert app.session.current == "training"
        await _press(pilot, app, "#batch-pick-8")
        await settle(pilot)
        assert app.spec.training.global_batch == 8
        assert app.plan is not None and row.error == ""
        assert _buttons(app) == []


def _buttons(app: DtrainApp) -> list[str]:
    return [
        str(b.label).split(":")[0]
        for b in app.screen.query("#batch-choices Button").results(Button)
    ]
