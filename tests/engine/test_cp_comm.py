"""How context parallelism moves keys and values: Megatron passes them round a ring behind the
attention (``--cp-comm-type p2p``, its default), all-gathers them first, exposed
(``allgather``, what Llama 3 trained with at 128K), or trades the sequence split for a head
split (``a2a``, Ulysses); PyTorch-native context parallelism (PyTorch's ``context_parallel``,
Accelerate, the shipped trainer) all-gathers them."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.errors import SpecError
from engine.plan import perf
from engine.plan.memory import LayoutDraft
from engine.plan.models import resolve_model
from engine.plan.names import CpComm, Framework, NetworkTier, Strategy
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
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
    gathered = replace(ring, cp_comm=CpComm.ALLGATHER)
    hidden = perf.terms(dims, ring, hw, SEQ).cp
    exposed = perf.terms(dims, gathered, hw, SEQ).cp
    # The same bytes (K and V in twice, their gradients out once): the ring leaves
    # 1 - Overlap.cp of them on the critical path, the all-gather all of them.
    assert hidden > 0
    assert exposed > 2 * hidden
    assert perf.terms(dims, replace(gathered, cp=1), hw, SEQ).cp == 0.0


def test_an_all_to_all_moves_queries_and_outputs_too() -> None:
    # Ulysses sends a rank's queries, keys and values to the ranks holding their heads and
    # brings the output back (and the same for the gradients): for a GQA model (32 query, 8
    # key/value heads) that is many times the keys and values a ring passes, none of it hidden.
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    hw = h100_hardware(2)
    ring = LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, tp=2, cp=4)
    a2a = replace(ring, cp_comm=CpComm.A2A)
    assert perf.terms(dims, a2a, hw, SEQ).cp > 3 * perf.terms(dims, ring, hw, SEQ).cp
    # Inside a node (tp x cp = 8) the all-to-all rides NVLink; across two it takes the NICs.
    across = replace(a2a, tp=1, cp=16)
    assert (
        perf.terms(dims, across, hw, SEQ).cp
        > perf.terms(dims, replace(a2a, tp=1, cp=8), hw, SEQ).cp
    )


def test_the_search_keeps_a2a_to_layouts_whose_heads_split() -> None:
    # 8 key/value heads: tp x cp must divide 8 for Ulysses to split them.
    spec = _spec(CpComm.A2A, LayoutSpec(framework=Framework.MEGATRON))
    lay = plan(spec).recommended
    assert lay.cp > 1 and 8 % (lay.tp * lay.cp) == 0
    assert "--cp-comm-type a2a" in megatron_args(plan(spec)).splitlines()


def test_a_forced_layout_whose_heads_do_not_split_is_refused_in_one_line() -> None:
    with pytest.raises(SpecError) as err:
        plan(_spec(CpComm.A2A))  # tp 2 x cp 8 = 16 does not divide 8 key/value heads
    assert err.value.field == "training.cp_comm"
    with pytest.raises(SpecError) as err:  # tp > 1 is a Megatron layout whatever the framework
        plan(_spec(CpComm.A2A, LayoutSpec(tp=2, cp=8)))
    assert err.value.field == "training.cp_comm"
    assert "8 key/value heads" in str(err.value) and "\n" not in str(err.value)


def test_pytorch_native_context_parallelism_all_gathers_whatever_is_asked() -> None:
    dims = resolve_model(ModelSpec(preset="llama-3-8b"))
    hw = h100_hardware(2)
    fsdp = LayoutDraft(Strategy.FSDP_FULL, Framework.FSDP, dp=2, cp=8)
    assert perf.terms(dims, fsdp, hw, SEQ).cp == pytest.approx(
        perf.terms(
            dims, replace(fsdp, framework=Framework.MEGATRON, cp_comm=CpComm.ALLGATHER), hw, SEQ
        ).cp
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
