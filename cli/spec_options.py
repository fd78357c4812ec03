"""The spec options every headless command shares (plan, write, launch) and how they build a
:class:`~engine.plan.specs.Spec`: a base from ``--profile NAME`` or ``--spec FILE`` (TOML or YAML),
then each option given on the command line overlays its field. Validation is the specs' own."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, cast

from pydantic import ValidationError

from engine.errors import DtrainError, SpecError, validation_messages
from engine.fsio import JSON_LIMIT, read_regular_text
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
    Optimizer,
    Precision,
    Recompute,
    Strategy,
)
from engine.plan.specs import Spec

SPEC_SECTIONS = ("model", "hardware", "network", "training", "layout", "launch")
# Keys a profile file carries besides the spec; a spec file may be a profile.
_PROFILE_KEYS = ("schema_version", "profile")


def whole_number(text: str) -> int:
    """argparse type for a count: ASCII digits only (``int("٣")`` would be 3)."""
    t = text.strip()
    if not t.isascii():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; use the digits 0-9")
    try:
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def number(text: str) -> float:
    """argparse type for a real number: ASCII only (``float("١٢")`` would be 12). nan and inf
    pass here and are refused by the spec, whose message names the field."""
    t = text.strip()
    if not t.isascii():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; use the digits 0-9")
    try:
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


# (option, section, field, argparse kwargs)
_MODEL_OPTS: list[tuple[str, str, dict[str, Any]]] = [
    ("--model", "preset", {"metavar": "PRESET", "help": "model preset (dtrain-tui model list)"}),
    (
        "--model-config",
        "config_path",
        {"metavar": "PATH", "help": "local Hugging Face config.json"},
    ),
    ("--params", "params", {"metavar": "N", "help": "bare parameter count, e.g. 7e9 or 7B"}),
    ("--layers", "layers", {"type": whole_number}),
    ("--hidden", "hidden", {"type": whole_number}),
    ("--heads", "heads", {"type": whole_number}),
    ("--kv-heads", "kv_heads", {"type": whole_number}),
    (
        "--head-dim",
        "head_dim",
        {"type": whole_number, "help": "width of one attention head; default hidden/heads"},
    ),
    ("--vocab", "vocab", {"type": whole_number}),
    ("--ffn", "ffn", {"type": whole_number, "help": "MLP intermediate size"}),
    ("--experts", "num_experts", {"type": whole_number, "help": "MoE experts per layer"}),
    ("--experts-per-token", "experts_per_token", {"type": whole_number, "help": "MoE top-k"}),
    (
        "--mtp-layers",
        "mtp_layers",
        {
            "type": whole_number,
            "help": "multi-token prediction modules Megatron trains beside the model "
            "(--mtp-num-layers); default: the config's num_nextn_predict_layers (DeepSeek-V3: 1)",
        },
    ),
]
_MODEL_EXTRAS = frozenset({"mtp_layers"})
"""Model options that add to the base's model (a profile's, a spec file's) instead of
replacing it."""


class _NameList(argparse.Action):
    """Names given space- or comma-separated (``a b``, ``a,b``), each once, kept in order."""

    def __call__(
        self, parser: Any, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        names = list(getattr(namespace, self.dest, None) or [])
        for word in values:
            names += [n for n in (p.strip() for p in str(word).split(",")) if n and n not in names]
        setattr(namespace, self.dest, names)


def _choices(enum: type) -> list[str]:
    return [e.value for e in enum]  # type: ignore[attr-defined]


_OTHER_OPTS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "--gpu",
        "hardware",
        "gpu",
        {"help": "accelerator (dtrain-tui gpus), e.g. h100-sxm, a100-80gb, cpu"},
    ),
    ("--gpus-per-node", "hardware", "gpus_per_node", {"type": whole_number}),
    ("--nodes", "hardware", "nodes", {"type": whole_number}),
    ("--cpu-ram-gb", "hardware", "cpu_ram_gb", {"type": number}),
    ("--intra-node", "hardware", "intra_node_link", {"choices": _choices(IntraNodeLink)}),
    ("--network", "network", "tier", {"choices": _choices(NetworkTier)}),
    ("--bandwidth-gbps", "network", "bandwidth_gbps", {"type": number, "help": "per-node Gbit/s"}),
    ("--socket-ifname", "network", "socket_ifname", {}),
    ("--ib-hca", "network", "ib_hca", {}),
    ("--seq-len", "training", "seq_len", {"type": whole_number}),
    ("--global-batch", "training", "global_batch", {"type": whole_number}),
    ("--micro-batch", "training", "micro_batch", {"type": whole_number}),
    ("--precision", "training", "precision", {"choices": _choices(Precision)}),
    (
        "--fp8-recipe",
        "training",
        "fp8_recipe",
        {
            "choices": _choices(Fp8Recipe),
            "help": "with --precision fp8: delayed (default) or tensorwise per-tensor scales, "
            "mxfp8 (Blackwell) or blockwise block scales (more accurate, GEMMs a little slower)",
        },
    ),
    ("--optimizer", "training", "optimizer", {"choices": _choices(Optimizer)}),
    ("--recompute", "training", "recompute", {"choices": _choices(Recompute)}),
    (
        "--cp-comm",
        "training",
        "cp_comm",
        {
            "choices": _choices(CpComm),
            "help": "Megatron context parallelism: p2p (default) passes keys and values round a "
            "ring behind the attention; allgather gathers them first, exposed; a2a trades the "
            "sequence split for a head split (Ulysses), exposed",
        },
    ),
    (
        "--moe-dispatcher",
        "training",
        "moe_dispatcher",
        {
            "choices": _choices(MoeDispatcher),
            "help": "MoE token dispatch: alltoall (default) or deepep (a token crosses the "
            "network once per remote node)",
        },
    ),
    (
        "--moe-capacity-factor",
        "training",
        "moe_capacity_factor",
        {
            "type": number,
            "help": "drop MoE tokens beyond this multiple of an expert's mean load (e.g. 1.0); "
            "default: dropless",
        },
    ),
    (
        "--moe-imbalance",
        "training",
        "moe_imbalance",
        {
            "type": number,
            "help": "load of the busiest expert-parallel rank over the mean, if known (1.0 for "
            "a benchmark that forces balanced routing); default: 1.15 under dropless routing",
        },
    ),
    (
        "--headroom",
        "training",
        "headroom",
        {
            "type": number,
            "help": "share of the usable GPU memory a plan keeps free (e.g. 0.05); default: "
            "0.03, or 0.08 for dropless MoE",
        },
    ),
    ("--tokens", "training", "tokens", {"help": "token budget for the cost estimate, e.g. 1e12"}),
    ("--price", "training", "price_per_gpu_hour", {"type": number, "help": "USD per GPU-hour"}),
    ("--lr", "training", "lr", {"type": number}),
    (
        "--steps",
        "training",
        "steps",
        {"type": whole_number, "help": "steps the example trainer runs"},
    ),
    (
        "--ckpt-dir",
        "training",
        "ckpt_dir",
        {
            "metavar": "DIR",
            "help": "where the run saves checkpoints (default: checkpoints/ in the bundle, one "
            "node only; several nodes need an absolute path every node reaches)",
        },
    ),
    (
        "--ckpt-every",
        "training",
        "ckpt_every",
        {
            "type": whole_number,
            "metavar": "N",
            "help": "save a checkpoint every N steps (0: never); default: the plan's interval "
            "that loses the least work",
        },
    ),
    (
        "--ckpt-storage",
        "training",
        "ckpt_storage",
        {
            "choices": _choices(CkptStorage),
            "help": "checkpoint storage for the save-time estimate (default: local on one "
            "node, parallel-fs on several)",
        },
    ),
    (
        "--ckpt-bandwidth-gbps",
        "training",
        "ckpt_bandwidth_gbps",
        {"type": number, "help": "checkpoint write bandwidth, Gbit/s per node"},
    ),
    ("--strategy", "layout", "strategy", {"choices": _choices(Strategy)}),
    ("--framework", "layout", "framework", {"choices": _choices(Framework)}),
    ("--tp", "layout", "tp", {"type": whole_number}),
    ("--pp", "layout", "pp", {"type": whole_number}),
    ("--dp", "layout", "dp", {"type": whole_number}),
    ("--cp", "layout", "cp", {"type": whole_number}),
    ("--ep", "layout", "ep", {"type": whole_number}),
    (
        "--expert-tp",
        "layout",
        "expert_tp",
        {
            "type": whole_number,
            "help": "tensor parallelism inside each expert: 1 (experts whole, EP folded over "
            "TP ranks) or the tp (Megatron's default); default: the faster",
        },
    ),
    ("--zero-stage", "layout", "zero_stage", {"type": whole_number}),
    ("--offload", "layout", "offload", {"choices": _choices(Offload)}),
    ("--virtual-stages", "layout", "virtual_stages", {"type": whole_number}),
]

_LAUNCH_OPTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("--backend", "launch", "backend", {"choices": _choices(Backend)}),
    ("--master-addr", "launch", "master_addr", {}),
    ("--master-port", "launch", "master_port", {"type": whole_number}),
    ("--identity", "launch", "identity_file", {"metavar": "KEYFILE"}),
    ("--known-hosts", "launch", "known_hosts", {"metavar": "FILE"}),
    ("--remote-workdir", "launch", "remote_workdir", {"metavar": "DIR"}),
    ("--remote-setup", "launch", "remote_setup", {"metavar": "CMD"}),
    (
        "--script",
        "launch",
        "script",
        {"help": "training script, written into the bundle (default: the example trainer)"},
    ),
    ("--nccl-debug", "launch", "nccl_debug", {"metavar": "LEVEL"}),
    ("--nccl-debug-subsys", "launch", "nccl_debug_subsys", {"metavar": "SUBSYS"}),
    (
        "--hang-timeout",
        "launch",
        "hang_timeout_s",
        {
            "type": number,
            "metavar": "S",
            "help": "fail the run when no rank prints anything for S seconds once a rank "
            "started (default 300)",
        },
    ),
    (
        "--start-timeout",
        "launch",
        "start_timeout_s",
        {
            "type": number,
            "metavar": "S",
            "help": "fail the run when a rank shows no sign of life S seconds after the nodes "
            "started (default 600)",
        },
    ),
    ("--max-restarts", "launch", "max_restarts", {"type": whole_number}),
    ("--sky-cluster", "launch", "sky_cluster", {}),
    ("--sky-cloud", "launch", "sky_cloud", {}),
    ("--partition", "launch", "slurm_partition", {"help": "Slurm partition"}),
    ("--account", "launch", "slurm_account", {"help": "Slurm account"}),
    ("--qos", "launch", "slurm_qos", {"help": "Slurm QoS"}),
    ("--constraint", "launch", "slurm_constraint", {"help": "Slurm node features, e.g. a100&ib"}),
    ("--reservation", "launch", "slurm_reservation", {"help": "Slurm reservation"}),
    (
        "--time-limit",
        "launch",
        "slurm_time_limit",
        {"metavar": "TIME", "help": "Slurm time limit: MINUTES, HH:MM:SS or D-HH:MM:SS"},
    ),
]


def _metavar(kw: dict[str, Any]) -> dict[str, Any]:
    """``--layers N`` in help, not ``--layers MODEL__LAYERS`` (the dest)."""
    if "metavar" in kw or "choices" in kw:
        return kw
    return {**kw, "metavar": "N" if kw.get("type") in (whole_number, number) else "VALUE"}


def add_config_dir_option(group: Any, help_text: str) -> None:
    """``--config-dir DIR``. SUPPRESS: a ``--config-dir`` given before the subcommand is kept."""
    group.add_argument(
        "--config-dir", type=Path, metavar="DIR", default=argparse.SUPPRESS, help=help_text
    )


def add_spec_options(parser: argparse.ArgumentParser, *, launch: bool = False) -> None:
    """Add the spec options (and, with ``launch``, the launch options) to ``parser``, one
    argument group at a time (the order ``--help`` lists them in)."""
    _add_source_options(parser)
    g = parser.add_argument_group("model")
    for opt, fld, kw in _MODEL_OPTS:
        g.add_argument(opt, dest=f"model__{fld}", default=None, **_metavar(kw))
    g = parser.add_argument_group("hardware, network, training, forced layout")
    for opt, sec, fld, kw in _OTHER_OPTS:
        g.add_argument(opt, dest=f"{sec}__{fld}", default=None, **_metavar(kw))
    _add_switches(g)
    _add_saver_switches(g)
    if launch:
        _add_launch_options(parser)


def _add_source_options(parser: argparse.ArgumentParser) -> None:
    """The ``spec source`` group: where the spec comes from (file, profile, calibration)."""
    src = parser.add_argument_group("spec source")
    src.add_argument("--spec", type=Path, metavar="FILE", help="spec file (TOML or YAML)")
    # SUPPRESS: a value given before the subcommand (`dtrain-tui --config-dir X plan`) is kept.
    src.add_argument(
        "--profile",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help="saved profile or built-in preset",
    )
    add_config_dir_option(src, "profiles directory root")
    src.add_argument(
        "--calibration",
        metavar="NAME",
        default=None,
        help="estimate with a saved calibration (dtrain-tui calibrate) or a calibration .json "
        "file; default: the one the --profile names",
    )


def _add_switches(g: Any) -> None:
    """The on/off options of the ``hardware, network, training, forced layout`` group."""
    g.add_argument(
        "--sequence-parallel",
        dest="layout__sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    g.add_argument(
        "--moe-a2a-overlap",
        dest="training__moe_a2a_overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Megatron MoE layouts: hide the expert all-to-all behind another micro-batch's "
        "compute (--overlap-moe-expert-parallel-comm) where the layout allows; default: off, "
        "as in Megatron (the plan says when it would be faster)",
    )
    g.add_argument(
        "--global-batch-nearest",
        dest="training__global_batch_nearest",
        action="store_true",
        default=None,
        help="when no layout trains --global-batch exactly, train the nearest batch one can "
        "(without it the plan refuses and names the nearest batches)",
    )
    g.add_argument(
        "--grads-bf16",
        dest="training__grads_bf16",
        action="store_true",
        default=None,
        help="Megatron layouts keep and reduce gradients in bf16 (--grad-reduce-in-bf16): half "
        "the gradient memory and traffic; default: fp32 main grads",
    )
    g.add_argument(
        "--fused-cross-entropy",
        dest="training__fused_cross_entropy",
        action="store_true",
        default=None,
        help="your PyTorch-native trainer's loss is a fused cross-entropy (flash-attn's, "
        "Liger's): about 4 bytes a logit instead of 14; Megatron's always is",
    )
    g.add_argument(
        "--torch-compile",
        dest="training__torch_compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="your PyTorch-native trainer runs its model under torch.compile (fused norms, "
        "activations, rotary); --no-torch-compile: its Python modules run eagerly. Default: "
        "eager for your own --script, the example trainer as it runs",
    )
    g.add_argument(
        "--ckpt-shared",
        dest="training__ckpt_shared",
        action="store_true",
        default=None,
        help="--ckpt-dir (or the bundle's checkpoints/) is on storage every node reaches, "
        "even as a relative path",
    )


def _add_saver_switches(g: Any) -> None:
    """Megatron's memory savers: bf16 moments and what it offloads to host memory."""
    g.add_argument(
        "--moments-bf16",
        dest="training__moments_bf16",
        action="store_true",
        default=None,
        help="Megatron layouts with AdamW keep Adam's moments in bf16 (the precision-aware "
        "optimizer: --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16): 4 bytes a parameter of "
        "optimizer state instead of 8; default: fp32 moments",
    )
    g.add_argument(
        "--offload-optimizer-states",
        dest="training__offload_optimizer_states",
        action="store_true",
        default=None,
        help="Megatron layouts with AdamW move the optimizer's master weights and moments to "
        "host memory between steps (--offload-optimizer-states; the step stays on the GPU): "
        "the GPU holds them only while the activations are gone; default: they stay",
    )
    g.add_argument(
        "--offload-modules",
        dest="training__offload_modules",
        nargs="+",
        action=_NameList,
        metavar="MODULE",
        default=None,
        help="Megatron layouts offload these modules' saved inputs to host memory "
        "(--fine-grained-activation-offloading): attn_norm, qkv_linear, core_attn, attn_proj, "
        "mlp_norm, expert_fc1, moe_act (space- or comma-separated); default: none",
    )


