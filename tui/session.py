"""The wizard's state: one :class:`WizardSession` per app, read and edited by the app and every
step; :class:`Step` names the steps, once.

``tui.app.DtrainApp`` creates the session and keeps it in step with the planner's workers; the
wizard screen moves between steps through it and draws it; each step reads its part of the spec
from it and hands back a validated sub-spec. Plain Python (no Textual): what the wizard holds
and which moves it allows is testable without a terminal.

The plan and the bundle follow the spec by *generation*: each plan started gets the next number,
and a result for an older generation is stale (a newer spec was asked for) and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tui.format import count, step_time, wizard_words

if TYPE_CHECKING:
    from engine.plan.result import Plan
    from engine.plan.specs import LayoutSpec, Spec


class Step(StrEnum):
    """The wizard's steps, in order."""

    MODEL = "model"
    HARDWARE = "hardware"
    NETWORK = "network"
    TRAINING = "training"
    DECISION = "decision"
    CONFIGS = "configs"
    LAUNCH = "launch"

    @property
    def label(self) -> str:
        """``Model``, ``Hardware``…: how the sidebar, the help and the palette name the step."""
        return self.value.capitalize()

    @property
    def number(self) -> int:
        """1-based position, as the sidebar and the help number the steps."""
        return list(Step).index(self) + 1


INPUT_STEPS = (Step.MODEL, Step.HARDWARE, Step.NETWORK, Step.TRAINING)
"""The steps whose spec parts the planner needs; planning waits until all four are valid."""

NEEDS_PLAN = (Step.CONFIGS, Step.LAUNCH)
"""Steps that show what the plan produced: they can't be entered without a plan."""


