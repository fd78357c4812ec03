"""What the user asks for: the model, the machines, the network, the training set-up, a forced
layout if any, and how to launch.

Every surface edits these models (the wizard one sub-spec per step, the CLI through options or a
``--spec`` TOML/YAML file, profiles through a TOML document) and hands a whole :class:`Spec` to
``engine.plan.planner.plan``. Validation lives here, in one place: every field has a docstring, a
range, and an error that names the field and what to pass instead. Unknown keys are refused
(``extra="forbid"``) so a typo in a spec file is reported, not silently defaulted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Self, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from engine.plan.calibration import Calibration
from engine.plan.catalog import resolve_gpu_key
from engine.plan.names import (
    Backend,
    CkptStorage,
    CpComm,
    Fp8Recipe,
    Framework,
    IntraNodeLink,
    MoeDispatcher,
    NetworkTier,
    Offload,
    OffloadModule,
    Optimizer,
    Precision,
    Recompute,
    Strategy,
)


def _number_kinds(annotation: object) -> tuple[bool, bool]:
    """(takes a number, takes a bool) for a field's annotation such as ``int | None``."""
    args = get_args(annotation) or (annotation,)
    number = any(a in (int, float) for a in args)
    return number, bool in args


class _Strict(BaseModel):
    # allow_inf_nan=False: nan/inf are refused as "not a finite number" before any range check
    # (which would report nan as "should be ≤ 10000"), so no config file ever holds Infinity.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_enum_values=False, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_lax_numbers(cls, v: object, info: ValidationInfo) -> object:
        """A number field takes a number: not ``yes``/``true`` (YAML's bools, which pydantic
        would read as 1) and not a string of non-ASCII digits (``"٣"``)."""
        if not isinstance(v, bool | str) or info.field_name is None:
            return v
        number, takes_bool = _number_kinds(cls.model_fields[info.field_name].annotation)
        if not number or takes_bool:
            return v
        if isinstance(v, bool):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        if not v.isascii():
            raise ValueError(f"{v!r} is not a number; use the digits 0-9")
        return v


_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBtT]?)\s*$")
_SIZE_MULT = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_count(value: object) -> float:
    """Read a parameter count: ``7e9``, ``7000000000``, ``"7B"``, ``"1.3b"``, ``"350M"``."""
    if isinstance(value, bool):
        raise ValueError("must be a number such as 7e9 or '7B'")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if m:
            return float(m.group(1)) * _SIZE_MULT[m.group(2).lower()]
    raise ValueError(f"{value!r} is not a parameter count; pass e.g. 7e9, 7B or 350M")


