"""The wizard screen: the step sidebar, one pane per step (model → … → launch), a status line and
the keys to move. It decides whether a step may be left forward (never while it has errors)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Button, ContentSwitcher, Footer, Header, Static

from tui.messages import StepValidated
from tui.screens.step import StepPane
from tui.widgets.step_nav import StepNav

if TYPE_CHECKING:
    from tui.app import DtrainApp
    from tui.screens.configs import ConfigsStep
    from tui.screens.decision import DecisionStep
    from tui.screens.launch import LaunchStep

STEP_TITLES: tuple[tuple[str, str], ...] = (
    ("model", "Model"),
    ("hardware", "Hardware"),
    ("network", "Network"),
    ("training", "Training"),
    ("decision", "Decision"),
    ("configs", "Configs"),
    ("launch", "Launch"),
)
STEP_KEYS: tuple[str, ...] = tuple(k for k, _ in STEP_TITLES)
_STEP_CLASS_NAMES = {
    "model": "ModelStep",
    "hardware": "HardwareStep",
    "network": "NetworkStep",
    "training": "TrainingStep",
    "decision": "DecisionStep",
    "configs": "ConfigsStep",
    "launch": "LaunchStep",
}


def step_class(step: str) -> type[StepPane]:
    """The pane class of ``step``; its module is imported on first use (start-up speed)."""
    module = importlib.import_module(f"tui.screens.{step}")
    cls: type[StepPane] = getattr(module, _STEP_CLASS_NAMES[step])
    return cls


INPUT_STEPS = ("model", "hardware", "network", "training")
"""The steps whose spec parts the planner needs; planning waits until all four are valid."""


class WizardScreen(Screen[None]):
    BINDINGS = [
        Binding("ctrl+n", "next", "Next", priority=True),
        Binding("ctrl+b", "back", "Back", priority=True),
        Binding("ctrl+s", "app.write_bundle", "Write", priority=True),
        Binding("ctrl+l", "app.launch", "Launch", priority=True, show=False),
        Binding("ctrl+r", "app.replan", "Re-plan", show=False),
        Binding("ctrl+o", "app.profiles", "Profiles"),
        Binding("ctrl+t", "app.toggle_dark", "Theme", show=False),
        Binding("f1", "app.help", "Help"),
    ]

    def __init__(self) -> None:
        super().__init__(id="wizard")
        self.current = STEP_KEYS[0]
        self.step_errors: dict[str, list[str]] = {}
        self._status: tuple[str, bool] = ("", False)

    @property
    def dtrain(self) -> DtrainApp:
        return cast("DtrainApp", self.app)

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False, icon="≡")
        with Horizontal(id="main"):
            yield StepNav(list(STEP_TITLES), id="nav")
            # Steps are built when first visited, the first one right after the first frame:
            # the frame (sidebar, status line, keys) is on screen before the fields are built.
            yield ContentSwitcher(id="steps")
        with Horizontal(id="navbar"):
            yield Button("◀ Back", id="back", compact=True)
            yield Static("", id="status-line", markup=False)
            yield Button("Next ▶", id="next", compact=True)
        yield Footer()

    def on_mount(self) -> None:
        for button in self.query("#navbar Button"):
            button.can_focus = False  # clicking Back/Next keeps the focus in the step's fields
        self.sub_title = "model → hardware → network → training → decision → configs → launch"
        self.call_after_refresh(self._enter, self.current)
        self.call_after_refresh(self.dtrain.schedule_plan)

    # --- panes --------------------------------------------------------------------------------
    def pane(self, step: str) -> StepPane | None:
        """The step's pane, or None while it has not been visited yet."""
        found = self.query(f"#step-{step}")
        return cast(StepPane, found.first()) if found else None

    @property
    def decision(self) -> DecisionStep | None:
        return cast("DecisionStep | None", self.pane("decision"))

    @property
    def configs(self) -> ConfigsStep | None:
        return cast("ConfigsStep | None", self.pane("configs"))

    @property
    def launch(self) -> LaunchStep | None:
        return cast("LaunchStep | None", self.pane("launch"))

    def inputs_valid(self) -> bool:
        return all(not self.step_errors.get(s) for s in INPUT_STEPS)

    def first_invalid(self, upto: str) -> str | None:
        """The first step before ``upto`` that has errors (None if all are valid)."""
        for key in STEP_KEYS[: STEP_KEYS.index(upto)]:
            if self.step_errors.get(key):
                return key
        return None

    def refresh_nav(self) -> None:
        invalid = {k: bool(v) for k, v in self.step_errors.items()}
        pending = {"decision"} if self.dtrain.planning else set()
        self.query_one(StepNav).set_state(self.current, invalid, pending)

    def set_status(self, text: str, *, error: bool = False) -> None:
        if (text, error) == self._status:
            return
        self._status = (text, error)
        line = self.query_one("#status-line", Static)
        line.update(text)
        line.set_class(error, "-error")

    @on(StepValidated)
    def _validated(self, event: StepValidated) -> None:
        event.stop()
        self.step_errors[event.step] = event.errors
        self.refresh_nav()
        if event.step == self.current and event.errors:
            self.set_status(f"✗ {event.errors[0]}", error=True)
        elif event.step == self.current:
            self.set_status(self.dtrain.status_text())
        if event.step in INPUT_STEPS or event.step in ("decision", "launch"):
            self.dtrain.schedule_plan()

    # --- moving -------------------------------------------------------------------------------
    async def action_next(self) -> None:
        i = STEP_KEYS.index(self.current)
        if i + 1 < len(STEP_KEYS):
            await self.go(STEP_KEYS[i + 1])

    async def action_back(self) -> None:
        i = STEP_KEYS.index(self.current)
        if i > 0:
            await self.go(STEP_KEYS[i - 1])

    @on(Button.Pressed, "#next")
    async def _next_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        await self.action_next()

    @on(Button.Pressed, "#back")
    async def _back_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        await self.action_back()

    @on(StepNav.Picked)
    async def _picked(self, event: StepNav.Picked) -> None:
        event.stop()
        await self.go(event.step)

    async def go(self, step: str) -> bool:
        """Move to ``step``; forward moves are refused while an earlier step is invalid."""
        if step == self.current:
            return True
        target = STEP_KEYS.index(step)
        if target > STEP_KEYS.index(self.current):
            bad = self.first_invalid(step)
            if bad is None and step in ("configs", "launch") and self.dtrain.plan is None:
                bad = "decision"
                if not self.step_errors.get("decision"):
                    self.step_errors["decision"] = ["no plan yet (planning…)"]
            if bad is not None:
                errors = self.step_errors.get(bad) or ["invalid"]
                self.set_status(f"✗ fix {bad} first: {errors[0]}", error=True)
                self.app.bell()
                if bad != self.current:
                    await self._enter(bad)
                return False
        await self._enter(step)
        return True

    async def _enter(self, step: str) -> None:
        switcher = self.query_one(ContentSwitcher)
        pane = self.pane(step)
        if pane is None:
            pane = step_class(step)()
            await switcher.mount(pane)
        elif step in ("network", "launch"):
            pane.revalidate()  # their summaries depend on the hardware step
        self.current = step
        switcher.current = f"step-{step}"
        if step == "configs":
            self.dtrain.want_bundle()
            cast("ConfigsStep", pane).refresh_files()
        target = pane.first_focus()
        if target is not None:
            target.focus()
        self.refresh_nav()
        errors = self.step_errors.get(step)
        if errors:
            self.set_status(f"✗ {errors[0]}", error=True)
        else:
            self.set_status(self.dtrain.status_text())
        self.query_one("#back", Button).disabled = step == STEP_KEYS[0]
        self.query_one("#next", Button).disabled = step == STEP_KEYS[-1]
