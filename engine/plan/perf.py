"""Time and cost model of one candidate layout: FLOPs per step, compute time at the GPU's
achievable fraction of peak, communication per strategy, the pipeline bubble, and from them step
time, tokens/s, MFU, scaling efficiency, GPU-hours and cost. Called by :mod:`engine.plan.search`
for every candidate it ranks, so it is plain arithmetic.

Sources: FLOPs per token ``6·N`` for forward + backward (Kaplan et al. 2020) plus the attention
matmuls ``12·L·h·s`` (PaLM, Chowdhery et al. 2022, App. B), and ``2·N`` more for a full recompute
of the forward (Korthikanti et al. 2022); collective volumes as in NCCL's performance notes
(``nccl-tests/doc/PERFORMANCE.md``: ring all-reduce moves ``2(n-1)/n`` of the buffer per rank,
all-gather and reduce-scatter ``(n-1)/n``); ZeRO-3's ``1.5×`` DDP volume (ZeRO paper §7.2.2);
the 1F1B bubble ``(p-1)/(m+p-1)`` and its ``1/v`` reduction by interleaving (Narayanan et al.
2021, §2.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from engine.plan.memory import LayoutDraft, stage_params
from engine.plan.specs import Framework, ModelDims, Offload, Precision, Recompute, Strategy


class Overlap:
    """Share of each kind of communication hidden behind compute, at best (public profiles:
    DDP's bucketed all-reduce overlaps backward; ZeRO-3 / FSDP prefetch the next all-gather;
    Megatron's TP all-reduces sit on the critical path and are not overlapped). A namespace of
    constants, not instantiated (a dataclass would cost start-up time for nothing)."""

    ddp: Final = 0.8
    zero: Final = 0.6
    """DeepSpeed ZeRO-1/2/3's gradient reduction and parameter gathers."""
    fsdp: Final = 0.7
    megatron: Final = 0.6
    """Megatron's data-parallel all-reduce (3D layouts)."""
    tp: Final = 0.0
    pp: Final = 0.5
    ep: Final = 0.2
    cp: Final = 0.7


# Bus bandwidth NCCL reaches over NVLink / PCIe, as a share of the link's line rate.
INTRA_EFFICIENCY = 0.8
# Fraction of host<->GPU bandwidth an offloaded optimizer step achieves (pinned copies).
OFFLOAD_EFFICIENCY = 0.7
# CPU Adam throughput per GPU's share of host cores, parameters per second (DeepSpeed's
# CPU-Adam reports ~1e9 params/s on a server's cores; a node shares them among its GPUs).
CPU_ADAM_PARAMS_PER_S = 1.0e9


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the time model needs of the machines."""

    peak_flops: float
    """Dense peak for the plan's precision, FLOP/s per GPU."""
    achievable_mfu: float
    intra_bytes_per_s: float
    """Scale-up bandwidth per GPU, one direction."""
    inter_bytes_per_s: float
    """Achievable scale-out bandwidth per node, one direction."""
    pcie_bytes_per_s: float
    gpus_per_node: int
    nodes: int
    price_per_gpu_hour: float | None = None


@dataclass(frozen=True, slots=True)
class Estimate:
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    """Communication not hidden behind compute."""
    bubble_fraction: float
    tokens_per_s: float
    mfu: float
    scaling_efficiency: float
    flops_per_step: float
    gpu_hours: float | None
    cost_usd: float | None


def flops_per_token(
    dims: ModelDims, seq_len: int, recompute: Recompute, *, attention: bool = True
) -> float:
    """Training FLOPs per token: ``6·N_active`` (+ ``12·L·h·s`` attention) and, for a full
    recompute, one more forward (``2·N_active`` + ``4·L·h·s``); selective recompute redoes only
    the attention score matmuls."""
    n = dims.params_active
    attn = 12 * dims.layers * dims.hidden * seq_len if attention else 0.0
    f = 6 * n + attn
    if recompute == Recompute.FULL:
        f += 2 * n + attn / 3
    elif recompute == Recompute.SELECTIVE:
        f += attn / 6
    return float(f)


def model_flops_per_token(dims: ModelDims, seq_len: int) -> float:
    """The FLOPs that MFU counts (no recompute): ``6·N_active + 12·L·h·s``."""
    return 6.0 * dims.params_active + 12.0 * dims.layers * dims.hidden * seq_len


def ring_allreduce_bytes(size: float, n: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``size`` bytes over ``n`` ranks."""
    return 2 * (n - 1) / n * size if n > 1 else 0.0


def gather_bytes(size: float, n: int) -> float:
    """Bytes each rank sends in an all-gather or reduce-scatter of a ``size``-byte buffer."""
    return (n - 1) / n * size if n > 1 else 0.0


def bubble_fraction(pp: int, microbatches: int, v: int = 1) -> float:
    """Idle share of a 1F1B pipeline: ``(p-1)/(m+p-1)``, with the bubble divided by ``v`` for the
    interleaved schedule."""
    if pp <= 1:
        return 0.0
    bubble = (pp - 1) / max(1, v)
    return bubble / (microbatches + bubble)


def group_bandwidth(hw: Hardware, ranks: int, stride: int) -> float:
    """Per-rank bus bandwidth of a collective over ``ranks`` ranks placed ``stride`` apart in the
    global rank order (TP innermost, then CP, then DP, then PP: see :func:`estimate_time`):
    inside one node it runs on the scale-up link; across nodes each node's NICs are shared by
    the group's ranks on that node."""
    intra = hw.intra_bytes_per_s * INTRA_EFFICIENCY
    if ranks <= 1:
        return intra
    if ranks * stride <= hw.gpus_per_node or hw.nodes <= 1:
        return intra
    # Every GPU of a node is in some group of this kind at the same time: the node's NICs are
    # shared by all of them (one NIC per GPU on DGX-class nodes gives the same figure).
    return min(intra, hw.inter_bytes_per_s / hw.gpus_per_node)


def estimate_time(
    dims: ModelDims,
    d: LayoutDraft,
    hw: Hardware,
    *,
    seq_len: int,
    tokens_budget: float | None = None,
) -> Estimate:
    """Step time and throughput of layout ``d``. Rank order is TP innermost, then CP, then DP,
    then PP outermost (Megatron's order), so TP stays inside a node, PP spans nodes."""
    world = d.world_size
    tokens = d.global_batch * seq_len
    total_flops = flops_per_token(dims, seq_len, d.recompute) * tokens
    per_gpu = total_flops / world
    eff = hw.peak_flops * hw.achievable_mfu
    compute = per_gpu / eff
    bubble = bubble_fraction(d.pp, d.grad_accum, d.virtual_stages)
    compute_with_bubble = compute / (1 - bubble) if bubble < 1 else compute * 1e6
    exposed = _exposed_comm(dims, d, hw, seq_len, compute)
    step = compute_with_bubble + exposed
    tokens_per_s = tokens / step
    mfu = model_flops_per_token(dims, seq_len) * tokens / (step * world * hw.peak_flops)
    ideal = model_flops_per_token(dims, seq_len) * tokens / (world * eff)
    scaling = min(1.0, ideal / step)
    gpu_hours = cost = None
    if tokens_budget:
        steps = tokens_budget / tokens
        gpu_hours = steps * step * world / 3600
        if hw.price_per_gpu_hour is not None:
            cost = gpu_hours * hw.price_per_gpu_hour
    return Estimate(
        step_time_s=step,
        compute_time_s=compute_with_bubble,
        comm_time_s=exposed,
        bubble_fraction=bubble,
        tokens_per_s=tokens_per_s,
        mfu=min(1.0, mfu),
        scaling_efficiency=scaling,
        flops_per_step=total_flops,
        gpu_hours=gpu_hours,
        cost_usd=cost,
    )


def _exposed_comm(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int, compute: float
) -> float:
    """Seconds per step of communication not hidden behind ``compute``: data parallelism's
    (partly overlapped with backward), then TP, PP, CP and EP, then offload's PCIe copies and
    CPU optimizer step."""
    grad_b = 2 if d.precision != Precision.FP32 else 4
    dense, expert = stage_params(dims, d)
    comm_dp, overlap = _data_parallel_comm(d, hw, dense, grad_b)
    if expert:
        ep_dp = max(1, d.dp * d.cp // d.ep)
        comm_dp += ring_allreduce_bytes(expert * grad_b, ep_dp) / group_bandwidth(
            hw, ep_dp, d.tp * d.ep
        )
    exposed = max(0.0, comm_dp - overlap * compute * 2 / 3)
    exposed = _add_model_parallel_comm(exposed, dims, d, hw, seq_len, act_b=grad_b)
    if d.offload != Offload.NONE:
        exposed = _add_offload(exposed, d, hw, dense + expert, grad_b)
    return exposed


def _data_parallel_comm(
    d: LayoutDraft, hw: Hardware, dense: float, grad_b: int
) -> tuple[float, float]:
    """Seconds per step of the data-parallel gradient / parameter traffic of the ``dense``
    parameters, and the share of it that can hide behind backward."""
    dp_n = d.dp * d.cp
    dp_bw = group_bandwidth(hw, dp_n, d.tp)
    m = d.grad_accum
    if d.strategy == Strategy.DDP or (d.framework == Framework.DDP):
        return ring_allreduce_bytes(dense * grad_b, dp_n) / dp_bw, Overlap.ddp
    if d.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        # reduce-scatter of grads (every micro-step for ZeRO-2) + all-gather of updated params.
        rs = gather_bytes(dense * grad_b, dp_n) / dp_bw
        ag = gather_bytes(dense * grad_b, dp_n) / dp_bw
        return rs * (m if d.strategy == Strategy.ZERO2 else 1) + ag, Overlap.zero
    if d.strategy in (Strategy.ZERO3, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID):
        # 1.5x DDP volume per micro-step: all-gather in forward and backward, reduce-scatter.
        n = dp_n
        inter_replicas = 1
        if d.strategy == Strategy.FSDP_HYBRID:
            n = max(1, min(dp_n, hw.gpus_per_node // max(1, d.tp)))
            inter_replicas = max(1, dp_n // n)
        bw = group_bandwidth(hw, n, d.tp)
        comm = 3 * gather_bytes(dense * grad_b, n) / bw * m
        if inter_replicas > 1:
            comm += ring_allreduce_bytes(dense * grad_b / n, inter_replicas) / group_bandwidth(
                hw, inter_replicas, d.tp * n
            )
        return comm, Overlap.fsdp if d.framework == Framework.FSDP else Overlap.zero
    if d.strategy == Strategy.FSDP_GRAD_OP:
        return (2 * gather_bytes(dense * grad_b, dp_n) * m) / dp_bw, Overlap.fsdp
    # 3D: Megatron DP all-reduce (or reduce-scatter + all-gather with distributed opt)
    return ring_allreduce_bytes(dense * grad_b, dp_n) / dp_bw, Overlap.megatron


def _add_model_parallel_comm(
    exposed: float, dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int, act_b: int
) -> float:
    """``exposed`` plus the TP, PP, CP and EP traffic of one step (added in that order)."""
    m = d.grad_accum
    s_local = seq_len / d.cp
    layers_local = dims.layers / d.pp
    microbatch_act = s_local * d.micro_batch * dims.hidden * act_b
    if d.tp > 1:
        # 4 all-reduces (or all-gather + reduce-scatter pairs with SP) per layer per micro-batch.
        vol = 4 * ring_allreduce_bytes(microbatch_act, d.tp) * layers_local * m
        exposed += vol / group_bandwidth(hw, d.tp, 1) * (1 - Overlap.tp)
    if d.pp > 1:
        vol = 2 * microbatch_act / d.tp * m
        exposed += vol / group_bandwidth(hw, 2, d.tp * d.cp * d.dp) * (1 - Overlap.pp)
    if d.cp > 1:
        kv = 2 * s_local * d.micro_batch * dims.kv_heads * dims.head_dim * act_b / d.tp
        vol = 3 * (d.cp - 1) * kv * layers_local * m  # forward pass + twice in backward
        exposed += vol / group_bandwidth(hw, d.cp, d.tp) * (1 - Overlap.cp)
    if dims.is_moe and d.ep > 1:
        routed = microbatch_act * dims.experts_per_token / d.tp
        vol = 4 * gather_bytes(routed, d.ep) * layers_local * m  # dispatch + combine, fwd + bwd
        exposed += vol / group_bandwidth(hw, d.ep, d.tp * d.cp) * (1 - Overlap.ep)
    return exposed


def _add_offload(exposed: float, d: LayoutDraft, hw: Hardware, params: float, grad_b: int) -> float:
    """``exposed`` plus offload's cost, once per step: grads down and params up over PCIe, and
    the CPU optimizer step over the ``params`` (dense + expert) this GPU holds."""
    local = params / max(
        1, d.dp * d.cp if d.zero_stage >= 1 or d.framework == Framework.FSDP else 1
    )
    moved = local * (grad_b + 2) + (
        params * 2 * 2 * d.grad_accum if d.offload == Offload.OPTIMIZER_PARAMS else 0.0
    )
    exposed += moved / (hw.pcie_bytes_per_s * OFFLOAD_EFFICIENCY)
    exposed += local / CPU_ADAM_PARAMS_PER_S
    return exposed
