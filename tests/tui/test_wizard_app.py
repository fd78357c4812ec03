"""App-wide behaviour: help screen, command palette actions, theme toggle, Ctrl+Q, start-up
imports (no torch / deepspeed / sky until a run needs them)."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle, text_of
from tui.app import DtrainApp, initial_spec
from tui.screens.help import HelpScreen

ROOT = Path(__file__).resolve().parents[2]


def test_help_palette_theme_and_quit(tmp_path: Path) -> None:
    asyncio.run(_app_wide(tmp_path))


async def _app_wide(tmp_path: Path) -> None:
    app = DtrainApp(demo_spec(), out_dir=tmp_path / "out", plan_delay_s=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        body = text_of(app, "#help-keys")
        for key in ("Ctrl+N", "Ctrl+B", "Ctrl+S", "Ctrl+Q", "Ctrl+P"):
            assert key in body
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        dark = app.current_theme.dark
        await pilot.press("ctrl+t")
        assert app.current_theme.dark is not dark
        # The palette finds the wizard's actions by name and runs them.
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"go to step 5")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await pilot.pause(0.2)
        await at_step(pilot, "decision")
        await pilot.press("ctrl+p")
        await pilot.pause(0.2)
        await pilot.press(*"write bundle")
        await pilot.pause(0.5)
        await pilot.press("enter")
        await settle(pilot)
        assert (tmp_path / "out" / "bundle.json").exists(), text_of(app, "#status-line")
        # Ctrl+O: the profiles dialog; loading a built-in profile refills every step.
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)
        from textual.widgets import DataTable

        from tui.screens.profiles import ProfilesScreen

        assert isinstance(app.screen, ProfilesScreen)
        table = app.screen.query_one(DataTable)
        row = table.get_row_index("single-node-8xh100")
        table.move_cursor(row=row)
        await pilot.press("l")
        await settle(pilot)
        assert not isinstance(app.screen, ProfilesScreen)
        assert app.profile_name == "single-node-8xh100"
        assert app.spec.hardware.gpus_per_node == 8 and app.spec.hardware.gpu != "cpu"
        assert app.plan is not None and app.plan.world_size == app.spec.hardware.world_size
        await pilot.press("ctrl+q")
    assert app.return_code == 0


def test_default_spec_is_the_builtin_demo_profile_or_the_embedded_demo(tmp_path: Path) -> None:
    spec = initial_spec(None, tmp_path)
    assert spec.hardware.gpu == "cpu" and spec.hardware.world_size == 2


def _heavy_imports() -> dict[str, int]:
    path = ROOT / "benchmarks" / "startup.py"
    module_spec = importlib.util.spec_from_file_location("dtrain_startup_bench", path)
    assert module_spec is not None and module_spec.loader is not None
    bench = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(bench)
    result: dict[str, int] = bench.heavy_imports()
    return result


def test_no_torch_deepspeed_or_sky_imported_while_planning_and_writing() -> None:
    # The app module alone: none of the heavy modules and not even the planner.
    probe = (
        "import sys, tui.app; "
        "print(sorted(m for m in ('torch', 'deepspeed', 'sky', 'engine.plan.planner') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
    # Through planning and bundle rendering: still none.
    assert _heavy_imports() == {"torch": 0, "deepspeed": 0, "sky": 0}
