"""The names a spec and a plan use: precisions, strategies, frameworks, recompute, fabrics,
backends, each a :class:`~enum.StrEnum` whose value is what a spec file, the CLI and ``--json``
spell.

Imported by every other module of :mod:`engine.plan` (the specs, the catalog, the time and
memory models, the plan result) and by the writers; it imports nothing of the project, so no
import circle runs through it.
"""

from __future__ import annotations

from enum import StrEnum


class Precision(StrEnum):
    """Training precision. bf16/fp16 are mixed precision with fp32 master weights; fp8 is bf16
    mixed precision whose linear layers run their GEMMs in FP8 (Transformer Engine's hybrid
    recipe, torchao float8), attention and the rest in bf16."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"


class Fp8Recipe(StrEnum):
    """How FP8 training scales its tensors into the FP8 range (Megatron-LM's ``--fp8-recipe``,
    Transformer Engine's recipes). Per-tensor scaling runs the FP8 GEMMs at full rate;
    block-scaled recipes keep more accuracy (a scale per block of values) for GEMMs that load
    and apply those scales, :data:`engine.plan.context.BLOCK_SCALED_FP8_RATE` of the rate."""

    DELAYED = "delayed"
    """One scale per tensor from the amax history of past steps (TE's DelayedScaling, the
    hybrid E4M3/E5M2 format; Megatron's default)."""
    TENSORWISE = "tensorwise"
    """One scale per tensor from the tensor itself (current scaling: NeMo's "FP8-CS",
    torchao's float8 tensorwise)."""
    MXFP8 = "mxfp8"
    """OCP microscaling: an E8M0 scale per 32 values, applied by Blackwell's tensor cores (NeMo's
    "FP8-MX" / MXFP8, torchao's mxfp8)."""
    BLOCKWISE = "blockwise"
    """A scale per 1 x 128 block of activations and 128 x 128 block of weights (DeepSeek-V3's
    fine-grained quantisation; TE's Float8BlockScaling)."""

    @property
    def block_scaled(self) -> bool:
        """A scale per block of values (MXFP8, blockwise), not one per tensor."""
        return self in (Fp8Recipe.MXFP8, Fp8Recipe.BLOCKWISE)


class Optimizer(StrEnum):
    """Optimizer, which sets the bytes of optimizer state per parameter."""

    ADAMW = "adamw"
    SGD = "sgd"  # SGD with momentum
    ADAM8BIT = "adam8bit"


class CpComm(StrEnum):
    """How context parallelism brings every rank the keys and values of the whole sequence
    (Transformer Engine's ``cp_comm_type``, Megatron's ``--cp-comm-type``)."""

    P2P = "p2p"
    """Round a ring: each step sends the next rank's key/value chunk while attending to the one
    it has, so most of the traffic hides behind the attention (Megatron's default)."""
    ALLGATHER = "allgather"
    """All-gather every chunk before the attention and reduce-scatter their gradients after
    it, on the critical path: simpler and robust to masks, exposed (PyTorch's and Accelerate's
    default; Llama 3's long-context training, Grattafiori et al. 2024, §3.3.2)."""
    A2A = "a2a"
    """Trade the sequence split for a head split (DeepSpeed-Ulysses, Jacobs et al. 2023): an
    all-to-all before the attention gives each rank ``1/cp`` of the heads over the whole
    sequence, another after it gives the sequence back, all on the critical path. Needs a TP
    rank's query and key/value heads to divide by cp
    (:func:`engine.plan.frameworks.cp_splits_heads`)."""


class MoeDispatcher(StrEnum):
    """How Megatron moves an MoE layer's tokens to their experts and back."""

    ALLTOALL = "alltoall"
    """NCCL all-to-all (``--moe-token-dispatcher-type alltoall``): every routed copy of a token
    travels to its expert's rank, over the network when that rank is on another node."""
    DEEPEP = "deepep"
    """DeepEP's hierarchical kernels (``--moe-token-dispatcher-type flex --moe-enable-deepep``;
    DeepSeek-V3 report §3.2.2): a token crosses the network once per remote node holding one of
    its experts and fans out over NVLink there. Needs Hopper-class GPUs with InfiniBand or
    RoCE (NVSHMEM)."""


class Recompute(StrEnum):
    """Activation recomputation (checkpointing) granularity, as in Korthikanti et al. 2022."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    MLP = "mlp"
    """Partial: only each layer's MLP is recomputed (its intermediates are not kept; one more
    MLP forward in backward), as Megatron-Core's ``--recompute-granularity selective
    --recompute-modules mlp`` or checkpointing the MLP submodule under FSDP/DeepSpeed."""
    LIGHT = "light"
    """Partial, Megatron-Core only, for MoE and latent-attention (MLA) models: the cheap parts
    are recomputed and the GEMM outputs kept -- the norms not fused into a linear, the MoE
    experts' activation function, and MLA's up-projections to the per-head queries, keys and
    values (``--recompute-granularity selective --recompute-modules layernorm moe_act
    mla_up_proj``, output-discarding checkpoints; DeepSeek-V3's own recipe, its report
    §3.2.3)."""


class Framework(StrEnum):
    """Which framework runs the plan (decides config files and the gradient convention)."""

    DDP = "ddp"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    MEGATRON = "megatron"


class Strategy(StrEnum):
    """The data-parallel memory strategy; ``3d`` is TP+PP(+CP/EP)+DP."""

    DDP = "ddp"
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"
    FSDP_FULL = "fsdp-full"
    FSDP_GRAD_OP = "fsdp-grad-op"
    FSDP_HYBRID = "fsdp-hybrid"
    THREE_D = "3d"


class Offload(StrEnum):
    """What lives in CPU memory instead of GPU memory (ZeRO-Offload / ZeRO-Infinity to CPU)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class OffloadModule(StrEnum):
    """A module whose saved input Megatron-Core's fine-grained activation offloading moves to
    host memory in the forward and back before its backward (``--fine-grained-activation-offloading
    --offload-modules ...``; Megatron-Core's user guide, "Fine-grained Activation Offloading",
    and the Megatron Core MoE report, arXiv:2603.07685 §4.1.5)."""

    ATTN_NORM = "attn_norm"
    """The attention's input norm: the residual stream entering the layer."""
    QKV_LINEAR = "qkv_linear"
    """The query-key-value projection: the normed hidden state."""
    CORE_ATTN = "core_attn"
    """The attention kernel: its queries, keys and values."""
    ATTN_PROJ = "attn_proj"
    """The output projection: the attention's output."""
    MLP_NORM = "mlp_norm"
    """The pre-MLP norm: the residual stream after attention."""
    EXPERT_FC1 = "expert_fc1"
    """The experts' first GEMM: every routed copy of a token (MoE)."""
    MOE_ACT = "moe_act"
    """The experts' activation function: the first GEMM's output (MoE)."""


class NetworkTier(StrEnum):
    """Inter-node fabric. ``ib`` means InfiniBand of unspecified generation (taken as HDR)."""

    IB = "ib"
    IB_HDR = "ib-hdr"
    IB_NDR = "ib-ndr"
    EFA = "efa"
    ROCE = "roce"
    TCP = "tcp"


class IntraNodeLink(StrEnum):
    """How GPUs inside one node talk: NVLink/xGMI (fast) or PCIe only."""

    NVLINK = "nvlink"
    PCIE = "pcie"


class Backend(StrEnum):
    """How a run is started."""

    LOCAL = "local"
    SSH = "ssh"
    SKYPILOT = "skypilot"
    SLURM = "slurm"


class PPSchedule(StrEnum):
    """Pipeline schedule: plain 1F1B or interleaved 1F1B (virtual stages)."""

    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class CkptStorage(StrEnum):
    """Where checkpoints are written, for the save-time estimate's default bandwidth
    (:data:`engine.plan.resilience.STORAGE_GBPS`)."""

    LOCAL = "local"
    """A node's own NVMe drive(s)."""
    PARALLEL_FS = "parallel-fs"
    """A parallel file system every node mounts (Lustre, GPFS, WEKA)."""
    OBJECT = "object"
    """Object storage (S3, GCS, Azure Blob) through a mount or a client."""
