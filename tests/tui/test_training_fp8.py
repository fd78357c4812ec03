"""FP8 in the wizard (issue 12): the Training step's precision list offers fp8, and choosing it
for a GPU without FP8 tensor cores is refused at the step, in words, until bf16 is chosen; a
light recompute for a model without experts or latent attention likewise."""

from __future__ import annotations

import asyncio
from pathlib import Path

from textual.widgets import Select

from engine.plan.names import Fp8Recipe, Precision, Recompute
from engine.plan.specs import HardwareSpec, ModelSpec, Spec, TrainingSpec
from tests.tui.wizard_support import at_step, to_training, until
from tui.app import DtrainApp


def _app(tmp_path: Path, gpu: str) -> DtrainApp:
    spec = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu=gpu, gpus_per_node=8, nodes=1),
        training=TrainingSpec(seq_len=4096, global_batch=64),
    )
    return DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.05)


def test_fp8_on_a_gpu_without_fp8_is_refused_at_the_training_step(tmp_path: Path) -> None:
    asyncio.run(_fp8(tmp_path))


async def _fp8(tmp_path: Path) -> None:
    app = _app(tmp_path, "a100-80gb")
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        select = app.screen.query_one("#f-precision", Select)
        assert (Precision.FP8.value, Precision.FP8.value) in [
            (str(label), value) for label, value in select._options
        ]
        select.value = Precision.FP8.value
        await until(pilot, lambda: bool(app.session.step_errors["training"]), "fp8 refused")
        problem = " ".join(app.session.step_errors["training"])
        assert "a100-80gb has no FP8 tensor cores" in problem and "bf16" in problem
        await pilot.press("ctrl+n")
        await at_step(pilot, "training")  # refused while the choice stands
        select.value = Precision.BF16.value
        await until(pilot, lambda: not app.session.step_errors["training"], "bf16 accepted")
        assert app.spec.training.precision == Precision.BF16


def test_bf16_gradients_are_chosen_at_the_training_step(tmp_path: Path) -> None:
    asyncio.run(_grads(tmp_path))


async def _grads(tmp_path: Path) -> None:
    app = _app(tmp_path, "h100-sxm")
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        app.screen.query_one("#f-grads_bf16", Select).value = "bf16"
        await until(pilot, lambda: bool(app.spec.training.grads_bf16), "bf16 grads in the spec")
        app.screen.query_one("#f-grads_bf16", Select).value = "auto"
        await until(pilot, lambda: not app.spec.training.grads_bf16, "back to fp32 main grads")


def test_light_recompute_is_refused_for_a_dense_model_at_the_training_step(
    tmp_path: Path,
) -> None:
    asyncio.run(_light(tmp_path))


async def _light(tmp_path: Path) -> None:
    app = _app(tmp_path, "h100-sxm")
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        select = app.screen.query_one("#f-recompute", Select)
        select.value = Recompute.LIGHT.value
        await until(pilot, lambda: bool(app.session.step_errors["training"]), "light refused")
        problem = " ".join(app.session.step_errors["training"])
        assert "recompute" in problem and "neither" in problem
        select.value = Recompute.MLP.value
        await until(pilot, lambda: not app.session.step_errors["training"], "mlp accepted")
        assert app.spec.training.recompute == Recompute.MLP


def test_the_fp8_recipe_is_chosen_at_the_training_step_and_checked_against_the_gpu(
    tmp_path: Path,
) -> None:
    asyncio.run(_recipe(tmp_path))


async def _recipe(tmp_path: Path) -> None:
    app = _app(tmp_path, "h100-sxm")
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        recipe = app.screen.query_one("#f-fp8_recipe", Select)
        recipe.value = Fp8Recipe.BLOCKWISE.value
        # A scaling recipe without fp8 training is refused, in words, at the step.
        await until(pilot, lambda: bool(app.session.step_errors["training"]), "needs fp8")
        assert "pick fp8" in " ".join(app.session.step_errors["training"])
        app.screen.query_one("#f-precision", Select).value = Precision.FP8.value
        await until(pilot, lambda: not app.session.step_errors["training"], "fp8 blockwise")
        assert app.spec.training.fp8_recipe == Fp8Recipe.BLOCKWISE
        # MXFP8 needs tensor cores that apply MX scales: an H100 has none.
        recipe.value = Fp8Recipe.MXFP8.value
        await until(pilot, lambda: bool(app.session.step_errors["training"]), "mxfp8 refused")
        problem = " ".join(app.session.step_errors["training"])
        assert "h100-sxm has no MXFP8 tensor cores" in problem and "b200" in problem
        recipe.value = "auto"
        await until(pilot, lambda: not app.session.step_errors["training"], "default recipe")
        assert app.spec.training.fp8_recipe is None


def test_a_profiles_fp8_recipe_survives_the_training_step(tmp_path: Path) -> None:
    asyncio.run(_kept(tmp_path))


async def _kept(tmp_path: Path) -> None:
    spec = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="b200", gpus_per_node=8, nodes=1),
        training=TrainingSpec(
            seq_len=4096, global_batch=64, precision=Precision.FP8, fp8_recipe=Fp8Recipe.MXFP8
        ),
    )
    app = DtrainApp(spec, out_dir=tmp_path / "b", plan_delay_s=0.05)
    async with app.run_test(size=(120, 40)) as pilot:
        await to_training(pilot)
        assert app.screen.query_one("#f-fp8_recipe", Select).value == Fp8Recipe.MXFP8.value
        app.screen.query_one("#f-grads_bf16", Select).value = "bf16"  # an edit re-reads the step
        await until(pilot, lambda: bool(app.spec.training.grads_bf16), "edit applied")
        assert app.spec.training.fp8_recipe == Fp8Recipe.MXFP8
