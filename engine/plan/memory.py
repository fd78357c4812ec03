"""Per-GPU memory model: parameters, gradients, optimizer states, activations and buffers of one
candidate layout. Called by :mod:`engine.plan.search` for every candidate it weighs (so it is plain
arithmetic, no allocation), and by the tests that pin it to its sources:

* **Model states** follow the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", §3.1 and Table 1): mixed-precision Adam holds
  ``2Ψ`` (16-bit params) ``+ 2Ψ`` (16-bit grads) ``+ KΨ`` optimizer states with ``K = 12`` (fp32
  master copy, momentum, variance); ZeRO-1 divides the ``K`` term by the DP degree ``Nd``, ZeRO-2
  the grads as well, ZeRO-3 everything. :func:`zero_model_states_bytes` is that formula as printed.
* **Each framework's own convention** then refines it (:func:`model_states`):
  DeepSpeed keeps 16-bit grads plus an fp32 gradient partition, as its estimators count them
  (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``:
  ``2Ψ + 18Ψ/N``; ``stage3.estimate_zero3_model_states_mem_needs``: ``4·largest_layer + 18Ψ/N``);
  Megatron accumulates fp32 "main grads" (``2 + 4 + 12 = 18`` bytes/param, or ``6 + 12/d`` with the
  distributed optimizer; Megatron-LM ``docs/source/distrib_optimizer.md``); torch DDP and FSDP
  under autocast / ``MixedPrecision`` keep fp32 parameters, which *are* the master copy.
* **Activations** follow Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
  Transformer Models", Table 2: per layer ``sbh(34 + 5as/h)`` bytes with no parallelism,
  ``sbh(10 + 24/t + 5as/(ht))`` with tensor parallelism ``t``, ``sbh/t·(34 + 5as/h)`` with
  TP + sequence parallelism; selective recompute drops the ``5as/h`` term; full recompute keeps
  only each layer's input, ``2sbh`` (divided by ``t`` under SP). With pipeline parallelism the
  first stage holds ``p`` micro-batches of its ``L/p`` layers under 1F1B (§4.2.3), times
  ``1 + (p-1)/(p·v)`` for the interleaved schedule with ``v`` model chunks per stage.
  :func:`korthikanti_layer_bytes` is the formula as printed; :func:`layer_activation_bytes`
  generalises its constants to GQA, gated (SwiGLU) MLPs, ``ffn ≠ 4h``, MoE top-k and
  FlashAttention, and reduces to it exactly for the paper's GPT shape.

All results are bytes per GPU (ints). Nothing here imports torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import NamedTuple

from engine.plan.dims import ModelDims
from engine.plan.names import (
    Framework,
    Offload,
    OffloadModule,
    Optimizer,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.nccl_memory import NcclFabric, nccl_buffer_bytes
from engine.plan.result import LayoutDraft as LayoutDraft  # re-exported: what it estimates
from engine.plan.result import MemoryBreakdown
from engine.plan.stages import in_flight, stage_layers

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size and
# allgather_bucket_size are 5e8 elements.
DS_BUCKET_ELEMENTS = 500_000_000
# Fraction of host RAM (and of a CPU rank's nominal memory) a plan may use.
USABLE_FRACTION = 0.90
GIB = 1024**3
CUDA_CONTEXT_BYTES = 768 * 1024**2
"""The CUDA context with its loaded kernels plus cuBLAS / cuDNN workspaces: 0.5-0.8 GiB per
process on Ampere / Hopper with CUDA 12's lazy loading (``CUDA_MODULE_LOADING=LAZY``), as
``nvidia-smi`` shows beside ``torch.cuda.memory_reserved()``."""
FRAGMENTATION = 0.04
"""Share of the remainder PyTorch's caching allocator loses to fragmentation (blocks cached but
not reusable at the next size); 2-3 % with ``expandable_segments``, more without."""

DENSE_HEADROOM = 0.03
"""Share of the usable memory a dense plan keeps free by default: the allocator's peaks
between the steady-state tensors this model counts (a collective's temporary, cuBLAS's
workspace growing with a shape) are a few per cent of a step's peak."""
MOE_HEADROOM = 0.08
"""The same for dropless MoE: the busiest expert rank's load moves from step to step (the
planner's :func:`expert_load` is its mean over steps, not its worst), and every routed copy it
receives is held for the backward."""


def default_headroom(dims: ModelDims, capacity_factor: float | None) -> float:
    """The headroom a plan keeps unless the spec sets one (``training.headroom``):
    :data:`MOE_HEADROOM` for dropless MoE, :data:`DENSE_HEADROOM` otherwise (a capacity factor
    caps what any rank receives)."""
    return MOE_HEADROOM if dims.is_moe and not capacity_factor else DENSE_HEADROOM


# --------------------------------------------------------------------------------------------
# Bytes per parameter


def optimizer_state_bytes(optimizer: Optimizer) -> int:
    """Optimizer states per parameter, without any master copy: AdamW keeps fp32 momentum and
    variance (8), SGD with momentum one fp32 buffer (4), 8-bit Adam two 1-byte states (2;
    bitsandbytes' block-wise quantisation constants are < 1% and ignored)."""
    return {Optimizer.ADAMW: 8, Optimizer.SGD: 4, Optimizer.ADAM8BIT: 2}[optimizer]


def is_mixed(precision: Precision) -> bool:
    return precision in (Precision.BF16, Precision.FP16, Precision.FP8)


def is_bf16(precision: Precision) -> bool:
    """bf16 training, with or without FP8 linear layers."""
    return precision in (Precision.BF16, Precision.FP8)


def zero_k(precision: Precision, optimizer: Optimizer) -> int:
    """The ZeRO paper's ``K``: optimizer-state bytes per parameter including the fp32 master copy
    under mixed precision (12 for mixed-precision Adam, as in the paper)."""
    return optimizer_state_bytes(optimizer) + (4 if is_mixed(precision) else 0)


def zero_model_states_bytes(psi: float, k: float, nd: int, stage: int) -> float:
    """Model-state bytes per GPU exactly as the ZeRO paper writes them (§3.1, Table 1), with 16-bit
    parameters and gradients: stage 0 ``(2+2+K)Ψ``; stage 1 (P_os) ``4Ψ + KΨ/Nd``; stage 2
    (P_os+g) ``2Ψ + (2+K)Ψ/Nd``; stage 3 (P_os+g+p) ``(2+2+K)Ψ/Nd``."""
    if stage == 0:
        return (4 + k) * psi
    if stage == 1:
        return 4 * psi + k * psi / nd
    if stage == 2:
        return 2 * psi + (2 + k) * psi / nd
    if stage == 3:
        return (4 + k) * psi / nd
    raise ValueError(f"zero stage must be 0-3, got {stage}")


@dataclass(frozen=True, slots=True)
class States:
    """Model-state bytes on one GPU, and what offload moved to CPU memory. ``buffers`` holds the
    framework's own buffers for these states; ``gathered`` is the part of it DeepSpeed's ZeRO-3
    estimator counts (4 bytes per parameter of the largest layer)."""

    params: float
    grads: float
    optimizer: float
    cpu: float = 0.0
    buffers: float = 0.0
    gathered: float = 0.0