def _add_launch_options(parser: argparse.ArgumentParser) -> None:
    """The ``launch`` group (the commands that write or start a run): where and how ranks start."""
    g = parser.add_argument_group("launch")
    for opt, sec, fld, kw in _LAUNCH_OPTS:
        g.add_argument(opt, dest=f"{sec}__{fld}", default=None, **_metavar(kw))
    g.add_argument(
        "--hosts",
        dest="launch__hosts",
        default=None,
        metavar="HOSTS",
        help="comma-separated [user@]host[:port], one per node, in node-rank order; "
        "'slurm': the nodes of the Slurm allocation this runs in",
    )
    g.add_argument(
        "--script-arg",
        dest="launch__script_args",
        action="append",
        default=None,
        metavar="ARG",
        help="argument for the training script (repeat)",
    )
    g.add_argument(
        "--hf-integration",
        dest="launch__hf_integration",
        action="store_true",
        default=None,
        help='write "auto" values in ds_config.json for the HF Trainer / Accelerate',
    )


def load_spec_file(path: Path) -> dict[str, Any]:
    """Read a TOML or YAML spec file into a dict; errors name the file."""
    try:
        text = read_regular_text(path, JSON_LIMIT, label=f"--spec {path}", follow=True)
    except DtrainError as e:  # a device, FIFO, directory, or too big: one line
        raise SpecError(str(e)) from None
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}", field="--spec") from None
    except UnicodeDecodeError as e:
        raise SpecError(
            f"{path} is not UTF-8 text (byte {e.start}); save it as UTF-8", field="--spec"
        ) from None
    import tomllib  # here: only a --spec file needs it, and `plan` should start fast

    try:
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            data = _load_yaml(text)
        else:
            data = tomllib.loads(text)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - any parse error (RecursionError too) is one line
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SpecError(f"{path} is not valid TOML/YAML: {first}", field="--spec") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{path} must hold a table of sections {SPEC_SECTIONS}", field="--spec")
    for key in data:
        if key not in SPEC_SECTIONS and key not in _PROFILE_KEYS:
            raise SpecError(
                f"unknown section {key!r} in {path}; sections are {', '.join(SPEC_SECTIONS)}",
                field=str(key),
            )
    return {k: v for k, v in data.items() if k in SPEC_SECTIONS}


