"""Step 4, the training set-up: sequence length, batch, precision, optimizer, recompute, and the
token budget and price the cost estimate uses."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Select, Static

from engine.plan.specs import Optimizer, Precision, Recompute, TrainingSpec
from tui.format import count
from tui.screens.step import AUTO, StepPane, set_text
from tui.session import Step
from tui.widgets.field_row import FieldRow

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

    def compose(self) -> ComposeResult:
        yield Static("Training", classes="step-title")
        yield Static("", id="training-summary", classes="summary", markup=False)
        yield FieldRow("seq_len", "Sequence length", placeholder="tokens per sequence")
        yield FieldRow("global_batch", "Global batch", placeholder="sequences per optimizer step")
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
        old = self.session.spec.training
        # Fields this step does not show are kept as they were (profiles may set them).
        for name in ("reference_batch", "grad_clip"):
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
        return []
