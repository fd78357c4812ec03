"""NCCL's buffers counted per communicator (planner issue #39, point 2): what a layout's
communicators hold on each GPU, matched against NVIDIA/nccl#1685's measured 8 x H100 figures
(``tests/data/nccl_memory.json``), in place of one flat 512 MiB reserve that the all-to-all of
an intra-node expert-parallel layout exceeds six times over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.plan.catalog import get_gpu
from engine.plan.memory import CUDA_CONTEXT_BYTES, LayoutDraft, gpu_usable_bytes
from engine.plan.names import CpComm, Framework, MoeDispatcher, NetworkTier, Strategy
from engine.plan.nccl_memory import CONNECTION_BYTES, NcclFabric, nccl_buffer_bytes
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec

GIB = 1024**3
DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "nccl_memory.json").read_text())
H100_NODE = NcclFabric(domain=8, nvlink=True)


def _draft(**kw: object) -> LayoutDraft:
    return LayoutDraft(Strategy.THREE_D, Framework.MEGATRON, **kw)  # type: ignore[arg-type]


def test_a_connection_holds_the_three_protocols_buffers() -> None:
    b = DATA["buffers"]
    assert CONNECTION_BYTES == b["simple_bytes"] + b["ll_bytes"] + b["ll128_bytes"]
    assert CONNECTION_BYTES == b["connection_bytes"]


def test_the_measured_8_h100_all_to_all_is_matched() -> None:
    """NVIDIA/nccl#1685: 1.06 GB outside PyTorch before the first all-to-all (the CUDA context
    and one collective communicator), 4.34 GB after it."""
    fig = next(f for f in DATA["measured"] if f["id"] == "nccl1685_h100x8_alltoall")
    collective = nccl_buffer_bytes(_draft(dp=8), H100_NODE)
    with_a2a = nccl_buffer_bytes(_draft(dp=8, ep=8, etp=1), H100_NODE)
    before = (CUDA_CONTEXT_BYTES + collective) / 1e9
    after = (CUDA_CONTEXT_BYTES + with_a2a) / 1e9
    assert before == pytest.approx(fig["before_alltoall_gb"], rel=0.05)
    assert after == pytest.approx(fig["after_alltoall_gb"], rel=0.05)


def test_buffers_grow_with_the_communicators_and_their_peers() -> None:
    """One collective (DDP over 8) < TP x PP x DP's three communicators; an expert group
    across nodes talks to more peers on fewer channels each; DeepEP brings its own buffers,
    not NCCL's all-to-all; CPU ranks (gloo) hold none."""
    ddp = nccl_buffer_bytes(_draft(dp=8), H100_NODE)
    three_d = nccl_buffer_bytes(_draft(tp=2, pp=2, dp=2), NcclFabric(domain=4, nvlink=True))
    assert three_d > ddp
    near = nccl_buffer_bytes(_draft(dp=8, ep=8, etp=1), H100_NODE)
    far = nccl_buffer_bytes(_draft(dp=64, ep=64, etp=1), H100_NODE)
    assert 0.3 * near < far < near  # 63 peers on 2 channels each, not 7 on 32
    deepep = nccl_buffer_bytes(_draft(dp=8, ep=8, etp=1, deepep=True), H100_NODE)
    assert deepep < near / 5
    pcie = nccl_buffer_bytes(_draft(dp=8), NcclFabric(domain=8, nvlink=False))
    assert pcie < ddp
    assert nccl_buffer_bytes(_draft(dp=8), None) == 0


def test_context_parallel_traffic_opens_what_it_talks_to() -> None:
    """CP8 on one node: Megatron's ring talks to two neighbours, Ulysses' all-to-all to all
    seven, PyTorch-native CP all-gathers (one collective)."""
    base = nccl_buffer_bytes(_draft(), H100_NODE)
    ring = nccl_buffer_bytes(_draft(cp=8), H100_NODE) - base
    a2a = nccl_buffer_bytes(_draft(cp=8, cp_comm=CpComm.A2A), H100_NODE) - base
    fsdp = LayoutDraft(Strategy.FSDP_FULL, Framework.FSDP, cp=8)
    gather = nccl_buffer_bytes(fsdp, H100_NODE) - nccl_buffer_bytes(
        LayoutDraft(Strategy.FSDP_FULL, Framework.FSDP), H100_NODE
    )
    assert a2a == pytest.approx(7 / 2 * ring, rel=0.15)
    assert gather < ring / 2


def test_an_intra_node_expert_layout_counts_its_all_to_all() -> None:
    """Mixtral 8x7B forced to EP8 on one node of 8 H100 under NCCL's all-to-all: the plan's
    memory holds the all-to-all's 3.3 GB of buffers (the flat reserve held 512 MiB for every
    layout), and the figure is in the total it judges fit by. A CPU plan counts none."""
    spec = Spec(
        model=ModelSpec(preset="mixtral-8x7b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=1),
        network=NetworkSpec(tier=NetworkTier.IB_NDR),
        training=TrainingSpec(seq_len=4096, global_batch=64, moe_dispatcher=MoeDispatcher.ALLTOALL),
        layout=LayoutSpec(strategy=Strategy.THREE_D, tp=1, pp=1, ep=8),
    )
    m = plan(spec).recommended.memory_per_gpu
    assert m.nccl > 3e9
    parts = m.params + m.grads + m.optimizer + m.activations + m.buffers + m.nccl
    assert m.total == parts - m.overlap
    cpu = plan(Spec(model=ModelSpec(preset="gpt2"), hardware=HardwareSpec(gpu="cpu", nodes=1)))
    assert cpu.recommended.memory_per_gpu.nccl == 0


def test_the_reserve_no_longer_holds_a_flat_nccl_share() -> None:
    """80 GiB less the CUDA context and 4 % fragmentation: 76.1 GiB (75.6 with the old flat
    512 MiB for NCCL, now counted per layout)."""
    usable = gpu_usable_bytes(get_gpu("h100-sxm").memory_bytes)
    assert usable / GIB == pytest.approx(76.08, abs=0.01)
