"""How MoE tokens travel: NCCL all-to-all sends every routed copy of a token to its expert's
rank; DeepEP (``--moe-dispatcher deepep``) sends a token once per remote node. The plan used to
cost every layout as DeepEP while writing ``--moe-token-dispatcher-type alltoall``."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Framework, MoeDispatcher, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware

ROOT = Path(__file__).resolve().parents[2]
DSV3_SHAPE = ModelSpec(
    layers=61,
    hidden=7168,
    heads=128,
    kv_heads=128,
    vocab=129280,
    ffn=2048,
    num_experts=256,
    experts_per_token=8,
)


def test_all_to_all_across_nodes_carries_every_routed_copy() -> None:
    dims = resolve_model(DSV3_SHAPE)
    d = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, pp=16, dp=16, ep=16)
    nccl = perf.terms(dims, d, h100_hardware(32), 4096).cp_ep
    deepep = perf.terms(dims, replace(d, deepep=True), h100_hardware(32), 4096).cp_ep
    # Over two nodes, top-8: all-to-all sends half of the 8 copies across (4 a token), DeepEP
    # one copy to the other node when any of the 8 experts is there (~1 a token).
    assert nccl > 2.5 * deepep
    inside = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, pp=16, dp=16, ep=8)
    a = perf.terms(dims, inside, h100_hardware(32), 4096).cp_ep
    b = perf.terms(dims, replace(inside, deepep=True), h100_hardware(32), 4096).cp_ep
    assert a == pytest.approx(b)  # inside a node both ride NVLink


def _spec(dispatcher: MoeDispatcher | None, overlap: bool | None = None) -> Spec:
    return Spec(
        model=DSV3_SHAPE,
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=256),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(
            seq_len=4096, global_batch=4096, moe_dispatcher=dispatcher, moe_a2a_overlap=overlap
        ),
    )


def test_the_all_to_all_dispatcher_sorts_received_tokens_by_local_expert() -> None:
    """Megatron-Core's all-to-all dispatcher copies the received tokens once more into
    local-expert order (and back) where a rank holds several experts; DeepEP and one expert a
    rank do not: the routed copies cross HBM twice as often."""
    dims = resolve_model(DSV3_SHAPE)
    hw = h100_hardware(32)

    def elementwise(d: LayoutDraft) -> float:
        return perf.terms(dims, d, hw, 4096).forward.elementwise

    several = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, pp=16, dp=16, ep=8)
    once = perf.terms(dims, several, hw, 4096).routed * dims.hidden * 2 / hw.hbm_bytes_per_s
    assert elementwise(several) - elementwise(replace(several, deepep=True)) == pytest.approx(
        4 * once
    )
    one = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=2, dp=256, ep=256)
    assert elementwise(one) == pytest.approx(elementwise(replace(one, deepep=True)))


def test_the_plan_keeps_all_to_all_inside_a_node_unless_deepep_is_asked_for() -> None:
    # With the all-to-all on the critical path (Megatron's overlap off; with it on, hiding it
    # behind the other micro-batch is what test_a2a_overlap.py checks).
    nccl = plan(_spec(None, overlap=False)).recommended
    deepep = plan(_spec(MoeDispatcher.DEEPEP, overlap=False)).recommended
    assert nccl.ep * nccl.expert_tp <= 8  # the EP group (consecutive ranks) stays in a node
    assert deepep.step_time_s < nccl.step_time_s


def test_the_dispatcher_is_written_as_it_was_costed() -> None:
    nccl = [x for x in megatron_args(plan(_spec(None))).splitlines() if not x.startswith("#")]
    assert "--moe-token-dispatcher-type alltoall" in nccl
    deepep = megatron_args(plan(_spec(MoeDispatcher.DEEPEP))).splitlines()
    assert "--moe-token-dispatcher-type flex" in deepep and "--moe-enable-deepep" in deepep


def test_the_cli_takes_the_dispatcher() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--model", "qwen3-30b-a3b", "--gpu", "h100"]
        + ["--gpus-per-node", "8", "--nodes", "4", "--moe-dispatcher", "deepep", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spec"]["training"]["moe_dispatcher"] == "deepep"


def test_an_all_to_all_across_nodes_under_nccl_names_deepep() -> None:
    def hints(dispatcher: MoeDispatcher | None, ep: int) -> list[str]:
        spec = _spec(dispatcher).model_copy(
            update={"layout": LayoutSpec(framework=Framework.MEGATRON, ep=ep, pp=16, tp=2)}
        )
        return [n for n in plan(spec).recommended.notes if "DeepEP sends it once per node" in n]

    across = hints(None, 64)
    assert len(across) == 1 and "spans 8 nodes" in across[0]
    assert "--moe-dispatcher deepep" in across[0]
    assert hints(MoeDispatcher.DEEPEP, 64) == []  # already asked for
    assert hints(None, 8) == []  # the group stays inside a node: NVLink either way


def test_moe_settings_the_plan_cannot_use_are_named() -> None:
    # DeepEP or a capacity factor asked for where nothing dispatches tokens (a dense model, or
    # an MoE layout without Megatron's expert parallelism) would otherwise do nothing silently.
    def said(spec: Spec, field: str) -> list[str]:
        return [w for w in plan(spec).warnings if w.startswith(f"training.{field}:")]

    dense = Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8),
        training=TrainingSpec(moe_dispatcher=MoeDispatcher.DEEPEP, moe_capacity_factor=1.0),
    )
    deepep = said(dense, "moe_dispatcher")
    assert len(deepep) == 1 and "is dense" in deepep[0]
    assert "--moe-capacity-factor" in said(dense, "moe_capacity_factor")[0]
    fsdp = _spec(MoeDispatcher.DEEPEP).model_copy(
        update={"layout": LayoutSpec(framework=Framework.FSDP)}
    )
    assert "runs as FSDP" in said(fsdp, "moe_dispatcher")[0]
    used = _spec(MoeDispatcher.DEEPEP).model_copy(
        update={"layout": LayoutSpec(framework=Framework.MEGATRON, ep=64, pp=16, tp=2)}
    )
    assert not said(used, "moe_dispatcher") and not said(used, "moe_capacity_factor")


def test_deepspeed_expert_parallelism_is_the_model_codes() -> None:
    # DeepSpeed-MoE's EP is an argument of the model's expert layers, which ds_config.json
    # cannot set: the plan says where it goes, with the degree it planned (the real signature).
    import inspect

    pytest.importorskip("deepspeed")
    from deepspeed.moe.layer import MoE

    spec = Spec(
        model=ModelSpec(preset="mixtral-8x7b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8),
        training=TrainingSpec(seq_len=4096, global_batch=64),
        layout=LayoutSpec(framework=Framework.DEEPSPEED, ep=8),
    )
    lay = plan(spec).recommended
    said = [n for n in lay.notes if n.startswith("ep=8 is DeepSpeed-MoE's")]
    assert len(said) == 1 and "MoE(ep_size=8)" in said[0]
    assert "ep_size" in inspect.signature(MoE.__init__).parameters


def test_deepspeed_moe_calls_its_experts_one_by_one() -> None:
    """DeepSpeed-MoE's ``Experts`` loops over the rank's experts in Python (three linears, the
    activation and the gating multiply each): 64 small experts a rank are host bound.
    Without DeepSpeed's EP the model's own MoE runs (transformers' grouped GEMM): no loop."""
    dims = resolve_model(ModelSpec(preset="qwen3-30b-a3b"))
    hw = h100_hardware(8)
    ds = LayoutDraft(Strategy.ZERO2, Framework.DEEPSPEED, dp=64, ep=2, zero_stage=2)
    loop = (dims.num_experts // 2) * 5 * perf.MOE_EXPERT_KERNEL_S
    assert perf.terms(dims, ds, hw, 4096).forward.mlp == pytest.approx(loop)
    grouped = replace(ds, ep=1)
    assert perf.terms(dims, grouped, hw, 4096).forward.mlp < loop / 2
