"""The fault drill's node kill, for real: a 2-node x 2-rank local bundle of the shipped trainer
(torchrun over gloo on CPU, both node scripts on this machine). ``run_drill(kill="node")``
SIGKILLs node 1's whole part of the run at a step; the launcher sees that node's script killed,
the restart policy relaunches, and the run resumes from the newest complete checkpoint with the
reference's losses. Nothing sleeps to wait: the drill polls the run's events with a deadline."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.launch.drill import run_drill
from engine.launch.options import LaunchOptions
from engine.rundir.record import RunState, read_record
from tests.e2e.launch_util import make_bundle

pytestmark = pytest.mark.slow

STEPS = 8
EVERY = 2
SEED = 4
"""Draws a kill of node 1 (ranks 2-3) at step 4 for an 8-step run checkpointing every 2."""
STEP_RE = re.compile(r"\[dtrain\] step=(\d+)/\d+ loss=(\S+)")


def _losses(log: Path) -> dict[int, str]:
    return {int(m[1]): m[2] for m in STEP_RE.finditer(log.read_text())}


def test_drill_kills_a_whole_node_and_the_run_resumes(tmp_path: Path) -> None:
    bundle = make_bundle(
        tmp_path / "bundle",
        nodes=2,
        gpus_per_node=2,
        steps=STEPS,
        script_args=["--sleep-per-step", "0.15"],
    )
    said: list[str] = []
    work = tmp_path / "work"
    report = run_drill(
        bundle,
        work,
        kills=1,
        seed=SEED,
        every=EVERY,
        kill="node",
        options=LaunchOptions(hang_timeout_s=120),
        say=said.append,
    )
    assert report.ok, "\n".join(said + report.lines())
    (r,) = report.recoveries
    assert (r.node, r.ranks, r.rank) == (1, (2, 3), None)
    assert r.killed_step is not None and r.resumed_from is not None
    assert r.resumed_from == r.newest_ckpt and r.resumed_from >= EVERY
    assert any(x.startswith("drill: SIGKILL node 1 (ranks 2-3; pid(s) ") for x in said), said
    assert report.lines()[0].startswith(
        f"kill 1: node 1 (ranks 2-3) at step {r.killed_step}: resumed from {r.resumed_from} "
    ), report.lines()
    # The launcher saw node 1's script killed (not a rank of node 0 losing its peers).
    rec = read_record(work / "drill")
    first, second = rec.attempts
    assert (first.state, second.state) == (RunState.FAILED, RunState.SUCCEEDED)
    assert first.failed_node == 1 and "SIGKILL" in first.cause, first.cause
    assert second.resumed_from_step == r.newest_ckpt
    # Resumed right: from the step after the checkpoint to the end, the reference's losses.
    ref = _losses(work / "reference" / "attempts" / "1" / "logs" / "rank0.stdout.log")
    after = _losses(work / "drill" / "attempts" / "2" / "logs" / "rank0.stdout.log")
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert sorted(after) == list(range(r.resumed_from + 1, STEPS + 1))
    assert after == {s: ref[s] for s in after}
