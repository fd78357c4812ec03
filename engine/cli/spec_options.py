"""The spec options every headless command shares (plan, write, launch) and how they build a
:class:`~engine.specs.Spec`: a base from ``--profile NAME`` or ``--spec FILE`` (TOML or YAML),
then each option given on the command line overlays its field. Validation is the specs' own."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from engine.errors import SpecError, validation_messages
from engine.specs import (
    Backend,
    Framework,
    IntraNodeLink,
    NetworkTier,
    Offload,
    Optimizer,
    Precision,
    Recompute,
    Spec,
    Strategy,
)

SPEC_SECTIONS = ("model", "hardware", "network", "training", "layout", "launch")
# Keys a profile file carries besides the spec; a spec file may be a profile.
_PROFILE_KEYS = ("schema_version", "profile")

# (option, section, field, argparse kwargs)
_MODEL_OPTS: list[tuple[str, str, dict[str, Any]]] = [
    ("--model", "preset", {"metavar": "PRESET", "help": "model preset (dtrain-tui model list)"}),
    (
        "--model-config",
        "config_path",
        {"metavar": "PATH", "help": "local Hugging Face config.json"},
    ),
    ("--params", "params", {"metavar": "N", "help": "bare parameter count, e.g. 7e9 or 7B"}),
    ("--layers", "layers", {"type": int}),
    ("--hidden", "hidden", {"type": int}),
    ("--heads", "heads", {"type": int}),
    ("--kv-heads", "kv_heads", {"type": int}),
    ("--vocab", "vocab", {"type": int}),
    ("--ffn", "ffn", {"type": int, "help": "MLP intermediate size"}),
    ("--experts", "num_experts", {"type": int, "help": "MoE experts per layer"}),
    ("--experts-per-token", "experts_per_token", {"type": int, "help": "MoE top-k"}),
]


def _choices(enum: type) -> list[str]:
    return [e.value for e in enum]  # type: ignore[attr-defined]


_OTHER_OPTS: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "--gpu",
        "hardware",
        "gpu",
        {"help": "accelerator (dtrain-tui gpus), e.g. h100-sxm, a100-80gb, cpu"},
    ),
    ("--gpus-per-node", "hardware", "gpus_per_node", {"type": int}),
    ("--nodes", "hardware", "nodes", {"type": int}),
    ("--cpu-ram-gb", "hardware", "cpu_ram_gb", {"type": float}),
    ("--intra-node", "hardware", "intra_node_link", {"choices": _choices(IntraNodeLink)}),
    ("--network", "network", "tier", {"choices": _choices(NetworkTier)}),
    ("--bandwidth-gbps", "network", "bandwidth_gbps", {"type": float, "help": "per-node Gbit/s"}),
    ("--socket-ifname", "network", "socket_ifname", {}),
    ("--ib-hca", "network", "ib_hca", {}),
    ("--seq-len", "training", "seq_len", {"type": int}),
    ("--global-batch", "training", "global_batch", {"type": int}),
    ("--micro-batch", "training", "micro_batch", {"type": int}),
    ("--precision", "training", "precision", {"choices": _choices(Precision)}),
    ("--optimizer", "training", "optimizer", {"choices": _choices(Optimizer)}),
    ("--recompute", "training", "recompute", {"choices": _choices(Recompute)}),
    ("--tokens", "training", "tokens", {"help": "token budget for the cost estimate, e.g. 1e12"}),
    ("--price", "training", "price_per_gpu_hour", {"type": float, "help": "USD per GPU-hour"}),
    ("--lr", "training", "lr", {"type": float}),
    ("--steps", "training", "steps", {"type": int, "help": "steps the example trainer runs"}),
    ("--strategy", "layout", "strategy", {"choices": _choices(Strategy)}),
    ("--framework", "layout", "framework", {"choices": _choices(Framework)}),
    ("--tp", "layout", "tp", {"type": int}),
    ("--pp", "layout", "pp", {"type": int}),
    ("--dp", "layout", "dp", {"type": int}),
    ("--cp", "layout", "cp", {"type": int}),
    ("--ep", "layout", "ep", {"type": int}),
    ("--zero-stage", "layout", "zero_stage", {"type": int}),
    ("--offload", "layout", "offload", {"choices": _choices(Offload)}),
    ("--virtual-stages", "layout", "virtual_stages", {"type": int}),
]

_LAUNCH_OPTS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("--backend", "launch", "backend", {"choices": _choices(Backend)}),
    ("--master-addr", "launch", "master_addr", {}),
    ("--master-port", "launch", "master_port", {"type": int}),
    ("--identity", "launch", "identity_file", {"metavar": "KEYFILE"}),
    ("--known-hosts", "launch", "known_hosts", {"metavar": "FILE"}),
    ("--remote-workdir", "launch", "remote_workdir", {"metavar": "DIR"}),
    ("--remote-setup", "launch", "remote_setup", {"metavar": "CMD"}),
    ("--script", "launch", "script", {"help": "training script (default: the example trainer)"}),
    ("--nccl-debug", "launch", "nccl_debug", {"metavar": "LEVEL"}),
    ("--nccl-debug-subsys", "launch", "nccl_debug_subsys", {"metavar": "SUBSYS"}),
    ("--hang-timeout", "launch", "hang_timeout_s", {"type": float, "metavar": "S"}),
    ("--max-restarts", "launch", "max_restarts", {"type": int}),
    ("--sky-cluster", "launch", "sky_cluster", {}),
    ("--sky-cloud", "launch", "sky_cloud", {}),
]


def _metavar(kw: dict[str, Any]) -> dict[str, Any]:
    """``--layers N`` in help, not ``--layers MODEL__LAYERS`` (the dest)."""
    if "metavar" in kw or "choices" in kw:
        return kw
    return {**kw, "metavar": "N" if kw.get("type") in (int, float) else "VALUE"}


def add_spec_options(parser: argparse.ArgumentParser, *, launch: bool = False) -> None:
    """Add the spec options (and, with ``launch``, the launch options) to ``parser``."""
    src = parser.add_argument_group("spec source")
    src.add_argument("--spec", type=Path, metavar="FILE", help="spec file (TOML or YAML)")
    # SUPPRESS: a value given before the subcommand (`dtrain-tui --config-dir X plan`) is kept.
    src.add_argument(
        "--profile",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help="saved profile or built-in preset",
    )
    src.add_argument(
        "--config-dir",
        type=Path,
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="profiles directory root",
    )
    g = parser.add_argument_group("model")
    for opt, fld, kw in _MODEL_OPTS:
        g.add_argument(opt, dest=f"model__{fld}", default=None, **_metavar(kw))
    g = parser.add_argument_group("hardware, network, training, forced layout")
    for opt, sec, fld, kw in _OTHER_OPTS:
        g.add_argument(opt, dest=f"{sec}__{fld}", default=None, **_metavar(kw))
    g.add_argument(
        "--sequence-parallel",
        dest="layout__sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
    )
    if launch:
        g = parser.add_argument_group("launch")
        for opt, sec, fld, kw in _LAUNCH_OPTS:
            g.add_argument(opt, dest=f"{sec}__{fld}", default=None, **_metavar(kw))
        g.add_argument(
            "--hosts",
            dest="launch__hosts",
            default=None,
            help="comma-separated [user@]host[:port], one per node, in node-rank order",
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
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}", field="--spec") from None
    try:
        if Path(path).suffix.lower() in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except Exception as e:  # noqa: BLE001 - any parse error becomes one line
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


def _base_from_profile(name: str, config_dir: Path | None) -> dict[str, Any]:
    from profiles.store import ProfileStore

    store = ProfileStore(config_dir)
    spec = store.load(name).spec
    return spec.model_dump(mode="json", exclude_none=True)


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
            data["model"] = fields  # a model given on the command line replaces the base's
            continue
        cur = data.get(section)
        if not isinstance(cur, dict):
            cur = {}
        cur.update(fields)
        data[section] = cur
    try:
        spec = Spec.model_validate(data)
    except ValidationError as e:
        raise SpecError("; ".join(validation_messages(e))) from None
    if not spec.model.has_source:
        raise SpecError(
            "no model given; pass --model PRESET, --model-config FILE, --params N, "
            "or --layers/--hidden/--heads/--vocab",
            field="model",
        )
    return spec
