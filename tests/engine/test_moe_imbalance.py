"""The busiest expert rank's load as the user states it (``--moe-imbalance``): a benchmark that
forces balanced routing (Megatron's ``--moe-router-force-load-balancing``, AutoModel's fake
balanced gate) says 1.0; unset, the planner assumes 15 % above the mean under dropless routing.
A planning input only: no flag is written for it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.names import Framework, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args

ROOT = Path(__file__).resolve().parents[2]


def _spec(imbalance: float | None, preset: str = "qwen3-30b-a3b") -> Spec:
    return Spec(
        model=ModelSpec(preset=preset),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=256, moe_imbalance=imbalance),
        layout=LayoutSpec(strategy=Strategy.THREE_D, tp=1, pp=1, dp=32, ep=8),
    )


def test_the_stated_load_replaces_the_assumption_and_a_capacity_still_caps_it() -> None:
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=1, pp=1, dp=32, ep=8)
    assert perf.moe_imbalance(d) == perf.MOE_IMBALANCE
    assert perf.moe_imbalance(replace(d, imbalance=1.0)) == 1.0
    assert perf.moe_imbalance(replace(d, imbalance=1.4)) == 1.4
    assert perf.moe_imbalance(replace(d, imbalance=1.4, capacity=1.25)) == 1.25
    assert perf.moe_imbalance(replace(d, ep=1, imbalance=1.4)) == 1.0


def test_the_plan_costs_the_stated_load_and_writes_nothing_for_it() -> None:
    assumed, balanced, skewed = (plan(_spec(x)) for x in (None, 1.0, 1.5))
    times = [p.recommended.step_time_s for p in (balanced, assumed, skewed)]
    assert times == sorted(times) and len(set(times)) == 3
    assert not any("moe_imbalance" in w for w in balanced.warnings)
    written = megatron_args(balanced)
    assert written == megatron_args(assumed)
    assert "force-load-balancing" not in written


def test_a_load_the_plan_cannot_use_is_named() -> None:
    dense = plan(_spec(1.0, preset="llama-3-8b").model_copy(update={"layout": LayoutSpec()}))
    said = [w for w in dense.warnings if w.startswith("training.moe_imbalance:")]
    assert len(said) == 1 and "--moe-imbalance" in said[0]


def test_the_cli_takes_the_load_and_refuses_a_bad_one_in_one_line() -> None:
    base = [sys.executable, "-m", "cli", "plan", "--model", "qwen3-30b-a3b", "--gpu", "h100"]
    base += ["--gpus-per-node", "8", "--nodes", "4", "--json"]
    ok = subprocess.run([*base, "--moe-imbalance", "1"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["spec"]["training"]["moe_imbalance"] == 1.0
    bad = subprocess.run(
        [*base, "--moe-imbalance", "0.5"], cwd=ROOT, capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "moe_imbalance" in bad.stderr
    assert "Traceback" not in bad.stderr
