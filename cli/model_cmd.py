"""``dtrain-tui model inspect|list`` and ``dtrain-tui gpus``: what the engine knows about models
and accelerators, for people (a table) and scripts (``--json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from cli.spec_options import whole_number
from engine.plan.catalog import GIB, get_network, list_gpus, short_aliases
from engine.plan.models import (
    architecture_notes,
    format_count,
    list_presets,
    preset_description,
    resolve_model,
)
from engine.plan.names import NetworkTier
from engine.plan.result import model_json
from engine.plan.specs import ModelSpec


def register(sub: Any) -> None:
    model = sub.add_parser("model", help="inspect a model's dimensions and parameter counts")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    ins = msub.add_parser("inspect", help="dimensions and exact parameter counts")
    ins.add_argument("preset", nargs="?", help="preset name (or use --model-config / dimensions)")
    ins.add_argument("--model", dest="preset_opt", metavar="PRESET")
    ins.add_argument("--model-config", type=Path, metavar="PATH")
    ins.add_argument("--params")
    for opt in (
        "layers",
        "hidden",
        "heads",
        "kv-heads",
        "head-dim",
        "vocab",
        "ffn",
        "experts",
        "experts-per-token",
        "mtp-layers",
    ):
        ins.add_argument(f"--{opt}", type=whole_number, metavar="N")
    ins.add_argument("--json", action="store_true", help="print the model object as JSON")
    ins.set_defaults(func=_inspect)
    lst = msub.add_parser("list", help="the built-in presets")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=_list)
    gpus = sub.add_parser("gpus", help="the accelerator and network catalog")
    gpus.add_argument("--json", action="store_true")
    gpus.set_defaults(func=_gpus)


def _inspect(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from engine.errors import SpecError, validation_messages

    try:
        spec = ModelSpec(
            preset=args.preset or args.preset_opt,
            config_path=args.model_config,
            params=args.params,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            head_dim=args.head_dim,
            vocab=args.vocab,
            ffn=args.ffn,
            num_experts=args.experts,
            experts_per_token=args.experts_per_token,
            mtp_layers=args.mtp_layers,
        )
    except ValidationError as e:
        raise SpecError("; ".join(validation_messages(e, "model"))) from None
    dims = resolve_model(spec)
    data = model_json(dims)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    rows = [
        ("name", dims.name),
        ("architecture", dims.arch),
        ("parameters", f"{dims.params_total:,} ({format_count(dims.params_total)})"),
    ]
    if dims.is_moe:
        rows.append(
            ("active per token", f"{dims.params_active:,} ({format_count(dims.params_active)})")
        )
        rows.append(("experts", f"{dims.num_experts} (top-{dims.experts_per_token})"))
    rows += [
        ("layers", str(dims.layers)),
        ("hidden", str(dims.hidden)),
        ("heads / kv heads", f"{dims.heads} / {dims.kv_heads} (head dim {dims.head_dim})"),
        ("ffn", f"{dims.ffn} ({'gated' if dims.gated_mlp else 'plain'} MLP)"),
        ("vocab", f"{dims.vocab} ({'tied' if dims.tie_embeddings else 'untied'} embeddings)"),
    ]
    notes = architecture_notes(dims)
    if notes:
        rows.append(("architecture notes", ", ".join(notes)))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


def _list(args: argparse.Namespace) -> int:
    out: list[dict[str, Any]] = []
    for name in list_presets():
        d = resolve_model(ModelSpec(preset=name))
        out.append(
            {
                "name": name,
                "params_total": d.params_total,
                "params_active": d.params_active,
                "description": preset_description(name),
            }
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for row in out:
        size = format_count(row["params_total"])
        if row["params_active"] != row["params_total"]:
            size += f" ({format_count(row['params_active'])} active)"
        print(f"{row['name']:<16} {size:<18} {row['description']}")
    return 0


def _gpus(args: argparse.Namespace) -> int:
    gpus = list_gpus()
    if args.json:
        data = {
            "gpus": [
                {
                    "key": g.key,
                    "aliases": list(short_aliases(g.key)),
                    "name": g.name,
                    "memory_bytes": g.memory_bytes,
                    "bf16_tflops": g.bf16_tflops,
                    "fp16_tflops": g.fp16_tflops,
                    "has_bf16": g.has_bf16,
                    "intra_link": g.intra_link.value,
                    "intra_gbps": g.intra_gbps,
                    "price_per_hour": g.price_per_hour,
                    "dist_backend": g.dist_backend,
                }
                for g in gpus
            ],
            "networks": [
                {
                    "tier": t.value,
                    "name": get_network(t).name,
                    "gbps_per_node": get_network(t).gbps_per_node,
                    "pick": get_network(t).pick,
                }
                for t in NetworkTier
            ],
        }
        print(json.dumps(data, indent=2))
        return 0
    kw = max([10, *(len(g.key) for g in gpus)])  # h100-sxm-500w is wider than the others
    also = {g.key: ", ".join(short_aliases(g.key)) or "-" for g in gpus}
    aw = max(4, *(len(a) for a in also.values()))
    print(
        f"{'key':<{kw}} {'also':<{aw}} {'memory':>9} {'bf16 TF':>8} {'fp16 TF':>8}  "
        f"{'link':<7} {'GB/s':>5}  name"
    )
    for g in gpus:
        bf16 = f"{g.bf16_tflops:g}" if g.has_bf16 else "-"
        print(
            f"{g.key:<{kw}} {also[g.key]:<{aw}} {g.memory_bytes / GIB:>6.0f}GiB {bf16:>8} "
            f"{g.fp16_tflops:>8g}  {g.intra_link.value:<7} {g.intra_gbps:>5g}  {g.name}"
        )
    print()
    nets = [get_network(t) for t in NetworkTier]
    nw = max(len(n.name) for n in nets)
    print(f"{'network':<8} {'Gbit/s/node':>11}  {'name':<{nw}}  pick it for")
    for n in nets:
        print(f"{n.tier.value:<8} {n.gbps_per_node:>11g}  {n.name:<{nw}}  {n.pick}")
    print(
        "Not sure? `ibstat` on a node shows each HCA's rate (200: HDR, 400: NDR); "
        "--bandwidth-gbps sets any other per-node figure."
    )
    print("--gpu takes the key, a name under 'also', or the part's name (\"H100 SXM5 80GB\").")
    return 0
