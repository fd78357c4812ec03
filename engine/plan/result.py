"""The planner's result: frozen values that the CLI's ``--json``, the wizard's decision step and
the config writers all read. ``Plan.to_json_dict()`` is the documented ``plan --json`` schema.

All memory figures are bytes per GPU; times are seconds; ``mfu`` is a fraction in [0, 1].
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.errors import DtrainError
from engine.plan.calibration import Calibration
from engine.plan.dims import ModelDims
from engine.plan.names import (
    Framework,
    Offload,
    Optimizer,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.specs import Spec


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryBreakdown(_Frozen):
    """Bytes per GPU, on the GPU (what is offloaded to CPU is in ``cpu_*``)."""

    params: int
    """Model parameters held on this GPU (16-bit working copy, or fp32 in fp32 training)."""
    grads: int
    """Gradients held on this GPU (16-bit for DeepSpeed; fp32 main grads for Megatron)."""
    optimizer: int
    """Optimizer states, including the fp32 master copy under mixed precision."""
    activations: int
    """Activations saved for backward at the peak (first pipeline stage for PP)."""
    buffers: int
    """Temporary buffers: communication buckets, ZeRO-3 gathered params, logits, fragmentation."""
    overlap: int = 0
    """Bytes counted above that are never alive together: gradients a plain PyTorch step
    allocates in backward as it frees the activations (DDP, FSDP)."""
    total: int
    """The peak: the sum of the above less ``overlap``."""
    cpu_bytes: int = 0
    """Bytes moved to CPU memory per GPU by offload (optimizer and/or params)."""


class Layout(_Frozen):
    """One candidate parallel layout and its estimates."""

    strategy: Strategy
    framework: Framework
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1
    """Tensor parallelism inside each expert (``--expert-tensor-parallel-size``): 1 keeps the
    experts whole with EP folded over the TP ranks; ``tp`` splits them like a dense MLP."""
    zero_stage: int = 0
    offload: Offload = Offload.NONE
    micro_batch: int = 1
    grad_accum: int = 1
    global_batch: int = 1
    recompute: Recompute = Recompute.NONE
    recompute_layers: int = 0
    """Full recompute of only the first N layers of each pipeline stage (Megatron's block
    method); 0: every layer (or no full recompute)."""
    sequence_parallel: bool = False
    precision: Precision = Precision.BF16
    pp_schedule: PPSchedule = PPSchedule.ONE_F_ONE_B
    virtual_stages: int = 1
    """Interleaved pipeline: model chunks per stage (1: plain 1F1B)."""
    first_stage_layers: int = 0
    """Layers on the first pipeline stage when it is lighter than the others (Megatron's
    ``--decoder-first-pipeline-num-layers``); 0: the even split."""
    last_stage_layers: int = 0
    """Layers on the last pipeline stage when lighter (``--decoder-last-pipeline-num-layers``)."""
    a2a_overlap: bool = False
    """The expert-parallel all-to-all overlapped with another micro-batch's compute (Megatron's
    ``--overlap-moe-expert-parallel-comm``)."""
    memory_per_gpu: MemoryBreakdown
    fits: bool
    step_time_s: float
    tokens_per_s: float
    mfu: float
    """Model FLOPs utilisation in Megatron-LM's convention (causal attention, the LM head, no
    embedding lookup: :func:`engine.plan.perf.model_flops_per_token`), what its logs print."""
    compute_time_s: float = 0.0
    comm_time_s: float = 0.0
    """Communication time not hidden behind compute."""
    bubble_fraction: float = 0.0
    scaling_efficiency: float = 1.0
    """The step of this layout with no exposed communication over its step
    (``compute_time_s / step_time_s``): 1 where every collective hides behind compute."""
    gpu_hours: float | None = None
    cost_usd: float | None = None
    rejected_because: str | None = None
    """Why this candidate lost (None for the recommended one)."""
    notes: list[str] = Field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def check_megatron(self, layers: int, optimizer: Optimizer) -> None:
        """Refuse, in one line naming the field, what Megatron-LM cannot run as this layout
        says: sequence parallelism without tensor parallelism, interleaved stages that do not
        split the ``layers`` evenly, 8-bit Adam (its moments in FP8 in the distributed
        optimizer) without the distributed optimizer over several data-parallel ranks. The
        Megatron writer asks before it writes a flag."""
        if self.sequence_parallel and self.tp == 1:
            raise DtrainError(
                "sequence parallelism needs tp > 1; drop --sequence-parallel or force --tp",
                field="layout.sequence_parallel",
            )
        uneven = bool(self.first_stage_layers or self.last_stage_layers)
        if self.pp_schedule == PPSchedule.INTERLEAVED and self.virtual_stages > 1 and not uneven:
            per_chunk, rem = divmod(layers, self.pp * self.virtual_stages)
            if rem or per_chunk == 0:
                raise DtrainError(
                    f"{layers} layers do not split into pp {self.pp} x {self.virtual_stages} "
                    "virtual stages; force a --virtual-stages that divides layers/pp",
                    field="layout.virtual_stages",
                )
        if optimizer == Optimizer.ADAM8BIT and self.zero_stage < 1 and self.dp * self.cp > 1:
            raise DtrainError(
                "adam8bit under Megatron keeps its moments in FP8 in the distributed optimizer, "
                "which this layout does not use; pass --zero-stage 1 (or --optimizer adamw)",
                field="training.optimizer",
            )


class Resilience(_Frozen):
    """What failures will cost this layout, before the run (:mod:`engine.plan.resilience`):
    the checkpoint's size and save time, the interruptions to expect at this many GPUs, the
    checkpoint interval that loses the least work (Young/Daly) and the share of GPU time that
    then trains."""

    ckpt_bytes_per_gpu: int
    """What the busiest GPU holds of a checkpoint: its parameters and optimizer states
    (offloaded ones included) as the layout shards them (:mod:`engine.plan.memory`)."""
    ckpt_bytes_total: int
    """One checkpoint, every shard once: the model's parameters and optimizer states."""
    storage: str
    """Where checkpoints go (``local``, ``parallel-fs``, ``object``)."""
    bandwidth_gbps: float
    """Write bandwidth per node, Gbit/s (``--ckpt-bandwidth-gbps`` or the storage's default)."""
    bandwidth_source: str
    """Where that bandwidth comes from."""
    save_s: float
    """Seconds to write one checkpoint, each node writing its share in parallel; the training
    loop is taken to wait for all of it (a synchronous save: an asynchronous one stalls less)."""
    failures_per_gpu_hour: float
    """Unexpected interruptions per GPU-hour, from the fleet figure of ``failure_source``."""
    failure_source: str
    mtbf_s: float
    """Mean time between interruptions of this run: 1 / (rate x GPUs)."""
    restart_s: float
    """Seconds from an interruption to training again (detect, stop, relaunch, load): an
    assumption, not a measurement."""
    interval_s: float
    """Young/Daly's checkpoint interval that loses the least work: sqrt(2 x save_s x mtbf_s)."""
    interval_steps: int
    """``interval_s`` in steps of the plan's step time (at least 1)."""
    every: int
    """The interval the bundle uses, in steps: ``training.ckpt_every`` when given, else
    ``interval_steps``; 0: no checkpoints."""
    lost_per_failure_s: float
    """Work lost per interruption at ``every``: half an interval (and its save) plus the
    restart."""
    goodput: float
    """Share of GPU time that trains at ``every``: less the save stalls and the lost work."""
    expected_interruptions: float | None = None
    """Interruptions expected over the whole run (its GPU-hours from ``training.tokens``);
    None without a token budget."""
    note: str | None = None
    """Why the bundle saves no checkpoints when the user did not say (several nodes and no
    directory they all reach), and how to turn them on."""


