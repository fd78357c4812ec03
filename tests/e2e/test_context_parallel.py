"""Context parallelism in the example trainer, for real: an FSDP plan with cp = 2, written by
dtrain-tui and run by torchrun over gloo, trains each sequence split over two ranks (keys and
values all-gathered, the causal mask by position) and learns exactly what one rank training
the whole sequences learns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.launch import LaunchOptions
from engine.launch.local import LocalBackend
from engine.rundir.events import LineEvent
from engine.rundir.files import read_run
from tests.e2e.launch_util import TINY, collect

pytestmark = pytest.mark.slow

LOSS_RE = re.compile(r"^\[dtrain\] step=(\d+)/\d+ loss=(\S+) ")


def _write(out: Path, gpus: int, *args: str) -> Path:
    from cli import main

    argv = ["write", *TINY, "--gpus-per-node", str(gpus), "--seq-len", "32"]
    argv += ["--global-batch", "2", "--micro-batch", "2", "--steps", "3", "--precision", "fp32"]
    argv += ["--framework", "fsdp", "--strategy", "fsdp-full", "--out", str(out), *args]
    assert main(argv) == 0, argv
    return out


def _losses(bundle: Path, run: Path) -> dict[int, list[float]]:
    backend = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=120))
    backend.start()
    events = collect(backend)
    assert backend.state == "succeeded", read_run(run)
    out: dict[int, list[float]] = {}
    for e in events:
        if isinstance(e, LineEvent) and e.stream == "stdout" and (m := LOSS_RE.match(e.line)):
            out.setdefault(e.rank or 0, []).append(float(m.group(2)))
    return out


def test_a_context_parallel_plan_trains_what_one_rank_trains(tmp_path: Path) -> None:
    split = _write(tmp_path / "cp", 2, "--cp", "2")
    whole = _write(tmp_path / "one", 1)
    cp = _losses(split, tmp_path / "run-cp")
    one = _losses(whole, tmp_path / "run-one")
    assert sorted(cp) == [0, 1] and len(one[0]) == 3
    # Both ranks of the group report the loss of the same sequences ...
    assert cp[0] == cp[1]
    # ... which is the loss of one rank training them whole, step after step (the same start,
    # data and gradients: only the order of floating-point sums differs).
    assert cp[0] == pytest.approx(one[0], abs=2e-3)
    rank0 = (tmp_path / "run-cp" / "logs" / "rank0.stdout.log").read_text()
    assert "world_size=2" in rank0 and " cp=2" in rank0