def model_states(
    psi: float,
    nd: int,
    *,
    framework: Framework,
    strategy: Strategy,
    zero_stage: int,
    precision: Precision,
    optimizer: Optimizer,
    offload: Offload = Offload.NONE,
    largest_layer: float = 0.0,
    grad_accum: int = 1,
    grads_bf16: bool = False,
    moments_bf16: bool = False,
) -> States:
    """Params, grads and optimizer bytes for ``psi`` parameters held by one GPU (after TP/PP/EP
    splits) and sharded ``nd`` ways by ZeRO / FSDP, in the framework's own convention (checked
    against a real run in tests/engine/test_real_memory.py; each convention is described where it
    is computed)."""
    nd = max(1, nd)
    if framework == Framework.DDP:
        return _ddp_states(psi, optimizer, nd)
    if framework == Framework.DEEPSPEED:
        if zero_stage in (0, 1, 2):
            return _deepspeed_states(psi, nd, zero_stage, precision, optimizer, offload, grad_accum)
        return _zero3_states(psi, nd, precision, optimizer, offload, largest_layer)
    if framework == Framework.FSDP:
        return _fsdp_states(psi, nd, strategy, precision, optimizer, offload)
    return _megatron_states(psi, nd, zero_stage, precision, optimizer, grads_bf16, moments_bf16)


def moments_bf16_apply(d: LayoutDraft) -> bool:
    """Whether the draft's bf16 moments (:attr:`LayoutDraft.moments_bf16`, set for AdamW only)
    take effect: only Megatron's precision-aware optimizer keeps them, and it runs under the
    distributed optimizer (or Megatron-FSDP) only (Megatron-LM's
    ``OptimizerConfig.__post_init__`` asserts it), over 16-bit training's fp32 master weights."""
    return (
        d.moments_bf16
        and d.framework == Framework.MEGATRON
        and d.zero_stage >= 1
        and is_mixed(d.precision)
    )


def _param_bytes(precision: Precision) -> int:
    """Bytes of the working copy of a parameter: 16-bit under mixed precision."""
    return 2 if is_mixed(precision) else 4


def _fp32_grad_bytes(precision: Precision) -> int:
    """DeepSpeed's fp32 gradient partition under mixed precision (none in fp32)."""
    return 4 if is_mixed(precision) else 0


def _ddp_states(psi: float, optimizer: Optimizer, replicas: int) -> States:
    """torch DDP under autocast: fp32 params (the master copy) and fp32 grads, plus states. DDP's
    all-reduce buckets hold a second copy of the gradients unless the model is wrapped with
    gradient_as_bucket_view=True ("the saved memory size will be equal to the total gradients
    size", torch.nn.parallel.DistributedDataParallel docs); the shipped trainer uses the
    default, and on one GPU, with nothing to reduce, does not wrap the model at all."""
    buckets = 4 * psi if replicas > 1 else 0.0
    return States(4 * psi, 4 * psi, optimizer_state_bytes(optimizer) * psi, buffers=buckets)


def _deepspeed_states(
    psi: float,
    nd: int,
    zero_stage: int,
    precision: Precision,
    optimizer: Optimizer,
    offload: Offload,
    grad_accum: int,
) -> States:
    """DeepSpeed, ZeRO stage 0-2: 16-bit params, a 16-bit gradient partition and the fp32
    gradient partition ``step()`` makes from it (both alive during the conversion), fp32 master
    and states. Stage 2: ``2Ψ + (2+4+K)Ψ/N`` (DeepSpeed's ``2Ψ + 18Ψ/N`` for Adam). Stage 1 is
    the same when every step is an accumulation boundary; with gradient accumulation it keeps the
    full 16-bit grads between boundaries (``2Ψ + 4Ψ/N``). Offload (ZeRO-Offload): the fp32 grads,
    master and states live in CPU memory."""
    pb = _param_bytes(precision)
    k = zero_k(precision, optimizer)
    fp32_grad = _fp32_grad_bytes(precision)
    bucket = min(DS_BUCKET_ELEMENTS, psi) * pb
    if zero_stage == 0:
        return States(pb * psi, (pb + fp32_grad) * psi, k * psi)
    if offload != Offload.NONE:
        # ZeRO-Offload: 16-bit params stay; grads are reduced straight into pinned CPU memory.
        return States(pb * psi, 0.0, 0.0, cpu=(fp32_grad + k) * psi / nd, buffers=bucket)
    grads = (pb + fp32_grad) * psi / nd
    if zero_stage == 1 and grad_accum > 1:
        grads = pb * psi + fp32_grad * psi / nd
    return States(pb * psi, grads, k * psi / nd, buffers=2 * bucket)


def _zero3_states(
    psi: float,
    nd: int,
    precision: Precision,
    optimizer: Optimizer,
    offload: Offload,
    largest_layer: float,
) -> States:
    """DeepSpeed ZeRO-3: ``(2+4+K)Ψ/N`` with the fp32 gradient partition as grads (DeepSpeed's
    ``18Ψ/N``), plus buffers: ``4·largest_layer`` for the gathered layer (``gathered``) and the
    persistent 16-bit reduce-scatter target ``grad_partitions_flat_buffer`` (``2Ψ/N``), which the
    estimator leaves out. Offload: the fp32 grads, master and states in CPU memory; with
    ``optimizer+params`` (ZeRO-Infinity to CPU) the 16-bit params too."""
    pb = _param_bytes(precision)
    k = zero_k(precision, optimizer)
    fp32_grad = _fp32_grad_bytes(precision)
    # DeepSpeed's allowance for the gathered layer (16-bit params + grads of the largest one).
    gathered = 4 * largest_layer
    if offload == Offload.OPTIMIZER_PARAMS:
        cpu = (pb + fp32_grad + k) * psi / nd
        return States(0.0, 0.0, 0.0, cpu=cpu, buffers=gathered, gathered=gathered)
    if offload == Offload.OPTIMIZER:
        cpu = (fp32_grad + k) * psi / nd
        return States(pb * psi / nd, 0.0, 0.0, cpu=cpu, buffers=gathered, gathered=gathered)
    grad_buffer = pb * psi / nd  # grad_partitions_flat_buffer: 16-bit, persistent
    return States(
        pb * psi / nd,
        (fp32_grad or pb) * psi / nd,
        k * psi / nd,
        buffers=gathered + grad_buffer,
        gathered=gathered,
    )


def _fsdp_states(
    psi: float,
    nd: int,
    strategy: Strategy,
    precision: Precision,
    optimizer: Optimizer,
    offload: Offload,
) -> States:
    """FSDP with ``MixedPrecision``: sharded fp32 params (the optimizer steps on them), sharded
    fp32 grads, states; SHARD_GRAD_OP keeps the 16-bit unsharded params between forward and
    backward. ``CPUOffload(offload_params=True)`` moves params, grads and states to CPU."""
    states = optimizer_state_bytes(optimizer)
    unsharded = _param_bytes(precision) * psi if strategy == Strategy.FSDP_GRAD_OP else 0.0
    if offload == Offload.OPTIMIZER_PARAMS:
        return States(unsharded, 0.0, 0.0, cpu=(4 + 4 + states) * psi / nd)
    return States(4 * psi / nd + unsharded, 4 * psi / nd, states * psi / nd)


