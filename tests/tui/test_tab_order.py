"""Tab order on every wizard step and in the profiles dialog (issue 40: "a Tab order that follows
the screen; every tab reachable by keyboard"), at 120x40.

From a step's first focus, Tab visits the focusable widgets top-to-bottom, left-to-right as drawn
and comes back (no trap); every stop is on screen, enabled, inside the step, and does something
(a scrolling container that cannot scroll is a stop that shows no focus and takes no key);
Shift+Tab walks the same stops backwards. On the Model step the tab bar is a Tab stop, ←/→ pick
each tab, and Tab then goes into that tab's fields."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.containers import ScrollableContainer
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import Select, TabbedContent, Tabs

from engine.plan.names import Backend
from engine.plan.specs import demo_spec
from tests.tui.wizard_support import at_step, settle, until
from tui.app import DtrainApp
from tui.screens.profiles import ProfilesScreen
from tui.session import Step

SIZE = (120, 40)
MOST_STOPS = 60
"""More Tab stops than any step has: a walk that has not come back by then is trapped."""


def _app(tmp_path: Path) -> DtrainApp:
    return DtrainApp(
        demo_spec(), out_dir=tmp_path / "b", plan_delay_s=0.01, config_dir=tmp_path / "cfg"
    )


def _name(w: Widget | None) -> str:
    if w is None:
        return "nothing"
    return f"{type(w).__name__}#{w.id}@{_drawn_at(w)}"


def _drawn_at(w: Widget) -> tuple[int, int]:
    """Where ``w`` is drawn (row, column), in the coordinates of the content it scrolls with:
    its screen region plus the scroll offsets of the containers above it, so that widgets
    focused at different scroll positions compare as the page draws them."""
    y, x = w.region.y, w.region.x
    for node in w.ancestors:
        if isinstance(node, Widget):
            y += node.scroll_offset.y
            x += node.scroll_offset.x
    return y, x


def _check_stop(w: Widget | None, within: Widget) -> Widget:
    """``w`` (the widget Tab reached) is a stop a person can see and use."""
    assert w is not None, "Tab left nothing focused"
    assert w is within or within in w.ancestors, f"Tab left {within.id}: {_name(w)}"
    assert not w.disabled and w.visible and w.display, f"Tab landed on a hidden stop {_name(w)}"
    assert all(a.display for a in w.ancestors if isinstance(a, Widget)), _name(w)
    shown = w.region.intersection(within.region if within is not w else w.screen.region)
    assert shown.area > 0, f"Tab landed on {_name(w)}, which is not on screen"
    if isinstance(w, ScrollableContainer) and w.children:  # a pane, not a field
        scrolls = w.max_scroll_y > 0 or w.max_scroll_x > 0
        assert scrolls, f"Tab landed on {_name(w)}, which shows no focus and cannot scroll"
    return w


async def _walk(pilot: Pilot[int], key: str, within: Widget) -> list[Widget]:
    """The stops ``key`` visits from the focused widget until it comes back to it."""
    app = pilot.app
    start = _check_stop(app.focused, within)
    stops = [start]
    for _ in range(MOST_STOPS):
        await pilot.press(key)
        await pilot.pause()
        focused = _check_stop(app.focused, within)
        if focused is start:
            return stops
        assert focused not in stops, f"{key} loops without coming back: {list(map(_name, stops))}"
        stops.append(focused)
    raise AssertionError(f"{key} never came back to {_name(start)}: {list(map(_name, stops))}")


async def _audit(pilot: Pilot[int], within: Widget) -> list[Widget]:
    """Tab from the focused widget follows the screen and Shift+Tab walks it backwards; the
    stops in Tab order from the focused one."""
    forward = await _walk(pilot, "tab", within)
    # One cycle, drawn order: from the topmost stop, each next stop is below or to the right.
    top = min(range(len(forward)), key=lambda i: _drawn_at(forward[i]))
    cycle = forward[top:] + forward[:top]
    where = [_drawn_at(w) for w in cycle]
    assert where == sorted(where) and len(set(where)) == len(where), (
        f"Tab does not follow the screen in {within.id}: {list(map(_name, cycle))}"
    )
    backward = await _walk(pilot, "shift+tab", within)
    assert backward == [forward[0], *reversed(forward[1:])], (
        f"Shift+Tab is not Tab backwards: {list(map(_name, forward))} vs "
        f"{list(map(_name, backward))}"
    )
    return forward


def _pane(app: DtrainApp, step: Step) -> Widget:
    return app.screen.query_one(f"#step-{step}")


def test_every_step_tabs_in_screen_order(tmp_path: Path) -> None:
    asyncio.run(_steps(tmp_path))


async def _steps(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        for i, step in enumerate(Step):
            if i:
                await pilot.press("ctrl+n")
                await at_step(pilot, step)
                await settle(pilot)
            pane = _pane(app, step)
            first = app.focused
            stops = await _audit(pilot, pane)
            assert stops[0] is first and len(stops) > 1, f"{step}: {list(map(_name, stops))}"
            if step == Step.LAUNCH:
                # The slurm backend shows its own rows: they join the order where drawn.
                app.screen.query_one("#f-backend", Select).value = Backend.SLURM.value
                await until(
                    pilot,
                    lambda: app.screen.query_one("#f-slurm_partition").display,
                    "the slurm rows never showed",
                )
                await settle(pilot)
                slurm = await _audit(pilot, pane)
                assert len(slurm) > len(stops), list(map(_name, slurm))


def test_every_model_tab_is_reached_and_picked_by_keyboard(tmp_path: Path) -> None:
    asyncio.run(_model_tabs(tmp_path))


async def _model_tabs(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        pane = _pane(app, Step.MODEL)
        content = pane.query_one("#model-source", TabbedContent)
        stops = await _audit(pilot, pane)
        bars = [w for w in stops if isinstance(w, Tabs)]
        assert len(bars) == 1, f"the tab bar is not one Tab stop: {list(map(_name, stops))}"
        # Shift+Tab from the first field reaches the tab bar (it is drawn just above).
        await pilot.press("shift+tab")
        await until(pilot, lambda: app.focused is bars[0], lambda: f"focus on {_name(app.focused)}")
        order = [p.id for p in content.query("TabPane")]
        assert order == ["src-preset", "src-config", "src-dims", "src-count"]
        # → walks every tab in turn (and wraps), ← walks back.
        start = order.index(content.active)
        for key, step in (("right", 1), ("left", -1)):
            for n in range(1, len(order) + 1):
                await pilot.press(key)
                want = order[(start + step * n) % len(order)]
                await until(
                    pilot,
                    lambda w=want: content.active == w,
                    lambda k=key: f"{k}: {content.active}",
                )
        for tab in order:
            while content.active != tab:
                await pilot.press("right")
            # Tab from the tab bar goes into the tab shown, at its first field.
            await pilot.press("tab")
            shown = content.query_one(f"#{tab}")
            await until(
                pilot,
                lambda s=shown: app.focused is not None and s in app.focused.ancestors,
                lambda t=tab: f"Tab after picking {t} went to {_name(app.focused)}",
            )
            assert app.focused is pane.first_focus(), _name(app.focused)
            await _audit(pilot, pane)
            await pilot.press("shift+tab")
            await until(pilot, lambda: app.focused is bars[0], "Shift+Tab missed the tab bar")


def test_profiles_dialog_tabs_in_screen_order(tmp_path: Path) -> None:
    asyncio.run(_profiles(tmp_path))


async def _profiles(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: isinstance(app.screen, ProfilesScreen), "no profiles dialog")
        await pilot.pause()
        dialog = app.screen.query_one("#profiles-dialog")
        stops = await _audit(pilot, dialog)
        assert stops[0].id == "profiles-table", list(map(_name, stops))
        assert [w.id for w in stops[1:]] == [
            "btn-load",
            "btn-save",
            "btn-save-as",
            "btn-rename",
            "btn-delete",
            "btn-close",
        ]


def test_sidebar_key_hints_are_whole_lines_at_120_columns(tmp_path: Path) -> None:
    asyncio.run(_hints(tmp_path))


async def _hints(tmp_path: Path) -> None:
    app = _app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        nav = app.screen.query_one("#nav")
        drawn = nav.render_lines(Region(0, 0, nav.size.width, nav.size.height))
        # Each row as drawn, less the sidebar's (transparent) left bar and padding.
        lines = ["".join(seg.text for seg in strip).lstrip("█▌▎ ").rstrip() for strip in drawn]
        # "^n next  ^b back" was wider than the sidebar: it wrapped to "^n next  ^b" / "back".
        for hint in ("^n next", "^b back", "F1 help"):
            assert hint in lines, f"{hint!r} is not a line of the sidebar: {lines}"
