"""What a tmux review of the app still found (issue 15's polish), each pinned with Pilot: a
calibration offer left over the next run's monitor, the Model step's refusal said twice, the Why
list's wrapped lines not under their item, what 80 columns cut (the footer's f1 Help, the Configs
legend, the profiles table), ``dtrain-tui monitor``'s footer without its quit key, docstring
markup in ``--help``, and the runs directory placeholder ignoring XDG_DATA_HOME.

Every test here fails on the code before these fixes."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from textual.app import App
from textual.widgets import DataTable, Input

from engine.monitor.tail import ListSource
from engine.plan.calibration import min_run_steps
from engine.plan.specs import demo_spec
from engine.rundir.events import RunStateChanged
from tests.tui.test_monitor import CLOCK, Endless, canned
from tests.tui.wizard_support import at_step, retype, settle, text_of, until
from tui.app import DtrainApp
from tui.screens.calibrate_offer import end_of_run_hint
from tui.screens.configs import LEGEND
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.screens.profiles import _when
from tui.widgets.flowchart import FlowChart

NARROW = (80, 24)


def _app(tmp_path: Path, **kw: Any) -> DtrainApp:
    return DtrainApp(demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.01, **kw)


def _footer_keys(app: App[Any]) -> dict[str, tuple[str, int]]:
    """key -> (description, right edge) of every key the footer shows."""
    keys: list[Any] = list(app.screen.query("FooterKey"))
    return {k.key: (k.description, k.region.right) for k in keys}


def _assert_footer_fits(app: App[Any], *want: tuple[str, str], every: bool = True) -> None:
    """The footer shows each of ``want`` uncut (with ``every``: all of its keys)."""
    keys = _footer_keys(app)
    footer: list[Any] = list(app.screen.query("FooterKey"))
    palette_x = next(k.region.x for k in footer if k.key == "ctrl+p")
    for key, desc in want:
        assert keys.get(key, ("",))[0] == desc, f"no {key} {desc} in the footer: {keys}"
    for key, (desc, right) in keys.items():
        if key != "ctrl+p" and (every or (key, desc) in want):
            assert right <= palette_x, f"{key} {desc} is cut at {app.size.width} columns: {keys}"


# ---- 1. the calibration offer belongs to its run ------------------------------------------------


def test_calibration_offer_is_withdrawn_when_another_runs_monitor_opens(tmp_path: Path) -> None:
    asyncio.run(_offer(tmp_path))


def _toasts(app: App[Any]) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def _offer(tmp_path: Path) -> None:
    steps = min_run_steps() + 1
    app = MonitorApp(
        ListSource([*canned(steps=steps, fail=False), [RunStateChanged("succeeded", "", CLOCK)]]),
        tmp_path / "run-a",
        world_size=4,
        clock=lambda: CLOCK,
    )
    hint = end_of_run_hint("succeeded")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: hint in _toasts(app), lambda: f"no offer: {_toasts(app)}")
        offer = next(n for n in app._notifications if n.message == hint)
        first = app.monitor
        # Another run's monitor opens (as Open run… or the next launch would): the offer is gone.
        other = MonitorScreen(Endless(), tmp_path / "run-b", world_size=1, clock=lambda: CLOCK)
        await app.push_screen(other)
        await until(pilot, lambda: app.screen is other, "the second monitor never opened")
        await until(pilot, lambda: hint not in _toasts(app), lambda: f"stale: {_toasts(app)}")
        assert offer.time_left > 0, "the offer only timed out: nothing withdrew it"
        await until(
            pilot,
            lambda: not any(hint in str(t.render()) for t in app.screen.query("Toast")),
            "the stale offer is still drawn over the second monitor",
        )
        # Its own monitor showing again does not bring it back, and k still works there.
        app.pop_screen()
        await until(pilot, lambda: app.screen is first, "back to the first monitor")
        assert hint not in _toasts(app)


# ---- 2. the Model step says an unsupported model_type once ---------------------------------------


def test_unsupported_model_type_is_said_once_at_the_field(tmp_path: Path) -> None:
    asyncio.run(_model_type(tmp_path))


async def _model_type(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "mamba-like", "num_hidden_layers": 6}))
    app = _app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.click("#--content-tab-src-config")
        field = app.screen.query_one("#f-config_path", Input)
        field.focus()
        await until(pilot, lambda: app.focused is field, "config path never got focus")
        await retype(pilot, str(cfg))
        await pilot.press("enter")
        await settle(pilot)
        row = app.screen.query_one("#row-config_path")
        error = row.error  # type: ignore[attr-defined]
        summary = text_of(app, "#model-summary")
        said = "'mamba-like' is not supported"
        assert said in error, error
        assert said not in summary, f"said twice: {summary!r}"
        assert summary.startswith("✗ config.json path"), summary  # it points at the field


# ---- 3. the Why list: a hanging indent ----------------------------------------------------------


def test_why_list_wraps_under_its_item(tmp_path: Path) -> None:
    asyncio.run(_why(tmp_path))


async def _why(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        assert app.wizard is not None and await app.wizard.go("decision")
        await at_step(pilot, "decision")
        await settle(pilot)
        chart = app.screen.query_one(FlowChart)
        await until(pilot, lambda: chart.size.width > 0, "no flowchart drawn")
        console = Console(file=io.StringIO(), width=chart.content_size.width, color_system=None)
        console.print(chart.render())
        lines = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
        items = lines[lines.index("Why") + 1 :]
        numbered = [x for x in items if re.match(r"\d+\. ", x)]
        rest = [x for x in items if x.strip() and not re.match(r"\d+\. ", x)]
        assert app.plan is not None and len(numbered) == len(app.plan.path), items
        # More lines than questions and reasons: some wrapped at this width.
        assert len(rest) > len(numbered), "\n".join(items)
        for line in rest:
            assert line.startswith("   "), f"not under its item: {line!r}\n" + "\n".join(items)


# ---- 4. what 80 columns cut -----------------------------------------------------------------------


def test_footer_shows_every_key_at_80_columns_on_every_step(tmp_path: Path) -> None:
    asyncio.run(_footer(tmp_path))


async def _footer(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        for step in ("model", "hardware", "network", "training", "decision", "configs", "launch"):
            assert app.wizard is not None and await app.wizard.go(step)
            await at_step(pilot, step)
            await settle(pilot)
            await pilot.pause()
            _assert_footer_fits(
                app,
                ("f1", "Help"),
                ("ctrl+l", "Launch"),
                ("ctrl+g", "Open run"),
                ("ctrl+q", "Quit"),
            )
        # The keys left out of the footer are on screen elsewhere: the step list's hint and
        # the Configs buttons.
        assert "^n next" in text_of(app, "#nav")
        assert app.screen.query_one("#edit").label.plain.endswith("^e")  # type: ignore[attr-defined]
        assert app.screen.query_one("#copy").label.plain.endswith("^y")  # type: ignore[attr-defined]


def test_configs_legend_fits_80_columns(tmp_path: Path) -> None:
    asyncio.run(_legend(tmp_path))


async def _legend(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        assert app.wizard is not None and await app.wizard.go("configs")
        await at_step(pilot, "configs")
        await settle(pilot)
        legend = app.screen.query_one("#file-legend")
        assert len(LEGEND) <= legend.content_size.width, (LEGEND, legend.content_size)
        for mark in ("+ new", "~ changed", "= same", "! yours", "- to remove", "k kept"):
            assert mark in LEGEND


def test_profiles_table_fits_80_columns(tmp_path: Path) -> None:
    asyncio.run(_profiles(tmp_path))


async def _profiles(tmp_path: Path) -> None:
    from profiles.store import ProfileStore
    from tui.screens.profiles import ProfilesScreen

    store = ProfileStore(tmp_path / "cfg")
    store.save_spec("mine", demo_spec())
    store.mark_used("mine")
    app = _app(tmp_path, config_dir=tmp_path / "cfg")
    async with app.run_test(size=NARROW) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, ProfilesScreen), "no profiles dialog")
        table = app.screen.query_one(DataTable)
        await until(pilot, lambda: table.row_count > 0, "no profiles listed")
        await pilot.pause()
        labels = [c.label.plain for c in table.columns.values()]
        assert labels == ["Name", "Model", "Cluster", "Used"], labels
        assert table.virtual_size.width <= table.scrollable_content_region.width, (
            f"the table scrolls sideways: {table.virtual_size.width} in "
            f"{table.scrollable_content_region.width} columns"
        )
        row = table.get_row("mine")
        assert row[3] == "now", row
        # Where it comes from and the exact time: the detail line of the highlighted profile.
        table.move_cursor(row=table.get_row_index("mine"))

        def detail() -> str:
            return str(app.screen.query_one("#profiles-detail").render())

        await until(pilot, lambda: "last used 20" in detail(), detail)
        table.move_cursor(row=table.get_row_index("local-cpu-demo"))
        await until(pilot, lambda: "built-in preset" in detail(), detail)


# ---- 5. dtrain-tui monitor RUN_DIR: q Quit in the footer -------------------------------------------


def test_standalone_monitor_footer_shows_q_quit(tmp_path: Path) -> None:
    asyncio.run(_monitor_quit(tmp_path))


async def _monitor_quit(tmp_path: Path) -> None:
    app = MonitorApp(Endless(), tmp_path / "run", world_size=1, clock=lambda: CLOCK)
    async with app.run_test(size=NARROW) as pilot:
        await until(pilot, lambda: isinstance(app.screen, MonitorScreen), "no monitor")
        await pilot.pause()
        _assert_footer_fits(app, ("q", "Quit"), every=False)
        assert "b" not in _footer_keys(app)  # no wizard to go back to
        await pilot.press("q")
        await until(pilot, lambda: app.return_code is not None, "q did not quit")
    assert app.return_code == 0


def test_wizard_monitor_footer_goes_back_and_has_no_quit(tmp_path: Path) -> None:
    asyncio.run(_wizard_monitor(tmp_path))


async def _wizard_monitor(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        monitor = MonitorScreen(Endless(), tmp_path / "run", world_size=1, can_go_back=True)
        await app.push_screen(monitor)
        await until(pilot, lambda: app.screen is monitor, "no monitor")
        await pilot.pause()
        keys = _footer_keys(app)
        assert keys.get("b", ("",))[0] == "Back to wizard", keys
        assert "q" not in keys, keys  # q goes back here, as b does: not a Quit
        await pilot.press("q")
        await until(pilot, lambda: app.screen is not monitor, "q did not go back")
        assert app.return_code is None  # the wizard is still open


# ---- 6. --help is plain text -------------------------------------------------------------------


def _helps(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from _helps(p, f"{name} {sub}")


def test_every_subcommand_help_is_free_of_docstring_markup() -> None:
    from cli import build_parser

    helps = dict(_helps(build_parser(), "dtrain-tui"))
    assert {"dtrain-tui calibrate", "dtrain-tui monitor", "dtrain-tui launch"} <= set(helps)
    markup = re.compile(r"``|:[a-z]+:`")
    for name, text in helps.items():
        bad = [line for line in text.splitlines() if markup.search(line)]
        assert not bad, f"{name} --help: {bad}"
    calibrate = helps["dtrain-tui calibrate"]
    assert "plan --calibration NAME" in " ".join(calibrate.split())
    assert "engine.monitor" not in calibrate  # a code reference says nothing to a user


# ---- 7. the runs directory placeholder is the real default ----------------------------------------


def test_runs_directory_placeholder_follows_xdg_data_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "xdg-data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    asyncio.run(_placeholder(tmp_path, data))


async def _placeholder(tmp_path: Path, data: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.wizard is not None and await app.wizard.go("launch")
        await at_step(pilot, "launch")
        placeholder = app.screen.query_one("#f-run_root", Input).placeholder
        assert placeholder == f"empty: {data / 'dtrain-tui' / 'runs'}", placeholder


def test_used_column_says_how_long_ago_in_seven_characters() -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime(2026, 6, 1, 12, tzinfo=UTC)
    ages = {
        timedelta(seconds=5): "now",
        timedelta(minutes=59): "59m ago",
        timedelta(hours=23): "23h ago",
        timedelta(days=59): "59d ago",
    }
    for age, text in ages.items():
        assert _when(now - age, now) == text
    assert _when(None) == "never"
    assert len(_when(now - timedelta(days=400), now)) <= 7  # a month and a year
