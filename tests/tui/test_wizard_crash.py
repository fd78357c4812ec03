"""A crash never exits 0, and loading a profile after visiting the Hardware step does not crash."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, OptionList

import tui.app
from engine.plan.specs import demo_spec
from tests.tui.wizard_support import settle
from tui.app import DtrainApp, run_app
from tui.screens.profiles import ProfilesScreen


def test_loading_a_profile_after_the_hardware_step_keeps_the_app_alive(tmp_path: Path) -> None:
    asyncio.run(_load_after_hardware(tmp_path))


async def _load_after_hardware(tmp_path: Path) -> None:
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", config_dir=tmp_path, plan_delay_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        wiz = app.wizard
        assert wiz is not None
        assert await wiz.go("hardware")
        await settle(pilot)
        for name in ("single-node-8xh100", "local-cpu-demo"):
            await pilot.press("ctrl+o")
            await pilot.pause(0.2)
            assert isinstance(app.screen, ProfilesScreen)
            table = app.screen.query_one(DataTable)
            table.move_cursor(row=table.get_row_index(name))
            await pilot.press("l")
            await settle(pilot)
            assert app.profile_name == name
        assert app.spec.hardware.gpu == "cpu"
        # the GPU list holds each catalog entry once
        ol = app.screen.query_one("#gpu-list", OptionList)
        assert ol.option_count == len(
            {ol.get_option_at_index(i).id for i in range(ol.option_count)}
        )
        await pilot.press("ctrl+q")
    assert app._exception is None
    assert app.return_code == 0


class _Boom(DtrainApp):
    CSS_PATH = str(Path(tui.app.__file__).with_name("app.tcss"))

    def on_mount(self) -> None:
        raise RuntimeError("boom")

    def run(self, *args: Any, **kwargs: Any) -> int | None:
        kwargs["headless"] = True
        return super().run(*args, **kwargs)


def test_an_unhandled_exception_exits_non_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tui.app, "DtrainApp", _Boom)
    assert run_app(config_dir=tmp_path) == 1