class WizardSession:
    """The spec being edited, where the user is, each step's errors, and the plan and bundle
    computed from the spec. ``spec`` None: ``default_spec()`` is read on first use (so the default
    profile is read after the first frame is drawn)."""

    def __init__(
        self,
        spec: Spec | None,
        default_spec: Callable[[], Spec],
        *,
        out_dir: Path | None,
        run_root: Path | None,
        show_timings: bool = True,
    ) -> None:
        self._spec = spec
        self._default_spec = default_spec
        self._out_dir = out_dir
        """Where the bundle is written, when chosen (None: :func:`default_out_dir` of the
        set-up, so a new set-up never previews as changes to another one's bundle)."""
        self.run_root = run_root
        """Where runs keep their logs; None: the engine's default (user data dir)."""
        self.show_timings = show_timings
        """Show how long planning took (off for snapshot tests, which must be repeatable)."""
        self.current = Step.MODEL
        self.step_errors: dict[Step, list[str]] = {}
        self.plan: Plan | None = None
        self.plan_elapsed_s = 0.0
        self.forcing = ""
        """With a forced layout: the auto plan and what forcing costs, in one line."""
        self.plan_failure = ""
        self.planning = False
        """A plan is scheduled or running for the current spec."""
        self.generation = 0
        self._planned_spec: Spec | None = None
        self.bundle: dict[str, str] = {}
        self.bundle_error = ""
        self.bundle_wanted = False
        """The decision step (or a later one) was opened: from then on every plan is rendered
        too, so Configs opens on its files (until then the writers are not run, so typing in the
        first steps costs one plan per pause, no more)."""
        self._bundle_generation = -1

    # --- the spec -----------------------------------------------------------------------------
    @property
    def out_dir(self) -> Path:
        """Where the bundle is written: the one chosen, else one named after the set-up."""
        return self._out_dir if self._out_dir is not None else default_out_dir(self.spec)

    @out_dir.setter
    def out_dir(self, value: Path) -> None:
        # The set-up's own directory, typed back as it was shown, keeps following the set-up.
        if self._out_dir is not None or value != default_out_dir(self.spec):
            self._out_dir = value

    @property
    def out_dir_follows_setup(self) -> bool:
        return self._out_dir is None

    @property
    def spec(self) -> Spec:
        if self._spec is None:
            self._spec = self._default_spec()
        return self._spec

    @spec.setter
    def spec(self, value: Spec) -> None:
        self._spec = value

    @property
    def forced_layout(self) -> LayoutSpec:
        """What the decision step forces (every field None: the planner chooses)."""
        return self.spec.layout

    def set_section(self, section: str, value: Any) -> None:
        """A step hands over a validated sub-spec (``model``, ``hardware``, … ``launch``)."""
        if getattr(self.spec, section) != value:
            self.spec = self.spec.model_copy(update={section: value})

    # --- steps --------------------------------------------------------------------------------
    def record(self, step: Step, errors: list[str]) -> None:
        self.step_errors[step] = errors

    def errors(self, step: Step) -> list[str]:
        if step == Step.TRAINING and self.batch_refused:
            return [*(self.step_errors.get(step) or []), self.plan_failure]
        return self.step_errors.get(step) or []

    @property
    def batch_refused(self) -> bool:
        """No plan because no layout trains the global batch: Training's field is at fault."""
        return self.plan is None and self.plan_failure.startswith("training.global_batch:")

    def inputs_valid(self) -> bool:
        return not any(self.step_errors.get(s) for s in INPUT_STEPS)

    def blocker(self, target: Step) -> Step | None:
        """The step that must be fixed before moving to ``target`` (None: the move is allowed).
        Moving back is always allowed; forward, every step before ``target`` must be valid, and
        the steps that show the plan's output need a plan."""
        order = list(Step)
        if order.index(target) <= order.index(self.current):
            return None
        for step in order[: order.index(target)]:
            if self.errors(step):
                return step
        if target in NEEDS_PLAN and self.plan is None:
            if not self.step_errors.get(Step.DECISION):
                self.step_errors[Step.DECISION] = ["no plan yet (planning…)"]
            return Step.DECISION
        return None

    # --- the plan -----------------------------------------------------------------------------
    def refuse_plan(self) -> None:
        """An input step is invalid: no plan (one still running is now stale), and the
        decision step says which step to fix."""
        bad = next(s for s in INPUT_STEPS if self.step_errors.get(s))
        self.generation += 1
        self.planning = False
        self.plan = None
        self._planned_spec = None
        self.plan_failure = f"fix the {bad} step first: {self.step_errors[bad][0]}"
        self.bundle = {}
        self.bundle_error = "No plan: fix the earlier steps."
        self.step_errors[Step.DECISION] = [self.plan_failure]

    def plan_is_current(self) -> bool:
        """The plan shown (or being computed) is for the spec as it is now."""
        return self._planned_spec == self.spec and (self.plan is not None or self.planning)

    def forget_plan(self) -> None:
        """Plan again even if the spec did not change (re-plan asked for, a profile loaded)."""
        self._planned_spec = None

    def begin_plan(self) -> tuple[Spec, int]:
        """A plan starts for the current spec: the spec and its generation."""
        self.generation += 1
        self._planned_spec = self.spec
        return self.spec, self.generation

    def plan_computed(
        self, plan: Plan, generation: int, elapsed_s: float, forcing: str = ""
    ) -> bool:
        """Take the planner's result; False (ignored) when it is stale."""
        if generation != self.generation:
            return False
        self.plan = plan
        self.forcing = forcing
        self.plan_failure = ""
        self.bundle_error = ""
        self.plan_elapsed_s = elapsed_s
        self.step_errors[Step.DECISION] = []
        return True

    def plan_failed(self, message: str, generation: int) -> bool:
        """Take the planner's refusal; False (ignored) when it is stale."""
        if generation != self.generation:
            return False
        self.plan = None
        self.plan_failure = wizard_words(message)
        self.bundle = {}
        self.bundle_error = f"No plan: {message}"
        self.step_errors[Step.DECISION] = [message]
        return True

    # --- the bundle ---------------------------------------------------------------------------
    def needs_render(self) -> bool:
        """The bundle is wanted and not yet rendered for the current plan."""
        return (
            self.bundle_wanted
            and self.plan is not None
            and self._bundle_generation != self.generation
        )

    def bundle_rendered(self, files: dict[str, str], generation: int) -> bool:
        if generation != self.generation:
            return False
        self.bundle = files
        self._bundle_generation = generation
        self.bundle_error = ""
        return True

    def bundle_failed(self, message: str, generation: int) -> bool:
        if generation != self.generation:
            return False
        self.bundle = {}
        self._bundle_generation = generation
        self.bundle_error = f"The writers refused this plan: {message}"
        return True

    # --- what the status line says ------------------------------------------------------------
    def plan_summary(self) -> str:
        """The status line of a valid step: the recommended layout in one line."""
        if self.plan is None:
            return "Planning…" if self.planning else "No plan yet."
        lay = self.plan.recommended
        from engine.plan.strategies import FRAMEWORK_OF

        # The verdict first: at 80 columns the line is cut at its end. The strategy names its
        # usual framework (3d: megatron, zero*: deepspeed); only a forced other one is added.
        name = lay.strategy.value
        if FRAMEWORK_OF.get(lay.strategy) != lay.framework:
            name += f" · {lay.framework.value}"
        return (
            f"{'fits' if lay.fits else 'does NOT fit'} · {name} · "
            f"{step_time(lay.step_time_s)} · {count(lay.tokens_per_s)} tok/s"
        )


DEFAULT_OUT_DIR = Path("dtrain-bundle")
"""The built-in CPU demo's bundle directory; every other set-up gets one of its own beside it."""


def default_out_dir(spec: Spec) -> Path:
    """The bundle directory of a set-up no one chose one for: ``dtrain-bundle`` for the demo,
    else named after the model and the machines (``dtrain-bundle-llama-3-70b-4x8-h100-sxm``)."""
    from engine.plan.specs import demo_spec

    demo = demo_spec()
    if spec.model == demo.model and spec.hardware == demo.hardware:
        return DEFAULT_OUT_DIR
    return Path(f"{DEFAULT_OUT_DIR}-{setup_slug(spec)}")


def setup_name(spec: Spec) -> str:
    """The set-up in a few words, for the title: ``llama-3-70b on 4×8 h100-sxm``."""
    m, hw = spec.model, spec.hardware
    model = m.preset or (m.config_path.stem if m.config_path else "custom model")
    where = (
        f"{hw.gpus_per_node} {hw.gpu}"
        if hw.nodes == 1
        else f"{hw.nodes}×{hw.gpus_per_node} {hw.gpu}"
    )
    return f"{model} on {where}"


def setup_slug(spec: Spec) -> str:
    import re

    m, hw = spec.model, spec.hardware
    model = m.preset or (m.config_path.stem if m.config_path else "custom")
    raw = f"{model}-{hw.nodes}x{hw.gpus_per_node}-{hw.gpu}".lower()
    return re.sub(r"[^a-z0-9.]+", "-", raw).strip("-")[:60] or "setup"
