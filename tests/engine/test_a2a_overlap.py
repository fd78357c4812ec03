"""Megatron-Core's expert-parallel all-to-all overlap (``--overlap-moe-expert-parallel-comm
--delay-wgrad-compute``): one micro-batch's forward runs layer by layer beside another's
backward, each hiding the other's dispatch and combine. It runs where Megatron-LM's
``TransformerConfig`` lets it (ep > 1; pp 1 or interleaved; no full recompute); the planner
turns it on there unless told not to, costs what the compute cannot cover, and writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.monitor.calibrate import _forced
from engine.plan import frameworks, perf
from engine.plan.annotate import describe
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import Framework, NetworkTier, Recompute, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.write.megatron import megatron_args, pretrain_gpt_script
from tests.engine.perf_fixtures import h100_hardware

ROOT = Path(__file__).resolve().parents[2]
MOE = ModelSpec(
    layers=32,
    hidden=4096,
    heads=32,
    kv_heads=8,
    vocab=32000,
    ffn=1408,
    num_experts=64,
    experts_per_token=6,
)
OVERLAP = ("--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute")


def _draft(**kw: object) -> LayoutDraft:
    base = {"tp": 1, "pp": 1, "dp": 32, "ep": 32, "micro_batch": 1, "grad_accum": 8}
    base.update(kw)
    return LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, zero_stage=1, **base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "applies"),
    [
        ({}, True),
        ({"pp": 4, "dp": 8}, False),  # plain 1F1B: the combined schedule needs chunks to pair
        ({"pp": 4, "dp": 8, "virtual_stages": 2}, True),
        ({"recompute": Recompute.FULL}, False),  # a checkpointed layer's backward is opaque
        ({"recompute": Recompute.LIGHT}, True),
        ({"ep": 1}, False),
        ({"zero_stage": 3}, False),
        ({"framework": Framework.FSDP}, False),
    ],
)
def test_it_runs_where_megatron_allows_it(change: dict[str, object], applies: bool) -> None:
    dims = resolve_model(MOE)
    assert frameworks.a2a_overlap_applies(dims, replace(_draft(), **change)) is applies  # type: ignore[arg-type]
    assert not frameworks.a2a_overlap_applies(
        resolve_model(ModelSpec(preset="llama-3-8b")), _draft()
    )


def test_the_hidden_all_to_all_leaves_the_critical_path_but_holds_sms() -> None:
    dims = resolve_model(MOE)
    hw = h100_hardware(4)
    off = _draft(ep=8)
    on = replace(off, a2a_overlap=True)
    ep = perf.terms(dims, off, hw, 4096).ep
    assert ep > 0
    (c_off, _, x_off), (c_on, _, x_on) = (perf.terms(dims, d, hw, 4096).layer for d in (off, on))
    # Inside a node the all-to-all takes less than the layer's compute: all of it hides.
    assert ep < c_off
    assert x_on == pytest.approx(x_off - ep)  # without it, all of it was exposed
    assert c_on == pytest.approx(c_off + perf.COMM_SM_SHARE * ep)
    assert (
        perf.estimate_time(dims, on, hw, seq_len=4096).step_time_s
        < perf.estimate_time(dims, off, hw, seq_len=4096).step_time_s
    )


def test_what_the_compute_cannot_cover_stays_exposed() -> None:
    dims = resolve_model(MOE)
    slow = replace(h100_hardware(4), inter_bytes_per_s=2e9)  # a crawling fabric
    on = _draft(a2a_overlap=True)
    ep = perf.terms(dims, on, slow, 4096).ep
    compute, _, exposed = perf.terms(dims, replace(on, a2a_overlap=False), slow, 4096).layer
    assert ep > compute
    _, _, exposed_on = perf.terms(dims, on, slow, 4096).layer
    assert exposed_on == pytest.approx(exposed - compute)


def test_a_layout_that_cannot_run_it_is_costed_without_it() -> None:
    dims = resolve_model(MOE)
    hw = h100_hardware(4)
    plain = _draft(pp=4, dp=8)
    assert perf.terms(dims, replace(plain, a2a_overlap=True), hw, 4096).layer == (
        perf.terms(dims, plain, hw, 4096).layer
    )


def _spec(overlap: bool | None = None, seq_len: int = 4096, **layout: object) -> Spec:
    return Spec(
        model=MOE,
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=seq_len, global_batch=256, moe_a2a_overlap=overlap),
        layout=LayoutSpec(**layout),  # type: ignore[arg-type]
    )


def test_asked_for_the_plan_uses_it_and_writes_it() -> None:
    p = plan(_spec(True, framework=Framework.MEGATRON, ep=8, pp=1, zero_stage=1))
    lay = p.recommended
    assert lay.a2a_overlap
    args = megatron_args(p).splitlines()
    assert all(flag in args for flag in OVERLAP)
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=32" in pretrain_gpt_script(p).splitlines()
    assert any("--overlap-moe-expert-parallel-comm" in n for n in lay.notes)
    assert describe(lay).endswith("+ all-to-all overlap")


def test_by_default_it_stays_off_as_in_megatron_and_the_plan_offers_it() -> None:
    # At 2K tokens (at 4K the second micro-batch's routed copies need a recompute that eats
    # most of the gain).
    layout = {"framework": Framework.MEGATRON, "ep": 8, "pp": 1, "zero_stage": 1}
    default = plan(_spec(seq_len=2048, micro_batch=1, **layout))
    told_off = plan(_spec(False, seq_len=2048, micro_batch=1, **layout))
    on = plan(_spec(True, seq_len=2048, micro_batch=1, **layout)).recommended
    for p in (default, told_off):
        off = p.recommended
        assert not off.a2a_overlap
        assert not any(flag in megatron_args(p) for flag in OVERLAP)
        assert "CUDA_DEVICE_MAX_CONNECTIONS" not in pretrain_gpt_script(p)
        assert (off.tp, off.pp, off.ep, off.recompute) == (on.tp, on.pp, on.ep, on.recompute)
        assert on.step_time_s < off.step_time_s
    offer = [w for w in default.warnings if "--moe-a2a-overlap" in w]
    assert len(offer) == 1 and f"{on.step_time_s:.3g} s a step" in offer[0]
    assert not any("--moe-a2a-overlap" in w for w in told_off.warnings)  # the user said no


def test_an_offer_only_where_it_saves_time() -> None:
    dense = plan(
        Spec(
            model=ModelSpec(preset="llama-3-8b"),
            hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=4),
            training=TrainingSpec(seq_len=4096, global_batch=256),
        )
    )
    assert not any("--moe-a2a-overlap" in w for w in dense.warnings)
    # Two stages without interleaving: the overlap cannot run, so there is nothing to offer.
    piped = plan(_spec(framework=Framework.MEGATRON, ep=8, pp=2, virtual_stages=1))
    assert not any("--moe-a2a-overlap" in w for w in piped.warnings)


def test_asked_for_where_it_cannot_run_the_plan_says_so() -> None:
    p = plan(_spec(True, framework=Framework.MEGATRON, ep=8, pp=4, virtual_stages=1))
    assert not p.recommended.a2a_overlap
    assert not any(flag in megatron_args(p) for flag in OVERLAP)
    said = [m for m in p.warnings if m.startswith("training.moe_a2a_overlap")]
    assert len(said) == 1 and "virtual-stages" in said[0]


def test_the_cli_takes_the_switch() -> None:
    def run(*extra: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "cli", "plan", "--model", "qwen3-30b-a3b", "--gpu", "h100"]
            + ["--gpus-per-node", "8", "--nodes", "4", "--framework", "megatron", "--json"]
            + list(extra),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)  # type: ignore[no-any-return]

    off = run("--no-moe-a2a-overlap")
    assert off["spec"]["training"]["moe_a2a_overlap"] is False  # type: ignore[index]
    assert off["recommended"]["a2a_overlap"] is False  # type: ignore[index]


def test_recalibrating_a_run_keeps_the_overlap_it_ran_with() -> None:
    rec = {"strategy": "3d", "framework": "megatron", "tp": 1, "pp": 1, "dp": 32, "ep": 8}
    for ran in (True, False, None):
        forced = _forced(_spec(ran), rec, "run-1")
        assert forced.training.moe_a2a_overlap is ran
        assert forced.layout.ep == 8


def test_the_second_micro_batch_it_keeps_alive_is_held_in_memory() -> None:
    # One stage: the overlap keeps two micro-batches' activations alive. At micro-batch 2 the
    # pair fits only under full recompute, which the overlap cannot run with: asked for, the
    # plan recomputes in full and says the overlap had no effect; without it MLP-only
    # recompute fits and is faster.
    layout = {"framework": Framework.MEGATRON, "tp": 1, "ep": 8, "pp": 1, "zero_stage": 1}
    asked = plan(_spec(True, micro_batch=2, **layout))
    on, off = asked.recommended, plan(_spec(micro_batch=2, **layout)).recommended
    assert on.recompute == Recompute.FULL and not on.a2a_overlap
    assert any(w.startswith("training.moe_a2a_overlap") for w in asked.warnings)
    assert off.recompute == Recompute.MLP and off.step_time_s < on.step_time_s
    # At micro-batch 1 the pair needs more recompute than a single micro-batch does.
    on = plan(_spec(True, micro_batch=1, **layout)).recommended
    off = plan(_spec(micro_batch=1, **layout)).recommended
    assert on.a2a_overlap and off.recompute == Recompute.NONE and on.recompute != Recompute.NONE
