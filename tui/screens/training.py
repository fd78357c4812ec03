"""Step 4, the training set-up: sequence length, batch, precision (fp8 where the GPU has it, and
its scaling recipe), Megatron's gradient precision and expert all-to-all overlap, optimizer,
recompute, and the token budget and price the cost estimate uses.

The global batch is the user's: when no layout can split it over the GPUs, the planner's refusal
is shown here, at the field, with the nearest batches that can be trained as buttons (the
planner's ``GlobalBatchError.choices``); a nearby batch that trains clearly faster
(``Plan.batch_choices``) is offered the same way. A forced layout (set in the decision step,
perhaps for an earlier model) is shown as a badge with a button to clear it."""

from __future__ import annotations

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widget import Widget
from textual.widgets import Button, Input, Select, Static

from engine.plan.catalog import get_gpu, list_gpus
from engine.plan.names import Fp8Recipe, Optimizer, Precision, Recompute
from engine.plan.result import BatchChoice
from engine.plan.specs import Spec, TrainingSpec
from tui import services
from tui.format import count
from tui.lifecycle import torn_down
from tui.screens.step import AUTO, StepPane, set_text
from tui.session import Step, WizardSession
from tui.widgets.field_row import FieldRow
from tui.widgets.forced_badge import ForcedBadge

BATCH_FIELD = "training.global_batch"
"""The field the planner names when it refuses a global batch."""

_KINDS = {
    "seq_len": "int",
    "global_batch": "int",
    "micro_batch": "int",
    "tokens": "count",
    "price_per_gpu_hour": "float",
    "lr": "float",
    "steps": "int",
}