def _megatron_states(
    psi: float,
    nd: int,
    zero_stage: int,
    precision: Precision,
    optimizer: Optimizer,
    grads_bf16: bool = False,
    moments_bf16: bool = False,
) -> States:
    """Megatron (3D): 16-bit params, fp32 main grads, fp32 master + states (18 B/param for
    Adam); the distributed optimizer (``zero_stage=1``) shards master and states over DP;
    ``zero_stage=2`` (Megatron-FSDP, or FSDP under TP/PP as Llama 3 trained) the grads too;
    ``zero_stage=3`` the parameters as well: FSDP2 under TP/PP/EP, as torchtitan and NeMo
    AutoModel run it, whose sharded fp32 parameters are the optimizer's master copy (no separate
    16-bit copy, ``MixedPrecisionPolicy`` casts each gathered unit): ``(4 + 4 + K - 4)Ψ/N``,
    experts sharded over their own EP x FSDP mesh (``nd`` is the caller's), plus the gathered
    units (:func:`estimate_memory`). ``grads_bf16``: bf16 main grads (2 B/param, not 4);
    ``moments_bf16``: Adam's moments in bf16 (4 B/param, not 8: the Megatron Core MoE report's
    ``6 + 8/d`` for DeepSeek-V3, arXiv:2603.07685 §4.1.6; :func:`moments_bf16_apply`)."""
    k = zero_k(precision, optimizer) - (4 if moments_bf16 else 0)
    g = 2 if grads_bf16 and is_bf16(precision) else 4
    if zero_stage >= 3:
        master = 4 if is_mixed(precision) else 0
        return States(4 * psi / nd, g * psi / nd, (k - master) * psi / nd)
    opt = k * psi / nd if zero_stage >= 1 else k * psi
    grads = g * psi / nd if zero_stage >= 2 else g * psi
    if precision == Precision.FP16 and zero_stage < 2:
        # fp16 accumulates and all-reduces its grads in fp16 (``accumulate_allreduce_grads_in_fp32``
        # is forced on for bf16 only); the optimizer step makes an fp32 copy of them beside the
        # master, sharded with it by the distributed optimizer: 20 bytes a parameter, 4 + 16/d
        # distributed (Megatron-LM ``docs/source/distrib_optimizer.md``).
        grads = 2 * psi + 4 * psi / (nd if zero_stage >= 1 else 1)
    return States(_param_bytes(precision) * psi, grads, opt)


# --------------------------------------------------------------------------------------------
# Activations


def korthikanti_layer_bytes(
    s: int,
    b: int,
    h: int,
    a: int,
    *,
    t: int = 1,
    sp: bool = False,
    recompute: Recompute = Recompute.NONE,
) -> float:
    """Activation bytes of one transformer layer as printed by Korthikanti et al. 2022 (Table 2):
    16-bit activations, MHA, a 4h non-gated MLP, dropout. ``t`` is the TP degree, ``sp`` sequence
    parallelism."""
    if recompute == Recompute.FULL:
        return 2 * s * b * h / (t if sp else 1)
    score = 0.0 if recompute == Recompute.SELECTIVE else 5 * a * s / h
    if sp:
        return s * b * h / t * (34 + score)
    return s * b * h * (10 + 24 / t + score / t)


@lru_cache(maxsize=16384)
def layer_activation_bytes(
    dims: ModelDims,
    s: int,
    b: int,
    *,
    t: int = 1,
    sp: bool = False,
    recompute: Recompute = Recompute.NONE,
    flash: bool = False,
    dropout: bool = True,
    bytes_per_value: int = 2,
    fp8_linears: bool = False,
    eager: bool = False,
    fp32_residual: bool = False,
    load: float = 1.0,
    expert_tp: int = 0,
) -> float:
    """One layer's saved activations, Korthikanti's accounting generalised to the model's shape.

    Replicated across TP ranks (split by ``t`` only with SP): the two layer-norm inputs (4sbh),
    the attention and MLP inputs (2sbh each) and the two dropout masks (sbh each) -- Korthikanti's
    ``10``. Split by ``t``: Q and K (2sbh + 2sbh_kv), V (2sbh_kv), the output projection's input
    (2sbh), and the MLP's intermediates (non-gated: 2sbf twice; gated: the fused gate-and-up
    output and the product, 6sbf, as Megatron's fused SwiGLU keeps them; MoE: times top-k) --
    Korthikanti's ``24`` for MHA and f = 4h. MLA adds its latents (the up-projections' inputs,
    whole on every TP rank). MLP-only recompute (``Recompute.MLP``) drops the MLP's
    intermediates; light recompute (``Recompute.LIGHT``) the unfused norms' 16-bit outputs, the
    routed experts' activation output and MLA's per-head Q, K, V. The attention score term ``5as²b``
    (softmax output, dropout mask and output) is what selective recompute drops;
    FlashAttention never stores it either (``flash=True``). ``bytes_per_value`` 4 doubles all
    for fp32 training. ``fp8_linears``: Transformer Engine's FP8 linears keep the FP8 cast of
    their inputs for the weight gradient, so the four GEMM inputs (QKV's and the MLP's inputs,
    the output projection's, the second MLP matrix's: sbh, sbh, q·sbh, k·sbf) take 1 byte.

    ``eager``: the block is written in plain PyTorch modules (Hugging Face, torchtitan, the
    shipped trainer), not Megatron-Core's fused ones, and keeps more (see the code).
    ``fp32_residual``: autocast over fp32 parameters (DDP's mixed precision), so the residual
    stream and the norms' inputs are fp32 and each linear keeps its own 16-bit cast of its input.

    MoE layers also keep each routed copy of the MLP's input (:func:`_dispatched_values`) and
    hold ``load`` times the mean routed tokens (the busiest expert-parallel rank); ``expert_tp``
    is the experts' own tensor parallelism (0: ``t``).
    """
    sbh = s * b * dims.hidden
    scale = bytes_per_value / 2
    if recompute == Recompute.FULL:
        # Only the block's input: the residual stream, fp32 under autocast over fp32 parameters.
        return (4 if fp32_residual else 2) * sbh / (t if sp else 1) * scale
    fp8 = fp8_linears and bytes_per_value == 2
    light = recompute == Recompute.LIGHT
    replicated = _replicated_values(dims, dropout=dropout, fp8=fp8, light=light)
    if fp32_residual:
        # The two norms' fp32 inputs (2 more bytes each), and the attention's input cast once
        # more (query and key-value projections each cast it).
        replicated += 4 + 2
    split = _split_values(dims, t, recompute, fp8=fp8, light=light, eager=eager, load=load)
    split += _dispatched_values(dims, recompute, fp8=fp8, load=load) * (expert_tp or t)
    score = 0.0
    if recompute in (Recompute.NONE, Recompute.MLP) and not flash:
        score = (5 if dropout else 2) * dims.heads * s / dims.hidden
    if sp:
        return sbh / t * (replicated + split + score) * scale
    return sbh * (replicated + (split + score) / t) * scale


def _experts_a_token(dims: ModelDims, load: float = 1.0) -> float:
    """MLPs each token passes through: its top-k routed experts (``load`` times the mean on the
    busiest expert rank) and the shared ones (1 dense)."""
    return dims.experts_per_token * load + dims.shared_experts if dims.is_moe else 1


MOE_INDEX_BYTES = 8
"""Bytes a routed copy keeps beside its hidden vector: the permutation's row index (int32) and
its routing probability (fp32), which the unpermute's backward reads."""


