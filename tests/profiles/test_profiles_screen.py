"""The profiles dialog driven by Textual's Pilot: list, load, save, save as, delete, rename."""

from __future__ import annotations

from typing import Any

import pytest
from textual.app import App
from textual.widgets import DataTable, Input, Static

from engine.plan.specs import Spec, demo_spec
from profiles.schema import Profile
from profiles.store import ProfileStore
from tests.profiles.conftest import write_profile
from tui.screens.profiles import ProfilesScreen

SIZE = (130, 40)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Host(App[None]):
    """A bare app that opens the dialog and records what it dismisses with."""

    def __init__(self, store: ProfileStore, spec: Spec | None, current: str | None = None) -> None:
        super().__init__()
        self.store = store
        self.spec = spec
        self.current = current
        self.results: list[Profile | None] = []

    def on_mount(self) -> None:
        self.push_screen(
            ProfilesScreen(self.store, spec=self.spec, current=self.current), self.results.append
        )


def _table(app: App[Any]) -> DataTable[str]:
    return app.screen.query_one(DataTable)


def _detail(app: App[Any]) -> str:
    return str(app.screen.query_one("#profiles-detail", Static).render())


async def test_lists_model_cluster_last_use_and_loads(store: ProfileStore) -> None:
    store.save_spec("mine", demo_spec(), description="my demo")
    store.mark_used("mine")
    write_profile(store, "broken", "[hardware]\nnodes = 'x'\n")
    app = Host(store, spec=None, current="mine")
    async with app.run_test(size=SIZE) as pilot:
        table = _table(app)
        rows = {table.get_row_at(i)[0]: table.get_row_at(i) for i in range(table.row_count)}
        assert rows["mine"][1:3] == ["custom 4L×256", "1×2 cpu · local"]
        assert rows["mine"][3] != "never" and rows["local-cpu-demo"][3] == "never"
        assert rows["4-node-h100-ib"][2] == "4×8 h100-sxm · ib-ndr · ssh"
        assert rows["broken"][1] == "BROKEN"
        assert "my demo" in _detail(app)  # the current profile is highlighted
        # the broken one shows its one-line error and cannot be loaded
        table.move_cursor(row=table.get_row_index("broken"))
        await pilot.pause()
        assert "hardware.nodes" in _detail(app)
        await pilot.press("enter")
        await pilot.pause()
        assert app.results == [] and "hardware.nodes" in _detail(app)
        table.move_cursor(row=table.get_row_index("4-node-h100-ib"))
        await pilot.press("enter")
        await pilot.pause()
    assert len(app.results) == 1 and app.results[0] is not None
    assert app.results[0].spec == store.load("4-node-h100-ib").spec
    assert next(e for e in store.list() if e.name == "4-node-h100-ib").last_used is not None


async def test_save_as_then_save(store: ProfileStore) -> None:
    spec = demo_spec()
    spec.training.steps = 5
    app = Host(store, spec=spec)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a")
        prompt = app.screen.query_one("#profiles-prompt", Input)
        assert prompt.has_focus
        await pilot.press(*"bad/name", "enter")
        await pilot.pause()
        assert "not a profile name" in _detail(app) and not store.profiles_dir.exists()
        prompt.value = ""
        await pilot.press(*"my-run", "enter")
        await pilot.pause()
    assert app.results and app.results[0] is not None and app.results[0].name == "my-run"
    assert store.load("my-run").spec == spec

    spec2 = spec.model_copy(deep=True)
    spec2.training.steps = 9
    app = Host(store, spec=spec2, current="my-run")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("s")
        await pilot.pause()
    assert store.load("my-run").training.steps == 9


