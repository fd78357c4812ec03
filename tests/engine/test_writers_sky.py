"""``sky.yaml`` against the installed SkyPilot: the version the ``sky`` extra promises, and
``resources.network_tier: best`` exactly where the plan assumes an RDMA fabric across nodes, read
back by SkyPilot's own task loader (``sky.Task.from_yaml``) and written out again by it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from engine.plan.result import Plan
from engine.plan.specs import NetworkTier
from engine.write import write_bundle
from engine.write.sky import sky_task_dict, wants_best_network
from tests.engine.writers_fixtures import golden_plans, make_plan

sky = pytest.importorskip("sky")
RDMA = {NetworkTier.IB, NetworkTier.IB_HDR, NetworkTier.IB_NDR, NetworkTier.EFA, NetworkTier.ROCE}


def _load(plan: Plan, tmp: Path) -> object:
    write_bundle(plan, tmp)
    return sky.Task.from_yaml(str(tmp / "sky.yaml"))


def _tiers(task: object) -> list[str | None]:
    """Each resource's network tier as SkyPilot parsed it ("best"), None where unset."""
    tiers = [r.network_tier for r in task.resources]  # type: ignore[attr-defined]
    return [None if t is None else t.value for t in tiers]


def test_the_installed_skypilot_is_the_one_the_sky_extra_requires() -> None:
    """pip once fell back to skypilot 0.9.2 (no network_tier) over a click conflict with the dev
    extra's huggingface_hub; pyproject.toml's caps keep it from happening again."""
    got = tuple(int(p) for p in version("skypilot").split(".")[:2])
    assert got >= (0, 10), f"skypilot {version('skypilot')} installed; the sky extra needs >= 0.10"


@pytest.mark.parametrize("tier", list(NetworkTier))
@pytest.mark.parametrize("nodes", [1, 2])
def test_network_tier_best_where_the_plan_assumes_rdma_across_nodes(
    tier: NetworkTier, nodes: int, tmp_path: Path
) -> None:
    plan = make_plan(gpu="h100-sxm", gpus_per_node=8, nodes=nodes, tier=tier)
    task = _load(plan, tmp_path)
    want = "best" if nodes > 1 and tier in RDMA else None
    assert _tiers(task) == [want]
    assert wants_best_network(plan) == (want is not None)
    # SkyPilot writes the field back out (what its client sends the API server).
    out = task.to_yaml_config()  # type: ignore[attr-defined]
    assert out["resources"].get("network_tier") == want
    text = (tmp_path / "sky.yaml").read_text()
    assert ("# Network: the plan assumes" in text) == (want is not None)


@pytest.mark.parametrize("name", sorted(golden_plans()))
def test_every_golden_ib_or_efa_plan_asks_for_the_fabric(name: str, tmp_path: Path) -> None:
    plan = golden_plans()[name]
    task = _load(plan, tmp_path)
    fast = plan.nodes > 1 and plan.spec.network.tier in RDMA
    assert _tiers(task) == ["best" if fast else None]
    on_disk = yaml.safe_load((tmp_path / "sky.yaml").read_text())
    assert on_disk["resources"] == sky_task_dict(plan)["resources"]
    if fast:
        assert list(on_disk["resources"])[-1] == "network_tier"  # after cloud and accelerators
