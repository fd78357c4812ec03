"""The planner's result: frozen values that the CLI's ``--json``, the wizard's decision step and
the config writers all read. ``Plan.to_json_dict()`` is the documented ``plan --json`` schema.
A :class:`Layout` is the :class:`LayoutDraft` the search estimated plus its estimates, so a
layout's fields are declared once, on the draft (which lives here, below the estimators that
read it: :mod:`engine.plan.memory` re-exports it).

All memory figures are bytes per GPU; times are seconds; ``mfu`` is a fraction in [0, 1].
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, fields
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass

from engine.errors import DtrainError
from engine.plan.calibration import Calibration
from engine.plan.dims import ModelDims
from engine.plan.names import (
    CpComm,
    Framework,
    Offload,
    OffloadModule,
    Optimizer,
    PPSchedule,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.specs import Spec


def gib(n: float) -> str:
    """Bytes for a reason line: GiB, or MiB below 1 GiB so small models don't read as 0.0 GiB."""
    if abs(n) < 1024**3:
        return f"{n / 1024**2:.1f} MiB"
    return f"{n / 1024**3:.1f} GiB"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


NOT_IN_JSON = Field(exclude=True)
"""Marks a :class:`LayoutDraft` field that ``plan --json`` leaves out: how the estimates treat
the layout (FP8 activations, the MoE routing, the gradients' dtype, CP's traffic), which the
``spec`` of the plan already says; the expert TP is shown as :attr:`LayoutDraft.expert_tp`."""


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
    """Temporary buffers: communication buckets, ZeRO-3 gathered params, logits."""
    nccl: int = 0
    """NCCL's own buffers for the communicators the layout opens
    (:func:`engine.plan.nccl_memory.nccl_buffer_bytes`); 0 on CPU ranks (gloo)."""
    overlap: int = 0
    """Bytes counted above that are never alive together: gradients a plain PyTorch step
    allocates in backward as it frees the activations (DDP, FSDP)."""
    total: int
    """The peak: the sum of the above less ``overlap``."""
    cpu_bytes: int = 0
    """Bytes moved to CPU memory per GPU by offload (optimizer and/or params), and the
    activations offloaded (:attr:`host_activations`)."""
    host_activations: int = 0
    """Of :attr:`cpu_bytes`, the activations Megatron's fine-grained offloading keeps in pinned
    host memory at the GPU's peak (:attr:`engine.plan.specs.TrainingSpec.offload_modules`)."""


