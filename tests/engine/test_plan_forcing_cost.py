"""A forced layout always says what it costs (issue 40): the ``plan`` report names the auto plan
and the extra step time, and the path's "no" answers say they come from the forced strategy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine.plan.annotate import step_time_text

ROOT = Path(__file__).resolve().parents[2]


def test_a_forced_strategy_names_the_auto_plan_and_its_cost() -> None:
    r = subprocess.run(
        [
            sys.executable, "-m", "cli", "plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
            "--gpus-per-node", "8", "--nodes", "4", "--network", "tcp", "--seq-len", "4096",
            "--global-batch", "256", "--strategy", "zero3",
        ],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    forced = next(i for i, line in enumerate(lines) if line.startswith("Forced: ZeRO-3"))
    cost = lines[forced + 1].strip()
    assert cost.startswith("auto plan: 3D (megatron)") and "/step; forcing costs +" in cost, cost
    assert "no such layout applies to this world size" not in r.stdout
    assert "the forced strategy=zero3 rules it out" in r.stdout
    assert "layouts the forced strategy=zero3 allows, none is 15% faster" in r.stdout


def test_step_times_follow_one_rule() -> None:
    assert step_time_text(0.084) == "84 ms/step"
    assert step_time_text(57.07) == "57.1 s/step"
    assert step_time_text(121.0) == "2.0 min/step"