class TrainingStep(StepPane):
    STEP = Step.TRAINING

    def __init__(self, session: WizardSession) -> None:
        super().__init__(session)
        self.batch_state: tuple[object, ...] = ()
        """What the batch advice was drawn from (redrawn only when it changes)."""
        self.batch_choices: list[BatchChoice] = []
        """The batches offered as buttons."""
        self.batch_error = ""
        """The planner's refusal of the batch, kept at the field until a plan replaces it."""

    def compose(self) -> ComposeResult:
        yield Static("Training", classes="step-title")
        yield ForcedBadge(id="forced-badge")
        yield Static("", id="training-summary", classes="summary", markup=False)
        yield FieldRow("seq_len", "Sequence length", placeholder="tokens per sequence")
        yield FieldRow("global_batch", "Global batch", placeholder="sequences per optimizer step")
        yield Static("", id="batch-note", markup=False).set_styles("display: none;")
        yield Horizontal(id="batch-choices", classes="buttons").set_styles("display: none;")
        yield FieldRow(
            "micro_batch", "Micro-batch", placeholder="per GPU; empty: the planner picks"
        )
        yield Static("Precision", classes="select-label")
        yield Select(
            [("auto (bf16 where the GPU has it)", AUTO)] + [(p.value, p.value) for p in Precision],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-precision",
        )
        yield Static("FP8 scaling (with fp8)", classes="select-label")
        yield Select(
            [
                ("delayed, per tensor (Megatron's default)", AUTO),
                ("tensorwise: current scaling, per tensor", Fp8Recipe.TENSORWISE.value),
                ("mxfp8: a scale per 32 values (Blackwell)", Fp8Recipe.MXFP8.value),
                ("blockwise: 1x128 / 128x128 blocks", Fp8Recipe.BLOCKWISE.value),
            ],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-fp8_recipe",
        )
        yield Static("Gradients (Megatron)", classes="select-label")
        yield Select(
            [
                ("fp32 main grads (Megatron's default)", AUTO),
                ("bf16 (--grad-reduce-in-bf16)", "bf16"),
            ],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-grads_bf16",
        )
        yield Static("Expert all-to-all (Megatron MoE)", classes="select-label")
        yield Select(
            [
                ("on the critical path (Megatron's default)", AUTO),
                ("overlapped (--overlap-moe-expert-parallel-comm)", "on"),
            ],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-moe_a2a_overlap",
        )
        yield Static("Optimizer", classes="select-label")
        yield Select(
            [(o.value, o.value) for o in Optimizer],
            value=Optimizer.ADAMW.value,
            allow_blank=False,
            compact=True,
            id="f-optimizer",
        )
        yield Static("Recompute", classes="select-label")
        yield Select(
            [("auto (the planner decides)", AUTO)] + [(r.value, r.value) for r in Recompute],
            value=AUTO,
            allow_blank=False,
            compact=True,
            id="f-recompute",
        )
        yield FieldRow(
            "tokens", "Token budget", placeholder="for GPU-hours and cost, e.g. 1T or 2e12"
        )
        yield FieldRow(
            "price_per_gpu_hour", "Price per GPU-hour", placeholder="USD; empty: catalog list price"
        )
        yield FieldRow("lr", "Learning rate", placeholder="optional, for the LR-scaling advice")
        yield FieldRow("steps", "Smoke-test steps", placeholder="steps the example trainer runs")

    def load(self) -> None:
        t = self.session.spec.training
        rows = self.rows()
        rows["seq_len"].value = str(t.seq_len)
        rows["global_batch"].value = str(t.global_batch)
        rows["micro_batch"].value = "" if t.micro_batch is None else str(t.micro_batch)
        rows["tokens"].value = "" if t.tokens is None else f"{t.tokens:g}"
        rows["price_per_gpu_hour"].value = (
            "" if t.price_per_gpu_hour is None else f"{t.price_per_gpu_hour:g}"
        )
        rows["lr"].value = "" if t.lr is None else f"{t.lr:g}"
        rows["steps"].value = str(t.steps)
        self.query_one("#f-precision", Select).value = t.precision.value if t.precision else AUTO
        recipe = t.fp8_recipe if t.fp8_recipe != Fp8Recipe.DELAYED else None
        self.query_one("#f-fp8_recipe", Select).value = recipe.value if recipe else AUTO
        self.query_one("#f-grads_bf16", Select).value = "bf16" if t.grads_bf16 else AUTO
        self.query_one("#f-moe_a2a_overlap", Select).value = "on" if t.moe_a2a_overlap else AUTO
        self.query_one("#f-optimizer", Select).value = t.optimizer.value
        self.query_one("#f-recompute", Select).value = t.recompute.value if t.recompute else AUTO

    def check(self) -> list[str]:
        data, errs = self.read_fields(_KINDS)
        for name in ("seq_len", "global_batch", "steps"):
            if name not in data and name not in errs:
                errs[name] = "required; type a whole number"
        for name in ("precision", "optimizer", "recompute"):
            value = self.select_value(name)
            if value:
                data[name] = value
        if data.get("precision") == Precision.FP8.value:
            gpu = self.session.spec.hardware.gpu
            if gpu in {g.key for g in list_gpus()} and not get_gpu(gpu).fp8_peak_tflops():
                errs["precision"] = (
                    f"{gpu} has no FP8 tensor cores; pick bf16, or a GPU with them on Hardware"
                )
        recipe = self.select_value("fp8_recipe")
        if recipe:
            data["fp8_recipe"] = recipe
            errs.update(_fp8_recipe_problem(recipe, data.get("precision"), self.session.spec))
        if data.get("recompute") == Recompute.LIGHT.value and not _has_light_parts(
            self.session.spec
        ):
            errs["recompute"] = (
                "light frees what MoE experts and latent attention hold, and this model has "
                "neither; pick mlp, full or auto"
            )
        if self.select_value("grads_bf16"):
            data["grads_bf16"] = True
        old = self.session.spec.training
        if self.select_value("moe_a2a_overlap"):
            data["moe_a2a_overlap"] = True
        elif old.moe_a2a_overlap is False:
            data["moe_a2a_overlap"] = False  # a profile's explicit "no" (no offer), kept
        # Fields this step does not show are kept as they were (profiles may set them).
        for name in (
            "reference_batch",
            "grad_clip",
            "global_batch_nearest",
            "cp_comm",
            "moe_dispatcher",
            "moe_capacity_factor",
            "moe_imbalance",
            "fused_cross_entropy",
            "torch_compile",
            "moments_bf16",
            "offload_modules",
            "offload_optimizer_states",
        ):
            data.setdefault(name, getattr(old, name))
        model, problems = self.build(TrainingSpec, data, errs)
        summary = self.query_one("#training-summary", Static)
        if model is None:
            set_text(summary, "")
            return problems
        assert isinstance(model, TrainingSpec)
        text = (
            f"{count(model.global_batch * model.seq_len)} tokens per optimizer step"
            f" = {model.global_batch} sequences × {model.seq_len} tokens"
        )
        if model.tokens:
            steps = model.tokens / (model.global_batch * model.seq_len)
            text += f"\nbudget {count(model.tokens)} tokens ≈ {count(steps)} steps"
        set_text(summary, text)
        self.session.set_section("training", model)
        self.query_one(ForcedBadge).show(self.session.forced_layout)
        return []

    def first_focus(self) -> Widget | None:
        return self.query_one("#f-seq_len", Input)

    # --- the global batch the planner could not split -----------------------------------------
    def draw_session(self) -> None:
        s = self.session
        self.query_one(ForcedBadge).show(s.forced_layout)
        if s.planning:
            return  # the advice stays until the new plan says otherwise
        batch = s.spec.training.global_batch
        if s.plan is None and s.plan_failure.startswith(f"{BATCH_FIELD}:"):
            state: tuple[object, ...] = ("refused", s.generation, s.plan_failure)
            if state != self.batch_state:
                self.batch_state = state
                message = s.plan_failure.removeprefix(f"{BATCH_FIELD}:").strip()
                self._show_batch(message.split("; the nearest")[0], [], error=True)
                self._nearest_worker(s.spec, s.generation)
        elif (
            s.plan is not None
            and s.plan.batch_choices
            and s.plan.spec.training.global_batch == batch
        ):
            state = ("faster", s.generation)
            if state != self.batch_state:
                self.batch_state = state
                self._show_batch(
                    f"a nearby global batch trains clearly faster than {batch}; pick one to "
                    "train it instead",
                    s.plan.batch_choices,
                    error=False,
                )
        elif self.batch_state:
            self.batch_state = ()
            self._show_batch("", [], error=False)
        row = self.rows()["global_batch"]
        if self.batch_error and not row.error:
            row.set_error(self.batch_error)  # re-validating the fields cleared it

    @work(thread=True, exclusive=True, group="batch-choices", exit_on_error=False)
    def _nearest_worker(self, spec: Spec, generation: int) -> None:
        """The planner's nearest trainable batches for a refused one (it refuses with them)."""
        from engine.plan.batch import GlobalBatchError
        from engine.plan.planner import plan

        try:
            plan(spec)
        except GlobalBatchError as e:
            self.app.call_from_thread(self._nearest_found, e.choices, generation)
        except Exception:  # noqa: BLE001 - the refusal itself is already on screen
            return

    def _nearest_found(self, choices: list[BatchChoice], generation: int) -> None:
        if self.batch_state[:2] != ("refused", generation):
            return  # the spec moved on
        if torn_down(self):
            return  # the app is tearing the step down: nothing to show the batches on
        message = self.session.plan_failure.removeprefix(f"{BATCH_FIELD}:").strip()
        head = message.split("; the nearest")[0]
        self._show_batch(f"{head}; pick one of the nearest batches below", choices, error=True)

    def _show_batch(self, text: str, choices: list[BatchChoice], *, error: bool) -> None:
        row = self.rows()["global_batch"]
        if error:
            self.batch_error = text
            row.set_error(text)
            set_text(self.query_one("#batch-note", Static), "")
        else:
            if self.batch_error and row.error == self.batch_error:
                row.set_error(None)
            self.batch_error = ""
            set_text(self.query_one("#batch-note", Static), f"⚠ {text}" if text else "")
        note = self.query_one("#batch-note", Static)
        note.set_class(bool(text) and not error, "-warn")
        note.display = bool(text) and not error
        if [c.global_batch for c in choices] == [c.global_batch for c in self.batch_choices]:
            return
        self.batch_choices = list(choices)
        box = self.query_one("#batch-choices", Horizontal)
        box.display = bool(choices)
        box.remove_children()
        box.mount_all(
            Button(
                f"use {c.global_batch}: {c.layout}"
                + (f", {count(c.tokens_per_s)} tok/s" if c.tokens_per_s else ""),
                id=f"batch-pick-{c.global_batch}",
                compact=True,
            )
            for c in choices
        )

    @on(Button.Pressed)
    def _batch_picked(self, event: Button.Pressed) -> None:
        name = event.button.id or ""
        if name.startswith("batch-pick-"):
            event.stop()
            self.rows()["global_batch"].value = name.removeprefix("batch-pick-")

    @on(ForcedBadge.Cleared)
    def _clear_forced(self, event: ForcedBadge.Cleared) -> None:
        event.stop()
        self.clear_forced_layout()


def _has_light_parts(spec: Spec) -> bool:
    """Whether the model has what a light recompute frees (MoE experts or latent attention);
    a model not yet complete counts as having them (the planner judges it later)."""
    from engine.errors import DtrainError

    try:
        dims = services.resolve_model(spec.model)
    except DtrainError:
        return True
    return dims.light_recompute_frees


def _fp8_recipe_problem(recipe: str, precision: object, spec: Spec) -> dict[str, str]:
    """Why the FP8 scaling cannot apply (keyed by field), or nothing: it needs fp8 training,
    and MXFP8 a GPU whose tensor cores apply MX block scales."""
    if precision != Precision.FP8.value:
        return {"fp8_recipe": "scales FP8 tensors: pick fp8 as the precision, or the default"}
    gpu = spec.hardware.gpu
    if recipe == Fp8Recipe.MXFP8.value and gpu in {g.key for g in list_gpus()}:
        if not get_gpu(gpu).mx_formats:
            with_mx = ", ".join(g.key for g in list_gpus() if g.mx_formats)
            return {
                "fp8_recipe": f"{gpu} has no MXFP8 tensor cores; pick tensorwise or blockwise, "
                f"or a GPU with them ({with_mx}) on Hardware"
            }
    return {}