def _dispatched_values(dims: ModelDims, recompute: Recompute, *, fp8: bool, load: float) -> float:
    """16-bit values per ``sbh`` an MoE layer keeps for its routed copies, per expert-TP rank's
    share of the tokens: each token is dispatched ``k`` times and every copy is the first
    expert GEMM's input, saved for its weight gradient (Megatron-Core's ``GroupedMLP`` /
    ``TEGroupedMLP`` after ``permute``; Hugging Face's expert loop indexes a copy per expert
    the same way), plus the permutation's index and probability. That is +46 % a layer for
    Qwen3-235B with no recompute and +80 % for DeepSeek-V3 under light recompute. FP8 experts
    keep the FP8 cast (1 byte). An MLP recompute (the MLP redone from its input) or a full one
    keeps none of it. Each rank's copies are its sequence-parallel share's; ``load``: the busiest
    expert rank receives that many times the mean (:func:`expert_load`)."""
    if not dims.is_moe or recompute in (Recompute.MLP, Recompute.FULL):
        return 0.0
    per_copy = (1 if fp8 else 2) + MOE_INDEX_BYTES / dims.hidden
    return per_copy * dims.experts_per_token * load


DROPLESS_IMBALANCE = 1.15
"""Load of the busiest expert-parallel rank over the mean under dropless routing with load
balancing, where the user states none (the time model's
:data:`engine.plan.perf.MOE_IMBALANCE` is this figure)."""


def expert_load(d: LayoutDraft) -> float:
    """The busiest expert-parallel rank's routed tokens over the mean, by the time model's rule
    (:func:`engine.plan.perf.moe_imbalance`): the user's ``--moe-imbalance``, else
    :data:`DROPLESS_IMBALANCE`, capped by a capacity factor; 1 without expert parallelism."""
    if d.ep <= 1:
        return 1.0
    load = d.imbalance or DROPLESS_IMBALANCE
    return min(load, d.capacity) if d.capacity else load


def held_expert_load(dims: ModelDims, d: LayoutDraft) -> float:
    """The busiest expert rank's routed tokens over the mean, summed over what its peak holds:
    the ``n`` MoE layers and micro-batches in flight on the heaviest stage, each routed on its
    own. A step waits on each layer's busiest rank (:func:`expert_load`), but one rank is rarely
    the busiest of all ``n``: its excess over the mean shrinks as ``1/√n`` (the spread of a sum
    of ``n`` routings). What is left of step-to-step swings is in the MoE headroom
    (:data:`MOE_HEADROOM`)."""
    if not dims.is_moe:
        return 1.0
    load = expert_load(d)
    if load <= 1.0:
        return load
    v = d.virtual_stages if d.pp_schedule == PPSchedule.INTERLEAVED else 1
    held = math.ceil(dims.moe_layers / d.pp) * in_flight(d.pp, d.grad_accum, v, 0)
    return 1.0 + (load - 1.0) / math.sqrt(max(1.0, held))


def _replicated_values(dims: ModelDims, *, dropout: bool, fp8: bool, light: bool) -> int:
    """16-bit values per ``sbh`` a layer keeps whole on every TP rank (split by ``t`` only with
    SP): the two norms' inputs, the attention and MLP inputs, the dropout masks
    (:func:`layer_activation_bytes`)."""
    replicated = 4 + 2 + 2 + (2 if dropout else 0)
    if fp8:
        replicated -= 2  # the attention and MLP inputs (LN outputs) in FP8
    elif light:
        # Norms recomputed: the 16-bit outputs of those not fused into the next linear (under
        # Transformer Engine the MoE layer's pre-MLP norm and MLA's input norm; in FP8 the
        # linears keep their own FP8 casts, which stay).
        replicated -= 2 * (dims.is_moe + dims.is_mla)
    return replicated


def _mlp_values(
    dims: ModelDims, recompute: Recompute, *, fp8: bool, light: bool, load: float = 1.0
) -> float:
    """16-bit values per ``sbh`` the MLP's intermediates keep, split by ``t``
    (:func:`layer_activation_bytes`)."""
    f = dims.ffn / dims.hidden
    k = _experts_a_token(dims, load)
    mlp = (6 * f if dims.gated_mlp else 4 * f) * k
    if recompute == Recompute.MLP:
        mlp = 0.0  # only the MLP's input (in the replicated values) is kept; the rest is recomputed
    if fp8:
        mlp -= f * k if mlp else 0.0  # the second MLP matrix's input
    elif light:
        # The routed experts' activation is recomputed.
        mlp -= 2 * f * dims.experts_per_token * load if dims.is_moe else 0.0
    return mlp


def _split_values(
    dims: ModelDims,
    t: int,
    recompute: Recompute,
    *,
    fp8: bool,
    light: bool,
    eager: bool,
    load: float = 1.0,
) -> float:
    """16-bit values per ``sbh`` a layer keeps split by ``t`` (before the attention scores):
    Q, K, V, the output projection's input, the MLP's intermediates, MLA's latents
    (:func:`layer_activation_bytes`)."""
    h = dims.hidden
    r = dims.kv_heads * dims.head_dim / h
    q = dims.heads * dims.head_dim / h
    rv = dims.kv_heads * dims.value_head_dim / h  # V (MLA: narrower than K)
    qo = dims.heads * dims.value_head_dim / h  # the output projection's input
    mlp = _mlp_values(dims, recompute, fp8=fp8, light=light, load=load)
    heads = 2 * q + 2 * r + 2 * rv
    if dims.is_mla:
        # The up-projections' inputs: the query latent and the key/value latent (with the
        # shared rotary key), whole on every TP rank. Recomputing the up-projections from
        # them drops the per-head queries, keys and values instead.
        latents = 2 * (dims.q_lora_rank + dims.kv_lora_rank + dims.qk_rope_head_dim) / h
        heads = latents * t if light else heads + latents * t
    split = heads + (qo if fp8 else 2 * qo) + mlp
    if eager:
        # Counted op by op and measured on an H100 (tests/data/gpu_runs.json, components): an
        # unfused SwiGLU also keeps the activation's output (2f); the attention kernel keeps K
        # and V repeated to every query head (repeat_kv), not the narrow ones. (Its output is
        # laid out token-major already, so the projection's input is the same tensor.)
        if dims.gated_mlp and mlp:
            split += 2 * (dims.ffn / h) * _experts_a_token(dims, load)
        if not dims.is_mla and dims.kv_heads < dims.heads:
            split += 2 * (q - r) + 2 * (q - rv)
    return split


def states_offload_apply(d: LayoutDraft) -> bool:
    """Whether the draft's optimizer states go to host memory between steps
    (:attr:`LayoutDraft.states_offload`): Megatron's ``--offload-optimizer-states`` keeps the
    step on the GPU and runs AdamW under the distributed optimizer (not Megatron-FSDP)."""
    return (
        d.states_offload
        and d.framework == Framework.MEGATRON
        and 1 <= d.zero_stage <= 2
        and is_mixed(d.precision)
    )