@dataclass(frozen=True, slots=True)
class LayoutDraft:
    """A candidate layout before it is estimated: what :func:`engine.plan.memory.estimate_memory`
    and :mod:`engine.plan.perf` read, built by the thousand by :mod:`engine.plan.search` (so a
    plain dataclass: no validation). A :class:`Layout` is a draft with its estimates, so each
    field here is a field of every Layout."""

    strategy: Strategy
    framework: Framework
    _: KW_ONLY
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    offload: Offload = Offload.NONE
    micro_batch: int = 1
    grad_accum: int = 1
    recompute: Recompute = Recompute.NONE
    recompute_layers: int = 0
    """Under full recompute, how many layers of each model chunk are recomputed (Megatron's
    ``--recompute-method block --recompute-num-layers N``: the first N of each pipeline stage,
    or of each virtual chunk under interleaving, keep only their input, the rest keep
    everything); 0: every layer."""
    sequence_parallel: bool = False
    precision: Precision = Precision.BF16
    pp_schedule: PPSchedule = PPSchedule.ONE_F_ONE_B
    virtual_stages: int = 1
    """Interleaved pipeline: model chunks per stage (1: plain 1F1B)."""
    first_stage_layers: int = 0
    """Transformer layers on the first pipeline stage (Megatron's
    ``--decoder-first-pipeline-num-layers``); 0: the even split. Per-stage counts:
    :func:`engine.plan.stages.stage_layers`."""
    last_stage_layers: int = 0
    """The same for the last stage (``--decoder-last-pipeline-num-layers``)."""
    a2a_overlap: bool = False
    """Megatron-Core's expert-parallel all-to-all overlap (``--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute``): one micro-batch's forward runs layer by layer beside another's
    backward, each hiding the other's dispatch and combine (see
    :func:`engine.plan.frameworks.a2a_overlap_applies`)."""
    etp: Annotated[int, NOT_IN_JSON] = 0
    """Tensor parallelism inside each expert; 0: ``tp`` (``plan --json`` shows
    :attr:`expert_tp`)."""
    fp8_linears: Annotated[bool, NOT_IN_JSON] = False
    """FP8 linear layers (Transformer Engine): each saves its input for the backward as the
    FP8 copy it made for the forward GEMM (1 byte, not 2); see
    :func:`engine.plan.memory.layer_activation_bytes`."""
    capacity: Annotated[float, NOT_IN_JSON] = 0.0
    """MoE expert capacity factor (tokens beyond it dropped); 0: dropless routing."""
    imbalance: Annotated[float, NOT_IN_JSON] = 0.0
    """The busiest expert rank's load over the mean as the user states it
    (:attr:`engine.plan.specs.TrainingSpec.moe_imbalance`); 0: the planner's assumption."""
    deepep: Annotated[bool, NOT_IN_JSON] = False
    """MoE tokens dispatched by DeepEP (:class:`engine.plan.names.MoeDispatcher`), not NCCL
    all-to-all: each token crosses the network once per remote node."""
    eager_modules: Annotated[bool, NOT_IN_JSON] = False
    """A PyTorch-native layout's trainer runs its model's Python modules eagerly (a Hugging
    Face model, torchtitan without compile): see
    :data:`engine.plan.perf.EAGER_MODULE_PASSES`. Megatron layouts ignore it."""
    fused_ce: Annotated[bool, NOT_IN_JSON] = False
    """The trainer's loss is a fused cross-entropy (see
    :attr:`engine.plan.specs.TrainingSpec.fused_cross_entropy`); Megatron's always is."""
    grads_bf16: Annotated[bool, NOT_IN_JSON] = False
    """Megatron keeps and reduces its main gradients in bf16 (``--grad-reduce-in-bf16``, as
    Megatron-Bridge's performance recipes do) instead of fp32: 2 bytes a parameter held and
    sent, not 4. Only read for Megatron bf16 layouts."""
    moments_bf16: Annotated[bool, NOT_IN_JSON] = False
    """Adam's moments in bf16 (Megatron's precision-aware optimizer, see
    :attr:`engine.plan.specs.TrainingSpec.moments_bf16`): 4 bytes a parameter, not 8. Only
    read for Megatron AdamW layouts with the distributed optimizer
    (:func:`engine.plan.memory.moments_bf16_apply`)."""
    states_offload: Annotated[bool, NOT_IN_JSON] = False
    """Megatron moves its optimizer states to host memory between steps
    (:attr:`engine.plan.specs.TrainingSpec.offload_optimizer_states`, set for AdamW only);
    only read where :func:`engine.plan.memory.states_offload_apply` says."""
    offload_modules: Annotated[tuple[OffloadModule, ...], NOT_IN_JSON] = ()
    """Modules whose saved inputs Megatron offloads to host memory
    (:attr:`engine.plan.specs.TrainingSpec.offload_modules`); only read for Megatron layouts
    without full recompute (:func:`engine.plan.memory.offloaded_values`)."""
    cp_comm: Annotated[CpComm, NOT_IN_JSON] = CpComm.P2P
    """How a Megatron layout's context parallelism moves keys and values
    (:class:`engine.plan.names.CpComm`); PyTorch-native layouts always all-gather them
    (:func:`engine.plan.frameworks.cp_comm_of`)."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step: ``micro_batch x grad_accum x dp``, by construction."""
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def expert_tp(self) -> int:
        """Tensor parallelism inside each expert (Megatron's ``--expert-tensor-parallel-size``,
        which defaults to ``tp``). At 1 the experts are whole on their GPU and the
        expert-parallel group is carved out of the stage's TP x DP x CP ranks (Megatron-Core's
        "MoE parallel folding", which every Megatron-Bridge MoE recipe sets: Qwen3-235B on H100
        as TP2 with EP32 over 16 data-parallel ranks): each rank routes its own
        sequence-parallel share of the tokens, the experts' GEMMs see whole expert widths and an
        MoE layer's MLP has no tensor-parallel collective."""
        return self.etp or self.tp

    @property
    def expert_dp(self) -> int:
        """Ranks of a pipeline stage holding the same experts: ``tp·dp·cp / (expert_tp·ep)``."""
        return max(1, self.tp * self.dp * self.cp // (self.expert_tp * self.ep))


_DRAFT_FIELDS = tuple(f.name for f in fields(LayoutDraft))
_JSON_DERIVED = {"ep": "expert_tp", "grad_accum": "global_batch"}
"""The draft's derived degrees ``plan --json`` writes, each after the field it follows."""


@pydantic_dataclass(frozen=True, slots=True, kw_only=True, config=ConfigDict(extra="forbid"))
class Layout(LayoutDraft):
    """One candidate parallel layout and its estimates: the :class:`LayoutDraft` it was
    estimated as (every field of the draft, declared there) and what the planner estimated of
    it. :meth:`engine.plan.search.Candidate.to_layout` builds it."""

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

    @staticmethod
    def of(draft: LayoutDraft, **estimates: Any) -> Layout:
        """``draft`` with its ``estimates`` (the fields a Layout adds to a draft), validated as
        one dict by the type adapter: a quarter faster than the dataclass's ``__init__``."""
        values = {name: getattr(draft, name) for name in _DRAFT_FIELDS}
        values.update(estimates)
        return _LAYOUT.validate_python(values)

    def draft(self) -> LayoutDraft:
        """The draft this layout was estimated as (its :class:`LayoutDraft` fields alone), for
        estimating it again with a setting changed."""
        return LayoutDraft(**{name: getattr(self, name) for name in _DRAFT_FIELDS})

    @model_serializer(mode="wrap")
    def _json(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The ``plan --json`` object: the fields with the derived degrees of
        :data:`_JSON_DERIVED` in their places."""
        out: dict[str, Any] = {}
        for name, value in handler(self).items():
            out[name] = value
            if name in _JSON_DERIVED:
                out[_JSON_DERIVED[name]] = getattr(self, _JSON_DERIVED[name])
        return out

    def to_json_dict(self) -> dict[str, Any]:
        """The layout as ``plan --json`` writes it (``recommended``, each of ``alternatives``)."""
        out: dict[str, Any] = _LAYOUT.dump_python(self, mode="json")
        return out

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


_LAYOUT = TypeAdapter(Layout)
"""Validates :meth:`Layout.of`'s values and writes a Layout's ``plan --json`` object."""


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
    worst_source: str | None = None
    """The fleet with the highest published interruption rate (the plan's worst case)."""
    worst_mtbf_s: float | None = None
    """Mean time between interruptions at that fleet's rate."""
    worst_goodput: float | None = None
    """Goodput at that rate, checkpointing at ``every``."""
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
        """How ``layout`` fits, as the plan, the CLI and the wizard say it: what it leaves free
        beyond the headroom, and the headroom ("fits with 3.8 GiB to spare beyond the 2.3 GiB
        (3%) headroom"; "fits with 6.1 GiB (8%) to spare" where none is kept), or "DOES NOT
        FIT"."""
        lay = layout or self.recommended
        if not lay.fits:
            return "DOES NOT FIT"
        free = self.usable_bytes - lay.memory_per_gpu.total
        whole = max(1, self.usable_bytes + self.headroom_bytes)
        if self.headroom_bytes <= 0:
            return f"fits with {gib(free)} ({free / whole:.0%}) to spare"
        kept = self.headroom_bytes / whole
        return f"fits with {gib(free)} to spare beyond the {gib(self.headroom_bytes)} ({kept:.0%}) headroom"

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
            "recommended": self.recommended.to_json_dict(),
            "alternatives": [a.to_json_dict() for a in self.alternatives],
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
