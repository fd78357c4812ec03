"""``dtrain-tui monitor RUN_DIR``: reopen a run from its directory (finished or still running) in
the monitor TUI; with ``--follow``, headless: print every line prefixed by its rank
(``[rank 3] ...``) or node (``[node 1] ...``), tailing the files while ``run.json`` says the run is
going, then each rank's exit and the final state. Exit code (``--follow``): 0 when the run
succeeded, 1 when it failed or was stopped.

Textual is imported only for the TUI; ``--follow`` runs on engine alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from cli.help_text import plain
from engine.monitor.state import exit_text
from engine.rundir.events import LineBatch, LineEvent, RankExit, RunStateChanged


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "monitor",
        help="watch a run directory: per-rank panes, NCCL pane, rank states (or --follow)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="a run directory written by launch"
    )
    p.add_argument(
        "--follow",
        "-f",
        action="store_true",
        help="headless: print rank-prefixed lines until the run ends",
    )
    p.add_argument(
        "--errors-only",
        action="store_true",
        help="with --follow: print only error lines (Traceback, OOM, NCCL WARN, timeouts…)",
    )
    p.add_argument(
        "--hang-after",
        type=float,
        default=60.0,
        metavar="S",
        help="flag a rank silent this many seconds while others print (default 60)",
    )
    p.add_argument(
        "--export",
        choices=("csv", "json"),
        metavar="csv|json",
        help="print the per-step series per rank and the telemetry samples (csv or json)",
    )
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="with --export: write to FILE (atomically) instead of stdout",
    )
    p.set_defaults(func=run)


def export(run_dir: Path, fmt: str, out_file: Path | None, out: TextIO = sys.stdout) -> int:
    """``--export``: the run's series as ``fmt`` text, to ``out_file`` or ``out``."""
    from engine.fsio import atomic_write_text
    from engine.monitor.export import export_text, read_series

    text = export_text(read_series(run_dir), fmt)
    if out_file is None:
        out.write(text)
        return 0
    try:
        atomic_write_text(out_file, text)
    except OSError as e:
        from engine.errors import DtrainError

        raise DtrainError(f"cannot write {out_file}: {e.strerror}", field="--out") from None
    print(f"wrote {out_file}", file=sys.stderr)
    return 0


def follow(run_dir: Path, out: TextIO = sys.stdout, *, errors_only: bool = False) -> int:
    """Print the run's lines as they come; return 0 if it succeeded, else 1."""
    from engine.monitor.logparse import classify_error
    from engine.monitor.tail import RunDirSource
    from engine.monitor.telemetry import shown_lines
    from engine.monitor.textsafe import safe_line, safe_text
    from engine.rundir.record import RunState

    source = RunDirSource(run_dir)
    source.start()
    from engine.diagnose.nccl_facts import TransportNotes

    transport = TransportNotes(source_dir=run_dir)  # the NCCL transport check, told once
    from engine.monitor.machine_notes import MachineNotes

    notes = MachineNotes(run_dir)  # the GPU panel's flags and the plan line, in text
    state: str = ""
    try:
        while not source.done:
            events = source.poll(0.25)
            for ev in events:
                if isinstance(ev, LineBatch | LineEvent):
                    tag = f"[rank {ev.rank}]" if ev.rank is not None else f"[node {ev.node}]"
                    lines: Sequence[str] = ev.lines if isinstance(ev, LineBatch) else (ev.line,)
                    transport.feed(ev.node, ev.host, lines)
                    lines = shown_lines(lines)  # the agent's telemetry: on disk, not here
                    if errors_only:
                        lines = tuple(
                            x
                            for x in lines
                            # the stuck rank named (engine.launch.frdump) is kept too
                            if classify_error(x) is not None
                            or x.startswith("[dtrain-tui] diagnosis: ")
                        )
                    if lines:
                        # Escape sequences in rank output never reach the terminal.
                        out.write(safe_text("".join(f"{tag} {x}\n" for x in lines)))
                elif isinstance(ev, RankExit):
                    how = "exited 0" if ev.exit_code == 0 else f"failed {exit_text(ev.exit_code)}"
                    reason = f" ({safe_line(ev.reason)})" if ev.reason else ""
                    if ev.exit_code is None and ev.reason == "stopped":  # the user's stop
                        how, reason = "stopped", ""
                    out.write(f"[rank {ev.rank}] {how}{reason}\n")
                elif isinstance(ev, RunStateChanged):
                    state = ev.state
                    msg = f": {safe_line(ev.message)}" if ev.message else ""
                    out.write(f"[run] {ev.state}{msg}\n")
            for finding in transport.fresh():
                out.write(safe_text("".join(f"[transport] {x}\n" for x in finding.lines())))
            out.write(safe_text("".join(x + "\n" for x in notes.feed(events, time.time()))))
            out.flush()
        out.write(safe_text("".join(x + "\n" for x in notes.end())))
    finally:
        source.stop()
    return 0 if state == RunState.SUCCEEDED else 1


def follow_attempts(run_dir: Path, out: TextIO = sys.stdout, *, errors_only: bool = False) -> int:
    """A run the restart policy relaunched (``attempts`` in run.json): follow each attempt's
    directory in turn, each attempt's end said in one line, then the work the restarts lost;
    0 if the run succeeded, else 1."""
    import threading

    from engine.monitor.tail import attempt_dirs, attempt_line, work_lost_line
    from engine.rundir.record import RunState, read_record

    followed = 0
    idle = threading.Event()  # never set: its wait is the pause between looks at run.json
    while True:
        rec = read_record(run_dir)
        dirs = attempt_dirs(run_dir, rec)
        if followed < len(dirs):
            out.write(f"[run] attempt {followed + 1} ({dirs[followed].relative_to(run_dir)})\n")
            out.flush()
            follow(dirs[followed], out, errors_only=errors_only)
            followed += 1
            rec = read_record(run_dir)
            if followed <= len(rec.attempts):
                out.write(attempt_line(rec.attempts[followed - 1]) + "\n")
            continue
        if rec.state.final:
            break
        idle.wait(0.25)
    out.write(work_lost_line(rec.attempts) + "\n")
    out.write(f"[run] {rec.state}: {rec.reason}\n" if rec.reason else f"[run] {rec.state}\n")
    out.flush()
    return 0 if rec.state == RunState.SUCCEEDED else 1


def run(args: argparse.Namespace) -> int:
    from engine.rundir.record import read_record

    rec = read_record(args.run_dir)  # a bad RUN_DIR is one line, before any screen opens
    if args.export is not None:
        return export(args.run_dir, args.export, args.out)
    if args.out is not None:
        from engine.errors import DtrainError

        raise DtrainError("--out needs --export csv or --export json", field="--out")
    if args.follow:
        if rec.attempts:
            return follow_attempts(args.run_dir, errors_only=args.errors_only)
        return follow(args.run_dir, errors_only=args.errors_only)
    from tui.screens.monitor import run_monitor

    run_dir = args.run_dir
    if rec.attempts:  # the TUI follows the newest attempt; --follow prints them all
        from engine.monitor.tail import attempt_dirs, attempt_line, work_lost_line

        for a in rec.attempts:
            print(attempt_line(a))
        print(work_lost_line(rec.attempts))
        run_dir = (attempt_dirs(args.run_dir, rec) or [args.run_dir])[-1]
    return run_monitor(run_dir, hang_after_s=args.hang_after)