class ModelSpec(_Strict):
    """Which model to train: a preset, a local Hugging Face ``config.json``, explicit dimensions,
    or a bare parameter count (dimensions are then derived from a standard aspect ratio).
    Exactly one source wins, in this order: ``config_path``, ``preset``, dimensions, ``params``."""

    preset: str | None = None
    """Name of a built-in preset (``dtrain-tui model list``), e.g. ``llama-3-8b``, ``mixtral-8x7b``."""
    config_path: Path | None = None
    """Path to a local Hugging Face ``config.json`` (or the directory holding it)."""
    params: float | None = Field(default=None, gt=0, le=1e14)
    """Bare total parameter count, e.g. 7e9 (``"7B"`` is accepted)."""
    layers: int | None = Field(default=None, ge=1, le=1024)
    """Number of transformer blocks."""
    hidden: int | None = Field(default=None, ge=8, le=262144)
    """Hidden (model) dimension."""
    heads: int | None = Field(default=None, ge=1, le=4096)
    """Attention heads."""
    kv_heads: int | None = Field(default=None, ge=1, le=4096)
    """Key/value heads (GQA/MQA); defaults to ``heads``."""
    head_dim: int | None = Field(default=None, ge=1, le=1024)
    """Width of one attention head (Megatron's ``kv_channels``); defaults to hidden / heads.
    Qwen3, Gemma and GPT-OSS set it apart from the hidden size (Qwen3-30B-A3B: hidden 2048,
    32 heads of 128), which changes the attention's projections and its score FLOPs."""
    vocab: int | None = Field(default=None, ge=2, le=10_000_000)
    """Vocabulary size."""
    ffn: int | None = Field(default=None, ge=1, le=1_048_576)
    """MLP intermediate size; defaults to 4·hidden (non-gated) when not given."""
    gated_mlp: bool | None = None
    """SwiGLU-style MLP with three matrices (llama) instead of two (gpt2); default: gated when ffn is given."""
    num_experts: int | None = Field(default=None, ge=1, le=4096)
    """MoE: experts per MoE layer (None or 1 for a dense model)."""
    experts_per_token: int | None = Field(default=None, ge=1, le=64)
    """MoE: experts each token is routed to (top-k)."""
    tie_embeddings: bool = False
    """Input embedding and output head share one matrix."""

    mtp_layers: int | None = Field(default=None, ge=0, le=16)
    """Multi-token prediction modules trained beside the model (Megatron-Core's
    ``--mtp-num-layers``; DeepSeek-V3 trained with one, its config's
    ``num_nextn_predict_layers``). Default: the config's count, 0 where it has none."""

    @field_validator("params", mode="before")
    @classmethod
    def _count(cls, v: object) -> object:
        return None if v is None else parse_count(v)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        source = "config_path" if self.config_path is not None else "preset" if self.preset else ""
        if source:
            # A preset or config.json sets every dimension: a --layers beside it would be
            # silently ignored, so it is refused instead.
            if self.config_path is not None and self.preset:
                raise ValueError(
                    "model.preset: give one model source, a preset or a config.json, not both"
                )
            for name in _DIMENSION_FIELDS:
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"model.{name}: the {source.replace('_', ' ')} sets the model's dimensions; "
                        f"drop {name}, or drop the {source.replace('_', ' ')} and give every dimension"
                    )
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(
                f"model.kv_heads: {self.kv_heads} must divide model.heads ({self.heads}); "
                "pass a kv_heads that divides heads"
            )
        if (
            self.hidden is not None
            and self.heads is not None
            and self.head_dim is None
            and self.hidden % self.heads
        ):
            raise ValueError(
                f"model.heads: hidden size {self.hidden} is not divisible by {self.heads} heads; "
                "pass a head count that divides hidden, or give head_dim"
            )
        if (
            self.num_experts is not None
            and self.experts_per_token is not None
            and self.experts_per_token > self.num_experts
        ):
            raise ValueError(
                f"model.experts_per_token: {self.experts_per_token} exceeds num_experts "
                f"({self.num_experts}); pass at most num_experts"
            )
        return self

    @property
    def has_source(self) -> bool:
        """True when some source of model dimensions was given."""
        return bool(self.config_path or self.preset or self.params or (self.layers and self.hidden))


_DIMENSION_FIELDS = (
    "params",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "ffn",
    "gated_mlp",
    "num_experts",
    "experts_per_token",
)
"""ModelSpec fields a preset or a config.json would override (so they are refused beside one)."""


def _normalise_gpu(value: object) -> object:
    if not isinstance(value, str):
        return value
    return resolve_gpu_key(value)


class HardwareSpec(_Strict):
    """The machines: which accelerator, how many per node, how many nodes."""

    gpu: str = "cpu"
    """Accelerator key from the catalog (``dtrain-tui gpus``): ``h100-sxm``, ``a100-80gb``, ``cpu``, …
    Aliases such as ``H100`` or ``A100 80GB`` are accepted."""
    gpus_per_node: int = Field(default=2, ge=1, le=64)
    """Accelerators (or, for ``cpu``, ranks) per node."""
    nodes: int = Field(default=1, ge=1, le=4096)
    """Number of nodes."""
    cpu_ram_gb: float | None = Field(default=None, gt=0, le=65536)
    """Host RAM per node in GB (bounds CPU offload); None: assume 2 GB per GB of GPU memory."""
    intra_node_link: IntraNodeLink | None = None
    """NVLink or PCIe inside a node; None: what the GPU type usually has."""

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, v: object) -> object:
        return _normalise_gpu(v)

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes


class NetworkSpec(_Strict):
    """The fabric between nodes and the interfaces NCCL should use."""

    tier: NetworkTier = NetworkTier.TCP
    """Inter-node network: ib, ib-hdr, ib-ndr, efa, roce, tcp."""
    bandwidth_gbps: float | None = Field(default=None, gt=0, le=100_000)
    """Per-node inter-node bandwidth in Gbit/s; None: the tier's catalog figure."""
    socket_ifname: str | None = None
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, e.g. ``eth0`` or ``^lo,docker``."""
    ib_hca: str | None = None
    """NCCL_IB_HCA, e.g. ``mlx5_0,mlx5_1`` or ``=mlx5_0:1``."""

    @field_validator("socket_ifname", "ib_hca")
    @classmethod
    def _iface(cls, v: str | None) -> str | None:
        if v is None or v == "":
            return None
        if not re.fullmatch(r"[\^=]?[A-Za-z0-9_.:,\-]+", v):
            raise ValueError(
                f"{v!r} is not an interface list; use names like eth0, ens5 or mlx5_0,mlx5_1 "
                "(optionally prefixed by ^ or =)"
            )
        return v


class TrainingSpec(_Strict):
    """The training set-up: batch, sequence, precision, optimizer."""

    seq_len: int = Field(default=2048, ge=1, le=16_777_216)
    """Tokens per sequence."""
    global_batch: int = Field(default=64, ge=1, le=100_000_000)
    """Sequences per optimizer step across all data-parallel replicas; the plan trains exactly
    this many (micro_batch x grad_accum x dp), or says that no layout can."""
    global_batch_nearest: bool | None = None
    """When no layout trains ``global_batch`` exactly, train the nearest batch one can (the
    plan says which); None or False: refuse, naming the nearest batches."""
    micro_batch: int | None = Field(default=None, ge=1, le=65536)
    """Sequences per GPU per forward/backward; None lets the planner choose."""
    precision: Precision | None = None
    """bf16, fp16 or fp32; None: bf16 where the GPU has it, else fp16 (fp32 on cpu)."""
    fp8_recipe: Fp8Recipe | None = None
    """With ``precision`` fp8: how its tensors are scaled (:class:`Fp8Recipe`); None: delayed
    per-tensor scaling (Megatron's default)."""
    optimizer: Optimizer = Optimizer.ADAMW
    """adamw, sgd (with momentum) or adam8bit."""
    recompute: Recompute | None = None
    """Activation recompute: none, selective, full; None lets the planner choose."""
    grads_bf16: bool | None = None
    """Megatron (3D) layouts keep and reduce their gradients in bf16 (``--grad-reduce-in-bf16``,
    as Megatron-Bridge's performance recipes do): half the gradient memory and traffic, at some
    risk to accuracy over long runs; None or False: fp32 main grads (Megatron's default)."""
    moments_bf16: bool | None = None
    """Megatron layouts with AdamW and the distributed optimizer keep Adam's two moments in
    bf16 (``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``,
    Transformer Engine's FusedAdam computing the update in fp32; as Megatron-Core's MoE FP8
    benchmarks run): 4 bytes a parameter of optimizer state, not 8. None or False: fp32
    moments (Megatron's default)."""
    offload_optimizer_states: bool | None = None
    """Megatron layouts with AdamW and the distributed optimizer move the optimizer's states
    (fp32 master weights and both moments) to host memory after each step and back before the
    next (``--offload-optimizer-states``; the step itself stays on the GPU): the GPU holds
    them only while the activations are gone, at two host-link copies a step. None or False:
    they stay on the GPU."""
    offload_modules: list[OffloadModule] | None = Field(default=None, max_length=7)
    """Megatron layouts move these modules' saved inputs to host memory in the forward and
    reload them for the backward (``--fine-grained-activation-offloading --offload-modules``,
    :class:`OffloadModule`), behind the compute where the host link keeps up: what the GPU
    holds of them is one layer per model chunk in flight, the rest lives in pinned host
    memory. Not with full recompute. None or empty: nothing offloaded."""
    cp_comm: CpComm | None = None
    """How a Megatron layout's context parallelism moves keys and values (:class:`CpComm`);
    None: p2p, Megatron's default. PyTorch-native layouts (FSDP, Accelerate) all-gather."""
    moe_dispatcher: MoeDispatcher | None = None
    """MoE token dispatch: alltoall (None) or deepep (:class:`MoeDispatcher`)."""
    moe_a2a_overlap: bool | None = None
    """Megatron's expert-parallel all-to-all overlap (``--overlap-moe-expert-parallel-comm``):
    true uses it where a Megatron MoE layout allows it (ep > 1, pp 1 or interleaved, no full
    recompute, not Megatron-FSDP); unset or false leaves it off, as Megatron does (unset, the
    plan says when asking for it would be faster)."""
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=16)
    """MoE expert capacity as a multiple of the mean load: tokens beyond it are dropped
    (Megatron's ``--moe-expert-capacity-factor``, padded to capacity so every shape is static);
    None: dropless routing (Megatron's default)."""
    moe_imbalance: float | None = Field(default=None, ge=1, le=8)
    """Load of the busiest expert-parallel rank over the mean, where it is known: measured on
    the user's own router, or 1.0 for a benchmark that forces balanced routing (Megatron's
    ``--moe-router-force-load-balancing`` and AutoModel's fake balanced gate draw random router
    logits). None: :data:`engine.plan.perf.MOE_IMBALANCE` under dropless routing. A capacity
    factor caps it either way. A planning input only: nothing is written for it."""
    headroom: float | None = Field(default=None, ge=0, le=0.5)
    """Share of the GPU's usable memory (after the CUDA context and fragmentation) a plan
    keeps free, for what no model counts (allocator spikes, a longer
    batch, a library's workspace): a layout fits only within the rest, and among layouts about
    as fast the plan prefers the one with more to spare. None:
    :data:`engine.plan.memory.DENSE_HEADROOM`, or :data:`engine.plan.memory.MOE_HEADROOM` for
    dropless MoE, whose routing moves the busiest rank's load from step to step."""
    fused_cross_entropy: bool | None = None
    """A PyTorch-native layout's trainer computes its loss with a fused cross-entropy
    (flash-attn's, Liger's, a chunked one) that keeps no fp32 copies of the logits: about 4
    bytes a logit at the loss instead of PyTorch's 14. Megatron layouts always fuse theirs
    (``--cross-entropy-loss-fusion``). None or False: PyTorch's own. A planning input only:
    nothing is written for it, and the example trainer uses PyTorch's."""
    torch_compile: bool | None = None
    """A PyTorch-native layout's trainer runs its model under ``torch.compile`` (torchtitan's
    ``--training.compile``, the Hugging Face Trainer's ``torch_compile``), which fuses the
    norms', activations' and rotary embeddings' element-wise kernels. False: the model's
    Python modules run eagerly (a Hugging Face model as it loads). None: eager for your own
    script (``launch.script``); the shipped example trainer as it runs. Megatron fuses its
    own either way. A planning input only: nothing is written for it."""
    lr: float | None = Field(default=None, gt=0, le=10)
    """Learning rate at ``reference_batch``; used for the linear LR-scaling advice."""
    reference_batch: int | None = Field(default=None, ge=1)
    """The global batch the ``lr`` was tuned for."""
    grad_clip: float = Field(default=1.0, ge=0)
    """Gradient clipping norm (0 disables)."""
    tokens: float | None = Field(default=None, gt=0, le=1e16)
    """Token budget for the GPU-hours and cost estimate; None: one step is estimated only."""
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=10_000)
    """USD per GPU-hour; None: the catalog's on-demand list figure."""
    steps: int = Field(default=20, ge=1)
    """Steps the example trainer runs (a smoke test)."""
    ckpt_dir: str | None = Field(default=None, min_length=1, max_length=4096)
    """Where the bundle's run saves its checkpoints (plan.json's ``checkpoint.dir``,
    ``DTRAIN_CKPT_DIR``); None: ``checkpoints/`` in the bundle, which only a one-node run may
    use. A multi-node run names an absolute path every node reaches."""
    ckpt_shared: bool | None = None
    """True: ``ckpt_dir`` (even a relative one) is on storage every node reaches (the bundle
    itself on a shared file system); None or False: a multi-node bundle needs an absolute
    ``ckpt_dir``."""
    ckpt_every: int | None = Field(default=None, ge=0, le=100_000_000)
    """Save a checkpoint every N steps (0: never); None: the plan's interval that loses the
    least work (:attr:`engine.plan.result.Resilience.interval_steps`)."""
    ckpt_storage: CkptStorage | None = None
    """Where checkpoints go, for the save-time estimate (:class:`CkptStorage`); None: local
    NVMe on one node, a parallel file system on several."""
    ckpt_bandwidth_gbps: float | None = Field(default=None, gt=0, le=100_000)
    """Write bandwidth to the checkpoint storage, Gbit/s per node; None: the storage kind's
    default (:data:`engine.plan.resilience.STORAGE_GBPS`)."""

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, v: object) -> object:
        return None if v is None else parse_count(v)

    @field_validator("offload_modules")
    @classmethod
    def _offload_modules(cls, v: list[OffloadModule] | None) -> list[OffloadModule] | None:
        """Each module once, in Megatron's own order (``--offload-modules`` lists a set)."""
        if not v:
            return None
        return [m for m in OffloadModule if m in v]