class PathStep(_Frozen):
    """One question of the decision flowchart and how this spec answered it."""

    question: str
    answer: str
    reason: str


class BatchChoice(_Frozen):
    """A global batch other than the one asked for, offered as an explicit choice: the nearest
    ones a layout can train when none trains the asked batch exactly, or a nearby one that
    trains clearly faster per token. Never applied without the user's say-so (``plan
    --global-batch-nearest``, or a choice in the wizard)."""

    global_batch: int
    layout: str
    """The best layout at that batch, described (``3D (megatron) tp=8 pp=4 dp=2``)."""
    tokens_per_s: float
    """That layout's estimated throughput (0 when none fits)."""
    fits: bool
    reason: str
    """Why it is offered, in one phrase."""


class GpuInfo(_Frozen):
    """What the plan assumed of the accelerator and the fabric."""

    key: str
    name: str
    memory_bytes: int
    peak_tflops: float
    """Dense peak for the plan's precision, TFLOP/s."""
    bf16: bool
    intra_node_gbps: float
    """Per-GPU scale-up bandwidth inside a node, GB/s, one direction."""
    inter_node_gbps: float
    """Per-node scale-out bandwidth, GB/s, one direction."""
    dist_backend: str
    """``nccl`` (``rccl`` on AMD is still called nccl by torch) or ``gloo`` for cpu."""
    price_per_gpu_hour: float | None = None


