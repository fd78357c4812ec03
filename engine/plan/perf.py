"""Time and cost model of one candidate layout: the step built up from one micro-batch on the
heaviest pipeline stage (its GEMMs at a shape-dependent efficiency, attention as causal kernels
run it, memory-bound element-wise work, the tensor/context/expert-parallel collectives left
exposed), the pipeline schedule around it, and the once-per-step data-parallel reduction and
optimizer step. From the step: tokens/s, MFU, scaling efficiency, GPU-hours and cost. Called by
:mod:`engine.plan.search` for every candidate it ranks, so it is plain arithmetic.

Sources. FLOPs: a linear layer of ``n`` weights costs ``2n`` FLOPs per token forward and twice
that backward (Kaplan et al. 2020, ``6N``); attention scores and context ``4·s·d`` per token and
layer forward, of which a causal kernel (FlashAttention, Dao 2023) computes half; a full recompute
repeats the forward (Korthikanti et al. 2022). GEMM efficiency falls as a per-GPU dimension
shrinks (``x / (x + GEMM_HALF_DIM)`` per dimension: tile and wave quantisation, NVIDIA's "Matrix
Multiplication Background" guide). Collectives: ring all-reduce moves ``2(n-1)/n`` of the buffer
per rank, all-gather / reduce-scatter ``(n-1)/n`` (``nccl-tests/doc/PERFORMANCE.md``); a group
spanning nodes gets its share of each node's NICs; a latency per ring step; an all-to-all
(MoE dispatch and combine) sends what is bound for other nodes through the GPU's own NIC and the
busiest expert rank sets its pace (:func:`alltoall_time`). Megatron-LM overlaps
the backward tensor-parallel all-reduce with the weight-gradient GEMM (its
``LinearWithGradAccumulationAndAsyncCommunication``), reduces bf16 gradients in fp32
(``accumulate_allreduce_grads_in_fp32``), and can only hide the data-parallel reduction behind
the last micro-batch's backward (the classic fp16 stack, see :func:`fused_attention`, overlaps
neither: its TP all-reduces and its gradient reduction are all exposed). Collectives reach their
bus bandwidth only for large buffers (:data:`NCCL_HALF_BANDWIDTH_BYTES`). The 1F1B bubble is
``(p-1)/v`` micro-batch times on the heaviest stage (Narayanan et al. 2021, §2.2); the last stage also runs the LM head.

The few efficiency constants below are global and physical (not one per case); they were chosen
on the calibration sources of ``tests/data/published_runs.json`` and checked on the held-out
ones by ``benchmarks/estimate_accuracy.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Final, NamedTuple

from engine.plan.dims import ModelDims
from engine.plan.frameworks import (
    a2a_overlap_applies,
    cp_comm_of,
    fp8_linears,
    fused_attention,
    shared_expert_overlap,
    tp_comm_overlap,
)
from engine.plan.memory import (
    DROPLESS_IMBALANCE,
    LayoutDraft,
    expert_load,
    moments_bf16_apply,
    mtp_modules,
    offloaded_layer_bytes,
    stage_params,
    states_offload_apply,
)
from engine.plan.names import (
    CpComm,
    Framework,
    Offload,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.stages import stage_layers


class Overlap:
    """Share of each kind of communication hidden behind the compute it can overlap with (public
    profiles: DDP's bucketed all-reduce and Megatron-Core's ``overlap_grad_reduce`` overlap the
    last backward; ZeRO-3 / FSDP prefetch the next all-gather). A namespace of constants."""

    ddp: Final = 0.8
    zero: Final = 0.3
    """DeepSpeed ZeRO-1/2/3's gradient reduction and parameter gathers (hook-driven prefetch
    overlaps less than FSDP's)."""
    fsdp: Final = 0.7
    zero3: Final = 0.0
    """DeepSpeed ZeRO-3's parameter gathers: issued by module hooks on the critical path, its
    prefetch (``stage3_prefetch_bucket_size``) reaching about one weight matrix ahead."""
    megatron: Final = 0.6
    """Megatron's data-parallel reduction (3D layouts), behind the last micro-batch's backward."""
    pp: Final = 0.5
    cp: Final = 0.7


# The expert-parallel all-to-all has no share constant here: Megatron-Core's MoE layer runs
# permute, dispatch, experts, combine, unpermute one after another on the compute stream, so
# nothing hides the dispatch and combine unless a schedule is built for it: the combined 1F1B
# of ``--overlap-moe-expert-parallel-comm`` (:func:`a2a_overlap_applies`) or the shared
# expert on its own stream (:func:`shared_expert_overlap`).


