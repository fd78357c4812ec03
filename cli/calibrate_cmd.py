"""``dtrain-tui calibrate RUN_DIR``: fit the cluster's efficiency factors from a finished run and
save them by name, so later plans for that cluster use and name them (``plan --calibration
NAME``, or a profile that names it: ``--profile P`` here attaches it).

Reads the run's plan and every rank's step lines (:func:`engine.monitor.calibrate.calibrate_run`),
prints the fitted factors and the step time the plan predicted before and after against the
measured one, and saves ``<config dir>/calibrations/NAME.json`` (never replacing one unless
``--force``). Exit 0 when saved (or printed with ``--dry-run``), 2 on a run it cannot use.
Imports no torch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from cli.help_text import plain
from cli.spec_options import add_config_dir_option


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "calibrate",
        help="fit the cluster's efficiency factors from a run and save them by name",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a run directory written by launch"
    )
    p.add_argument(
        "--name", metavar="NAME", help="save it under this name (default: the run's name)"
    )
    p.add_argument(
        "--preflight",
        type=Path,
        metavar="DIR",
        help="a preflight's run directory (or its preflight.json): the network factor from its "
        "measured inter-node bus bandwidth (default: network x1.0)",
    )
    p.add_argument(
        "--profile",
        metavar="P",
        default=argparse.SUPPRESS,
        help="the profile of this cluster: refuse a run on another GPU, and make the profile "
        "use the calibration",
    )
    add_config_dir_option(p, "config directory root (calibrations/ and profiles/ under it)")
    p.add_argument("--force", action="store_true", help="replace a calibration of that name")
    p.add_argument("--dry-run", action="store_true", help="fit and print; save nothing")
    p.add_argument("--json", action="store_true", help="print the calibration as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.monitor.calibrate import calibrate_run
    from profiles.calibrations import CalibrationStore, check_name, safe_name
    from profiles.store import ProfileStore

    config_dir = getattr(args, "config_dir", None)
    profile = getattr(args, "profile", None)
    name = check_name(args.name) if args.name else safe_name(Path(args.run_dir).resolve().name)
    store = CalibrationStore(config_dir)
    if not args.dry_run and not args.force:
        store.check_free(name)  # refused before the fit's work, not after
    expect = ProfileStore(config_dir).load(profile).hardware.gpu if profile else None
    result = calibrate_run(args.run_dir, name=name, preflight=args.preflight, expect_gpu=expect)
    saved = None
    if not args.dry_run:
        saved = store.save(result.calibration, overwrite=args.force)
        if profile:
            store.attach(profile, name)
    if args.json:
        json.dump(result.calibration.model_dump(mode="json"), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render(result, sys.stdout, saved=saved, profile=profile)
    return 0


def _ms(s: float) -> str:
    return f"{s * 1000:.3g} ms" if s < 1 else f"{s:.3g} s"


def _off(predicted: float, measured: float) -> str:
    """How far a prediction is from the measurement: ``+12%``, ``-28%``, ``±0%``."""
    if measured <= 0:
        return "-"
    off = (predicted - measured) / measured
    return "±0%" if abs(off) < 0.005 else f"{off:+.0%}"


def render(result: Any, out: TextIO, *, saved: Path | None, profile: str | None) -> None:
    """The human report: factors, then step time predicted before and after vs measured."""
    from engine.plan.calibration import GIB, compute_change
    from engine.plan.catalog import get_gpu, get_network

    cal = result.calibration
    src = cal.source
    before = result.before.recommended
    after = result.after.recommended
    w = out.write
    w(
        f"Calibration {cal.name!r} from run {src.run}: {src.layout} on {src.world_size} x "
        f"{cal.gpu}, median of {src.steps} steps after {src.warmup_steps} warm-up\n"
    )
    w(f"  compute  ×{cal.compute:.3g}  ({compute_change(get_gpu(cal.gpu), cal)})\n")
    if src.measured_busbw_gbps is not None:
        net = get_network(result.before.spec.network.tier)
        w(
            f"  network  ×{cal.network:.3g}  ({net.name}: measured {src.measured_busbw_gbps:.3g} "
            f"GB/s bus bandwidth, efficiency {net.efficiency:.2f} -> "
            f"{min(1.0, net.efficiency * cal.network):.3g})\n"
        )
    else:
        w("  network  ×1.0   (not measured: --preflight DIR takes a preflight's figure)\n")
    if cal.memory_overhead_gib is not None and src.measured_peak_mem_gib is not None:
        w(
            f"  memory   {cal.memory_overhead_gib:+.2f} GiB per GPU (measured peak "
            f"{src.measured_peak_mem_gib:.2f} GiB, predicted {before.memory_per_gpu.total / GIB:.2f})\n"
        )
    m = src.measured_step_time_s
    w(
        f"\nStep time  measured {_ms(m)} (median)   predicted before {_ms(before.step_time_s)} "
        f"({_off(before.step_time_s, m)})   after {_ms(after.step_time_s)} "
        f"({_off(after.step_time_s, m)})\n"
    )
    if src.measured_tokens_per_s:
        w(
            f"Tokens/s   measured {src.measured_tokens_per_s:,.0f}   predicted before "
            f"{before.tokens_per_s:,.0f}   after {after.tokens_per_s:,.0f}\n"
        )
    if saved is None:
        w("\n(dry run: nothing saved)\n")
        return
    w(f"\nSaved {saved}\n")
    if profile:
        w(f"Profile {profile!r} now uses it: plans from --profile {profile} say '{cal.label()}'\n")
    else:
        w(f"Use it: dtrain-tui plan ... --calibration {cal.name}\n")