def offloaded_values(
    dims: ModelDims,
    modules: tuple[OffloadModule, ...],
    t: int,
    recompute: Recompute,
    *,
    fp8: bool,
    load: float = 1.0,
    expert_tp: int = 0,
) -> tuple[float, float]:
    """(replicated, split by ``t``) 16-bit values per ``sbh`` of one layer's saved activations
    that Megatron-Core's fine-grained offloading moves to host memory: each module's input as
    :func:`layer_activation_bytes` counts it. The two norms' inputs (the residual stream); the
    QKV projection's input (the normed hidden state, FP8 under FP8 linears, recomputed for
    MLA's latent norm under light recompute); the attention kernel's queries, keys and values
    (MLA's per-head ones are recomputed under light recompute); the output projection's input;
    every routed copy of a token (the experts' first GEMM's input,
    :func:`_dispatched_values`); the experts' first GEMM's output (the activation's input,
    whose output light recompute drops already: the whole ``fc1 -> act`` chain leaves).
    Nothing under full recompute, which keeps only each layer's input."""
    if not modules or recompute == Recompute.FULL:
        return 0.0, 0.0
    h = dims.hidden
    light = recompute == Recompute.LIGHT
    replicated = split = 0.0
    if OffloadModule.ATTN_NORM in modules:
        replicated += 2
    if OffloadModule.MLP_NORM in modules:
        replicated += 2
    if OffloadModule.QKV_LINEAR in modules and not (light and dims.is_mla and not fp8):
        replicated += 1 if fp8 else 2
    if OffloadModule.CORE_ATTN in modules and not (light and dims.is_mla):
        r = dims.kv_heads * dims.head_dim / h
        q = dims.heads * dims.head_dim / h
        split += 2 * q + 2 * r + 2 * dims.kv_heads * dims.value_head_dim / h
    if OffloadModule.ATTN_PROJ in modules:
        split += (1 if fp8 else 2) * dims.heads * dims.value_head_dim / h
    if OffloadModule.EXPERT_FC1 in modules:
        split += _dispatched_values(dims, recompute, fp8=fp8, load=load) * (expert_tp or t)
    if OffloadModule.MOE_ACT in modules and dims.is_moe and recompute != Recompute.MLP:
        up = 4 if dims.gated_mlp else 2  # fc1's output: gate and up (2f values) or f
        split += up * dims.ffn / h * dims.experts_per_token * load
    return replicated, split


def offloaded_layer_bytes(dims: ModelDims, d: LayoutDraft, s_local: int, load: float) -> float:
    """Bytes of one layer's saved activations, for one micro-batch of ``s_local`` tokens per CP
    rank, that the Megatron draft ``d`` offloads (:func:`offloaded_values`; 0 where it offloads
    nothing); ``load``: the busiest expert rank's routed tokens over the mean."""
    if not d.offload_modules or d.framework != Framework.MEGATRON:
        return 0.0
    fp8 = (d.fp8_linears or d.precision == Precision.FP8) and is_mixed(d.precision)
    replicated, split = offloaded_values(
        dims, d.offload_modules, d.tp, d.recompute, fp8=fp8, load=load, expert_tp=d.expert_tp
    )
    sbh = s_local * d.micro_batch * dims.hidden * (1 if is_mixed(d.precision) else 2)
    return sbh * (replicated / (d.tp if d.sequence_parallel else 1) + split / d.tp)


def offloaded_layers(in_flight_mb: float, layers: int, chunks: int) -> float:
    """Layers' worth of the offloaded modules' inputs that live in host memory when a stage
    holds ``in_flight_mb`` micro-batches of its ``layers`` layers in ``chunks`` model chunks:
    all but the last layer of each (micro-batch, chunk) in flight, which is not offloaded (its
    backward comes next), and the one layer reloaded ahead of the backward (Megatron Core MoE
    report, arXiv:2603.07685 §4.1.5: the layer-staggered reload keeps one activation per
    module on the GPU)."""
    return max(0.0, in_flight_mb * layers - in_flight_mb * chunks - 1)


def pipeline_in_flight(pp: int, grad_accum: int, schedule: PPSchedule, v: int) -> float:
    """Micro-batches whose activations the first stage holds at its peak, as a multiple of one
    micro-batch's activations for ``L/p`` layers: ``min(p, m)`` under 1F1B; interleaving
    multiplies by ``1 + (p-1)/(p·v)`` (Korthikanti et al. 2022, §4.2.3), at most all ``m``
    (see :func:`engine.plan.stages.in_flight`)."""
    interleaved = schedule == PPSchedule.INTERLEAVED and v > 1
    return in_flight(pp, grad_accum, v if interleaved else 1, 0)


# --------------------------------------------------------------------------------------------
# Per-GPU parameter counts


def per_layer_params(dims: ModelDims) -> tuple[float, float]:
    """(dense, expert) parameters of one transformer block (an MoE block where an MoE model
    leads with dense layers: those hold :attr:`ModelDims.params_dense_mlp` more dense
    parameters and no experts)."""
    experts = dims.params_experts / max(1, dims.moe_layers) if dims.is_moe else 0.0
    leading = dims.dense_layers * dims.params_dense_mlp
    other = dims.params_total - dims.params_embedding - dims.params_experts - leading
    return other / dims.layers, experts


def mtp_modules(dims: ModelDims, d: LayoutDraft) -> int:
    """Multi-token prediction modules layout ``d`` trains (:attr:`ModelDims.mtp_layers`):
    Megatron-Core runs them (``--mtp-num-layers``), on the last pipeline stage; the
    Hugging Face models under DDP, FSDP and DeepSpeed leave them out."""
    return dims.mtp_layers if d.framework == Framework.MEGATRON else 0


_STAGE_PARAMS: dict[tuple[object, ...], tuple[ModelDims, tuple[float, float]]] = {}
""":func:`stage_params` by the fields it reads (the model by identity, as in
:data:`_STATES_CACHE`): the memory and the time model ask for it at every layout."""
_STAGE_PARAMS_MAX = 20_000


def stage_params(dims: ModelDims, d: LayoutDraft) -> tuple[float, float]:
    """(dense, expert) parameters held by the heaviest GPU: its pipeline stage's layers (the first
    stage also holds the input embedding; the last the head -- we take the larger) split by TP,
    experts split by EP (and by TP only without EP: :func:`expert_tp`). An MoE model's leading
    dense layers sit on the first stage. Cached (:data:`_STAGE_PARAMS`)."""
    key = (
        id(dims),
        d.pp,
        d.tp,
        d.expert_tp,
        d.ep,
        d.framework,
        d.first_stage_layers,
        d.last_stage_layers,
    )
    hit = _STAGE_PARAMS.get(key)
    if hit is not None and hit[0] is dims:
        return hit[1]
    value = _stage_params(dims, d)
    if len(_STAGE_PARAMS) >= _STAGE_PARAMS_MAX:
        _STAGE_PARAMS.clear()
    _STAGE_PARAMS[key] = (dims, value)
    return value


