"""Names a bundle gives: the run's name and the order of numbered files.

Both are pure functions with no clock in them, so a bundle written twice reads the same.
"""

from __future__ import annotations

import re

from engine.plan.result import Plan

_NAME_RE = re.compile(r"[^a-z0-9-]+")


def natural_key(name: str) -> list[object]:
    """Sort key putting ``launch_node2.sh`` before ``launch_node10.sh``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def run_name(plan: Plan) -> str:
    """A stable run name, e.g. ``llama-2-7b-zero2-1x8``: no timestamp, so output is repeatable."""
    lay = plan.recommended
    raw = f"{plan.model.name}-{lay.strategy.value}-{plan.nodes}x{plan.gpus_per_node}"
    name = _NAME_RE.sub("-", raw.lower()).strip("-")
    return re.sub(r"-{2,}", "-", name)[:60].strip("-") or "dtrain-run"
