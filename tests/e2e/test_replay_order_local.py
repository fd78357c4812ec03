"""A reopened run replays in write order, for real (issue 40): torchrun over gloo on CPU, a
script whose two ranks take turns printing to stdout and stderr, then rank 0 dies; the run
directory the local backend wrote, reopened with :class:`RunDirSource`, gives the turns in the
order they were taken, the Traceback last (by file, rank 0's stderr came before rank 1's last
step)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.launch import LaunchOptions
from engine.launch.local import LocalBackend
from engine.monitor.tail import RunDirSource
from engine.rundir.events import per_line
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, make_bundle

pytestmark = pytest.mark.slow

# Each turn ends at a barrier, and a pause lets torchrun's --tee (it polls the ranks' files)
# pass the line on before the other rank prints: the order on the pipe is then the turns'.
SCRIPT = """
import sys, time
import torch.distributed as dist

dist.init_process_group("gloo")
r = dist.get_rank()
turns = [(0, sys.stdout), (1, sys.stdout), (0, sys.stderr), (1, sys.stdout)]
for i, (who, out) in enumerate(turns):
    if r == who:
        print(f"[turn] {i} rank={r}", file=out, flush=True)
    dist.barrier()
    time.sleep(0.5)
if r == 0:
    raise ZeroDivisionError("turns are over")
dist.barrier()
"""
TURN = re.compile(r"^\[turn\] (\d) ")


def test_a_reopened_local_run_replays_the_ranks_turns_in_order(tmp_path: Path) -> None:
    script = tmp_path / "turns.py"
    script.write_text(SCRIPT)
    bundle = make_bundle(tmp_path / "b", script=script)
    run = tmp_path / "run"
    backend = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=120))
    backend.start()
    live_events = collect(backend)
    assert backend.state == "failed", read_run(run)
    assert (run / "logs" / "order.idx").is_file()

    source = RunDirSource(run)
    source.start()
    events = []
    for _ in range(2000):
        if source.done:
            break
        events += source.poll(0.05)
    assert source.done
    replayed = marked(per_line(events))
    # The reference is the order the lines reached the launcher (what it wrote, one chunk after
    # the other): torchrun's --tee decides that order, not the test. Every turn is there, and
    # the replay is that order exactly, rank 0's Traceback included.
    assert sorted((t for t in replayed if t[2] != "error"), key=lambda t: t[2]) == [
        (0, "stdout", "0"),
        (1, "stdout", "1"),
        (0, "stderr", "2"),
        (1, "stdout", "3"),
    ]
    assert replayed == marked(live_events)


def marked(events: list[object]) -> list[tuple[int | None, str, str]]:
    """(rank, stream, turn number or "error") of the turn lines and rank 0's error line."""
    out: list[tuple[int | None, str, str]] = []
    for ev in events:
        line = getattr(ev, "line", None)
        if line is None:
            continue
        rank, stream = getattr(ev, "rank", None), getattr(ev, "stream", "")
        if m := TURN.match(line):
            out.append((rank, stream, m[1]))
        elif rank == 0 and line.startswith("ZeroDivisionError"):
            out.append((rank, stream, "error"))
    return out