GEMM_HALF_DIM: Final = 128
"""A per-GPU GEMM dimension of this many elements runs at half the large-GEMM efficiency
(``x / (x + 128)`` per dimension: 96 -> 0.43, 384 -> 0.75, 3072 -> 0.96). Chosen with the
A100 large-GEMM efficiency (0.80, cuBLAS's ~250 TFLOP/s) on Korthikanti et al. 2022's per-layer
timings (Table 4) and Narayanan et al. 2021's weak-scaling sweep (1.7B at TP1 to 1T at TP8)."""
ATTENTION_EFFICIENCY: Final = 0.5
"""Attention kernels (FlashAttention 2/3 forward and backward averaged) relative to a large GEMM,
where the catalog gives no figure for the GPU (FlashAttention-2 on Ampere: Dao 2023)."""
ATTENTION_HEAD_DIM: Final = 128
"""Head width at which the catalog's attention rates are stated (Llama, the calibration rows)."""
SCORE_BYTES: Final = 13.0
"""HBM bytes per attention score and forward on the classic (unfused) path, 16-bit: the
``QK^T`` GEMM writes it (2), the fused scale-mask-softmax reads and writes it (4), dropout reads
it and writes it and its mask (5), the context GEMM reads it (2). Backward moves twice that."""
SCORE_BYTES_NO_DROPOUT: Final = 8.0
"""The same without attention dropout (Llama-family models)."""
FLASH_BACKWARD: Final = 2.5
"""FlashAttention's backward runs 5 matmuls to the forward's 2. It runs them at a lower rate
(cuDNN's SDPA: 3.05-3.28x the forward's time; Megatron Core MoE report, arXiv:2603.07685,
Table 9), but the per-GPU attention rates (:data:`engine.plan.catalog.HOPPER_FA3` and its
kin) are forward-and-backward-together rates, so that is already in them: Table 9's Hopper
kernel at 4K, 553 / 422 TFLOP/s, is 453 together, HOPPER_FA3's 454. Timing the backward at
3.16x on top of them would count it twice."""
ELEMENTWISE_BYTES: Final = 34.0
"""HBM bytes per token per hidden unit one layer's forward moves outside GEMMs (norms, residual
adds, dropout, activation, rotary, bias: reads and writes in 16 bit); backward moves twice."""
EAGER_PASSES: Final = 2.5
"""How many times more HBM traffic the element-wise work of a gated-MLP (Llama-family) block
moves outside Megatron's fused kernels when its kernels are fused or native: the model under
``torch.compile`` (chosen on torchtitan's compiled calibration rows), or the shipped example
trainer, whose blocks call torch's one-kernel norms and carry no rotary embedding (its GPU
runs, ``tests/data/gpu_runs.json``). The Python modules of a Hugging Face or torchtitan
model run eagerly move more (:data:`EAGER_MODULE_PASSES`); LayerNorm-GELU blocks have their
own figure (:data:`EAGER_PASSES_LAYERNORM`)."""
EAGER_MODULE_PASSES: Final = 4.0
"""The same for a Llama block whose Python modules run eagerly (a Hugging Face model as it
loads, torchtitan without ``--training.compile``), counted in bytes per token and hidden unit
of one forward: two RMSNorms that upcast to fp32 and run five or six kernels (~36 bytes each
against ~6 fused), the residual adds (~12), the rotary embedding's complex products on the
queries and keys (~25 with grouped KV), SwiGLU's three kernels over the MLP's width (~35 for
Llama 3 8B): about 140, 4x Megatron's fused :data:`ELEMENTWISE_BYTES`. torchtitan's
uncompiled calibration rows agree (Llama 3 and 2 on 64 A100, Llama 3.1 8B on 8 and 128 H100:
3.4 % MAPE, -1.2 % bias, against 6.9 % and -6.8 % at the compiled figure)."""
EAGER_PASSES_LAYERNORM: Final = 1.25
"""The same for a LayerNorm-GELU block (a non-gated MLP: GPT-2, Pythia, OPT, BLOOM, MPT). Eager
PyTorch runs its norm and its activation as one native kernel each (``layer_norm``, ``gelu``),
which move about what Megatron's fused ones do; only the residual adds and the odd cast are
extra. Chosen on the example trainer's GPU calibration runs (``tests/data/gpu_runs.json``, the
sweep, all plain PyTorch); the Llama figure would predict these blocks far too slow."""
LAYER_OVERHEAD_S: Final = 60e-6
"""Fixed cost per layer and pass (kernel launches and small kernels that do not scale)."""
MOE_DISPATCH_S: Final = 1.0e-3
"""Fixed cost of one MoE layer's forward beyond its FLOPs: dropless routing copies the tokens
per expert to the host to size the grouped GEMM and the all-to-all (a device-to-host sync), so
the GPU then waits on the CPU to launch the rest of the layer's ~100 small kernels (router,
top-k, permute, token-count exchange, unpermute; ~10 us each). Backward pays it twice, like the
other per-layer work."""
MOE_DROP_DISPATCH_S: Final = 0.3e-3
"""The same with a capacity factor: every shape is known before the layer runs (padded to
capacity), so there is no device-to-host sync and the host launches ahead; what remains is the
GPU time of the router's and the permutations' small kernels."""
CLASSIC_LAYER_HOST_S: Final = 1.2e-3
"""Host time to issue one GPT layer's forward on the classic fp16 Megatron-LM stack (2021-22,
PyTorch eager): about 60 Python-dispatched operations (two fused layer norms, four linears
with their tensor-parallel copy/reduce autograd functions, the QKV split and transposes, the
fused scale-mask-softmax, three dropouts each under the CUDA RNG tracker's fork, two
TorchScript bias-dropout-add calls and the bias-GeLU one) at about 20 us each (PyTorch's
per-op dispatch from Python), the same again when a checkpointed layer's forward is rerun."""
MOE_IMBALANCE: Final = DROPLESS_IMBALANCE
"""Load of the busiest expert-parallel rank relative to the mean under dropless routing with an
auxiliary balancing loss: every rank waits for the one that receives the most tokens, in its
all-to-alls and its expert GEMMs. Balancing (an auxiliary loss, or DeepSeek-V3's bias terms)
keeps the busiest rank near the mean but not at it; 15 % is an assumed figure, not one measured
per run (a capacity factor of 1.0 with token dropping would cap it at the mean)."""
COMM_SM_SHARE: Final = 20 / 132
"""Share of the GPU's SMs a collective running beside compute holds: NCCL's kernels move and
reduce the data on the SMs, one thread block per channel, so compute that runs under a hidden
collective loses that share for as long as the collective runs. DeepSeek-V3's report
(§3.2.2) dedicates 20 of the H800's 132 SMs to its all-to-all; a ring all-gather, reduce-scatter
or all-reduce across nodes spreads over a comparable number of channels (a couple a NIC), and
FSDP's gathers and reductions run under the whole forward and backward. Pipeline sends and
context-parallel ring passes are point-to-point, a couple of channels a peer
(``NCCL_NCHANNELS_PER_NET_PEER``), and are not charged. The share is DeepSeek-V3's, checked on
the calibration set, not fitted to it."""
MOE_EXPERT_KERNEL_S: Final = 10e-6
"""Host time per kernel the grouped expert MLP launches per local expert: Transformer
Engine's ``GroupedLinear`` loops over the rank's experts issuing one GEMM each (and, in FP8,
two more to quantize its input: amax and cast), so a layer's forward costs ``local experts x 2
linears x kernels`` launches of about 10 us; the backward twice that (data and weight
gradients), as the forward's other per-layer work. DeepSpeed-MoE's ``Experts`` does the same
from Python, calling each local expert (the model's MLP) in turn."""
UNALIGNED_GEMM_SLOWDOWN: Final = 5.7
"""How many times longer a matrix product takes when a row of its output or input is not a
whole number of 16 bytes (a vocabulary not a multiple of 8 in 16-bit), measured on an H100 in
bf16 for the LM head at 16K tokens: forward, data and weight gradient together 5.9x slower at
50257 than at 50304, 5.5x at 128257 than at 128256 (tests/data/gpu_runs.json, alignment); the
shipped trainer's GPT-2 step 0.157 s against 0.102 s with the vocabulary padded to 50304."""
TP_OVERLAP_RS_SPLITS: Final = 4
"""Chunks Transformer Engine's userbuffers split a reduce-scatter overlapped with the GEMM
before it into (``num_splits`` 4 in Megatron-Core's default ``ub_cfg`` for the ``proj`` and
``fc2`` reduce-scatters, which run as the ``pipeline`` method; the all-gathers run as
``ring_exchange``): the last chunk's reduce-scatter stays exposed."""
INTRA_EFFICIENCY: Final = 0.8
"""Bus bandwidth NCCL reaches over NVLink / PCIe, as a share of the link's line rate."""
RING_STEP_LATENCY_S: Final = 12e-6
"""Per ring step of a collective across nodes: NCCL's own tuning model (``src/graph/tuning.cc``,
``hwLat``) puts a Simple-protocol ring step over the network at 6.6-9.6 us, before the proxy
thread's and the NIC's share at thousands of ranks; Narayanan et al. 2021's ZeRO-3 runs (Table
2, 384 to 2240 ranks) fit about 12 us."""
RING_STEP_LATENCY_INTRA_S: Final = 4e-6
"""The same over NVLink (NCCL's ``hwLat``: 3.4-5.7 us a Simple ring step)."""
NCCL_HALF_BANDWIDTH_BYTES: Final = 8e6
"""A collective whose ranks each send this many bytes reaches half its bus bandwidth: NCCL
pipelines a buffer through its channels in fixed-size chunks, so small and mid-size buffers
leave the links partly idle (nccl-tests' all_reduce on 8 x A100 NVLink reaches about half its
peak bus bandwidth near 8 MB and 90 % only at a few hundred MB)."""
COLLECTIVE_LAUNCH_S: Final = 12e-6
"""Fixed cost of launching one NCCL collective."""
FP8_GEMM_EFFICIENCY: Final = 0.84
"""An FP8 GEMM's share of the FP8 peak relative to a bf16 GEMM's share of the bf16 peak (its
scaling factors and amax reductions; the casts into FP8 are :data:`FP8_CAST_BYTES`). Chosen on
the calibration sources' FP8 rows (torchtitan's float8 Llama 3 runs), with the casts counted
apart."""
FP8_CAST_BYTES: Final = 4.0
"""HBM bytes per element to quantize an FP8 linear layer's input (forward) or its output's
gradient (backward): read in 16 bit (2), written in FP8 row-wise (1) and column-wise (1), the
transposed copy the other backward GEMM needs (Transformer Engine's ``cast_transpose``,
MXFP8's row- and column-wise blocks). A GEMM of ``m x k`` by ``k x n`` thus moves
``4·m·(k + n)`` bytes of casts besides its ``2·m·n·k`` FLOPs forward and ``4·m·n·k`` backward:
a few per cent of a wide dense layer's linear time (Llama 3 405B at TP 8: 5 %), a quarter of
a fine-grained expert layer's on an H100 (Qwen3-30B-A3B's 768-wide experts: the cast bytes
grow with ``k + n``, the FLOPs with ``k·n``). Weights are quantized once a step (the first
micro-batch's) and not counted."""
DS_GATHER_EFFICIENCY: Final = 0.5
"""Share of the bus bandwidth DeepSpeed ZeRO-3's parameter all-gather reaches: it gathers into
a list of per-rank tensors and copies them into place (``torch.distributed.all_gather``), where
FSDP's flat ``all_gather_into_tensor`` writes in place."""
OFFLOAD_EFFICIENCY: Final = 0.7
"""Fraction of host<->GPU bandwidth an offloaded optimizer step achieves (pinned copies)."""
CPU_ADAM_PARAMS_PER_S_PER_NODE: Final = 2.0e9
"""DeepSpeed CPU-Adam throughput of one server's cores (its GPUs share them)."""
OPTIMIZER_BYTES_PER_PARAM: Final = 36.0
"""HBM traffic of a fused Adam step per local parameter: read and write fp32 master, moments,
read the gradient and write the 16-bit copy (8 fewer with bf16 moments)."""


@dataclass(frozen=True, slots=True)
class Hardware:
    """What the time model needs of the machines."""

    peak_flops: float
    """Dense peak for the plan's precision, FLOP/s per GPU."""
    achievable_mfu: float
    """The catalog's whole-step efficiency: used only when ``gemm_efficiency`` is not given."""
    intra_bytes_per_s: float
    """Scale-up bandwidth per GPU, one direction."""
    inter_bytes_per_s: float
    """Achievable scale-out bandwidth per node, one direction."""
    pcie_bytes_per_s: float
    gpus_per_node: int
    nodes: int
    price_per_gpu_hour: float | None = None
    gemm_efficiency: float = 0.0
    """Fraction of peak a large bf16 GEMM reaches (cuBLAS); 0: derived from achievable_mfu."""
    hbm_bytes_per_s: float = 2.0e12
    nvlink_domain: int = 0
    """GPUs of the NVLink domain the job's groups are placed in where it spans nodes (64 or 72
    on NVL72 racks: :func:`engine.plan.catalog.job_domain`); 0: the node."""
    linear_peak_flops: float = 0.0
    """Peak of the linear layers' GEMMs when they run in a lower precision than the rest (FP8
    training: Transformer Engine / torchao float8 linears, attention and the rest in bf16);
    0: ``peak_flops``."""
    attention_eager: float = 0.0
    """A fused causal attention kernel's rate relative to a large GEMM as PyTorch SDPA runs it
    (FlashAttention-2; the catalog's ``flash_attention_vs_gemm``); 0: :data:`ATTENTION_EFFICIENCY`."""
    attention_fused: float = 0.0
    """The same for Megatron-Core's Transformer Engine kernel (cuDNN, FlashAttention-3 class on
    Hopper); 0: ``attention_eager``."""
    softmax_head_dim: float = 0.0
    """The head width at which a fused attention kernel's exponentials take as long as its
    matmuls: dense peak / (4 x the GPU's exp rate); 0: head width not modelled
    (:func:`head_dim_factor`)."""

    def attention(self, framework: Framework) -> float:
        """The attention kernel's rate relative to a large GEMM under ``framework``."""
        eager = self.attention_eager or ATTENTION_EFFICIENCY
        return (self.attention_fused or eager) if framework == Framework.MEGATRON else eager

    @property
    def gemm(self) -> float:
        """Large-GEMM efficiency."""
        return self.gemm_efficiency or min(0.95, self.achievable_mfu / 0.6)

    @property
    def linear_rate(self) -> float:
        """FLOP/s a large linear-layer GEMM runs at."""
        if self.linear_peak_flops > self.peak_flops:  # :func:`fp8_linears`
            return self.linear_peak_flops * self.gemm * FP8_GEMM_EFFICIENCY
        return self.peak_flops * self.gemm

    @property
    def domain(self) -> int:
        """GPUs reachable over the scale-up link."""
        return max(self.gpus_per_node, self.nvlink_domain)


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


# --------------------------------------------------------------------------------------------
# FLOPs


def attention_dim(dims: ModelDims) -> float:
    """The width attention's score and context products run at: ``heads x head_dim``, or for
    MLA's wider query/key heads (192) and narrower value heads (128) their mean, since
    ``QK^T`` runs at the first and ``PV`` at the second."""
    return dims.heads * (dims.head_dim + dims.value_head_dim) / 2