class Plan(_Frozen):
    """The whole answer: the resolved model, the flowchart path, the recommended layout and the
    alternatives that lost (each with ``rejected_because``), plus warnings."""

    spec: Spec
    model: ModelDims
    gpu: GpuInfo
    world_size: int
    nodes: int
    gpus_per_node: int
    recommended: Layout
    alternatives: list[Layout] = Field(default_factory=list)
    path: list[PathStep] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    forced: bool = False
    """True when the user forced (part of) the layout; ``recommended`` is then that layout."""
    batch_choices: list[BatchChoice] = Field(default_factory=list)
    """Other global batches worth offering (see :class:`BatchChoice`); empty when the asked
    batch is as good as any nearby."""
    calibration: Calibration | None = None
    """The calibration the estimates use (``Spec.calibration`` when it was measured on this
    plan's GPU); None: the catalog's figures."""
    usable_bytes: int
    """GPU memory a layout may use, per GPU: what every layout's fit was judged by (the GPU's
    memory less the named reserves and the calibration's measured overhead,
    :func:`engine.plan.context.usable_memory`), less the headroom. The CLI's memory table and
    the wizard's bars mark it."""
    headroom_bytes: int = 0
    """What the plan keeps free beyond ``usable_bytes`` (``training.headroom``, or the default
    for the model: :func:`engine.plan.memory.default_headroom`)."""
    resilience: Resilience | None = None
    """What failures will cost the recommended layout (:class:`Resilience`)."""

    def spare_bytes(self, layout: Layout | None = None) -> int:
        """What ``layout`` (the recommended one by default) leaves of the memory before the
        headroom: the margin the plan states ("fits with 6.1 GiB (8 %) to spare")."""
        lay = layout or self.recommended
        return self.usable_bytes + self.headroom_bytes - lay.memory_per_gpu.total

    def margin_text(self, layout: Layout | None = None) -> str:
        """How ``layout`` fits, as the plan says it: "fits with 6.1 GiB (8 %) to spare" of the
        memory before the headroom, or "DOES NOT FIT"."""
        lay = layout or self.recommended
        if not lay.fits:
            return "DOES NOT FIT"
        spare = self.spare_bytes(lay)
        share = spare / max(1, self.usable_bytes + self.headroom_bytes)
        return f"fits with {spare / 1024**3:.1f} GiB ({share:.0%}) to spare"

    def to_json_dict(self) -> dict[str, Any]:
        """The ``plan --json`` object (documented in the README)."""
        m = self.model
        data: dict[str, Any] = {
            "model": model_json(m),
            "gpu": self.gpu.model_dump(mode="json"),
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "forced": self.forced,
            "recommended": self.recommended.model_dump(mode="json"),
            "alternatives": [a.model_dump(mode="json") for a in self.alternatives],
            "path": [p.model_dump(mode="json") for p in self.path],
            "warnings": list(self.warnings),
            "usable_bytes": self.usable_bytes,
            "headroom_bytes": self.headroom_bytes,
            "batch_choices": [b.model_dump(mode="json") for b in self.batch_choices],
            "resilience": None
            if self.resilience is None
            else self.resilience.model_dump(mode="json"),
            "spec": self.spec.model_dump(mode="json", exclude_none=True),
        }
        data["calibration"] = (
            None if self.calibration is None else self.calibration.model_dump(mode="json")
        )
        return data


def model_json(m: ModelDims) -> dict[str, Any]:
    """The ``model`` object of ``plan --json`` and ``model inspect --json``."""
    return {
        "name": m.name,
        "arch": m.arch,
        "params_total": m.params_total,
        "params_active": m.params_active,
        "layers": m.layers,
        "hidden": m.hidden,
        "heads": m.heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "vocab": m.vocab,
        "ffn": m.ffn,
        "gated_mlp": m.gated_mlp,
        "num_experts": m.num_experts,
        "experts_per_token": m.experts_per_token,
        "tie_embeddings": m.tie_embeddings,
        "params_embedding": m.params_embedding,
        "params_experts": m.params_experts,
        # What a plain transformer has none of: only where the model has it.
        **{k: getattr(m, k) for k in _ARCHITECTURE_FIELDS if getattr(m, k)},
    }


_ARCHITECTURE_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "v_head_dim",
    "shared_experts",
    "dense_layers",
    "dense_ffn",
    "sliding_window",
    "window_layers",
    "window_pattern",
    "expert_groups",
    "group_topk",
    "mtp_layers",
)
"""ModelDims fields of latent attention, shared experts, leading dense layers, sliding
windows and multi-token prediction (``model_json`` writes them only where they are set)."""
