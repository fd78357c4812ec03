"""``sky.yaml`` against the installed SkyPilot: the version the ``sky`` extra promises, and
``resources.network_tier: best`` exactly where the plan assumes an RDMA fabric across nodes, read
back by SkyPilot's own task loader (``sky.Task.from_yaml``) and written out again by it."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from engine.plan.names import NetworkTier
from engine.plan.result import Plan
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


def test_the_run_command_runs_preflight_py_when_asked(tmp_path: Path) -> None:
    """sky.yaml's run section under bash, with a `torchrun` on PATH that records its words: the
    training script normally, the bundle's preflight.py when DTRAIN_PREFLIGHT=1 (as the node
    scripts do), with the same options and arguments."""
    import json
    import os
    import subprocess
    import sys

    from tests.engine.test_writers import DUMP

    plan = make_plan(launch={"script": "my train.py", "script_args": ["--epochs", "2"]})
    bundle = tmp_path / "b"
    write_bundle(plan, bundle)
    run = yaml.safe_load((bundle / "sky.yaml").read_text())["run"]
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "dump_args.py").write_text(DUMP)
    fake = tools / "torchrun"
    fake.write_text(f'#!/bin/sh\nexec {sys.executable} {tools / "dump_args.py"} "$@"\n')
    fake.chmod(0o755)

    def argv(extra: dict[str, str]) -> list[str]:
        out = tmp_path / "dump.json"
        env = {
            **os.environ,
            "PATH": f"{tools}:{os.environ['PATH']}",
            "DUMP_TO": str(out),
            "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
            "SKYPILOT_NUM_NODES": "1",
            "SKYPILOT_NODE_RANK": "0",
            "SKYPILOT_NUM_GPUS_PER_NODE": "2",
            "MASTER_PORT": "29511",
            **extra,
        }
        proc = subprocess.run(
            ["bash", "-c", run], cwd=bundle, env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        words: list[str] = json.loads(out.read_text())["argv"]
        return words

    normal = argv({})
    pre = argv({"DTRAIN_PREFLIGHT": "1"})
    i = normal.index("my train.py")
    assert normal[i + 1 :] == ["--epochs", "2"]
    assert pre[:i] == normal[:i] and pre[i] == "preflight.py" and pre[i + 1 :] == normal[i + 1 :]