def _load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (PyYAML keeps the last,
    so a second ``preset:`` would silently win) and YAML's aliases (a billion-laughs bomb)."""
    import yaml

    class _UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                try:
                    dup = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class reports it
                    dup = False
                if dup:
                    raise SpecError(
                        f"duplicate key {key!r} (line {key_node.start_mark.line + 1}); "
                        "give each key once",
                        field="--spec",
                    )
            return super().construct_mapping(node, deep=deep)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = cast(Any, self).peek_event()
                raise SpecError(
                    f"YAML aliases (*{event.anchor}) are not accepted in a spec file "
                    f"(line {event.start_mark.line + 1}); write the value out",
                    field="--spec",
                )
            return super().compose_node(parent, index)

    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _base_from_profile(name: str, config_dir: Path | None) -> dict[str, Any]:
    from profiles.store import ProfileStore

    store = ProfileStore(config_dir)
    spec = store.load(name).spec
    return spec.model_dump(mode="json", exclude_none=True)


def check_launch_args(args: argparse.Namespace) -> None:
    """Check the launch options given on the command line on their own, so they are checked
    when a written bundle is launched too (no spec is built then): ``--hang-timeout 0``, a host
    starting with ``-``, a master address with a newline. Also ``--run-dir``: not a file."""
    from engine.plan.specs import LaunchSpec

    given: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest.startswith("launch__") and value is not None:
            fld = dest.removeprefix("launch__")
            if fld == "hosts" and isinstance(value, str):
                value = [h for h in value.split(",") if h.strip()]
            given[fld] = value
    try:
        LaunchSpec.model_validate(given)
    except ValidationError as e:
        raise SpecError("; ".join(validation_messages(e, "launch"))) from None
    run_dir = getattr(args, "run_dir", None)
    if run_dir is not None:
        run_dir = Path(run_dir)
        if run_dir.is_symlink() and not run_dir.exists():
            raise SpecError(
                f"{run_dir} is a symlink to {run_dir.readlink()}, which does not exist",
                field="--run-dir",
            )
        if run_dir.exists() and not run_dir.is_dir():
            raise SpecError(f"{run_dir} exists and is not a directory", field="--run-dir")
        parent = next((a for a in run_dir.parents if a.exists() or a.is_symlink()), None)
        if parent is not None and not parent.is_dir():
            raise SpecError(f"{parent} is not a directory", field="--run-dir")