def _stage_params(dims: ModelDims, d: LayoutDraft) -> tuple[float, float]:
    dense_l, expert_l = per_layer_params(dims)
    layers = math.ceil(dims.layers / d.pp)
    # The first stage's leading dense layers trade experts for a dense MLP; the heaviest of
    # the first stage and a stage of MoE layers only.
    leading = min(layers, dims.dense_layers)
    ends = dims.params_embedding if d.pp == 1 else dims.vocab * dims.hidden
    first = (
        (layers * dense_l + leading * dims.params_dense_mlp + ends) / d.tp,
        (layers - leading) * expert_l / (d.expert_tp * d.ep),
    )
    # Each multi-token prediction module: a layer and its 2h -> h projection.
    mtp = mtp_modules(dims, d)
    module = (
        mtp * (dense_l + 2 * dims.hidden**2) / d.tp,
        mtp * expert_l / (d.expert_tp * d.ep),
    )
    if d.pp == 1:
        return first[0] + module[0], first[1] + module[1]
    candidates = [first]
    if leading:
        candidates.append(
            (
                (layers * dense_l + dims.vocab * dims.hidden) / d.tp,
                layers * expert_l / (d.expert_tp * d.ep),
            )
        )
    if mtp:
        # The last stage: its own layers, the head and the modules.
        last = stage_layers(dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers)[-1]
        candidates.append(
            (
                (last * dense_l + dims.vocab * dims.hidden) / d.tp + module[0],
                last * expert_l / (d.expert_tp * d.ep) + module[1],
            )
        )
    return max(candidates, key=sum)


def largest_layer_params(dims: ModelDims, tp: int = 1) -> float:
    """The largest single module (DeepSpeed's ``largest_layer_params``): the embedding, one MLP
    matrix or the fused QKV projection, split by TP."""
    qkv = dims.hidden * (dims.heads + 2 * dims.kv_heads) * dims.head_dim
    if dims.is_mla:
        qkv = (dims.q_lora_rank or dims.hidden) * dims.heads * dims.head_dim
    mlp = dims.hidden * max(dims.ffn * max(1, dims.shared_experts), dims.dense_ffn)
    return max(dims.vocab * dims.hidden, mlp, qkv) / tp


def block_params(dims: ModelDims, tp: int = 1) -> float:
    """Parameters of one FSDP unit (a transformer block, or the embedding when larger)."""
    dense_l, expert_l = per_layer_params(dims)
    return max(dense_l + max(expert_l, dims.params_dense_mlp), dims.vocab * dims.hidden) / tp


# --------------------------------------------------------------------------------------------
# The whole breakdown


def estimate_memory(
    dims: ModelDims,
    d: LayoutDraft,
    *,
    seq_len: int,
    optimizer: Optimizer,
    flash: bool = True,
    gpus_per_node: int = 0,
    nccl: NcclFabric | None = None,
) -> MemoryBreakdown:
    """Per-GPU memory of layout ``d`` for ``dims`` at ``seq_len``: the heaviest GPU (first
    pipeline stage). ``flash`` assumes FlashAttention / SDPA kernels (true on GPUs), so the
    ``as²`` score term is not stored even without recompute. ``gpus_per_node`` bounds the shard
    group of FSDP HYBRID_SHARD; ``nccl`` where NCCL's buffers run (None: not counted,
    :func:`engine.plan.nccl_memory.nccl_buffer_bytes`)."""
    fixed = _memory_fixed(dims, d, seq_len, optimizer, flash, gpus_per_node, nccl)
    return breakdown_at(fixed, d.recompute_layers)


def breakdown_at(fixed: MemoryFixed, recompute_layers: int) -> MemoryBreakdown:
    """:func:`estimate_memory` of the draft ``fixed`` was worked out for
    (:func:`memory_fixed`), with ``recompute_layers`` layers of each chunk recomputed."""
    parts, overlap, cpu = _parts_at(fixed, recompute_layers)
    # model_construct: the planner builds thousands of these; the values are ints by construction.
    return MemoryBreakdown.model_construct(
        params=parts[0],
        grads=parts[1],
        optimizer=parts[2],
        activations=parts[3],
        buffers=parts[4],
        nccl=parts[5],
        overlap=overlap,
        total=sum(parts) - overlap,
        cpu_bytes=cpu,
        host_activations=fixed[10],
    )


def memory_total(
    dims: ModelDims,
    d: LayoutDraft,
    *,
    seq_len: int,
    optimizer: Optimizer,
    flash: bool = True,
    gpus_per_node: int = 0,
    nccl: NcclFabric | None = None,
    recompute_layers: int,
) -> tuple[int, int]:
    """(``total``, ``cpu_bytes``) of :func:`estimate_memory` for ``d`` with
    ``recompute_layers`` layers of each chunk recomputed, without building that draft or the
    breakdown."""
    fixed = _memory_fixed(dims, d, seq_len, optimizer, flash, gpus_per_node, nccl)
    return total_at(fixed, recompute_layers)


def memory_fixed(
    dims: ModelDims,
    d: LayoutDraft,
    *,
    seq_len: int,
    optimizer: Optimizer,
    flash: bool = True,
    gpus_per_node: int = 0,
    nccl: NcclFabric | None = None,
) -> MemoryFixed:
    """What :func:`estimate_memory` works out for ``d`` before the recomputed layers a chunk
    (``d.recompute_layers`` is not read): the search's bisection over block recompute asks
    for several counts of one draft (:func:`total_at`) and weighs one
    (:func:`breakdown_at`), and only the activations depend on the count."""
    return _memory_fixed(dims, d, seq_len, optimizer, flash, gpus_per_node, nccl)


def total_at(fixed: MemoryFixed, recompute_layers: int) -> tuple[int, int]:
    """(``total``, ``cpu_bytes``) of :func:`breakdown_at`, without building the breakdown."""
    parts, overlap, cpu = _parts_at(fixed, recompute_layers)
    return sum(parts) - overlap, cpu


_ActivationTerms = tuple[tuple[tuple[float, int], ...], float, float, int, float | None, float, int]
"""The activations' figures before the recomputed layers a chunk (:func:`_activation_terms`)."""
MemoryFixed = tuple[
    int, int, int, int, int, int, _ActivationTerms, float | None, float, bool, int, bool
]
"""The share of a draft's memory that does not depend on the recomputed layers a chunk
(:func:`memory_fixed`): params, grads, optimizer, buffers, NCCL's buffers and CPU bytes, the
activation terms,
autocast's weight copies (None where they do not count), the logits, and whether the gradients
and the activations share the peak, the activations offloaded to host memory (counted in
the CPU bytes too), and whether the optimizer states and the activations share it (the states
offloaded between steps). A plain tuple: the search builds thousands."""


