"""The Model step's head width (``model.head_dim``) and the architecture notes of the model
line: a Qwen3-style attention given by hand, and DeepSeek-V3's latent attention, shared expert
and leading dense layers named in the summary."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from textual.widgets import Button, Input

from engine.plan.specs import ModelSpec, demo_spec
from tests.tui.wizard_support import retype, settle, text_of, until
from tui.app import DtrainApp
from tui.widgets.field_row import FieldRow

SIZE = (120, 40)


def _app(tmp_path: Path) -> DtrainApp:
    return DtrainApp(demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.01, show_timings=False)


async def _type_into(pilot, app: DtrainApp, name: str, text: str) -> None:  # type: ignore[no-untyped-def]
    field = app.screen.query_one(f"#f-{name}", Input)
    field.focus()
    await until(pilot, lambda: app.focused is field, f"{name} never got focus")
    await retype(pilot, text)


def test_a_head_width_typed_in_the_dimensions_tab_reaches_the_model(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.click("#--content-tab-src-dims")
            await _type_into(pilot, app, "head_dim", "128")
            await pilot.press("enter")
            await settle(pilot)
            button = app.screen.query_one("#use-src-dims", Button)
            button.focus()
            await until(pilot, lambda: app.focused is button, "button never got focus")
            await pilot.press("enter")
            await settle(pilot)
            assert app.spec.model.head_dim == 128 and app.spec.model.layers == 4
            assert "heads of 128" in text_of(app, "#model-summary")

    asyncio.run(go())


def test_a_deepseek_v3_config_is_summarised_with_its_architecture(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    src = Path(__file__).parents[1] / "engine" / "data" / "hf_configs" / "deepseek-v3.json"
    cfg.write_text(json.dumps(json.loads(src.read_text())))

    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await pilot.click("#--content-tab-src-config")
            await _type_into(pilot, app, "config_path", str(cfg))
            await pilot.press("enter")
            await settle(pilot)
            assert app.spec.model == ModelSpec(config_path=cfg)
            summary = text_of(app, "#model-summary")
            assert "671" in summary and "latent attention (kv 512, q 1536)" in summary
            assert "1 shared expert" in summary and "first 3 layers dense" in summary

    asyncio.run(go())


def test_the_multi_token_prediction_depth_is_set_beside_any_source(tmp_path: Path) -> None:
    async def go() -> None:
        app = _app(tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            await settle(pilot)
            await _type_into(pilot, app, "preset", "deepseek-v3")
            await pilot.press("enter")
            await until(pilot, lambda: app.spec.model.preset == "deepseek-v3", "no preset")
            await until(
                pilot,
                lambda: "1 multi-token prediction module" in text_of(app, "#model-summary"),
                "the summary never named the module",
            )
            await _type_into(pilot, app, "mtp_layers", "0")
            await until(pilot, lambda: app.spec.model.mtp_layers == 0, "depth never reached")
            assert app.spec.model.preset == "deepseek-v3"
            await until(
                pilot,
                lambda: "multi-token" not in text_of(app, "#model-summary"),
                "the summary still names the module",
            )
            await _type_into(pilot, app, "mtp_layers", "-1")
            row = app.screen.query_one("#row-mtp_layers", FieldRow)
            await until(pilot, lambda: bool(row.error), "a negative depth was not refused")
            assert "at least 0" in row.error
            assert app.spec.model.preset == "deepseek-v3"  # the model itself is kept

    asyncio.run(go())
