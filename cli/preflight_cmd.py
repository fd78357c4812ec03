"""``dtrain-tui preflight``: before a run, measure the fabric and the GPUs in the run's own torchrun
world (the bundle's ``preflight.py``, started like ``launch`` on the same backend, hosts and
options): the all-reduce busbw per size against what the plan assumed, the node pairs that find a
slow node or link, a GEMM per GPU, and a verdict. Writes ``RUN/preflight.json``. Exit 0 when
everything is as the plan assumes, 1 when a slow node, link, GPU or fabric is found (or the
preflight could not finish), 2 on bad input, 128 + N when stopped by signal N."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from typing import Any

from cli.help_text import plain
from cli.launch_cmd import (
    _backend_options,
    _bundle,
    _Interrupted,
    _options,
    _print_events,
    _say,
    _StopSignals,
    add_launch_arguments,
)
from engine.errors import DtrainError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "preflight",
        help="measure all-reduce busbw, node pairs and GEMM per GPU in the run's world; a verdict",
        description=plain(__doc__),
    )
    add_launch_arguments(p)
    p.add_argument(
        "--max-mb",
        type=int,
        metavar="MIB",
        help="largest all-reduce of the sweep in MiB (default 1024 on GPU, 64 on CPU ranks)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        default=None,
        help="stop the preflight if it has not ended after S seconds (default 900)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stop = _StopSignals()
    stop.install()
    try:
        return _run(args, stop)
    except _Interrupted as e:
        _say(
            f"dtrain-tui: interrupted ({signal.Signals(e.signum).name}) before the preflight started"
        )
        return 128 + e.signum
    finally:
        stop.restore()


def _run(args: argparse.Namespace, stop: _StopSignals) -> int:
    from cli.spec_options import check_launch_args
    from engine.diagnose.preflight import report_lines
    from engine.launch.preflight import DEADLINE_S, drive, finish_preflight, start_preflight
    from engine.rundir.files import new_run_dir
    from engine.write.manifest import read_manifest

    if args.deadline is not None and not 0 < args.deadline <= 86400:
        raise DtrainError(f"{args.deadline:g} is outside (0, 86400] seconds", field="--deadline")
    if getattr(args, "launch__hosts", None) == "slurm":
        from engine.launch.slurm_cli import allocation_hosts

        args.launch__hosts = ",".join(allocation_hosts())
    check_launch_args(args)
    bundle_dir, run_dir, spec_launch = _bundle(args)
    manifest = read_manifest(bundle_dir)
    kind = str(
        getattr(args, "launch__backend", None)
        or (spec_launch.backend.value if spec_launch else manifest.backend)
    )
    options = _options(args, manifest.hosts, spec_launch)
    extra = _backend_options(args, kind, options)
    run_dir = run_dir or new_run_dir(f"{manifest.name}-preflight")
    backend = start_preflight(
        kind, bundle_dir, run_dir, options, sbatch_args=extra.get("sbatch_args", ()),
        max_mb=args.max_mb,
    )  # fmt: skip
    _say(f"dtrain-tui: preflight run directory {backend.run.path}")
    try:
        backend.start()
    except _Interrupted as e:
        stop.live = True
        if backend.state.final:
            _say(f"dtrain-tui: preflight stopped while starting ({signal.Signals(e.signum).name})")
            return 128 + e.signum
    stop.live = True
    out: Any = None if args.quiet else sys.stdout

    def show(events: list[Any]) -> None:
        nonlocal out
        if out is None:
            return
        try:
            _print_events([_without_result(e) for e in events], out)
        except OSError:
            out = None

    drive(
        backend,
        deadline_s=args.deadline or DEADLINE_S,
        on_events=show,
        stops_asked=lambda: len(stop.got),
    )
    if stop.got:
        _say(f"dtrain-tui: preflight {backend.state}: {backend.run.record.reason}")
        return stop.exit_code()
    try:
        report = finish_preflight(backend)
    except DtrainError as e:
        _say(f"dtrain-tui: {e}")
        return 1
    with contextlib.suppress(OSError):
        print("\n".join(report_lines(report)), flush=True)
    _say(f"dtrain-tui: preflight {report.verdict} ({backend.run.path / 'preflight.json'})")
    return report.exit_code


def _without_result(ev: Any) -> Any:
    """The rank-0 result line is one long JSON object: shown as a short note instead."""
    from dataclasses import replace

    from engine.diagnose.preflight import RESULT_MARK
    from engine.rundir.events import LineBatch, LineEvent

    note = RESULT_MARK + "{...} (result; see preflight.json)"
    if isinstance(ev, LineBatch) and any(x.startswith(RESULT_MARK + "{") for x in ev.lines):
        return replace(
            ev, lines=tuple(note if x.startswith(RESULT_MARK + "{") else x for x in ev.lines)
        )
    if isinstance(ev, LineEvent) and ev.line.startswith(RESULT_MARK + "{"):
        return replace(ev, line=note)
    return ev