class LayoutSpec(_Strict):
    """A forced layout. Every field is optional; what is set is kept, the rest is searched."""

    strategy: Strategy | None = None
    framework: Framework | None = None
    tp: int | None = Field(default=None, ge=1, le=1024)
    """Tensor-parallel degree (keep it inside a node)."""
    pp: int | None = Field(default=None, ge=1, le=1024)
    """Pipeline-parallel stages."""
    dp: int | None = Field(default=None, ge=1, le=1_000_000)
    """Data-parallel degree."""
    cp: int | None = Field(default=None, ge=1, le=1024)
    """Context-parallel degree (sequence split across GPUs)."""
    ep: int | None = Field(default=None, ge=1, le=4096)
    """Expert-parallel degree (MoE)."""
    expert_tp: int | None = Field(default=None, ge=1, le=1024)
    """Tensor parallelism inside each expert (Megatron's ``--expert-tensor-parallel-size``):
    1 keeps experts whole and lets EP fold over the TP ranks, ``tp`` (Megatron's default)
    splits them like a dense MLP; None: the search weighs both."""
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    offload: Offload | None = None
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism (needs tp > 1)."""
    micro_batch: int | None = Field(default=None, ge=1, le=65536)
    recompute: Recompute | None = None
    virtual_stages: int | None = Field(default=None, ge=1, le=128)
    """Interleaved pipeline: model chunks per stage."""

    @property
    def is_forced(self) -> bool:
        return any(v is not None for v in self.model_dump().values())

    def given_text(self) -> str:
        """What is forced, as a person writes it: ``tp=4 pp=2 strategy=3d`` ("" for nothing)."""
        given = self.model_dump(exclude_none=True, mode="json")
        return " ".join(f"{k}={v}" for k, v in given.items())


# No part may start with "-": the name reaches ssh, pdsh and the hostfile, where "-oX" is an option.
_HOST_RE = re.compile(
    r"(?:(?P<user>[A-Za-z0-9_][A-Za-z0-9_.\-]*)@)?(?P<host>[A-Za-z0-9_.][A-Za-z0-9_.\-]*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{1,5}))?"
)
ADDR_RE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.\-]*|\[?[0-9A-Fa-f:.]+\]?")
"""A rendezvous address: a host name or an IP (IPv6 may be bracketed); matched whole."""


class Host(BaseModel):
    """One node: ``[user@]host[:port]``; ``host`` may be an alias from ~/.ssh/config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    user: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)

    @classmethod
    def parse(cls, text: str) -> Host:
        m = _HOST_RE.fullmatch(text.strip())
        if not m:
            raise ValueError(
                f"{text!r} is not a host; write [user@]host[:port] with letters, digits, . _ - only "
                "(not starting with -)"
            )
        port = m.group("port")
        return cls(host=m.group("host"), user=m.group("user"), port=int(port) if port else None)

    def __str__(self) -> str:
        s = self.host
        if self.user:
            s = f"{self.user}@{s}"
        if self.port:
            s = f"{s}:{self.port}"
        return s


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""An environment variable name: ASCII letters, digits and ``_``, not starting with a digit.
Matched whole (:func:`is_env_name`): with ``match``, ``$`` also matches before a final newline,
and ``"reboot\\n"`` would pass. The writers quote by the same rule (:mod:`engine.write.quoting`)."""


def is_env_name(name: str) -> bool:
    """True when ``name`` is an environment variable name by :data:`ENV_NAME_RE`."""
    return ENV_NAME_RE.fullmatch(name) is not None


SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,\-]*")
"""A Slurm partition, account, QoS or reservation name (a comma-separated list for partitions)."""
SLURM_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.\-&|,\[\]()*:]+")
SLURM_TIME_RE = re.compile(
    r"(?i:unlimited|infinite)|[0-9]+(?::[0-5]?[0-9](?::[0-5]?[0-9])?)?"
    r"|[0-9]+-[0-9]{1,2}(?::[0-5]?[0-9](?::[0-5]?[0-9])?)?"
)
"""sbatch's ``--time`` forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
days-hours:minutes, days-hours:minutes:seconds."""


class LaunchSpec(_Strict):
    """How and where to start the run. Never holds a password, a key or a token: key files by path."""

    backend: Backend = Backend.LOCAL
    hosts: list[str] = Field(default_factory=list)
    """One ``[user@]host[:port]`` per node, in node-rank order; empty for local runs."""
    master_addr: str | None = None
    """Rendezvous address; None: the first host (127.0.0.1 for local runs)."""
    master_port: int = Field(default=29500, ge=1, le=65535)
    ssh_user: str | None = None
    identity_file: Path | None = None
    """Private key file, by path (the key itself is never stored)."""
    known_hosts: Path | None = None
    remote_workdir: str = "~/dtrain-runs"
    remote_setup: str | None = None
    """A shell command run on each node before launch, e.g. ``source ~/venv/bin/activate``."""
    script: str | None = None
    """Training script; None: the shipped example trainer."""
    script_args: list[str] = Field(default_factory=list)
    nccl_debug: str | None = None
    """NCCL_DEBUG level for the run: VERSION, WARN, INFO, TRACE."""
    nccl_debug_subsys: str | None = None
    """NCCL_DEBUG_SUBSYS, e.g. ``INIT,NET``."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for every rank."""
    max_restarts: int = Field(default=0, ge=0, le=100)
    hang_timeout_s: float = Field(default=300.0, gt=0)
    start_timeout_s: float = Field(default=600.0, gt=0)
    """Seconds the ranks get to start (import torch, the rendezvous) before the run fails:
    until a rank's first sign of life the hang timeout does not run."""
    sky_cluster: str | None = None
    sky_cloud: str | None = None
    sky_autostop_min: int | None = Field(default=None, ge=0)
    sky_down: bool = False
    hf_integration: bool = False
    """Write ``"auto"`` values in ds_config.json for the HF Trainer / Accelerate integration."""
    slurm_partition: str | None = None
    """Slurm partition (``#SBATCH --partition``); None: the cluster's default partition."""
    slurm_account: str | None = None
    """Slurm account charged for the job (``--account``); None: the user's default."""
    slurm_qos: str | None = None
    """Slurm quality of service (``--qos``); None: the account's default."""
    slurm_constraint: str | None = None
    """Node features the job needs (``--constraint``), e.g. ``a100&ib``."""
    slurm_reservation: str | None = None
    """Slurm reservation to run in (``--reservation``)."""
    slurm_time_limit: str | None = None
    """Wall-clock limit (``--time``): ``MINUTES``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM:SS``;
    None: the partition's default."""

    @field_validator("slurm_partition", "slurm_account", "slurm_qos", "slurm_reservation")
    @classmethod
    def _slurm_name(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_NAME_RE.fullmatch(v):
            raise ValueError(f"{v!r}: a Slurm name takes letters, digits and , . _ - only")
        return v

    @field_validator("slurm_constraint")
    @classmethod
    def _slurm_constraint(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_CONSTRAINT_RE.fullmatch(v):
            raise ValueError(
                f"{v!r}: a Slurm constraint takes feature names joined by & | , "
                "with [ ] ( ) * and digits only, e.g. a100&ib"
            )
        return v

    @field_validator("slurm_time_limit")
    @classmethod
    def _slurm_time(cls, v: str | None) -> str | None:
        if v is not None and not SLURM_TIME_RE.fullmatch(v.strip()):
            raise ValueError(
                f"{v!r} is not a Slurm time limit; write MINUTES, HH:MM:SS or D-HH:MM:SS "
                "(e.g. 90, 2:00:00, 1-12:00:00) or UNLIMITED"
            )
        return v.strip() if v is not None else None

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: list[str]) -> list[str]:
        for h in v:
            Host.parse(h)
        return [h.strip() for h in v]

    @field_validator("master_addr")
    @classmethod
    def _master_addr(cls, v: str | None) -> str | None:
        if v is not None and not ADDR_RE.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a host name or IP address; use letters, digits and . _ - : only "
                "(not starting with -)"
            )
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not is_env_name(k):
                raise ValueError(
                    f"{k!r} is not an environment variable name; use A-Z, a-z, 0-9 and _ "
                    "(not starting with a digit)"
                )
            if "\n" in val or "\0" in val:
                raise ValueError(f"value of {k} contains a newline or NUL; pass one line")
        return v

    @field_validator("nccl_debug")
    @classmethod
    def _nccl_debug(cls, v: str | None) -> str | None:
        if v is None:
            return None
        levels = {"VERSION", "WARN", "INFO", "TRACE", "ABORT"}
        if v.upper() not in levels:
            raise ValueError(f"{v!r} is not an NCCL_DEBUG level; use one of {sorted(levels)}")
        return v.upper()

    @field_validator("nccl_debug_subsys", "sky_cluster", "sky_cloud")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[\^A-Za-z0-9_,.\-]+", v):
            raise ValueError(f"{v!r}: use letters, digits and , . _ - only")
        return v

    def parsed_hosts(self) -> list[Host]:
        return [Host.parse(h) for h in self.hosts]


class Spec(_Strict):
    """Everything the planner needs, plus how to launch. The unit a profile or a spec file holds."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    hardware: HardwareSpec = Field(default_factory=HardwareSpec)
    network: NetworkSpec = Field(default_factory=NetworkSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    layout: LayoutSpec = Field(default_factory=LayoutSpec)
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    calibration: Calibration | None = None
    """Efficiency factors measured on this cluster (``plan --calibration NAME``, ``dtrain-tui
    calibrate``); None: the catalog's figures."""


def demo_spec() -> Spec:
    """The embedded default: a tiny GPT on one node, 2 CPU ranks over gloo; launches in seconds."""
    return Spec(
        model=ModelSpec(layers=4, hidden=256, heads=4, vocab=1024),
        hardware=HardwareSpec(gpu="cpu", gpus_per_node=2, nodes=1),
        training=TrainingSpec(seq_len=64, global_batch=8, steps=20),
    )
