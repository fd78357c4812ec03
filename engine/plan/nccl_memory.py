"""NCCL's buffers on each GPU, counted over the communicators a layout opens.

NCCL keeps a fixed set of buffers per connection and channel, so its memory grows with the
channels it opens, the peers each rank connects to and the communicators a layout creates
(sjeaugey on NVIDIA/nccl#986: linear in the channels; a ring holds two connections whatever
its size; send/receive adds more). A collective's ring holds, per channel, one set of the
three protocols' buffers (``src/include/comm.h`` and ``src/device/common.h``: Simple's
``DEFAULT_BUFFSIZE`` 4 MiB, LL's 8 x 512 threads x 8 steps x 16 B = 512 KiB, LL128's
120 x 640 x 8 x 8 B = 4,915,200 B). Point-to-point traffic (pipeline send/receive, the MoE
all-to-all, ring attention) connects each peer it talks to on ``p2p channels per peer``
channels: 32 between NVLink peers, 2 where any peer of the communicator is across the network
(``NCCL_NCHANNELS_PER_NET_PEER``; NCCL takes the smallest over all pairs). The figures and
their sources are in ``tests/data/nccl_memory.json``.

Counted: the tensor-parallel, data-parallel (with context parallel: Megatron's data- and
context-parallel group) and expert-data-parallel collectives, the context-parallel traffic (a
ring's two neighbours, Ulysses' all-to-all, or PyTorch's all-gather), the pipeline's
neighbours and the expert-parallel all-to-all (NCCL's, not DeepEP's, which brings its own
NVSHMEM buffers). Not counted: NVLink SHARP's buffers (``NCCL_NVLS_ENABLE``) and the world
group's barrier, both small or off in the logs in ``../shared/fixtures/logs/``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final, NamedTuple

from engine.plan.frameworks import cp_comm_of
from engine.plan.names import CpComm
from engine.plan.result import LayoutDraft

CONNECTION_BYTES: Final = 4 * 1024**2 + 512 * 1024 + 4_915_200
"""One connection of one channel with all three protocols' buffers (Simple, LL, LL128):
9,633,792 B."""
P2P_CHANNEL_PEER_BYTES: Final = 14_640_000
"""One point-to-point channel to one peer, both directions: NVIDIA/nccl#1685 measured 1.06 GB
before the first ``all_to_all_single`` on 8 x H100 and 4.34 GB after it, 32 channels to each
of 7 peers: 3.28 GB / 224."""
NVLINK_COLL_CHANNELS: Final = 24
"""Channels of a collective inside an NVLink node (8 x H100, NCCL 2.21: ``24 coll channels``)."""
PCIE_COLL_CHANNELS: Final = 4
"""The same over PCIe (NVIDIA/nccl#1706: ``4 coll channels`` between two GPUs)."""
NET_CHANNELS_PER_GPU: Final = 2
"""Channels a collective across nodes opens per GPU of the group on a node, up to
:data:`NET_COLL_CHANNELS_MAX` (NCCL 2.21, one GPU a node over InfiniBand: ``2 coll channels``)."""
NET_COLL_CHANNELS_MAX: Final = 16
"""Channels of a collective across nodes with a node's eight GPUs in it (24 x H100 over three
nodes, NVIDIA/nccl#1453: ``Channel 00/16``)."""
NVLINK_P2P_CHANNELS: Final = 32
"""``p2p channels per peer`` between NVLink peers (NVIDIA/nccl#1685, 8 x H100)."""
NET_P2P_CHANNELS: Final = 2
"""``p2p channels per peer`` in a communicator with a peer across the network or on PCIe
(``NCCL_NCHANNELS_PER_NET_PEER``; NVIDIA/nccl#1189, #1706)."""


class NcclFabric(NamedTuple):
    """Where a layout's NCCL communicators run: the GPUs one NVLink (or PCIe) domain holds and
    whether the GPUs in it talk over NVLink."""

    domain: int
    nvlink: bool


def nccl_buffer_bytes(d: LayoutDraft, fabric: NcclFabric | None) -> int:
    """NCCL's buffers on one GPU of layout ``d`` (0 without a fabric: gloo on CPU ranks, or an
    estimate of the model states alone). Ranks are placed TP innermost, then CP, then DP, then
    PP; an expert group's ranks are ``expert_tp`` apart."""
    if fabric is None:
        return 0
    cp_comm = cp_comm_of(d) if d.cp > 1 else CpComm.P2P
    return _buffer_bytes(
        fabric, d.tp, d.cp, d.dp, d.pp, d.ep, d.expert_tp, d.expert_dp, d.deepep, cp_comm
    )


@lru_cache(maxsize=4096)
def _buffer_bytes(
    fabric: NcclFabric,
    tp: int,
    cp: int,
    dp: int,
    pp: int,
    ep: int,
    etp: int,
    expert_dp: int,
    deepep: bool,
    cp_comm: CpComm,
) -> int:
    """:func:`nccl_buffer_bytes` of the degrees (cached: a search sizes thousands of drafts
    over a few dozen meshes)."""
    total = _collective(fabric, tp, 1)
    total += _collective(fabric, dp * cp, tp)
    if cp > 1:
        # The ring passes keys and values to its two neighbours; Ulysses' all-to-all talks to
        # every rank of the group; an all-gather is one more collective.
        if cp_comm == CpComm.ALLGATHER:
            total += _collective(fabric, cp, tp)
        else:
            peers = cp - 1 if cp_comm == CpComm.A2A else min(2, cp - 1)
            total += _p2p(fabric, cp, tp, peers)
    if pp > 1:
        total += _p2p(fabric, pp, tp * cp * dp, min(2, pp - 1))
    if ep > 1:
        total += _collective(fabric, expert_dp, etp * ep)
        if not deepep:
            total += _p2p(fabric, ep, etp, ep - 1)
    return total


def _local(fabric: NcclFabric, ranks: int, stride: int) -> int | None:
    """Ranks of a group of ``ranks`` placed ``stride`` apart on one domain, or None where the
    whole group is on one."""
    if ranks * stride <= fabric.domain:
        return None
    return max(1, min(ranks, fabric.domain // max(1, stride)))


def _collective(fabric: NcclFabric, ranks: int, stride: int) -> int:
    """One collective communicator's ring buffers on each of its ranks."""
    if ranks <= 1:
        return 0
    local = _local(fabric, ranks, stride)
    if local is None:
        channels = NVLINK_COLL_CHANNELS if fabric.nvlink else PCIE_COLL_CHANNELS
    else:
        channels = min(NET_COLL_CHANNELS_MAX, NET_CHANNELS_PER_GPU * local)
    return channels * CONNECTION_BYTES


def _p2p(fabric: NcclFabric, ranks: int, stride: int, peers: int) -> int:
    """One communicator's send/receive buffers to ``peers`` of its ranks."""
    if ranks <= 1 or peers <= 0:
        return 0
    near = fabric.nvlink and _local(fabric, ranks, stride) is None
    return peers * (NVLINK_P2P_CHANNELS if near else NET_P2P_CHANNELS) * P2P_CHANNEL_PEER_BYTES
