"""The monitor at 80x24: the header keeps its essentials (the run's name, its state, the root
cause, the errors, the ranks, a filter) and the footer every key it shows, none cut at the row's
end; lower-priority parts (the view, the badge, the counts) give way first, labels shorten.
At 160 columns nothing is left out."""

from __future__ import annotations

import asyncio

from textual.widgets._footer import FooterKey

from engine.monitor.tail import ListSource
from tests.tui.test_monitor import CLOCK, Endless, canned, settle
from tui.screens.monitor import MonitorApp, MonitorScreen
from tui.widgets.monitor_footer import SHORT, Fit, fit_keys
from tui.widgets.monitor_header import MonitorHeader, Part, fit_parts
from tui.widgets.rank_pane import LinePattern

TITLE = "20261202-133306-llama-3-8b"
"""A run directory's name as ``launch`` makes it (date, time, set-up)."""


def header(m: MonitorScreen) -> str:
    return str(m.query_one(MonitorHeader).render())


def footer(m: MonitorScreen) -> list[tuple[str, str, int]]:
    """(key, label, right edge) of every key on the footer."""
    return [(k.key_display, k.description, k.region.right) for k in m.query(FooterKey)]


def assert_fits(m: MonitorScreen, width: int, *, title_cut: bool = False) -> None:
    """Header and footer within ``width``; the run's name whole unless ``title_cut``."""
    row = header(m)
    assert len(row) <= width - 2, row  # the header's padding: 1 each side
    assert title_cut or "…" not in row, row
    keys = footer(m)
    assert keys and all(right <= width for _, _, right in keys), keys


def test_a_failed_run_at_80_columns_keeps_the_essentials() -> None:
    async def go() -> None:
        app = MonitorApp(ListSource(canned()), world_size=4, clock=lambda: CLOCK, title=TITLE)
        async with app.run_test(size=(80, 24)) as pilot:
            m = await settle(pilot)
            await pilot.pause(0.1)
            row = header(m)
            for essential in (TITLE, "● failed", "root cause", "r3", "2 errors", "4 ranks"):
                assert essential in row, (essential, row)
            assert_fits(m, 80)
            shown = {key for key, _, _ in footer(m)}
            assert {"q", "?", "e", "/", "z", "v", "]", "c", "t"} <= shown, shown
            m.set_filter(LinePattern("loss"))
            await pilot.pause(0.1)
            row = header(m)
            assert "filter 'loss'" in row and "root cause r3" in row, row
            assert row.startswith(" 20261202-1333"), row  # the name gives way last, cut
            assert_fits(m, 80, title_cut=True)

    asyncio.run(go())


def test_a_running_run_from_the_wizard_at_80_columns_shows_stop_and_back() -> None:
    async def go() -> None:
        app = MonitorApp(Endless(), world_size=8, title=TITLE, can_go_back=True)
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(100):
                await pilot.pause(0.02)
                if app.monitor is not None and "1 rank" in header(app.monitor):
                    break
            m = app.monitor
            assert m is not None
            await pilot.pause(0.1)
            assert "8 ranks" in header(m), header(m)
            assert_fits(m, 80)
            shown = {key for key, _, _ in footer(m)}
            assert {"b", "?", "^x", "e", "/", "z", "v"} <= shown, shown

    asyncio.run(go())


def test_at_160_columns_nothing_is_left_out() -> None:
    async def go() -> None:
        app = MonitorApp(ListSource(canned()), world_size=4, clock=lambda: CLOCK, title=TITLE)
        async with app.run_test(size=(160, 48)) as pilot:
            m = await settle(pilot)
            await pilot.pause(0.1)
            row = header(m)
            assert "monitor" in row and "root cause: rank 3" in row and "view rank" in row, row
            labels = {label for _, label, _ in footer(m)}
            assert {"Next error", "Rank/node", "NCCL pane", "palette"} <= labels, labels
            assert_fits(m, 160)

    asyncio.run(go())


def test_fit_parts_gives_way_in_turn_and_cuts_the_title_last() -> None:
    parts = [
        Part(" monitor ", drop=3),
        Part(" a-very-long-run-name ", title=True),
        Part("● failed"),
        Part(" · root cause: rank 3", short=" · root cause r3"),
        Part("  view rank", drop=1),
    ]
    assert [t for t, _ in fit_parts(parts, 200)] == [p.text for p in parts]
    assert [t for t, _ in fit_parts(parts, 55)] == [
        " monitor ",
        " a-very-long-run-name ",
        "● failed",
        " · root cause r3",
    ]
    tight = "".join(t for t, _ in fit_parts(parts, 40))
    assert tight == " a-very-long-r… ● failed · root cause r3" and len(tight) == 40


def test_fit_keys_shortens_then_compacts_then_leaves_the_last_keys_off() -> None:
    keys = [
        ("back", "b", "Back to wizard"),
        ("help", "?", "Help"),
        ("stop_run", "^x", "Stop run"),
        ("next_error", "e", "Next error"),
        ("toggle_nccl", "c", "NCCL pane"),
        ("toggle_side", "t", "Table"),
    ]
    assert fit_keys(keys, 200) == Fit({})
    assert fit_keys(keys, 76) == Fit(SHORT)  # 64 columns of keys short, the palette's 12
    tight = fit_keys(keys, 56)
    assert tight.compact and tight.labels["back"] == "Back" and not tight.hidden
    assert fit_keys(keys, 50) == Fit(tight.labels, compact=True, hidden=frozenset({"toggle_side"}))
    # The first keys stay whatever the width.
    assert fit_keys(keys, 10).hidden == frozenset({"toggle_nccl", "toggle_side"})
