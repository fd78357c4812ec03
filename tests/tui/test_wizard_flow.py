"""The whole wizard driven by key presses, from the first step to a written bundle: a dense model
and a MoE model, asserting what the screen shows and what lands on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from textual.widgets import OptionList

from engine.plan.names import Strategy
from engine.plan.specs import demo_spec
from engine.plan.strategies import DISPLAY_NAME
from tests.tui.wizard_support import at_step, focused_id, retype, settle, text_of, until
from tui.app import DtrainApp


async def _pick_preset(pilot, name: str) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    # The demo spec opens on the Dimensions tab; Shift+Tab reaches the source tabs.
    assert focused_id(app) == "f-layers"
    await pilot.press("shift+tab")
    await pilot.press("left", "left")  # Dimensions -> config.json -> Preset
    await pilot.press("tab")
    assert focused_id(app) == "f-preset"
    await retype(pilot, name[:-1])
    await pilot.press(name[-1], "enter")


async def _hardware(pilot, gpu: str, per_node: int, nodes: int) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    assert focused_id(app) == "f-gpu"
    await retype(pilot, gpu)
    await pilot.press("tab")  # the catalog list below the field is no Tab stop
    assert focused_id(app) == "f-gpus_per_node"
    await retype(pilot, str(per_node))
    await pilot.press("tab")
    await retype(pilot, str(nodes))


def test_dense_model_to_written_bundle(tmp_path: Path) -> None:
    asyncio.run(_dense(tmp_path))


async def _dense(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    app = DtrainApp(demo_spec(), out_dir=out, plan_delay_s=0.25)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await _pick_preset(pilot, "llama-3-8b")
        await until(
            pilot,
            lambda: "8.03 B parameters" in text_of(app, "#model-summary"),
            lambda: f"model summary: {text_of(app, '#model-summary')!r}",
        )
        assert "llama-3-8b" in text_of(app, "#model-summary")
        await pilot.press("ctrl+n")
        await at_step(pilot, "hardware")
        await _hardware(pilot, "h100-sxm", 8, 2)
        assert "H100" in text_of(app, "#hardware-summary")
        assert "world size 16" in text_of(app, "#hardware-summary")
        await pilot.press("ctrl+n")
        await at_step(pilot, "network")
        # Network tier: open the select, move up from tcp to ib-ndr, pick it.
        assert focused_id(app) == "f-tier"
        await pilot.press("enter", "up", "up", "up", "enter")
        await until(
            pilot,
            lambda: app.spec.network.tier.value == "ib-ndr",
            lambda: f"the tier is {app.spec.network.tier.value}, not ib-ndr",
        )
        assert "Gbit/s per node" in text_of(app, "#network-summary")
        assert "NDR" in text_of(app, "#network-summary")
        await pilot.press("ctrl+n")
        assert focused_id(app) == "f-seq_len"
        await retype(pilot, "4096")
        await pilot.press("tab")
        await retype(pilot, "512")
        await pilot.press("ctrl+n")
        await at_step(pilot, "decision")
        await settle(pilot)
        plan = app.plan
        assert plan is not None and plan.model.name == "llama-3-8b" and plan.world_size == 16
        assert plan.spec.training.seq_len == 4096 and plan.spec.training.global_batch == 512
        status = text_of(app, "#plan-status")
        # The status line names the strategy as the plan's text does ("3D", "ZeRO-3").
        assert DISPLAY_NAME[plan.recommended.strategy] in status and "tokens/s" in status
        chart = text_of(app, "#flowchart")
        assert (
            "Does the model fit on one GPU?" in chart
            and f"◀ {plan.recommended.strategy.value}" in chart
        )
        assert plan.path[0].reason.split()[0] in chart  # the planner's own reasons are listed
        cards = app.screen.query("MemoryBars")
        assert len(cards) == 1 + min(len(plan.alternatives), 3)
        assert "step time" in text_of(app, "#metrics")
        await pilot.press("ctrl+n")
        await at_step(pilot, "configs")
        files = app.bundle
        assert {"plan.json", "launch_node0.sh", "launch_node1.sh", "nccl.env"} <= set(files)
        assert "new file" in text_of(app, "#preview-body")
        await pilot.press("ctrl+s")
        await settle(pilot)
        result = text_of(app, "#write-result")
        assert result.startswith("✓ wrote") and str(out.resolve()) in result
        written = json.loads((out / "plan.json").read_text())
        assert written["model"]["name"] == "llama-3-8b"
        assert (out / "launch_node1.sh").exists() and (out / "bundle.json").exists()
        # Back to training, halve the batch: the configs step now diffs against what is on disk.
        await pilot.press("ctrl+b", "ctrl+b")
        await at_step(pilot, "training")
        await pilot.press("tab")
        assert focused_id(app) == "f-global_batch"
        await retype(pilot, "256")
        await pilot.press("ctrl+n", "ctrl+n")
        await settle(pilot)
        await at_step(pilot, "configs")
        names = sorted(app.bundle)
        file_list = app.screen.query_one("#file-list", OptionList)
        labels = [str(file_list.get_option_at_index(i).prompt) for i in range(len(names))]
        assert "~ plan.json" in labels and "= train.py" in labels
        file_list.highlighted = names.index("plan.json")
        await until(
            pilot,
            lambda: "differs from" in text_of(app, "#preview-body"),
            "the preview never showed plan.json's diff",
        )
        preview = text_of(app, "#preview-body")
        assert "Diff against the output directory" in preview
        assert '-    "global_batch": 512' in preview or "-" in preview.split("Diff")[1]
        # A file the user edited is never overwritten silently: the first ^s refuses …
        edited = (out / "nccl.env").read_text() + "# my tweak\n"
        (out / "nccl.env").write_text(edited)
        await pilot.press("ctrl+s")
        await settle(pilot)
        result = text_of(app, "#write-result")
        assert result.startswith("✗") and "nccl.env" in result and "press ^s again" in result
        assert (
            json.loads((out / "plan.json").read_text())["spec"]["training"]["global_batch"] == 512
        )
        # … the second one backs it up and writes.
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert "backed up 1 edited file" in text_of(app, "#write-result")
    assert json.loads((out / "plan.json").read_text())["spec"]["training"]["global_batch"] == 256
    backups = list(out.glob("nccl.env.bak-*"))
    assert len(backups) == 1 and backups[0].read_text() == edited


def test_moe_model_to_written_bundle_and_forced_layout(tmp_path: Path) -> None:
    asyncio.run(_moe(tmp_path))


async def _moe(tmp_path: Path) -> None:
    out = tmp_path / "moe"
    # A global batch that 16 data-parallel replicas can train exactly (the demo's 8 cannot, so
    # forcing pure ZeRO-3 on 2 x 8 GPUs would be refused, rightly).
    spec = demo_spec()
    spec = spec.model_copy(
        update={"training": spec.training.model_copy(update={"global_batch": 64})}
    )
    app = DtrainApp(spec, out_dir=out, plan_delay_s=0.25)
    async with app.run_test(size=(160, 48)) as pilot:
        await settle(pilot)
        await _pick_preset(pilot, "mixtral-8x7b")
        summary = text_of(app, "#model-summary")
        assert "active per token" in summary and "8 experts, top-2" in summary
        await pilot.press("ctrl+n")
        await _hardware(pilot, "h100-sxm", 8, 2)
        await pilot.press("ctrl+n", "ctrl+n")
        await at_step(pilot, "training")
        await pilot.press("ctrl+n")
        await settle(pilot)
        plan = app.plan
        assert plan is not None and plan.model.is_moe and not plan.forced
        # Force ZeRO-3 from the decision step: it re-plans at once.
        assert app.focused is app.wizard.pane("decision")  # arrows scroll the report
        await pilot.press("tab")  # Tab reaches the force controls
        assert focused_id(app) == "f-strategy"
        await pilot.press("enter", *["down"] * (list(Strategy).index(Strategy.ZERO3) + 1), "enter")
        await settle(pilot)
        assert app.spec.layout.strategy == Strategy.ZERO3
        assert app.plan is not None and app.plan.forced
        assert app.plan.recommended.strategy == Strategy.ZERO3
        assert "(forced)" in text_of(app, "#plan-status")
        # An impossible degree: the planner's one-line refusal is shown and blocks Next.
        await pilot.press("tab")
        assert focused_id(app) == "f-tp"
        await retype(pilot, "3")
        await settle(pilot)
        assert app.plan is None
        refusal = text_of(app, "#plan-status")
        assert refusal.startswith("✗") and "3" in refusal
        await pilot.press("ctrl+n")
        await at_step(pilot, "decision")
        await pilot.press("ctrl+a", "ctrl+k")
        await settle(pilot)
        assert app.plan is not None and app.plan.recommended.strategy == Strategy.ZERO3
        await pilot.press("ctrl+n")
        await at_step(pilot, "configs")
        await pilot.press("ctrl+s")
        await settle(pilot)
        assert text_of(app, "#write-result").startswith("✓ wrote")
    plan_json = json.loads((out / "plan.json").read_text())
    assert plan_json["model"]["num_experts"] == 8
    assert plan_json["recommended"]["strategy"] == "zero3"
    assert (out / "ds_config.json").exists() or (out / "fsdp.json").exists()