def _memory_fixed(
    dims: ModelDims,
    d: LayoutDraft,
    seq_len: int,
    optimizer: Optimizer,
    flash: bool,
    gpus_per_node: int,
    nccl: NcclFabric | None,
) -> MemoryFixed:
    st_dense, st_exp = _layout_states(dims, d, optimizer, gpus_per_node)
    s_local = max(1, seq_len // d.cp)
    terms = _activation_terms(dims, d, s_local, flash)
    autocast = None
    if d.framework == Framework.DDP and is_mixed(d.precision):
        autocast = autocast_weight_copies(dims, d)
    buffers = st_dense.buffers + st_exp.buffers
    logits = logits_bytes(dims, d, s_local) if d.pp == 1 else 0.0
    buffers += logits
    if d.framework == Framework.FSDP:
        # Current + prefetched unit gathered in 16-bit, and the unit's unsharded 16-bit grads.
        buffers += 3 * block_params(dims, d.tp) * (2 if is_mixed(d.precision) else 4)
    elif d.framework == Framework.MEGATRON and d.zero_stage >= 3 and d.dp * d.cp > 1:
        # The same for fully sharded 3D: one block's dense part, and this rank's experts where
        # FSDP shards them further (over the expert data-parallel ranks; with none they stay
        # whole).
        dense_l, expert_l = per_layer_params(dims)
        experts = expert_l / (d.expert_tp * d.ep) if d.expert_dp > 1 else 0.0
        unit = dense_l / d.tp + experts
        buffers += 3 * unit * (2 if is_mixed(d.precision) else 4)
    # A plain PyTorch step frees its gradients between steps (zero_grad(set_to_none=True),
    # torch's default) and allocates each layer's in backward as it frees that layer's
    # activations: the peak holds the larger of the two, not both. With gradient
    # accumulation the first micro-batch's gradients stay for the next one's activations.
    overlaps = d.framework in (Framework.DDP, Framework.FSDP) and d.grad_accum == 1
    host = int(host_activations(terms))
    states_off = states_offload_apply(d)
    opt = int(st_dense.optimizer + st_exp.optimizer)
    return (
        int(st_dense.params + st_exp.params),
        int(st_dense.grads + st_exp.grads),
        opt,
        int(buffers),
        nccl_buffer_bytes(d, nccl),
        int(st_dense.cpu + st_exp.cpu) + host + (opt if states_off else 0),
        terms,
        autocast,
        logits,
        overlaps,
        host,
        states_off,
    )


def _parts_at(fixed: MemoryFixed, recompute_layers: int) -> tuple[list[int], int, int]:
    """:func:`estimate_memory`'s (params, grads, optimizer, activations, buffers, NCCL's
    buffers), overlap and CPU bytes, from the draft's :data:`MemoryFixed` at
    ``recompute_layers``."""
    params, grads, optimizer, buffers, nccl, cpu, terms, autocast, logits, overlaps = fixed[:10]
    acts = _activations_at(terms, recompute_layers)
    if autocast is not None:
        acts += autocast
    parts = [params, grads, optimizer, int(acts), buffers, nccl]
    overlap = min(grads, int(acts + logits)) if overlaps else 0
    if fixed[11]:
        # The states come back for the step, when the activations are gone: the peak holds
        # the larger of the two.
        overlap = min(optimizer, int(acts + logits))
    return parts, overlap, cpu


def autocast_weight_copies(dims: ModelDims, d: LayoutDraft) -> float:
    """The 16-bit copies of the weights autocast makes for the forward's matrix products, which
    each linear keeps for its backward (2 bytes a weight) until that layer's backward runs:
    every linear of the blocks that keep their activations, the attention's only where the MLP
    is recomputed, none in a fully recomputed block (its forward runs again), and the head."""
    dense_l, _ = per_layer_params(dims)
    kept = {Recompute.NONE: dense_l, Recompute.MLP: attention_params(dims), Recompute.FULL: 0.0}
    per_layer = kept.get(d.recompute, dense_l)
    layers = math.ceil(dims.layers / d.pp)
    return 2 * (layers * per_layer + dims.vocab * dims.hidden) / d.tp


def attention_params(dims: ModelDims) -> float:
    """One layer's attention weights (query, key, value and output projections; a GQA/MHA
    layout)."""
    h, q = dims.hidden, dims.heads * dims.head_dim
    return h * (q + 2 * dims.kv_heads * dims.head_dim) + q * h


def logits_bytes(dims: ModelDims, d: LayoutDraft, s_local: int) -> float:
    """The cross-entropy's peak (the last stage's). Eager PyTorch: the 16-bit logits the script
    still holds (2 bytes a logit), and at the loss's backward the fp32 log-probabilities it
    saved, the gradient arriving from the loss and the gradient of the upcast logits (4 each):
    14 bytes a logit (measured 12 above the 16-bit logits on an H100 at 50K, 128K and 256K
    vocabularies: tests/data/gpu_runs.json, components). Megatron's fused vocab-parallel
    cross-entropy (``--cross-entropy-loss-fusion``) works on the 16-bit logits and writes the
    gradient in their place, with one 16-bit working copy (4 bytes). At a 152K vocabulary and
    16K tokens a micro-batch that is 9 GiB against 32. A PyTorch-native trainer's fused loss
    (:attr:`LayoutDraft.fused_ce`: flash-attn's ``CrossEntropyLoss``, Liger's) does the same."""
    per_logit = 4 if d.framework == Framework.MEGATRON or d.fused_ce else 14
    return per_logit * s_local * d.micro_batch * dims.vocab / d.tp


_STATES_CACHE: dict[tuple[object, ...], tuple[ModelDims, tuple[States, States]]] = {}
""":func:`_layout_states` by what they depend on: a search weighs each mesh at many
micro-batches and recomputes, which change only the activations. The model is keyed by identity
(hashing it field by field costs more than the look-up saves) and kept beside the value, so its
id cannot be reused while the entry lives; a hit checks it is the same object."""
_STATES_CACHE_MAX = 20_000


def _layout_states(
    dims: ModelDims, d: LayoutDraft, optimizer: Optimizer, gpus_per_node: int
) -> tuple[States, States]:
    """Model states of the dense and the expert parameters the heaviest GPU holds (cached:
    :data:`_STATES_CACHE`)."""
    key = (
        id(dims),
        d.strategy,
        d.framework,
        d.tp,
        d.pp,
        d.dp,
        d.cp,
        d.ep,
        d.etp,
        d.zero_stage,
        d.offload,
        d.grad_accum,
        d.precision,
        d.grads_bf16,
        moments_bf16_apply(d),
        d.first_stage_layers,
        d.last_stage_layers,
        optimizer,
        gpus_per_node,
    )
    hit = _STATES_CACHE.get(key)
    if hit is not None and hit[0] is dims:
        return hit[1]
    states = _states_of(dims, d, optimizer, gpus_per_node)
    if len(_STATES_CACHE) >= _STATES_CACHE_MAX:
        _STATES_CACHE.clear()
    _STATES_CACHE[key] = (dims, states)
    return states


def _states_of(
    dims: ModelDims, d: LayoutDraft, optimizer: Optimizer, gpus_per_node: int
) -> tuple[States, States]:
    dense, expert = stage_params(dims, d)
    shard = d.dp * d.cp  # CP ranks hold the same weights and reduce gradients with DP
    expert_shard = d.expert_dp
    nd = shard
    if d.strategy == Strategy.FSDP_HYBRID and gpus_per_node:
        nd = max(1, math.gcd(shard, gpus_per_node))  # shard inside a node, replicate across
    states = partial(
        model_states,
        grad_accum=d.grad_accum,
        framework=d.framework,
        strategy=d.strategy,
        zero_stage=d.zero_stage,
        precision=d.precision,
        optimizer=optimizer,
        offload=d.offload,
        grads_bf16=d.grads_bf16,
        moments_bf16=moments_bf16_apply(d),
    )
    st_dense = states(dense, nd, largest_layer=largest_layer_params(dims, d.tp))
    st_exp = states(expert, expert_shard, largest_layer=0.0) if expert else States(0.0, 0.0, 0.0)
    return st_dense, st_exp


class _LayerShape(NamedTuple):
    """What :func:`layer_activation_bytes` reads of a layout besides the recompute and the FP8
    linears (its keywords, as :func:`_activation_terms` passes them)."""

    s: int
    b: int
    t: int
    sp: bool
    flash: bool
    dropout: bool
    bytes_per_value: int
    eager: bool
    fp32_residual: bool
    load: float
    expert_tp: int


_LAYER_BYTES: dict[tuple[int, _LayerShape, Recompute, bool], tuple[ModelDims, float]] = {}
""":func:`layer_activation_bytes` as :func:`_activation_terms` asks for it, by its arguments: a search
weighs thousands of layouts that share a few hundred layer shapes (micro-batch, TP, recompute,
load). The model by identity, as in :data:`_STATES_CACHE`."""
_LAYER_BYTES_MAX = 20_000


def _layer_bytes(dims: ModelDims, shape: _LayerShape, recompute: Recompute, fp8: bool) -> float:
    """:func:`layer_activation_bytes` of ``dims`` at ``shape``, cached (:data:`_LAYER_BYTES`)."""
    key = (id(dims), shape, recompute, fp8)
    hit = _LAYER_BYTES.get(key)
    if hit is not None and hit[0] is dims:
        return hit[1]
    value = layer_activation_bytes(
        dims,
        shape.s,
        shape.b,
        t=shape.t,
        sp=shape.sp,
        flash=shape.flash,
        dropout=shape.dropout,
        bytes_per_value=shape.bytes_per_value,
        eager=shape.eager,
        fp32_residual=shape.fp32_residual,
        load=shape.load,
        expert_tp=shape.expert_tp,
        recompute=recompute,
        fp8_linears=fp8,
    )
    if len(_LAYER_BYTES) >= _LAYER_BYTES_MAX:
        _LAYER_BYTES.clear()
    _LAYER_BYTES[key] = (dims, value)
    return value


@lru_cache(maxsize=4096)
def _peak_stages(
    layers: int, pp: int, first: int, last: int, mtp: int
) -> tuple[tuple[int, int], ...]:
    """(stage, layers) of the stages that can hold the peak: of the stages with the same layer
    count (``mtp`` more on the last), the first. A stage holds ``in_flight(stage)`` times what
    its layers keep and :func:`engine.plan.stages.in_flight` never grows with the stage, so a
    later stage of as many layers never holds more (the maximum is the same float): an even
    split of 64 stages is weighed as one or two."""
    split = stage_layers(layers, pp, first, last)
    split[-1] += mtp
    firsts: dict[int, int] = {}
    for i, n in enumerate(split):
        firsts.setdefault(n, i)
    return tuple((i, n) for n, i in firsts.items())


def _activation_terms(
    dims: ModelDims, d: LayoutDraft, s_local: int, flash: bool
) -> _ActivationTerms:
    """The activations the first pipeline stage holds at its peak, for ``s_local`` tokens per CP
    rank, before the recomputed layers a chunk come in (:func:`_activations_at`): each stage
    that can hold the peak as (its micro-batches in flight, its layers), a layer's bytes under ``d``'s recompute,
    a layer's that keeps everything, the virtual stages under full recompute (0 otherwise),
    what recomputing one layer in backward materialises again (None: nothing), a layer's bytes
    that fine-grained offloading moves to host memory (:func:`offloaded_values`) and the model
    chunks a stage (:func:`offloaded_layers`)."""
    mixed = is_mixed(d.precision)
    shape = _LayerShape(
        s_local,
        d.micro_batch,
        d.tp,
        d.sequence_parallel,
        flash,
        not dims.gated_mlp,
        2 if mixed else 4,
        d.framework != Framework.MEGATRON,
        d.framework == Framework.DDP and mixed,
        held_expert_load(dims, d),
        d.expert_tp,
    )

    def layer(recompute: Recompute = Recompute.NONE, fp8_linears: bool = False) -> float:
        return _layer_bytes(dims, shape, recompute, fp8_linears)

    fp8 = d.fp8_linears or d.precision == Precision.FP8
    per_layer = layer(recompute=d.recompute, fp8_linears=fp8)
    kept = layer(fp8_linears=fp8)  # a layer that keeps everything (no recompute)
    off = offloaded_layer_bytes(dims, d, s_local, shape.load)
    # The stage holding the most: the first under an even split; a lighter first stage can
    # leave the peak to the second, which holds one micro-batch fewer of more layers.
    # The multi-token prediction modules' layers are the last stage's.
    stages = _peak_stages(
        dims.layers, d.pp, d.first_stage_layers, d.last_stage_layers, mtp_modules(dims, d)
    )
    v = d.virtual_stages if d.pp_schedule == PPSchedule.INTERLEAVED else 1
    # One stage with the all-to-all overlap: the next micro-batch's forward runs beside this
    # one's backward, so two are alive at once (a pipeline's warm-up already holds that one).
    paired = 2.0 if d.a2a_overlap and d.pp == 1 and d.grad_accum > 1 else 1.0
    held = tuple((paired * in_flight(d.pp, d.grad_accum, v, i), n) for i, n in stages)
    again = None
    if d.recompute in (Recompute.MLP, Recompute.LIGHT):
        # Recomputing one layer's MLP (or norms, activation, up-projections) in backward
        # materialises what it had dropped again.
        again = kept - per_layer
    elif d.recompute == Recompute.FULL:
        # Recomputing one layer in backward materialises that layer's full activations again.
        again = layer(recompute=Recompute.SELECTIVE if flash else Recompute.NONE)
    v_full = v if d.recompute == Recompute.FULL else 0
    return held, per_layer, kept, v_full, again, off, v


def host_activations(terms: _ActivationTerms) -> float:
    """Bytes of :func:`_activation_terms`' activations that fine-grained offloading keeps in
    pinned host memory at the GPU's peak (:func:`offloaded_layers`)."""
    held, _, _, _, _, off, chunks = terms
    return max(off * offloaded_layers(f, n, chunks) for f, n in held) if off else 0.0


def _activations_at(terms: _ActivationTerms, recompute_layers: int) -> float:
    """The activations of :func:`_activation_terms`' draft with ``recompute_layers`` layers of
    each chunk recomputed under full recompute (what :attr:`LayoutDraft.recompute_layers` says).
    Gated-MLP (Llama-family) models train without dropout, so no dropout masks."""
    held, per_layer, kept, v_full, again, off, chunks = terms
    # Block recompute (a full recompute of only the first N layers of each model chunk): those
    # keep their input only, the others everything. 0: every layer recomputes.
    redone = v_full * recompute_layers
    if not redone:
        acts = max(f * (n * per_layer) - off * offloaded_layers(f, n, chunks) for f, n in held)
    else:
        acts = max(f * (min(redone, n) * per_layer + max(0, n - redone) * kept) for f, n in held)
    if again is not None:
        acts += again
    return acts


def usable_bytes(memory_bytes: int) -> int:
    """What a plan may use of host RAM or a CPU rank's memory (see :data:`USABLE_FRACTION`)."""
    return int(memory_bytes * USABLE_FRACTION)


def gpu_reserves(memory_bytes: int) -> dict[str, int]:
    """The named reserves taken off an accelerator's memory before a plan may use it: the CUDA
    context and the allocator's fragmentation (NCCL's buffers depend on the layout: each
    breakdown counts its own, :attr:`MemoryBreakdown.nccl`)."""
    return {
        "cuda_context": CUDA_CONTEXT_BYTES,
        "fragmentation": int(max(0, memory_bytes - CUDA_CONTEXT_BYTES) * FRAGMENTATION),
    }


def gpu_usable_bytes(memory_bytes: int) -> int:
    """What a plan may use of an accelerator's memory: all of it less :func:`gpu_reserves`
    (76.1 GiB of an 80 GiB part)."""
    return memory_bytes - sum(gpu_reserves(memory_bytes).values())
