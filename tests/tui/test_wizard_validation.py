"""Validation as typed: the engine's message next to the field, a step with errors can't be left
forward (keys or mouse), going back always works, and odd input never crashes the wizard."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual import events
from textual.widgets import Input

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, focused_id, retype, settle, text_of, until
from tui.app import DtrainApp
from tui.widgets.field_row import FieldRow


def _row(app: DtrainApp, name: str) -> FieldRow:
    return app.screen.query_one(f"#row-{name}", FieldRow)


def test_invalid_fields_block_next_and_show_engine_messages(tmp_path: Path) -> None:
    asyncio.run(_invalid(tmp_path))


async def _invalid(tmp_path: Path) -> None:
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        assert focused_id(app) == "f-layers"
        # heads that don't divide hidden: the model-level rule lands next to the heads field.
        await pilot.press("tab", "tab")
        assert focused_id(app) == "f-heads"
        await retype(pilot, "7")
        assert "not divisible by 7 heads" in _row(app, "heads").error
        assert app.session.step_errors["model"]
        assert "✗" in text_of(app, "#nav")
        await pilot.press("ctrl+n")
        await at_step(pilot, "model")  # refused
        assert "fix model first" in text_of(app, "#status-line")
        # The mouse can't skip it either: the Next button and the sidebar refuse too.
        await pilot.click("#next")
        await at_step(pilot, "model")
        await pilot.click("#nav", offset=(4, 5))  # "5 Decision"
        await at_step(pilot, "model")
        # Odd input: unicode, pasted text, huge numbers, negatives, empty; none crashes.
        assert focused_id(app) == "f-heads"
        for text in ("八", "-4", "", "1e400", "0x10", "3.5"):
            await retype(pilot, text) if text else await pilot.press("ctrl+a", "ctrl+k")
            assert _row(app, "heads").error, text
            assert app.session.step_errors["model"]
        await pilot.press("ctrl+a", "ctrl+k")
        heads = app.screen.query_one("#f-heads", Input)
        heads.post_message(events.Paste("12 heads\npasted from a doc"))
        await until(
            pilot, lambda: bool(heads.value and _row(app, "heads").error), "paste not refused"
        )
        await pilot.press("ctrl+a", "ctrl+k")
        heads.post_message(events.Paste("9" * 5000))  # huge: Python refuses such int strings
        await until(
            pilot,
            lambda: bool(_row(app, "heads").error),
            "huge paste not refused",
        )
        await retype(pilot, "4")
        assert _row(app, "heads").error == ""
        assert not app.session.step_errors["model"]
        await pilot.press("ctrl+n")
        await at_step(pilot, "hardware")
        # Hardware: a negative node count and an unknown GPU, each with its own message.
        await retype(pilot, "warp-drive-9000")
        assert "warp-drive-9000" in _row(app, "gpu").error
        await retype(pilot, "A100 80GB")  # aliases resolve through the catalog
        assert _row(app, "gpu").error == ""
        assert app.spec.hardware.gpu == "a100-80gb"
        await pilot.press("tab", "tab")  # GPUs per node, then nodes (the suggestions: no stop)
        assert focused_id(app) == "f-nodes"
        await retype(pilot, "-2")
        assert _row(app, "nodes").error == "must be at least 1, not -2"
        await pilot.press("ctrl+n")
        await at_step(pilot, "hardware")
        # Back always works, even from an invalid step, and the sidebar shows which is invalid.
        await pilot.press("ctrl+b")
        await at_step(pilot, "model")
        nav = text_of(app, "#nav")
        hw_line = next(line for line in nav.splitlines() if "Hardware" in line)
        assert "✗" in hw_line
        await pilot.click("#nav", offset=(4, 2))  # "2 Hardware" (back to it is allowed)
        await at_step(pilot, "hardware")
        app.set_focus(app.screen.query_one("#f-nodes", Input))
        await retype(pilot, "2")
        await settle(pilot)
        assert not app.session.step_errors["hardware"]
        assert app.spec.hardware.nodes == 2
        await pilot.click("#next")
        await at_step(pilot, "network")


def test_model_sources_preset_search_config_json_and_count(tmp_path: Path) -> None:
    asyncio.run(_sources(tmp_path))


async def _sources(tmp_path: Path) -> None:
    cfg = tmp_path / "my-model"
    cfg.mkdir()
    (cfg / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 128, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, '
        '"intermediate_size": 344}'
    )
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.2)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("shift+tab", "left", "left", "tab")
        assert focused_id(app) == "f-preset"
        # Search filters the list; ↓ moves the highlight; ⏎ picks.
        await retype(pilot, "mixtral")
        await pilot.press("down", "enter")
        assert app.spec.model.preset == "mixtral-8x22b"
        assert "active per token" in text_of(app, "#model-summary")
        await retype(pilot, "no-such-model")
        assert "no preset named" in _row(app, "preset").error
        # config.json: the path input completes directories (→ accepts).
        await pilot.press("shift+tab", "right", "tab")
        assert focused_id(app) == "f-config_path"
        path_input = app.screen.query_one("#f-config_path", Input)
        await pilot.press("ctrl+a", "ctrl+k")
        path_input.post_message(events.Paste(str(tmp_path) + "/"))  # a pasted directory …
        await pilot.press("m", "y", "-", "m", "o")  # … then typed: the rest is suggested
        await pilot.pause(0.2)
        await pilot.press("right")
        assert app.screen.query_one("#f-config_path", Input).value == str(cfg) + "/"
        await until(pilot, lambda: app.spec.model.config_path is not None, "config not read")
        summary = text_of(app, "#model-summary")
        assert "2 layers" in summary and "(2 kv)" in summary
        await pilot.press("ctrl+a", "ctrl+k")
        path_input.post_message(events.Paste(str(tmp_path / "missing.json")))
        await until(
            pilot,
            lambda: "does not exist" in _row(app, "config_path").error,
            lambda: f"config_path error: {_row(app, 'config_path').error!r}",
        )
        # A bare parameter count.
        await pilot.press("shift+tab", "right", "right", "tab")
        assert focused_id(app) == "f-params"
        await retype(pilot, "1.3B")
        assert app.spec.model.params == 1.3e9
        assert "1.3 B parameters" in text_of(app, "#model-summary")
        await retype(pilot, "lots")
        assert "not a parameter count" in _row(app, "params").error