def window_share(dims: ModelDims, seq_len: int) -> float:
    """A causal attention's score pairs with the model's sliding window, as a share of the
    full causal prefix, averaged over the layers: a window of ``w`` keys over ``s`` tokens
    computes ``s·w - w²/2`` pairs of the ``s²/2`` (``(2sw - w²)/s²``; 0.75 at ``s = 2w``).
    A fused kernel skips the blocks outside the window (FlashAttention's ``window_size``,
    cuDNN's sliding window in Transformer Engine)."""
    w = dims.sliding_window
    if not w or w >= seq_len:
        return 1.0
    windowed = (2 * seq_len * w - w * w) / (seq_len * seq_len)
    return 1.0 - dims.window_layers / dims.layers * (1.0 - windowed)


def _projections(dims: ModelDims, t: float, tp: int, gemm: Callable[..., float]) -> float:
    """Seconds of one layer's attention projections for ``t`` tokens. Standard attention: the
    fused QKV and the output projection, split over TP. MLA (Megatron-Core's
    MLASelfAttention): the down-projections into the query and key/value latents are whole on
    every TP rank, the up-projections to the heads and the output projection split."""
    h = dims.hidden
    if not dims.is_mla:
        q = dims.heads * dims.head_dim
        kv = dims.kv_heads * dims.head_dim
        return gemm(t, (q + 2 * kv) / tp, h) + gemm(t, h, q / tp)
    sec = gemm(t, dims.kv_lora_rank + dims.qk_rope_head_dim, h) + _mla_up(dims, t, tp, gemm)
    if dims.q_lora_rank:
        sec += gemm(t, dims.q_lora_rank, h)
    else:
        sec += gemm(t, dims.heads * dims.head_dim / tp, h)
    return sec + gemm(t, h, dims.heads * dims.value_head_dim / tp)


def projection_flops(dims: ModelDims, tokens: float, tp: int) -> float:
    """FLOPs of one layer's attention projections (QKV, or MLA's down- and up-projections, and
    the output) for ``tokens`` tokens on one of ``tp`` tensor-parallel ranks, forward."""
    return _projections(dims, tokens, tp, lambda m, n, k: 2 * m * n * k)


def _mla_up(dims: ModelDims, t: float, tp: int, gemm: Callable[..., float]) -> float:
    """Seconds of MLA's up-projections from the latents to the heads (keys' no-rotary part and
    values from the key/value latent; queries from the query latent where there is one),
    split over TP: what a light recompute runs again."""
    nope = dims.head_dim - dims.qk_rope_head_dim
    sec = gemm(t, dims.heads * (nope + dims.value_head_dim) / tp, dims.kv_lora_rank)
    if dims.q_lora_rank:
        sec += gemm(t, dims.heads * dims.head_dim / tp, dims.q_lora_rank)
    return sec


def flops_per_token(
    dims: ModelDims,
    seq_len: int,
    recompute: Recompute,
    *,
    attention: bool = True,
    causal: bool = True,
    share: float = 1.0,
) -> float:
    """Training FLOPs executed per token: ``6·N_active`` for the weights, attention ``12·L·d·s``
    (``d`` = heads x head_dim) halved for a causal kernel, and for a full recompute one more
    forward (``2·N_active`` and a third of the attention); selective recompute redoes only the
    attention, MLP-only recompute the MLP's ``2·N_mlp``, light recompute MLA's up-projections;
    ``share``: the layers a full recompute redoes (Megatron's block method)."""
    n = dims.params_active
    attn = 12 * dims.layers * attention_dim(dims) * seq_len if attention else 0.0
    if causal:
        attn *= window_share(dims, seq_len) / 2
    f = 6 * n + attn
    if recompute == Recompute.FULL:
        f += share * (2 * n + attn / 3)
    elif recompute == Recompute.SELECTIVE:
        f += attn / 3
    elif recompute == Recompute.LIGHT and dims.is_mla:
        # The up-projections' weights, 2 FLOPs each a token: the GEMMs of _mla_up.
        f += _mla_up(dims, 1.0, 1, lambda m, n, k: 2 * m * n * k) * dims.layers
    elif recompute == Recompute.MLP:
        mats = 3 if dims.gated_mlp else 2
        k = dims.experts_per_token + dims.shared_experts if dims.is_moe else 1
        f += 2 * (dims.layers - dims.dense_layers) * mats * dims.ffn * dims.hidden * k
        f += 2 * dims.params_dense_mlp * dims.dense_layers
    return float(f)


def model_flops_per_token(dims: ModelDims, seq_len: int) -> float:
    """The FLOPs that MFU counts, in Megatron-LM's convention (``num_floating_point_operations``
    in ``megatron/training/training.py``, the figure its logs print): 6 per active weight of
    every matrix product, the LM head's included and the embedding lookup (token and position
    tables) not, and causal attention's half of the score and context products,
    ``3·L·s·heads·(d_qk + d_v)``; no recompute, no sliding-window discount (Megatron has none).
    Against PaLM's ``6·N + 12·L·h·s`` it is 9 % lower at 8K tokens for Llama 3 8B and half at
    128K."""
    lookup = max(0, dims.params_embedding - dims.vocab * dims.hidden)
    weights = dims.params_active - lookup
    heads = dims.heads * (dims.head_dim + dims.value_head_dim)
    return 6.0 * weights + 3.0 * dims.layers * seq_len * heads


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


def gemm_shape_efficiency(*sizes: float) -> float:
    """Share of the large-GEMM rate a GEMM with these per-GPU dimensions reaches."""
    f = 1.0
    for x in sizes:
        f *= x / (x + GEMM_HALF_DIM)
    return f


# --------------------------------------------------------------------------------------------
# Bandwidth


def _spans_nodes(hw: Hardware, ranks: int, stride: int) -> bool:
    return ranks > 1 and hw.nodes > 1 and ranks * stride > hw.domain


