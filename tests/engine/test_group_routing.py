"""Group-limited routing (DeepSeek-V3's node-limited routing, report §2.1.2): the 256 experts
fall into ``n_group`` 8 contiguous groups and each token's 8 experts come from the
``topk_group`` 4 groups of highest affinity. With EP64 over eight 8-GPU nodes a group is a node,
so a hierarchical dispatcher (DeepEP) sends a token to at most 4 nodes: fewer copies cross the
network than under unrestricted routing."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.models import load_hf_config, preset_config, resolve_model
from engine.plan.names import Framework, MoeDispatcher, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware


def _sampled_reach(domains: int, k: int, groups: int, topk: int, trials: int = 20000) -> float:
    """The same probability drawn as the router draws it: ``topk`` distinct groups, then ``k``
    distinct experts among theirs (256 experts laid over the domains in order)."""
    rng = random.Random(0)
    experts = 256
    per_group, per_domain = experts // groups, experts // domains
    hits = 0
    for _ in range(trials):
        chosen = rng.sample(range(groups), topk)
        pool = [g * per_group + i for g in chosen for i in range(per_group)]
        picked = rng.sample(pool, k)
        hits += any(e // per_domain == 1 for e in picked)  # domain 1: another domain
    return hits / trials


@pytest.mark.parametrize(("domains", "groups", "topk"), [(8, 8, 4), (4, 8, 4), (16, 8, 4)])
def test_the_reach_is_what_the_router_draws(domains: int, groups: int, topk: int) -> None:
    free = perf.domain_reach(domains, 8)
    limited = perf.domain_reach(domains, 8, groups, topk)
    assert free == pytest.approx(1 - (1 - 1 / domains) ** 8)
    assert limited < free
    assert limited == pytest.approx(_sampled_reach(domains, 8, groups, topk), abs=0.03)


def test_groups_that_do_not_restrict_change_nothing() -> None:
    assert perf.domain_reach(8, 8, 8, 8) == perf.domain_reach(8, 8)
    assert perf.domain_reach(3, 8, 8, 4) == perf.domain_reach(3, 8)  # not aligned to domains
    assert perf.domain_reach(8, 8, 0, 0) == perf.domain_reach(8, 8)


def test_the_config_states_the_groups() -> None:
    ds = resolve_model(ModelSpec(preset="deepseek-v3"))
    assert (ds.expert_groups, ds.group_topk) == (8, 4)
    kimi = resolve_model(ModelSpec(preset="kimi-k2"))  # one group: every expert open
    assert (kimi.expert_groups, kimi.group_topk) == (0, 0)


@pytest.mark.parametrize("n_group", [7, "8", 0.5])
def test_groups_that_do_not_divide_the_experts_are_one_line(
    tmp_path: Path, n_group: object
) -> None:
    cfg = {k: v for k, v in preset_config("deepseek-v3").items() if not k.startswith("_")}
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "n_group": n_group}))
    with pytest.raises(SpecError) as e:
        load_hf_config(f)
    assert "\n" not in str(e.value) and e.value.field == "model.config_path (n_group)"


def test_deepep_across_nodes_sends_fewer_copies() -> None:
    dims = resolve_model(ModelSpec(preset="deepseek-v3"))
    free = dims.model_copy(update={"expert_groups": 0, "group_topk": 0})
    hw = h100_hardware(256)
    across = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, pp=16, dp=128, ep=64, deepep=True)
    limited, unrestricted = (perf.terms(m, across, hw, 4096).cp_ep for m in (dims, free))
    # 3.15 remote nodes a token instead of 4.59: about a third less on the network.
    assert 0.6 * unrestricted < limited < 0.8 * unrestricted
    # NCCL's all-to-all sends every copy to its expert wherever the groups are.
    nccl = replace(across, deepep=False)
    assert perf.terms(dims, nccl, hw, 4096).cp_ep == perf.terms(free, nccl, hw, 4096).cp_ep


def test_megatron_routes_as_the_model_was_trained() -> None:
    spec = Spec(
        model=ModelSpec(preset="deepseek-v3"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=32),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=1024, moe_dispatcher=MoeDispatcher.DEEPEP),
    )
    args = megatron_args(plan(spec)).splitlines()
    assert "--moe-router-num-groups 8" in args and "--moe-router-group-topk 4" in args
    kimi = spec.model_copy(update={"model": ModelSpec(preset="kimi-k2")})
    assert "--moe-router-num-groups" not in megatron_args(plan(kimi))
