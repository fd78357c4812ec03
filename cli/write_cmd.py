"""``dtrain-tui write``: plan the spec and write the run bundle (configs, node scripts, env,
SkyPilot task, README) to ``--out DIR``, printing one line per file.

A file in DIR that the user changed (or that dtrain-tui never wrote) is never replaced silently:
without ``--force`` the command writes nothing and names the files; with ``--force`` each is
kept as ``NAME.bak-<UTC time>`` first.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cli.spec_options import add_spec_options, spec_from_args
from engine.errors import DtrainError

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from engine.write.ds_config import Scheduler

    p = sub.add_parser(
        "write",
        help="write the run bundle (configs, launch scripts, env, sky.yaml) for a spec",
        description=(
            "Plan the spec and write every file the run needs into --out DIR. Files you edited "
            "are never replaced silently: without --force nothing is written and they are named."
        ),
    )
    add_spec_options(p, launch=True)
    g = p.add_argument_group("output")
    g.add_argument("--out", type=Path, metavar="DIR", help="bundle directory (created if missing)")
    g.add_argument(
        "--force",
        action="store_true",
        help="replace files you changed, keeping each as NAME.bak-<UTC time>",
    )
    g.add_argument(
        "--print",
        dest="print_file",
        metavar="FILE",
        help="print one bundle file (e.g. ds_config.json, launch_node0.sh) and write nothing",
    )
    g.add_argument(
        "--scheduler",
        choices=[s.value for s in Scheduler],
        default=Scheduler.NONE.value,
        help="LR scheduler in ds_config.json (DeepSpeed plans): warmup or warmup-decay",
    )
    g.add_argument("--warmup-steps", type=int, metavar="N", help="scheduler warm-up steps")
    g.add_argument(
        "--fsdp-version",
        type=int,
        choices=[1, 2],
        default=2,
        help="FSDP API in fsdp.json / accelerate_config.yaml: 2 (fully_shard, default) or 1",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.plan.planner import plan
    from engine.write.bundle import WriteOptions, render_bundle, write_bundle
    from engine.write.checks import check_spec_batch
    from engine.write.ds_config import Scheduler
    from engine.write.summary import plan_summary

    if args.print_file is None and args.out is None:
        raise DtrainError("say where to write: pass --out DIR (or --print FILE)", field="--out")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        raise DtrainError("must be 0 or more", field="--warmup-steps")
    spec = spec_from_args(args)
    the_plan = plan(spec)
    check_spec_batch(the_plan)
    options = WriteOptions(
        scheduler=Scheduler(args.scheduler),
        warmup_steps=args.warmup_steps,
        fsdp_version=args.fsdp_version,
    )
    if args.print_file is not None:
        files = render_bundle(the_plan, options)
        f = files.get(args.print_file)
        if f is None:
            raise DtrainError(
                f"this bundle has no {args.print_file!r}; it has {', '.join(files)}",
                field="--print",
            )
        sys.stdout.write(f.text)
        return 0
    out = Path(args.out)
    report = write_out(out, lambda: write_bundle(the_plan, out, force=args.force, options=options))
    print(f"plan: {plan_summary(the_plan)}")
    for w in the_plan.warnings:
        print(f"warning: {w}")
    print(f"bundle: {out}")
    for line in report.lines():
        print(f"  {line}")
    # Quoted: the line is meant to be pasted into a shell, and a directory may hold spaces or $.
    print(
        f"start it: dtrain-tui launch {shlex.quote(str(out))}   "
        f"(or by hand: {shlex.quote(str(out / 'launch_node0.sh'))})"
    )
    return 0


def write_out(out: Path, write: Callable[[], T], field: str = "--out") -> T:
    """Run ``write`` (which writes under ``out``); a disk or path problem (a parent that is a
    file, a dangling symlink, no permission, a full disk) is one line naming ``field``."""
    if out.is_symlink() and not out.exists():
        raise DtrainError(
            f"{out} is a symlink to {out.readlink()}, which does not exist; "
            "pass a directory, or create the target first",
            field=field,
        )
    try:
        return write()
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise DtrainError(
            f"cannot write to {out}: {e.strerror or e}{where}; pass a writable directory "
            "with free space",
            field=field,
        ) from None
