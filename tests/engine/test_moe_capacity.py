"""Token-drop MoE training (``--moe-capacity-factor``): the busiest expert rank's load is capped
at the capacity, shapes are static (no device-to-host sync for token counts), and the plan
writes Megatron's flags for what it costed. Dropless routing stays the default."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Framework, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args

ROOT = Path(__file__).resolve().parents[2]


def _spec(capacity: float | None) -> Spec:
    return Spec(
        model=ModelSpec(preset="qwen3-30b-a3b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=256, moe_capacity_factor=capacity),
    )


def test_a_capacity_factor_caps_the_busiest_experts_load() -> None:
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=1, dp=32, ep=8)
    assert perf.moe_imbalance(d) == perf.MOE_IMBALANCE > 1.0
    assert perf.moe_imbalance(replace(d, capacity=1.0)) == 1.0
    assert perf.moe_imbalance(replace(d, capacity=4.0)) == perf.MOE_IMBALANCE


def test_token_drop_is_faster_than_dropless_on_the_same_layout() -> None:
    dims = resolve_model(ModelSpec(preset="qwen3-30b-a3b"))
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=1, dp=32, ep=8)
    hw = perf.Hardware(
        peak_flops=989e12,
        achievable_mfu=0.45,
        intra_bytes_per_s=450e9,
        inter_bytes_per_s=50e9,
        pcie_bytes_per_s=64e9,
        gpus_per_node=8,
        nodes=4,
    )
    dropless = perf.terms(dims, d, hw, 4096).forward
    dropped = perf.terms(dims, replace(d, capacity=1.0), hw, 4096).forward
    assert dropped.mlp < dropless.mlp  # the busiest rank's experts see no more than capacity
    assert dropped.elementwise < dropless.elementwise  # no host sync for the token counts
    assert (
        perf.terms(dims, replace(d, capacity=1.0), hw, 4096).cp_ep
        < perf.terms(dims, d, hw, 4096).cp_ep
    )


def test_the_plan_costs_and_writes_the_capacity_factor() -> None:
    dropless = plan(_spec(None))
    dropped = plan(_spec(1.0))
    assert dropped.recommended.step_time_s < dropless.recommended.step_time_s
    args = megatron_args(dropped).splitlines()
    assert "--moe-expert-capacity-factor 1" in args
    assert "--moe-pad-expert-input-to-capacity" in args
    assert not any("capacity" in a for a in megatron_args(dropless).splitlines())


def test_the_cli_takes_the_capacity_factor_and_refuses_a_bad_one_in_one_line() -> None:
    base = [sys.executable, "-m", "cli", "plan", "--model", "qwen3-30b-a3b", "--gpu", "h100"]
    base += ["--gpus-per-node", "8", "--nodes", "4", "--json"]
    ok = subprocess.run(
        [*base, "--moe-capacity-factor", "1.25"], cwd=ROOT, capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["spec"]["training"]["moe_capacity_factor"] == 1.25
    bad = subprocess.run(
        [*base, "--moe-capacity-factor", "0"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "moe_capacity_factor" in bad.stderr or "capacity" in bad.stderr