def group_bandwidth(hw: Hardware, ranks: int, stride: int) -> float:
    """Per-rank bus bandwidth of a collective over ``ranks`` ranks placed ``stride`` apart in the
    global rank order (TP innermost, then CP, then DP, then PP). Inside the scale-up domain it
    runs on NVLink; across nodes NCCL spreads its rings over all of a node's NICs, so a group
    gets the node's bandwidth times the share of the node's GPUs it holds (a DP group of one GPU
    per node gets one NIC's worth; a group holding the whole node gets all of them)."""
    intra = hw.intra_bytes_per_s * INTRA_EFFICIENCY
    if not _spans_nodes(hw, ranks, stride):
        return intra
    local = max(1, min(ranks, hw.gpus_per_node // max(1, stride)))
    return min(intra, hw.inter_bytes_per_s * local / hw.gpus_per_node)


_GROUP_LINKS: dict[tuple[int, int, int], tuple[Hardware, float, float]] = {}
""":func:`collective_time`'s (bus bandwidth, ring-step latency) of a group, by the hardware (by
identity, kept beside the value and checked on a hit, as in :data:`_LAYER_CACHE`), the ranks
and the stride: a search times thousands of collectives over a few dozen groups."""
_GROUP_LINKS_MAX = 20_000


def _group_links(hw: Hardware, ranks: int, stride: int) -> tuple[float, float]:
    """(:func:`group_bandwidth`, the latency of one ring step) of a group (cached:
    :data:`_GROUP_LINKS`)."""
    key = (id(hw), ranks, stride)
    hit = _GROUP_LINKS.get(key)
    if hit is not None and hit[0] is hw:
        return hit[1], hit[2]
    hop = RING_STEP_LATENCY_S if _spans_nodes(hw, ranks, stride) else RING_STEP_LATENCY_INTRA_S
    bandwidth = group_bandwidth(hw, ranks, stride)
    if len(_GROUP_LINKS) >= _GROUP_LINKS_MAX:
        _GROUP_LINKS.clear()
    _GROUP_LINKS[key] = (hw, bandwidth, hop)
    return bandwidth, hop


def collective_time(hw: Hardware, nbytes: float, ranks: int, stride: int, steps: int) -> float:
    """Seconds of one collective moving ``nbytes`` per rank in ``steps`` ring steps. A ring step
    ends when its slowest hop does: a ring through several nodes pays the network's latency at
    every step, even where most hops are NVLink."""
    if ranks <= 1:
        return 0.0
    group, hop = _group_links(hw, ranks, stride)
    bandwidth = group * nbytes / (nbytes + NCCL_HALF_BANDWIDTH_BYTES)
    return COLLECTIVE_LAUNCH_S + steps * hop + nbytes / bandwidth


def allreduce_time(hw: Hardware, size: float, ranks: int, stride: int) -> float:
    """Ring all-reduce (NCCL switches to a tree at scale: its latency grows as log n). A group
    spanning nodes with several ranks in each pays the network's latency only on the steps
    that cross a node boundary, NVLink's on the rest (NCCL's own latency model,
    ``src/graph/tuning.cc``: a ring's ``2·nNodes`` inter-node steps of its ``2(n-1)``, a tree's
    ``2·log2(nNodes)`` network hops after ``2(n/nNodes - 1)`` NVLink ones; it runs the faster)."""
    nbytes = ring_allreduce_bytes(size, ranks)
    nodes = nodes_spanned(hw, ranks, stride)
    if nodes <= 1 or nodes >= ranks:
        steps = min(2 * (ranks - 1), 4 * max(1, math.ceil(math.log2(max(2, ranks)))))
        return collective_time(hw, nbytes, ranks, stride, steps)
    per_node = ranks / nodes
    ring = 2 * nodes * RING_STEP_LATENCY_S + 2 * (ranks - 1 - nodes) * RING_STEP_LATENCY_INTRA_S
    tree = 2 * (
        (per_node - 1) * RING_STEP_LATENCY_INTRA_S
        + math.ceil(math.log2(nodes)) * RING_STEP_LATENCY_S
    )
    return collective_time(hw, nbytes, ranks, stride, 0) + min(ring, tree)


def nodes_spanned(hw: Hardware, ranks: int, stride: int) -> int:
    """Scale-up domains (nodes) a group of ``ranks`` ranks ``stride`` apart touches."""
    if not _spans_nodes(hw, ranks, stride):
        return 1
    per_domain = max(1, hw.domain // max(1, stride))
    return min(ranks, math.ceil(ranks / per_domain))


def gather_time(hw: Hardware, size: float, ranks: int, stride: int) -> float:
    """Ring all-gather or reduce-scatter of a ``size``-byte (unsharded) buffer."""
    return collective_time(hw, gather_bytes(size, ranks), ranks, stride, ranks - 1)


# --------------------------------------------------------------------------------------------
# One micro-batch on one stage


class MicroBatch(NamedTuple):
    """Seconds of one micro-batch's forward + backward on the heaviest stage."""

    compute: float
    """GEMMs, attention, element-wise work (and the recompute forward)."""
    comm: float
    """Tensor/context/expert-parallel and pipeline traffic left exposed."""
    backward: float
    """The backward share of ``compute`` (what a once-per-step reduction can hide behind)."""
    fill: float
    """The mean ``compute`` of the other stages: what the pipeline's fill and drain wait on
    (:func:`estimate_time`); ``compute`` itself without a pipeline."""


def _act_bytes(d: LayoutDraft) -> int:
    return 4 if d.precision == Precision.FP32 else 2


class LayerForward(NamedTuple):
    """Seconds of one layer's forward for one micro-batch, by kind of work."""

    gemm: float
    attention: float
    elementwise: float
    mlp: float = 0.0
    """The MLP's share of ``gemm`` (what an MLP-only recompute runs again)."""
    shared: float = 0.0
    """The shared experts' share of ``mlp`` (what can run beside the dispatch and combine,
    :func:`shared_expert_overlap`)."""
    light: float = 0.0
    """What a light recompute runs again: the norms, the experts' activation, MLA's
    up-projections."""


def _layer_forward(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> LayerForward:
    """One layer's forward, one micro-batch: its GEMMs at their shapes' efficiency (MoE: each
    local expert's GEMM sees ``t·k·ep/E`` tokens), causal attention, and the element-wise work
    (replicated over TP ranks unless sequence parallelism splits it)."""
    t = d.micro_batch * seq_len / d.cp
    h, tp = dims.hidden, d.tp
    rate = hw.linear_rate
    # The backward is costed at twice the forward's GEMM time (:func:`_layer_costs`), so the
    # forward carries a third of a linear's casts, forward and backward together.
    cast = FP8_CAST_BYTES / 3 / hw.hbm_bytes_per_s if fp8_linears(hw) else 0.0

    def gemm(m: float, n: float, k: float) -> float:
        return 2 * m * n * k / (rate * gemm_shape_efficiency(m, n, k)) + cast * m * (k + n)

    sec = _projections(dims, t, tp, gemm)
    mats = 2 if dims.gated_mlp else 1
    k_active = dims.experts_per_token + dims.shared_experts if dims.is_moe else 1
    shared = 0.0
    if dims.is_moe:
        # Folded experts (EP over TP ranks, :func:`expert_tp`) route each TP rank's own
        # sequence-parallel share of the tokens and run whole expert widths.
        etp = d.expert_tp
        per_expert = t * etp / tp * dims.experts_per_token * d.ep / dims.num_experts
        mlp = gemm(per_expert, mats * dims.ffn / etp, h) + gemm(per_expert, h, dims.ffn / etp)
        local = dims.num_experts / d.ep
        mlp = mlp * local * moe_imbalance(d)
        if d.framework == Framework.MEGATRON:
            # The expert loop is host bound when each expert's GEMM takes less than launching it.
            kernels = 3 if fp8_linears(hw) else 1
            mlp = max(mlp, local * 2 * kernels * MOE_EXPERT_KERNEL_S)
        elif d.framework == Framework.DEEPSPEED and d.ep > 1:
            # DeepSpeed-MoE's ``Experts`` calls the rank's experts one by one from Python, each
            # the model's own MLP: its linears (``mats`` in, one out), the activation and the
            # gating multiply.
            mlp = max(mlp, local * (mats + 3) * MOE_EXPERT_KERNEL_S)
        if dims.shared_experts:
            # Shared experts: one dense MLP every token passes through, split like the dense
            # MLP over TP (Megatron-Core's SharedExpertMLP), never dispatched.
            width = dims.shared_experts * dims.ffn / tp
            shared = gemm(t, mats * width, h) + gemm(t, h, width)
            mlp += shared
        # The router's GEMM, whole on every rank: not one of Transformer Engine's FP8 linears
        # (Megatron-Core's router multiplies in bf16, or fp32 with --moe-router-dtype), so it
        # casts nothing.
        e = dims.num_experts
        sec += mlp + 2 * t * e * h / (rate * gemm_shape_efficiency(t, e, h))
    else:
        mlp = gemm(t, mats * dims.ffn / tp, h) + gemm(t, h, dims.ffn / tp)
        sec += mlp
    attn = _attention_forward(dims, d, hw, seq_len, t)
    width = h / (tp if d.sequence_parallel else 1) + dims.ffn * k_active / tp / 4
    eager = EAGER_PASSES_LAYERNORM
    if dims.gated_mlp:
        eager = EAGER_MODULE_PASSES if d.eager_modules else EAGER_PASSES
    elem_bytes = ELEMENTWISE_BYTES * (1.0 if d.framework == Framework.MEGATRON else eager)
    elem = elem_bytes * t * width * _act_bytes(d) / 2 / hw.hbm_bytes_per_s
    fixed = LAYER_OVERHEAD_S
    if dims.is_moe:
        fixed += MOE_DROP_DISPATCH_S if d.capacity else MOE_DISPATCH_S
        # Permutation: the k routed copies of each of the rank's tokens are gathered into
        # expert order before the dispatch and scattered back (weighted) after the combine,
        # each copy read and written once each way; Megatron's all-to-all dispatcher sorts
        # them a second time by local expert after the dispatch and back before the combine
        # where a rank holds several experts (``sort_chunks_by_idxs``).
        passes = 8 if _sorts_by_local_expert(dims, d) else 4
        elem += passes * _routed(dims, d, t) * h * _act_bytes(d) / hw.hbm_bytes_per_s
    light = _light_forward(dims, d, hw, t, gemm) if d.recompute == Recompute.LIGHT else 0.0
    return LayerForward(sec, attn, elem + fixed, mlp, shared, light)


def _light_forward(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, t: float, gemm: Callable[..., float]
) -> float:
    """Seconds a light recompute (:attr:`Recompute.LIGHT`) repeats of one layer's forward: the
    norms not fused into a linear (each reads and writes the hidden state), the routed
    experts' activation (reads the gate and up halves, writes the product) and MLA's
    up-projection GEMMs."""
    h_local = dims.hidden / (d.tp if d.sequence_parallel else 1)
    moved = 2 * t * h_local * (dims.is_moe + dims.is_mla)
    if dims.is_moe:
        moved += 3 * _routed(dims, d, t) * dims.ffn / d.expert_tp
    sec = moved * _act_bytes(d) / hw.hbm_bytes_per_s
    return sec + (_mla_up(dims, t, d.tp, gemm) if dims.is_mla else 0.0)


def _sorts_by_local_expert(dims: ModelDims, d: LayoutDraft) -> bool:
    """Whether Megatron-Core's all-to-all dispatcher copies the received tokens once more, into
    local-expert order, after the dispatch and back before the combine ("Permutation 2",
    ``MoEAlltoAllTokenDispatcher.dispatch_postprocess``): a Megatron layout with several
    experts a rank and no DeepEP (which hands the tokens over already grouped)."""
    return (
        d.framework == Framework.MEGATRON
        and not d.deepep
        and d.ep > 1
        and dims.num_experts // d.ep > 1
    )


def _routed(dims: ModelDims, d: LayoutDraft, t: float) -> float:
    """Routed token copies on the busiest expert rank for ``t`` local tokens: each TP rank's
    sequence-parallel share (folded experts: whole widths), ``k`` copies of each."""
    return t * d.expert_tp / d.tp * dims.experts_per_token * moe_imbalance(d)


def moe_imbalance(d: LayoutDraft) -> float:
    """The busiest expert-parallel rank's load over the mean: as the user states it
    (``--moe-imbalance``), else :data:`MOE_IMBALANCE` under dropless routing; a capacity
    factor caps it (tokens beyond capacity are dropped). Without expert parallelism every rank
    holds every expert and runs all ``k`` copies of its own tokens however the router spreads
    them: there is no busiest rank to wait for."""
    if d.ep <= 1:
        return 1.0
    load = d.imbalance or MOE_IMBALANCE
    return min(load, d.capacity) if d.capacity else load


def _attention_forward(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int, t: float
) -> float:
    """Seconds of one layer's attention core (scores, softmax, context), forward, one
    micro-batch of ``t`` local tokens. A fused causal kernel computes half the scores (each
    query attends to half the keys) at the GPU's attention rate for the framework's kernel
    (:meth:`Hardware.attention`: FlashAttention-2 under SDPA, cuDNN / FA3 under Megatron) and never
    writes them to memory. The classic path computes every score (the causal mask is applied
    after the ``QK^T`` GEMM) in two batched GEMMs whose inner or outer dimension is the head
    dimension, and moves the ``heads/TP x s x s`` score matrix through HBM
    (:data:`SCORE_BYTES`: written, softmaxed, dropped out, read by the context GEMM)."""
    q = attention_dim(dims) / d.tp
    flops = 4 * t * seq_len * q
    if fused_attention(d):
        rate = hw.peak_flops * hw.gemm * hw.attention(d.framework)
        flops *= window_share(dims, seq_len)
        return flops / 2 / (rate * head_dim_factor(dims.head_dim, hw.softmax_head_dim))
    shape = gemm_shape_efficiency(seq_len / d.cp, seq_len, dims.head_dim)
    scores = t * seq_len * dims.heads / d.tp
    score_bytes = SCORE_BYTES if not dims.gated_mlp else SCORE_BYTES_NO_DROPOUT
    return flops / (hw.peak_flops * hw.gemm * shape) + scores * score_bytes / hw.hbm_bytes_per_s


def head_dim_factor(head_dim: int, softmax_head_dim: float) -> float:
    """A fused attention kernel's rate at ``head_dim`` relative to its rate at
    :data:`ATTENTION_HEAD_DIM`, where the catalog states it. Each score costs ``4 x head_dim``
    matmul FLOPs and one exponential on the special-function units, which run some hundred
    times slower than the tensor cores, so the kernel's time per FLOP grows as
    ``1 + softmax_head_dim / head_dim``. FlashAttention-3 measures it (Shah et al. 2024,
    Fig. 5, H100 bf16 forward at 4k): head width 64 at 476 TFLOP/s against 638 at 128 (0.75;
    this model: 0.75). Wider heads gain nothing measured (their tiles shrink): capped at 1."""
    if not softmax_head_dim or head_dim >= ATTENTION_HEAD_DIM:
        return 1.0
    return (1 + softmax_head_dim / ATTENTION_HEAD_DIM) / (1 + softmax_head_dim / head_dim)


def padded_vocab(vocab: int) -> int:
    """The vocabulary rounded up to a multiple of 64 (nanoGPT's 50257 -> 50304)."""
    return -(-vocab // 64) * 64


def unaligned_vocab(dims: ModelDims, d: LayoutDraft) -> bool:
    """Whether the logits' rows (the vocabulary on one TP rank) are not a whole number of 16
    bytes, so cuBLAS cannot run the head's products on its tensor-core kernels. Megatron pads
    the vocabulary (``--make-vocab-size-divisible-by 128``, times TP); the Hugging Face model
    an eager framework trains keeps the configuration's size (GPT-2's 50257)."""
    if d.framework == Framework.MEGATRON:
        return False
    elements = 16 // (4 if d.precision == Precision.FP32 else 2)
    return (dims.vocab // d.tp) % elements != 0


def _head_forward(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """The LM head and the loss of one micro-batch, forward (the last stage runs it). The head
    stays in bf16 under FP8 training: Megatron-Core's output layer is a plain
    ``ColumnParallelLinear``, not a Transformer Engine module, and torchtitan's float8
    converter skips it (``filter_fqns``: ``output``)."""
    t = d.micro_batch * seq_len / d.cp
    n = dims.vocab / d.tp
    softmax = 3 * 4 * t * n / hw.hbm_bytes_per_s  # fp32 logits: write, read, write grad
    return _head_gemm_forward(dims, d, hw, seq_len) + softmax


def _head_gemm_forward(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """The LM head's matrix product of one micro-batch, forward, at an aligned vocabulary."""
    t = d.micro_batch * seq_len / d.cp
    n = dims.vocab / d.tp
    rate = hw.peak_flops * hw.gemm
    return 2 * t * n * dims.hidden / (rate * gemm_shape_efficiency(t, n, dims.hidden))


def unpadded_vocab_seconds(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """Seconds a step would take longer if the vocabulary were left unaligned
    (:func:`unaligned_vocab`): the head's three products of every micro-batch, each
    :data:`UNALIGNED_GEMM_SLOWDOWN` times longer. The estimates assume it padded, as Megatron
    pads it and as the plan tells the user to."""
    if not unaligned_vocab(dims, d):
        return 0.0
    head = _head_gemm_forward(dims, d, hw, seq_len)
    return d.grad_accum * 3 * head * (UNALIGNED_GEMM_SLOWDOWN - 1)


def _mtp_projection_forward(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """One multi-token prediction module's projection of the normed hidden state and next
    token's embedding, concatenated (``2h``), back to ``h``, one micro-batch, forward
    (Megatron-Core's ``eh_proj``, split over TP)."""
    t = d.micro_batch * seq_len / d.cp
    n = dims.hidden / d.tp
    k = 2 * dims.hidden
    return 2 * t * n * k / (hw.peak_flops * hw.gemm * gemm_shape_efficiency(t, n, k))


def _tp_comm(
    dims: ModelDims,
    d: LayoutDraft,
    hw: Hardware,
    seq_len: int,
    wgrad: float,
    linear: float = 0.0,
) -> float:
    """Exposed tensor-parallel seconds of one layer, one micro-batch: two all-reduces (or
    all-gather + reduce-scatter pairs with SP) forward, two backward (Megatron hides those
    behind the weight-gradient GEMMs, ``wgrad`` seconds), two more for a full recompute. Under
    ``--tp-comm-overlap`` (:func:`tp_comm_overlap`) each pass's collectives run beside the
    GEMMs next to them, ``linear`` seconds forward (those of the attention projections, and of
    the MLP where it is split over TP) and twice that backward, holding
    :data:`COMM_SM_SHARE` of the SMs while they do."""
    if d.tp <= 1:
        return 0.0
    size = d.micro_batch * seq_len / d.cp * dims.hidden * _act_bytes(d)
    one = allreduce_time(hw, size, d.tp, 1)
    if d.sequence_parallel:
        one = 2 * gather_time(hw, size, d.tp, 1)
    again = {Recompute.FULL: 1.0 + _recomputed_share(dims, d), Recompute.MLP: 1.5}.get(
        d.recompute, 1.0
    )
    mlp = one
    if dims.is_moe and d.expert_tp == 1:
        # Whole experts (LayoutDraft.expert_tp) take each rank's sequence-parallel tokens as
        # they are: an MoE layer's MLP has no tensor-parallel collective, only its attention.
        mlp = 0.0
    elif dims.is_moe:
        # Experts split over TP: Megatron's all-to-all dispatcher all-gathers the routed tokens
        # (k copies of each) over the expert-TP group and reduce-scatters the experts' output.
        routed = size * dims.experts_per_token
        mlp = 2 * gather_time(hw, routed, d.expert_tp, 1)
    forward = (one + mlp) * again  # a recomputed forward repeats its all-reduces
    backward = one + mlp
    if linear and tp_comm_overlap(d.framework, d.tp, d.sequence_parallel, d.precision):
        # Userbuffers pass the all-gathers round a ring, each step's transfer beside the GEMM
        # of the chunk already there (all of it hidden); the reduce-scatters follow the GEMM in
        # TP_OVERLAP_RS_SPLITS chunks, the last one's with nothing after it to hide behind.
        tail = (one + mlp) / 2 / TP_OVERLAP_RS_SPLITS
        hidden = one + mlp - tail
        return again * (tail + _behind(hidden, linear)) + tail + _behind(hidden, 2 * linear)
    if d.framework == Framework.MEGATRON and fused_attention(d):
        backward = _behind(backward, wgrad)
    return forward + backward


def _tp_linear(dims: ModelDims, d: LayoutDraft, f: LayerForward) -> float:
    """Forward seconds of the GEMMs beside a layer's tensor-parallel collectives: all of its
    linears, less the routed experts where they are whole on their GPU (folded, ``etp`` 1),
    which have no tensor-parallel collective next to them."""
    if dims.is_moe and d.expert_tp == 1:
        return f.gemm - f.mlp + f.shared
    return f.gemm


def _cp_ep_comm(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """Exposed context-parallel (ring passes of K and V) and expert-parallel (all-to-all
    dispatch and combine, forward and backward) seconds of one layer, one micro-batch, without
    Megatron's all-to-all overlap or a shared expert beside it (see :func:`_layer_costs`)."""
    return _cp_comm(dims, d, hw, seq_len) + _ep_comm(dims, d, hw, seq_len)


def _cp_comm(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """Exposed context-parallel seconds of one layer, one micro-batch (:func:`cp_comm_of`).
    Passed round a ring (Megatron's ``p2p``), the other ranks' keys and values come in forward
    and again backward and their gradients go back, each step's transfer beside the attention
    to the chunk already there; all-gathered, the same bytes move before the attention and
    after it, exposed; all-to-all (Ulysses), the rank's queries, keys and values go out to the
    ranks holding their heads and the attention's output comes back, and the same again for
    the gradients, exposed."""
    if d.cp <= 1:
        return 0.0
    t = d.micro_batch * seq_len / d.cp
    b = _act_bytes(d)
    kv_width = dims.kv_heads * dims.head_dim / d.tp
    how = cp_comm_of(d)
    if how == CpComm.A2A:
        q_width = attention_dim(dims) / d.tp
        into = alltoall_time(hw, t * (q_width + 2 * kv_width) * b, d.cp, d.tp)
        back = alltoall_time(hw, t * q_width * b, d.cp, d.tp)
        return 2 * (into + back)
    kv = 2 * t * kv_width * b
    if how == CpComm.ALLGATHER:
        return 3 * gather_time(hw, kv * d.cp, d.cp, d.tp)
    vol = 3 * (d.cp - 1) * kv
    return vol / group_bandwidth(hw, d.cp, d.tp) * (1 - Overlap.cp)


def _ep_comm(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """Seconds of one layer's expert-parallel all-to-alls for one micro-batch (dispatch and
    combine forward and backward, and again for a recomputed forward), none hidden."""
    if not dims.is_moe or d.ep <= 1:
        return 0.0
    routed = seq_len / d.cp * d.micro_batch * dims.hidden * _act_bytes(d)
    routed *= dims.experts_per_token / d.tp
    passes = 6 if d.recompute in (Recompute.FULL, Recompute.MLP) else 4
    # The expert-parallel group is consecutive ranks (Megatron-Core orders expert ranks
    # tp-ep-dp-pp with the expert TP of :func:`expert_tp`, 1 under EP).
    # NCCL's all-to-all sends every routed copy; DeepEP one per remote node (copies).
    copies = dims.experts_per_token if d.deepep else 1
    one = alltoall_time(
        hw,
        routed * moe_imbalance(d),
        d.ep,
        d.expert_tp,
        copies=copies,
        groups=(dims.expert_groups, dims.group_topk),
    )
    return passes * one


def alltoall_time(
    hw: Hardware,
    nbytes: float,
    ranks: int,
    stride: int,
    *,
    copies: int = 1,
    groups: tuple[int, int] = (0, 0),
) -> float:
    """Seconds of one all-to-all in which each of ``ranks`` ranks (``stride`` apart) sends
    ``nbytes`` spread evenly over the group (MoE dispatch or combine). Unlike a ring, every
    byte bound for another scale-up domain crosses the network: the share ``(n - l)/n`` of it
    (``l`` ranks of the group in this rank's domain) leaves through this GPU's share of its
    node's NICs (every GPU of the node runs its own all-to-all at the same moment), the rest
    over NVLink, both at once (NCCL posts every peer's send together). A ring all-reduce
    crossing nodes gives a rank the whole node's NICs; an all-to-all gives it one NIC's worth.
    ``copies``: ``nbytes`` holds that many copies of each token (MoE top-k); a hierarchical
    dispatcher (DeepEP, Megatron-Core's flex dispatcher; DeepSeek-V3 report §3.2.2) sends a
    token once to each remote domain that hosts one of its experts and fans it out there over
    NVLink, so the network carries ``(D - 1)(1 - (1 - 1/D)^k)`` copies of it, ``D`` domains,
    instead of ``k (n - l)/n``; fewer under group-limited routing (``groups``: see
    :func:`domain_reach`)."""
    if ranks <= 1:
        return 0.0
    local = max(1, min(ranks, hw.domain // max(1, stride)))
    intra = hw.intra_bytes_per_s * INTRA_EFFICIENCY
    sent = nbytes * (ranks - 1) / ranks
    ramp = sent / (sent + NCCL_HALF_BANDWIDTH_BYTES)
    nvlink = nbytes * (local - 1) / ranks / (intra * ramp)
    latency = RING_STEP_LATENCY_INTRA_S
    remote = 0.0
    if local < ranks and hw.nodes > 1:
        nic = hw.inter_bytes_per_s / hw.gpus_per_node
        share = (ranks - local) / ranks
        if copies > 1:
            domains = math.ceil(ranks / local)
            share = (domains - 1) * domain_reach(domains, copies, *groups) / copies
        remote = nbytes * share / (nic * ramp)
        latency = RING_STEP_LATENCY_S
    return COLLECTIVE_LAUNCH_S + latency + max(nvlink, remote)


def domain_reach(domains: int, k: int, groups: int = 0, topk: int = 0) -> float:
    """Probability that a token's ``k`` routed experts include one in a given other scale-up
    domain, the EP group spread over ``domains`` of them. Unrestricted routing:
    ``1 - (1 - 1/D)^k``. Group-limited routing (DeepSeek-V3's node-limited routing, report
    §2.1.2: its 256 experts in ``n_group`` 8 contiguous groups, each token's experts from the
    ``topk_group`` 4 groups of highest affinity; Megatron-Core's ``--moe-router-num-groups`` /
    ``--moe-router-group-topk``) confines a token to ``topk`` of the ``groups`` groups: with
    EP64 over eight 8-GPU nodes a group is a node, and a token reaches at most 4 of them
    (0.45 of each other node instead of 0.66). A domain holding ``g`` whole groups is reached
    when some of them are chosen (hypergeometric) and one of the ``k`` experts, spread over the
    ``topk`` chosen groups, lands in them; a group spanning several domains must be chosen and
    then holds ``groups / (topk D)`` of the token's candidates in each. Groups that do not
    align with domains are taken as unrestricted."""
    free = 1 - (1 - 1 / domains) ** k
    if not groups or not 0 < topk < groups:
        return free
    if domains >= groups and domains % groups == 0:
        return topk / groups * (1 - (1 - groups / (topk * domains)) ** k)
    if groups % domains:
        return free
    g = groups // domains
    total = math.comb(groups, topk)
    return sum(
        math.comb(g, j) * math.comb(groups - g, topk - j) / total * (1 - (1 - j / topk) ** k)
        for j in range(1, min(g, topk) + 1)
    )


def _host_bound_gap(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int, layer_fwd: float
) -> float:
    """Seconds one layer's forward passes (the forward, and the recomputed one under full
    recompute) wait on the host, one micro-batch: the classic fp16 stack (see
    :func:`fused_attention`) issues every kernel of a layer from Python, one by one
    (:data:`CLASSIC_LAYER_HOST_S`), and its tensor-parallel all-reduces run on the compute
    stream, so a forward whose GPU work plus all-reduces is shorter than that is host bound.
    Only small per-GPU layers reach it (a 3.6B GPT at TP 8: 0.6 ms of GPU work a layer)."""
    if fused_attention(d) or d.framework != Framework.MEGATRON:
        return 0.0
    size = d.micro_batch * seq_len / d.cp * dims.hidden * _act_bytes(d)
    tp_fwd = 2 * allreduce_time(hw, size, d.tp, 1) if d.tp > 1 else 0.0
    passes = 1.0 + (_recomputed_share(dims, d) if d.recompute == Recompute.FULL else 0.0)
    return passes * max(0.0, CLASSIC_LAYER_HOST_S - layer_fwd - tp_fwd)


def _recomputed_share(dims: ModelDims, d: LayoutDraft) -> float:
    """Share of the heaviest stage's layers a full recompute runs again: all of them, or the
    first ``recompute_layers`` of each of its model chunks (Megatron's block method)."""
    if not d.recompute_layers:
        return 1.0
    heaviest = max(stage_layers(dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers))
    return min(max(1, d.virtual_stages) * d.recompute_layers, heaviest) / heaviest


def _layer_costs(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int
) -> tuple[float, float, float]:
    """One layer's (forward + backward, backward, exposed TP/CP/EP traffic) seconds for one
    micro-batch."""
    f = _layer_forward(dims, d, hw, seq_len)
    layer_fwd = f.gemm + f.attention + f.elementwise
    attn_bwd = FLASH_BACKWARD if fused_attention(d) else 2.0
    layer_bwd = 2 * f.gemm + attn_bwd * f.attention + 2 * f.elementwise
    if d.recompute == Recompute.FULL:
        layer_bwd += layer_fwd * _recomputed_share(dims, d)
    elif d.recompute == Recompute.SELECTIVE:
        layer_bwd += f.attention
    elif d.recompute == Recompute.MLP:
        layer_bwd += f.mlp
    elif d.recompute == Recompute.LIGHT:
        layer_bwd += f.light
    per_layer = layer_fwd + layer_bwd + _host_bound_gap(dims, d, hw, seq_len, layer_fwd)
    # Megatron hides the backward TP all-reduce behind the weight-gradient GEMMs of the
    # column-parallel layers: about half of the layer's GEMM time.
    comm = _tp_comm(dims, d, hw, seq_len, f.gemm / 2, _tp_linear(dims, d, f))
    comm += _cp_comm(dims, d, hw, seq_len)
    ep = _ep_comm(dims, d, hw, seq_len)
    if d.a2a_overlap and a2a_overlap_applies(dims, d):
        # Combined 1F1B: this layer's forward for one micro-batch runs beside its backward for
        # another, each one's dispatch and combine behind the other's compute; what the
        # compute cannot cover stays exposed, and the all-to-all kernels hold some SMs.
        hidden = min(ep, per_layer)
        per_layer += COMM_SM_SHARE * hidden
        comm += ep - hidden
    elif shared_expert_overlap(dims, d.framework, d.ep, deepep=d.deepep):
        # The shared expert's first linear runs beside the dispatch, its second beside the
        # combine, forward and backward: it hides as much of them as it takes.
        comm += ep - min(ep, 3 * f.shared)
    else:
        comm += ep
    return per_layer, layer_bwd, comm


_LAYER_CACHE: dict[tuple[object, ...], tuple[object, ...]] = {}
"""One layer's costs by the layout fields they read (:func:`_layer_key`): the search times
thousands of layouts that differ only in their data-parallel degree, strategy, pipeline depth
or accumulation, which leave a layer's forward and backward as they are."""
_LAYER_CACHE_MAX = 20_000


_SHAPE_FIELDS = (
    "strategy",
    "dp",
    "grad_accum",
    "offload",
    "zero_stage",
    "pp",
    "virtual_stages",
    "first_stage_layers",
    "last_stage_layers",
    "pp_schedule",
)
"""The :class:`LayoutDraft` fields one layer's costs (:func:`_layer_costs`) never read, or read
only as :func:`_layer_key` keeps them."""
_LAYER_FIELDS = tuple(f.name for f in fields(LayoutDraft) if f.name not in _SHAPE_FIELDS)


def _layer_key(d: LayoutDraft) -> tuple[object, ...]:
    """``d`` without the fields one layer's costs (:func:`_layer_costs`) never read: the
    data-parallel degree, the accumulation, the strategy and offload, and the pipeline's shape
    and the ZeRO stage except where they decide something of the layer (a block recompute's
    share of the stage, the all-to-all overlap's schedule). Every other field is kept, so a
    field added to the draft is in the key."""
    block = d.recompute == Recompute.FULL and d.recompute_layers > 0
    shape: tuple[object, ...] = ()
    if block:
        shape = (d.pp, d.virtual_stages, d.first_stage_layers, d.last_stage_layers)
    if d.a2a_overlap:
        shape += (d.pp == 1 or d.virtual_stages > 1, d.zero_stage >= 3)
    return (*(getattr(d, name) for name in _LAYER_FIELDS), shape)


def _layer_costs_cached(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """(MoE or dense layer, leading dense layer) costs of ``d`` (:func:`_layer_costs`), cached
    on the objects themselves (``dims`` and ``hw`` by identity, checked on a hit)."""
    key = (id(dims), id(hw), seq_len, _layer_key(d))
    hit = _LAYER_CACHE.get(key)
    if hit is not None and hit[0] is dims and hit[1] is hw:
        return hit[2], hit[3]  # type: ignore[return-value]
    moe = _layer_costs(dims, d, hw, seq_len)
    dense = _layer_costs(dims.dense_view(), d, hw, seq_len) if dims.dense_layers else moe
    if len(_LAYER_CACHE) >= _LAYER_CACHE_MAX:
        _LAYER_CACHE.clear()
    _LAYER_CACHE[key] = (dims, hw, moe, dense)
    return moe, dense


@lru_cache(maxsize=4096)
def _stage_kinds(
    layers: int, pp: int, first: int, last: int, dense_layers: int, mtp: int
) -> tuple[tuple[tuple[int, int, bool], ...], tuple[int, ...]]:
    """The pipeline's kinds of stage for :func:`micro_batch_time`, each (layers, leading dense
    layers, whether it is the last stage) in the order they first appear, and each stage's kind:
    the leading dense layers fill the first stages, the multi-token prediction modules (``mtp``)
    are the last stage's layers."""
    split = stage_layers(layers, pp, first, last)
    kinds: dict[tuple[int, int, bool], int] = {}
    of_stage: list[int] = []
    before = 0
    end = len(split) - 1
    for i, n in enumerate(split):
        n_dense = min(n, max(0, dense_layers - before))
        before += n
        if i == end:
            n += mtp
        of_stage.append(kinds.setdefault((n, n_dense, i == end), len(kinds)))
    return tuple(kinds), tuple(of_stage)


def micro_batch_time(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> MicroBatch:
    """One micro-batch's forward and backward on the heaviest pipeline stage: its layers (the
    last stage's plus the LM head when that is heavier), the exposed TP/CP/EP traffic, and the
    pipeline sends (one pair per model chunk). An MoE model's leading dense layers
    (:attr:`ModelDims.dense_layers`) sit on the first stage and are costed as the dense layers
    they are; multi-token prediction modules (:func:`mtp_modules`) on the last, each one more
    layer, its ``2h -> h`` projection and one more pass through the head."""
    moe, dense = _layer_costs_cached(dims, d, hw, seq_len)
    mtp = mtp_modules(dims, d)
    head = 3 * _head_forward(dims, d, hw, seq_len)
    head += mtp * (head + 3 * _mtp_projection_forward(dims, d, hw, seq_len))
    comm = backward = 0.0
    kinds, of_stage = _stage_kinds(
        dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers, dims.dense_layers, mtp
    )
    summed: list[float] = []
    offloaded = 0.0
    if d.offload_modules:
        offloaded = offloaded_layer_bytes(dims, d, max(1, seq_len // d.cp), expert_load(d))
    for n, n_dense, last in kinds:  # each kind of stage once (most of an even split is one)
        stage = [n_dense * a + (n - n_dense) * b for a, b in zip(dense, moe, strict=True)]
        summed.append(stage[0] + (head if last else 0.0))
        backward = max(backward, stage[1])
        exposed = stage[2]
        if offloaded:
            exposed += offload_exposed(hw, offloaded * n, stage[0] - stage[1], stage[1])
        comm = max(comm, exposed)
    stages = [summed[k] for k in of_stage]
    compute = max(stages)
    fill = (sum(stages) - compute) / (len(stages) - 1) if len(stages) > 1 else compute
    if d.pp > 1:
        comm += _p2p(dims, d, hw, seq_len) * (1 - Overlap.pp)
    return MicroBatch(compute, comm, backward, fill)


def offload_exposed(hw: Hardware, moved: float, forward: float, backward: float) -> float:
    """Seconds of one micro-batch's activation offloading a stage cannot hide: ``moved`` bytes
    go to the host on their own stream as the ``forward`` runs and come back as the
    ``backward`` does (Megatron-Core's fine-grained offloading, the Megatron Core MoE report's
    §4.1.5: the copy engines run beside the compute), each direction at the host link's
    pinned-copy rate; what a pass cannot cover waits."""
    seconds = moved / (hw.pcie_bytes_per_s * OFFLOAD_EFFICIENCY)
    return max(0.0, seconds - forward) + max(0.0, seconds - backward)


def _p2p(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> float:
    """Seconds of one micro-batch's pipeline sends on a stage (activation forward, its gradient
    backward, once per model chunk). Stages run in lock step, so when the pipeline spans
    nodes its slowest boundary, the one between two nodes, sets the pace: every GPU of the
    sending stage on a node shares that node's NICs. Megatron sends each tensor-parallel rank
    a ``1/TP`` slice and all-gathers it over NVLink on arrival (Narayanan et al. 2021, §4.1,
    "scatter/gather"); sequence parallelism's activations are already split."""
    act = d.micro_batch * seq_len / d.cp * dims.hidden * _act_bytes(d)
    stride = d.tp * d.cp * d.dp
    if d.pp * stride > hw.domain and hw.nodes > 1:
        stride = max(stride, hw.domain)
    gather = 0.0
    if d.sequence_parallel:
        act /= d.tp
    elif d.framework == Framework.MEGATRON and d.tp > 1:
        gather = gather_time(hw, act, d.tp, 1)
        act /= d.tp
    one = collective_time(hw, act, 2, stride, 1) + gather
    return 2 * one * max(1, d.virtual_stages)


class LayerCost(NamedTuple):
    """Seconds of one layer for one micro-batch, as :func:`micro_batch_time` adds them up."""

    compute: float
    """Forward and backward (and what a recompute runs again), host waits included."""
    backward: float
    """The backward share of ``compute``."""
    exposed: float
    """Tensor-, context- and expert-parallel traffic left exposed after every overlap."""


class Terms(NamedTuple):
    """One micro-batch of layout ``d`` on one GPU, term by term: what :func:`micro_batch_time`
    and :func:`estimate_time` are built from, for tests and for explaining an estimate. Layer
    figures are one (MoE) layer of the heaviest stage; seconds throughout."""

    forward: LayerForward
    """One layer's forward by kind of work."""
    layer: LayerCost
    """One layer's forward and backward and its exposed traffic."""
    tp: float
    """Exposed tensor-parallel seconds of one layer (the backward's behind the layer's
    weight-gradient GEMMs where the framework overlaps them)."""
    cp: float
    """Exposed context-parallel seconds of one layer."""
    ep: float
    """One layer's expert-parallel all-to-alls, none of them hidden."""
    host_gap: float
    """Seconds one layer's forward passes wait on the host (the classic fp16 stack)."""
    head: float
    """The LM head and the loss, forward."""
    p2p: float
    """The pipeline sends of one micro-batch on a stage, none hidden."""
    routed: float
    """Routed token copies on the busiest expert rank (MoE; the micro-batch's local tokens
    times ``k`` times the imbalance)."""

    @property
    def cp_ep(self) -> float:
        """Context- and expert-parallel seconds of one layer, before any overlap hides the
        all-to-alls."""
        return self.cp + self.ep


def terms(dims: ModelDims, d: LayoutDraft, hw: Hardware, seq_len: int) -> Terms:
    """The terms of one micro-batch of layout ``d`` (see :class:`Terms`)."""
    f = _layer_forward(dims, d, hw, seq_len)
    t = d.micro_batch * seq_len / d.cp
    return Terms(
        forward=f,
        layer=LayerCost(*_layer_costs(dims, d, hw, seq_len)),
        tp=_tp_comm(dims, d, hw, seq_len, f.gemm / 2, _tp_linear(dims, d, f)),
        cp=_cp_comm(dims, d, hw, seq_len),
        ep=_ep_comm(dims, d, hw, seq_len),
        host_gap=_host_bound_gap(dims, d, hw, seq_len, f.gemm + f.attention + f.elementwise),
        head=_head_forward(dims, d, hw, seq_len),
        p2p=_p2p(dims, d, hw, seq_len),
        routed=_routed(dims, d, t) if dims.is_moe else 0.0,
    )


# --------------------------------------------------------------------------------------------
# The step


def estimate_time(
    dims: ModelDims,
    d: LayoutDraft,
    hw: Hardware,
    *,
    seq_len: int,
    tokens_budget: float | None = None,
    mb: MicroBatch | None = None,
) -> Estimate:
    """Step time and throughput of layout ``d``: ``m`` micro-batch times on the heaviest stage
    and ``(p-1)/v`` on the others (the pipeline's fill and drain), then what is left exposed of
    the data-parallel reduction, offload and the optimizer step. Rank order is TP innermost,
    then CP, then DP, then PP outermost (Megatron's order), so TP stays inside a node, PP spans
    nodes. ``mb``: :func:`micro_batch_time` of ``d``, when the caller has it.

    Every term is a sum of non-negative seconds, so the step is never shorter than its
    micro-batches' share (:func:`step_floor`): the search ranks by that bound first."""
    world = d.world_size
    tokens = d.global_batch * seq_len
    share = _recomputed_share(dims, d)
    total_flops = flops_per_token(dims, seq_len, d.recompute, share=share) * tokens
    if mb is None:
        mb = micro_batch_time(dims, d, hw, seq_len)
    m = d.grad_accum
    v = max(1, d.virtual_stages)
    slots = m + ((d.pp - 1) / v if d.pp > 1 else 0.0)
    bubble = bubble_fraction(d.pp, m, v)
    comm, optimizer = _step_comm(dims, d, hw, mb)
    # 1F1B with stage times t_i takes (m - 1) max t + sum t: the first micro-batch's forward
    # crosses every stage, the heaviest runs all m, the last backward crosses back. The fill
    # and drain are the other stages' work, not the heaviest's (the LM head's last stage).
    compute = mb.compute * m + mb.fill * (slots - m) + optimizer
    exposed = mb.comm * slots + comm
    step = compute + exposed
    tokens_per_s = tokens / step
    mfu = model_flops_per_token(dims, seq_len) * tokens / (step * world * hw.peak_flops)
    gpu_hours = cost = None
    if tokens_budget:
        gpu_hours = tokens_budget / tokens * step * world / 3600
        if hw.price_per_gpu_hour is not None:
            cost = gpu_hours * hw.price_per_gpu_hour
    return Estimate(
        step_time_s=step,
        compute_time_s=compute,
        comm_time_s=exposed,
        bubble_fraction=bubble,
        tokens_per_s=tokens_per_s,
        mfu=min(1.0, mfu),
        # The same layout's step with no exposed communication, over the step.
        scaling_efficiency=min(1.0, compute / step),
        flops_per_step=total_flops,
        gpu_hours=gpu_hours,
        cost_usd=cost,
    )


def step_floor(d: LayoutDraft, mb: MicroBatch) -> float:
    """A lower bound of :func:`estimate_time`'s step time for ``d`` whose micro-batch is ``mb``:
    the micro-batches' compute (the pipeline's fill and drain included) and their exposed
    traffic, without the optimizer step and the once-a-step communication (seconds, none
    negative). Each term rounded as the step's own, so the bound holds in floating point too:
    rounding never turns a larger sum into a smaller one."""
    m = d.grad_accum
    v = max(1, d.virtual_stages)
    slots = m + ((d.pp - 1) / v if d.pp > 1 else 0.0)
    return (mb.compute * m + mb.fill * (slots - m)) + mb.comm * slots


def _step_comm(
    dims: ModelDims, d: LayoutDraft, hw: Hardware, mb: MicroBatch
) -> tuple[float, float]:
    """(exposed communication, optimizer step) seconds per step outside the micro-batch loop:
    the data-parallel traffic of the dense and expert parameters, offload's copies and CPU
    step, the optimizer states' copies to the host and back where Megatron offloads them
    between steps; the optimizer step's HBM traffic over the parameters this GPU updates."""
    dense, expert = stage_params(dims, d)
    units = max(stage_layers(dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers))
    sharded_3d = d.strategy == Strategy.THREE_D and d.zero_stage >= 3
    exposed = data_parallel_exposed(
        d, hw, dense, mb, units, dims.gated_mlp, expert if sharded_3d else 0.0
    )
    if expert and not sharded_3d:
        stride = d.expert_tp * d.ep
        comm = allreduce_time(hw, expert * grad_reduce_bytes(d), d.expert_dp, stride)
        exposed += _behind(comm, _megatron_overlap(d) * mb.backward)
    local = dense + expert
    if d.zero_stage >= 1 or d.framework == Framework.FSDP:
        local = dense / max(1, d.dp * d.cp) + expert / d.expert_dp
    if d.offload != Offload.NONE:
        return exposed + _offload(d, hw, dense + expert, local), 0.0
    moments = 4 if moments_bf16_apply(d) else 8
    if states_offload_apply(d):
        # Master weights and both moments down to the host after the step and back before
        # the next: two copies the step waits on.
        exposed += 2 * local * (4 + moments) / (hw.pcie_bytes_per_s * OFFLOAD_EFFICIENCY)
    step_bytes = OPTIMIZER_BYTES_PER_PARAM - 2 * (8 - moments)
    return exposed, local * step_bytes / hw.hbm_bytes_per_s


def grad_reduce_bytes(d: LayoutDraft) -> int:
    """Bytes per gradient element on the wire: Megatron reduces bf16 gradients in fp32
    (``accumulate_allreduce_grads_in_fp32``, on for bf16) unless told to keep them in bf16
    (:attr:`LayoutDraft.grads_bf16`); DDP, FSDP and DeepSpeed in the training precision."""
    if d.precision == Precision.FP32:
        return 4
    if d.framework == Framework.MEGATRON and d.precision in (Precision.BF16, Precision.FP8):
        return 2 if d.grads_bf16 else 4
    return 2


def data_parallel_exposed(
    d: LayoutDraft,
    hw: Hardware,
    dense: float,
    mb: MicroBatch,
    units: int,
    gated: bool = False,
    expert: float = 0.0,
) -> float:
    """Exposed seconds of the data-parallel gradient / parameter traffic of the ``dense``
    parameters. A once-per-step reduction hides only behind the last micro-batch's backward;
    ZeRO-2 reduces every micro-batch, ZeRO-3 / FSDP gather every micro-batch, each behind that
    micro-batch's compute."""
    n = d.dp * d.cp
    if n <= 1:
        return 0.0
    g = grad_reduce_bytes(d)
    stride = d.tp
    m = d.grad_accum
    if d.strategy == Strategy.DDP or d.framework == Framework.DDP:
        comm = allreduce_time(hw, dense * g, n, stride)
        return _behind(comm, Overlap.ddp * mb.backward)
    if d.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        rs = gather_time(hw, dense * g, n, stride)
        ag = gather_time(hw, dense * 2, n, stride)
        if d.strategy == Strategy.ZERO2:
            return m * _behind(rs, Overlap.zero * mb.backward) + ag
        return _behind(rs, Overlap.zero * mb.backward) + ag
    if d.strategy in (Strategy.ZERO3, Strategy.FSDP_FULL, Strategy.FSDP_HYBRID) or (
        d.zero_stage >= 3
    ):
        return _sharded_exposed(d, hw, dense, mb, units, gated, expert)
    if d.strategy == Strategy.FSDP_GRAD_OP:
        comm = gather_time(hw, dense * 2, n, stride) + gather_time(hw, dense * g, n, stride)
        return m * _behind(comm, Overlap.fsdp * mb.compute)
    # 3D: Megatron's all-reduce, or reduce-scatter + all-gather with the distributed optimizer.
    if d.zero_stage >= 1:
        # --overlap-grad-reduce hides the reduce-scatter behind the last backward,
        # --overlap-param-gather the all-gather behind the next step's first forward.
        rs = gather_time(hw, dense * g, n, stride)
        ag = gather_time(hw, dense * 2, n, stride)
        overlap = _megatron_overlap(d)
        forward = max(0.0, mb.compute - mb.backward)
        return _behind(rs, overlap * mb.backward) + _behind(ag, overlap * forward)
    return _behind(allreduce_time(hw, dense * g, n, stride), _megatron_overlap(d) * mb.backward)


def _behind(comm: float, cover: float) -> float:
    """Exposed seconds of ``comm`` run beside ``cover`` seconds of compute, plus what its
    kernels take from that compute while hidden (they hold SMs: :data:`COMM_SM_SHARE`)."""
    hidden = min(max(0.0, comm), max(0.0, cover))
    return comm - hidden + COMM_SM_SHARE * hidden


def _megatron_overlap(d: LayoutDraft) -> float:
    """Share of Megatron's data-parallel reduction hidden behind the last backward:
    Megatron-Core's ``overlap_grad_reduce``; the classic fp16 stack (see
    :func:`fused_attention`) reduces its contiguous gradient buffer after the backward."""
    return Overlap.megatron if fused_attention(d) else 0.0


def _sharded_exposed(
    d: LayoutDraft,
    hw: Hardware,
    dense: float,
    mb: MicroBatch,
    units: int,
    gated: bool,
    expert: float = 0.0,
) -> float:
    """ZeRO-3 / FSDP: every micro-batch gathers each block's parameters for the forward and
    again for the backward and reduce-scatters its gradients; prefetch hides part of it behind
    that micro-batch's compute. FSDP gathers a block as one flat buffer (one collective per
    block and pass). DeepSpeed ZeRO-3 gathers parameter by parameter as hooks fire (one
    collective per weight matrix: QKV, output, the MLP's two or three), through a list-based
    all-gather that reaches :data:`DS_GATHER_EFFICIENCY` of the bus bandwidth, and a full
    recompute gathers the block a third time for the recomputed forward. At a few hundred
    ranks and more these collectives are latency bound (a ring of ``n`` ranks takes ``n - 1``
    steps), which is why ZeRO-3 measured 2-5x slower than PTD-P in Narayanan et al. 2021
    (Table 2). HYBRID_SHARD shards inside a node and all-reduces the shards across nodes once
    per step. Fully sharded 3D (``zero_stage=3``: FSDP2 or Megatron-FSDP under TP/PP/EP) gathers
    block by block as FSDP does, the ``expert`` parameters (this EP rank's) sharded over the
    expert data-parallel group (:attr:`LayoutDraft.expert_dp` ranks, ``ep`` apart) and gathered with the
    block, so they share its compute to hide behind. ``units``: the blocks."""
    n = d.dp * d.cp
    shard = n
    replicas = 1
    if d.strategy == Strategy.FSDP_HYBRID:
        shard = max(1, min(n, hw.gpus_per_node // max(1, d.tp)))
        replicas = max(1, n // shard)
    pieces, gathers, eff, overlap = 1, 2, 1.0, Overlap.fsdp
    if d.framework == Framework.DEEPSPEED:
        pieces = 5 if gated else 4
        gathers = 3 if d.recompute == Recompute.FULL else 2
        eff, overlap = DS_GATHER_EFFICIENCY, Overlap.zero3
    groups = [(dense, shard, d.tp)]
    if expert and d.expert_dp > 1:
        groups.append((expert, d.expert_dp, d.expert_tp * d.ep))
    comm = edges = 0.0
    for params, size, stride in groups:
        piece = params * 2 / units / pieces
        gather = gather_time(hw, piece / eff, size, stride)
        scatter = gather_time(hw, piece, size, stride)
        comm += (gathers * gather + scatter) * pieces * units
        # The first block's gather and the last one's reduce-scatter have no compute to hide
        # behind.
        edges += (gather + scatter) * pieces
    exposed = d.grad_accum * max(edges, _behind(comm, overlap * mb.compute))
    if replicas > 1:
        exposed += allreduce_time(hw, dense * 2 / shard, replicas, d.tp * shard)
    return exposed


def _offload(d: LayoutDraft, hw: Hardware, params: float, local: float) -> float:
    """Offload's cost, once per step: grads down and params up over PCIe, and the CPU optimizer
    step over the ``local`` parameters of every GPU of the node (they share its cores)."""
    grad_b = 2 if d.precision != Precision.FP32 else 4
    moved = local * (grad_b + 2) + (
        params * 2 * 2 * d.grad_accum if d.offload == Offload.OPTIMIZER_PARAMS else 0.0
    )
    seconds = moved / (hw.pcie_bytes_per_s * OFFLOAD_EFFICIENCY)
    return seconds + local * hw.gpus_per_node / CPU_ADAM_PARAMS_PER_S_PER_NODE