def check_batch_fields(spec: Spec) -> None:
    """A micro batch (training's or a forced layout's) must divide the global batch, or every
    step trains another number of sequences than asked (``--micro-batch 1000 --global-batch 8``
    trained 2000). The planner only warns, for the wizard's sake; the CLI refuses."""
    gb = spec.training.global_batch
    for fld, mb in (
        ("training.micro_batch", spec.training.micro_batch),
        ("layout.micro_batch", spec.layout.micro_batch),
    ):
        if mb is not None and (mb > gb or gb % mb):
            how = "exceeds" if mb > gb else "does not divide"
            raise SpecError(
                f"{mb} {how} training.global_batch ({gb}), so a step would train another "
                "number of sequences than asked; pass a micro batch that divides the global batch",
                field=fld,
            )


def _check_host_gpus(hardware: Any) -> None:
    """``--gpus-per-node`` larger than the GPU's host (``--gpus-per-node 72`` on an NVL72
    rack, which the spec's bound would refuse without a word on trays): the catalog's one
    line."""
    if not isinstance(hardware, dict):
        return
    gpn, key = hardware.get("gpus_per_node"), hardware.get("gpu")
    if not isinstance(gpn, int) or not isinstance(key, str):
        return
    from engine.plan.catalog import get_gpu, host_gpus_problem

    try:
        gpu = get_gpu(key)
    except ValueError:
        return  # the planner names an unknown GPU itself
    problem = host_gpus_problem(gpu, gpn)
    if problem is not None:
        raise SpecError(problem, field="hardware.gpus_per_node")


