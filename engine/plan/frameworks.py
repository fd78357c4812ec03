"""What a framework's features allow and what they need: the rules the time model
(:mod:`engine.plan.perf`), the search (:mod:`engine.plan.search`), the notes
(:mod:`engine.plan.annotate`) and the writers (:mod:`engine.write.megatron`) all read, so that a
plan never costs a feature the written config leaves off, nor writes one it did not cost.

Pure predicates over a layout draft and a model's dimensions; imports only the names, the
dimensions and the draft.
"""

from __future__ import annotations

from typing import Protocol

from engine.plan.dims import ModelDims
from engine.plan.names import CpComm, Fp8Recipe, Framework, Precision, Recompute
from engine.plan.result import LayoutDraft


class _Rates(Protocol):
    """The two peaks :func:`fp8_linears` compares (``engine.plan.perf.Hardware`` has them)."""

    @property
    def peak_flops(self) -> float: ...

    @property
    def linear_peak_flops(self) -> float: ...


def megatron_fp8_flags(recipe: Fp8Recipe | None) -> list[str]:
    """Megatron-LM's flags for FP8 training under ``recipe`` (None: delayed), as
    Megatron-Bridge's mixed-precision recipes set them (``bf16_with_fp8_mixed``,
    ``..._current_scaling_...``, ``..._mxfp8_...``, ``..._subchannel_scaling_...``): the hybrid
    format (E4M3 forward, E5M2 gradients) for per-tensor scales, E4M3 throughout for block
    scales."""
    if recipe in (None, Fp8Recipe.DELAYED):
        return ["--fp8-format hybrid", "--fp8-amax-history-len 1024", "--fp8-amax-compute-algo max"]
    fmt = "hybrid" if recipe == Fp8Recipe.TENSORWISE else "e4m3"
    return [f"--fp8-format {fmt}", f"--fp8-recipe {recipe.value}"]


def cp_splits_heads(heads: int, kv_heads: int, tp: int, cp: int) -> bool:
    """Whether ``cp`` ranks can split a TP rank's attention heads, query and key/value alike,
    as the all-to-all variant of context parallelism (:attr:`CpComm.A2A`) does."""
    return heads % (tp * cp) == 0 and kv_heads % (tp * cp) == 0


def fp8_linears(hw: _Rates) -> bool:
    """Whether the linear layers run in FP8 (a lower precision than the rest)."""
    return hw.linear_peak_flops > hw.peak_flops


def fused_attention(d: LayoutDraft) -> bool:
    """Whether the attention runs as one fused (FlashAttention / cuDNN / SDPA) kernel. Training
    stacks that do (Megatron-Core with Transformer Engine, torchtitan, FSDP with SDPA) train in
    bf16 (or FP8 linears around bf16 attention); fp16 and fp32 training runs the classic path
    (Megatron-LM's fused scale-mask-softmax between two batched GEMMs, as in Narayanan et al.
    2021, Korthikanti et al. 2022 and BLOOM), and V100s, which only have fp16, have no
    FlashAttention 2 at all."""
    return d.precision in (Precision.BF16, Precision.FP8)


def tp_comm_overlap(
    framework: Framework, tp: int, sequence_parallel: bool, precision: Precision
) -> bool:
    """Whether the layout runs Megatron-Core's ``--tp-comm-overlap``: Transformer Engine's
    userbuffers split each sequence-parallel all-gather and reduce-scatter into chunks run
    beside the chunks of the GEMM next to them (the QKV and first MLP GEMMs behind their input's
    all-gather, the output projections behind their reduce-scatter, the backward's in turn),
    as NVIDIA's Llama 3 70B / 405B and GPT-3 175B recipes set it. It needs Megatron with
    Transformer Engine (the fused bf16 / FP8 path, :func:`fused_attention`), sequence
    parallelism and a TP group on NVLink (the planner keeps TP inside the NVLink domain). The
    time model costs it and the written Megatron arguments turn it on, both through here."""
    return (
        framework == Framework.MEGATRON
        and tp > 1
        and sequence_parallel
        and precision in (Precision.BF16, Precision.FP8)
    )


def cp_comm_of(d: LayoutDraft) -> CpComm:
    """How the layout's context parallelism moves keys and values: a Megatron layout as asked
    (``--cp-comm-type``, p2p by default), a PyTorch-native one by all-gather (PyTorch's
    ``context_parallel``, Accelerate and the shipped trainer gather them)."""
    return d.cp_comm if d.framework == Framework.MEGATRON else CpComm.ALLGATHER


def a2a_overlap_applies(dims: ModelDims, d: LayoutDraft) -> bool:
    """Whether Megatron-Core's expert-parallel all-to-all overlap can run this layout: a
    Megatron MoE layout with ep > 1 whose pipeline is one stage or interleaved (its combined
    1F1B schedule pairs model chunks), without full recompute (a checkpointed layer's backward
    is one opaque block the schedule cannot split), not fully sharded (Megatron-FSDP gathers
    per block outside that schedule). Megatron-LM's ``TransformerConfig`` asserts the same."""
    return (
        d.framework == Framework.MEGATRON
        and dims.is_moe
        and d.ep > 1
        and (d.pp == 1 or d.virtual_stages > 1)
        and d.recompute != Recompute.FULL
        and d.zero_stage < 3
    )


def shared_expert_overlap(dims: ModelDims, framework: Framework, ep: int, *, deepep: bool) -> bool:
    """Whether the shared expert runs beside the dispatch and combine where the all-to-all
    overlap does not (its combined 1F1B schedules the shared expert itself): Megatron-Core's
    ``--moe-shared-expert-overlap`` ("overlapping between shared expert computations and
    dispatcher communications; without this, the shared experts execute after the routed
    experts", its ``TransformerConfig``) puts it on a side stream. Megatron-Core allowed it
    with the all-to-all dispatcher only, and Megatron-Bridge turns it off whenever it applies
    DeepEP or HybridEP (``apply_flex_dispatcher_backend``), so it is not assumed under DeepEP.
    The time model and the written Megatron arguments (:mod:`engine.write.megatron`) both ask
    this function."""
    return (
        framework == Framework.MEGATRON
        and dims.is_moe
        and dims.shared_experts > 0
        and ep > 1
        and not deepep
    )