async def test_save_refuses_a_secret_and_stays_open(store: ProfileStore) -> None:
    spec = demo_spec()
    spec.launch.env = {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123456"}
    app = Host(store, spec=spec)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("a", *"leaky", "enter")
        await pilot.pause()
        assert "never stores" in _detail(app)
        assert isinstance(app.screen, ProfilesScreen)
    assert app.results == [] and not store.user_path("leaky").exists()


async def test_delete_and_rename(store: ProfileStore) -> None:
    store.save_spec("one", demo_spec())
    store.save_spec("two", demo_spec())
    app = Host(store, spec=None, current="one")
    async with app.run_test(size=SIZE) as pilot:
        table = _table(app)
        await pilot.press("d")
        await pilot.pause()
        assert "Delete 'one'?" in _detail(app)
        await pilot.press("n")  # changed my mind
        assert store.is_user("one")
        await pilot.press("d", "y")
        await pilot.pause()
        assert not store.is_user("one") and "one" not in [
            table.get_row_at(i)[0] for i in range(table.row_count)
        ]
        table.move_cursor(row=table.get_row_index("two"))
        await pilot.press("r")
        prompt = app.screen.query_one("#profiles-prompt", Input)
        prompt.value = ""
        await pilot.press(*"three", "enter")
        await pilot.pause()
        assert store.is_user("three") and not store.is_user("two")
        # built-ins are neither deleted nor renamed
        table.move_cursor(row=table.get_row_index("local-cpu-demo"))
        await pilot.press("d")
        await pilot.pause()
        assert "cannot be deleted" in _detail(app)
        await pilot.press("escape")
        await pilot.pause()
    assert app.results == [None]
    assert store.is_builtin("local-cpu-demo")


async def test_wizard_starts_with_a_broken_profile_and_lists_the_others(
    store: ProfileStore,
) -> None:
    """The real app: a broken file on disk neither stops it starting nor hides the others;
    opening the broken one by name is a one-line error."""
    from engine.errors import DtrainError
    from tui.app import DtrainApp, initial_spec

    store.save_spec("good", demo_spec())
    broken = write_profile(store, "broken", "schema_version = 2\n[model\n")
    with pytest.raises(DtrainError) as exc:
        initial_spec("broken", store.config_dir)
    assert "\n" not in str(exc.value) and str(broken) in str(exc.value)
    assert initial_spec("good", store.config_dir) == store.load("good").spec  # --profile good
    spec = initial_spec(None, store.config_dir)
    app = DtrainApp(spec, config_dir=store.config_dir, out_dir=store.config_dir / "bundle")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert isinstance(app.screen, ProfilesScreen)
        table = _table(app)
        rows = {table.get_row_at(i)[0]: table.get_row_at(i)[1] for i in range(table.row_count)}
        assert rows["broken"] == "BROKEN" and rows["good"] == "custom 4L×256"
        assert "4-node-h100-ib" in rows
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, ProfilesScreen)
    assert broken.read_text() == "schema_version = 2\n[model\n"


async def test_loading_a_profile_in_the_wizard_fills_it(store: ProfileStore) -> None:
    from tui.app import DtrainApp

    app = DtrainApp(demo_spec(), config_dir=store.config_dir, out_dir=store.config_dir / "b")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+o")
        await pilot.pause()
        table = _table(app)
        table.move_cursor(row=table.get_row_index("4-node-h100-ib"))
        await pilot.press("enter")
        await pilot.pause()
        assert not isinstance(app.screen, ProfilesScreen)
        assert app.profile_name == "4-node-h100-ib"
        assert app.spec == store.load("4-node-h100-ib").spec


async def test_last_used_profile_is_one_keystroke_away(store: ProfileStore) -> None:
    from datetime import UTC, datetime

    store.save_spec("last-week", demo_spec())
    store.save_spec("aaa-older", demo_spec())
    store.mark_used("aaa-older", datetime(2025, 1, 1, tzinfo=UTC))
    store.mark_used("last-week", datetime(2025, 6, 1, tzinfo=UTC))
    app = Host(store, spec=None)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("enter")
        await pilot.pause()
    assert app.results and app.results[0] is not None and app.results[0].name == "last-week"