def spec_from_args(args: argparse.Namespace) -> Spec:
    """Build the Spec: profile or spec file, then command-line overlays. Raises SpecError."""
    base: dict[str, Any] = {}
    if getattr(args, "profile", None):
        base = _base_from_profile(args.profile, getattr(args, "config_dir", None))
    if getattr(args, "spec", None):
        base = load_spec_file(args.spec)
    overlay: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if "__" not in dest or value is None:
            continue
        section, fld = dest.split("__", 1)
        if fld == "hosts" and isinstance(value, str):
            value = [h for h in value.split(",") if h.strip()]
        overlay.setdefault(section, {})[fld] = value
    data: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, fields in overlay.items():
        if section == "model":
            base_model = data.get("model")
            if set(fields) <= _MODEL_EXTRAS and isinstance(base_model, dict):
                data["model"] = {**base_model, **fields}
            else:
                data["model"] = fields  # a model given on the command line replaces the base's
            continue
        cur = data.get(section)
        if not isinstance(cur, dict):
            cur = {}
        cur.update(fields)
        data[section] = cur
    _check_host_gpus(data.get("hardware"))
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        raise SpecError("; ".join(validation_messages(e))) from None
    check_batch_fields(spec)
    if spec.model.preset:
        from engine.plan.models import preset_config

        preset_config(spec.model.preset)  # an unknown one is refused now, not when planned
    if not spec.model.has_source:
        raise SpecError(
            "no model given; pass --model PRESET, --model-config FILE, --params N, "
            "or --layers/--hidden/--heads/--vocab",
            field="model",
        )
    return with_calibration(spec, args)


def with_calibration(spec: Spec, args: argparse.Namespace) -> Spec:
    """``spec`` with ``--calibration NAME|FILE``, else the calibration ``--profile`` names."""
    ref = getattr(args, "calibration", None)
    config_dir = getattr(args, "config_dir", None)
    if not ref and getattr(args, "profile", None):
        from profiles.store import ProfileStore

        ref = ProfileStore(config_dir).load(args.profile).profile.calibration or None
    if not ref:
        return spec
    from profiles.calibrations import resolve

    return spec.model_copy(update={"calibration": resolve(ref, config_dir)})
