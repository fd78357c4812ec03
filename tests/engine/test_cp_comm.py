"""How context parallelism moves keys and values: Megatron passes them round a ring behind the
attention (``--cp-comm-type p2p``, its default) or all-gathers them first, exposed
(``allgather``, what Llama 3 trained with at 128K); PyTorch-native context parallelism
(PyTorch's ``context_parallel``, Accelerate, the shipped trainer) all-gathers them."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.planner import plan
from engine.plan.specs import (
    CpComm,
    Framework,
    HardwareSpec,
    LayoutSpec,
    ModelSpec,
    NetworkSpec,
    NetworkTier,
    Spec,
    Strategy,
    TrainingSpec,
)
from engine.write.megatron import megatron_args
from tests.engine.perf_fixtures import h100_hardware

ROOT = Path(__file__).resolve().parents[2]
SEQ = 131072


def _spec(cp_comm: CpComm | None, layout: LayoutSpec | None = None) -> Spec:
    return Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=2),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=SEQ, global_batch=16, cp_comm=cp_comm),
        layout=layout or LayoutSpec(framework=Framework.MEGATRON, tp=2, cp=8),
    )


def test_an_all_gather_exposes_what_the_ring_hides_behind_the_attention() -> None:
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    hw = h100_hardware(2)
    ring = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=2, cp=8)
    gathered = replace(ring, cp_allgather=True)
    hidden = perf._cp_comm(dims, ring, hw, SEQ)
    exposed = perf._cp_comm(dims, gathered, hw, SEQ)
    # The same bytes (K and V in twice, their gradients out once): the ring leaves
    # 1 - Overlap.cp of them on the critical path, the all-gather all of them.
    assert hidden > 0
    assert exposed > 2 * hidden
    assert perf._cp_comm(dims, replace(gathered, cp=1), hw, SEQ) == 0.0


def test_pytorch_native_context_parallelism_all_gathers_whatever_is_asked() -> None:
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    hw = h100_hardware(2)
    fsdp = LayoutDraft(Strategy.FSDP_FULL, Framework.FSDP, dp=2, cp=8)
    assert perf._cp_comm(dims, fsdp, hw, SEQ) == pytest.approx(
        perf._cp_comm(dims, replace(fsdp, framework=Framework.MEGATRON, cp_allgather=True), hw, SEQ)
    )


def test_the_plan_costs_and_writes_the_cp_comm_type_asked_for() -> None:
    ring = plan(_spec(None)).recommended
    gathered_plan = plan(_spec(CpComm.ALLGATHER))
    gathered = gathered_plan.recommended
    assert (ring.tp, ring.cp) == (gathered.tp, gathered.cp) == (2, 8)
    assert gathered.comm_time_s > ring.comm_time_s
    assert gathered.step_time_s > ring.step_time_s
    args = megatron_args(gathered_plan).splitlines()
    assert "--cp-comm-type allgather" in args
    assert not [a for a in megatron_args(plan(_spec(None))).splitlines() if "--cp-comm" in a]


def test_a_cp_comm_type_the_plan_cannot_use_is_named() -> None:
    def said(spec: Spec) -> list[str]:
        return [w for w in plan(spec).warnings if w.startswith("training.cp_comm:")]

    no_cp = _spec(CpComm.ALLGATHER, LayoutSpec(framework=Framework.MEGATRON, tp=8, cp=1))
    assert "splits no sequence" in said(no_cp)[0]
    fsdp = _spec(CpComm.P2P, LayoutSpec(framework=Framework.FSDP, cp=8))
    assert "runs as FSDP" in said(fsdp)[0] and "all-gathers" in said(fsdp)[0]
    assert said(_spec(CpComm.ALLGATHER)) == []


def test_the_cli_takes_the_cp_comm_type_and_refuses_a_wrong_one_in_one_line() -> None:
    base = [sys.executable, "-m", "cli", "plan", "--model", "llama-3-8b", "--gpu", "h100"]
    base += ["--gpus-per-node", "8", "--nodes", "2", "--seq-len", str(SEQ), "--global-batch", "16"]
    ok = subprocess.run(
        base + ["--cp-comm", "allgather", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert '"cp_comm": "allgather"' in ok.stdout
    bad = subprocess.run(
        base + ["--cp-comm", "ring"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode != 0
    lines = bad.stderr.strip().splitlines()
    assert len(lines) <= 2 and "--cp-comm" in bad.stderr and "Traceback" not in bad.stderr
