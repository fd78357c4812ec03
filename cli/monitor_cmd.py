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
    p.set_defaults(func=run)


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
    state: str = ""
    try:
        while not source.done:
            for ev in source.poll(0.25):
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
            out.flush()
    finally:
        source.stop()
    return 0 if state == RunState.SUCCEEDED else 1


def run(args: argparse.Namespace) -> int:
    from engine.rundir.record import read_record

    read_record(args.run_dir)  # a bad RUN_DIR is one line, before any screen opens
    if args.follow:
        return follow(args.run_dir, errors_only=args.errors_only)
    from tui.screens.monitor import run_monitor

    return run_monitor(args.run_dir, hang_after_s=args.hang_after)
