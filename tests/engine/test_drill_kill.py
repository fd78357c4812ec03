"""The fault drill's targets (engine/launch/drill.py): which rank or node each kill takes down,
how the report names it, and :func:`kill_node` on a stand-in for a local node: a session of its
own holding an untagged helper, whose "ranks" sit in sessions of their own tagged
``GROUP_RANK`` as torchrun's are. The node killed loses every process, the other node none.
Waits on pidfds (the kernel says when a process ended), never on a clock."""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.drill_cmd import KILL_MODES
from engine.launch.drill import KillMode, Recovery, _targets, kill_node, node_processes

GPUS = 2
REPO = Path(__file__).resolve().parents[2]

FAKE_NODE = """\
import os, signal, subprocess, sys
node = int(sys.argv[1])
pause = "import signal; print('up', flush=True); signal.pause()"
untagged = {k: v for k, v in os.environ.items() if k != "DTRAIN_RUN_ID"}
kids = [subprocess.Popen([sys.executable, "-c", pause], stdout=subprocess.PIPE, env=untagged)]
for lr in range(2):
    env = dict(os.environ, GROUP_RANK=str(node), LOCAL_RANK=str(lr), RANK=str(node * 2 + lr))
    kids.append(subprocess.Popen([sys.executable, "-c", pause], stdout=subprocess.PIPE, env=env,
                                 start_new_session=True))
for k in kids:
    k.stdout.readline()
print(" ".join(str(k.pid) for k in kids), flush=True)
signal.pause()
"""


def _start_node(run_id: str, node: int) -> tuple[subprocess.Popen[bytes], list[int]]:
    """A stand-in node: its leader's pid first, then the helper's and the two ranks'."""
    proc = subprocess.Popen(
        [sys.executable, "-c", FAKE_NODE, str(node)],
        env={**os.environ, "DTRAIN_RUN_ID": run_id},
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the node is up: every child said so
    assert line, "the stand-in node did not start"
    return proc, [proc.pid, *map(int, line.split())]


def _ended(fds: list[int], timeout: float) -> set[int]:
    """The pidfds among ``fds`` whose process ended within ``timeout`` seconds."""
    left, done = list(fds), set()
    while left:
        ready, _, _ = select.select(left, [], [], timeout)
        if not ready:
            break
        done.update(ready)
        left = [f for f in left if f not in done]
    return done


@pytest.fixture
def two_nodes() -> Iterator[tuple[str, list[list[int]]]]:
    run_id = f"drill-test-{uuid.uuid4().hex}"
    started = [_start_node(run_id, n) for n in range(2)]
    try:
        yield run_id, [pids for _, pids in started]
    finally:
        for proc, pids in started:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(30)


def test_kill_node_takes_down_the_whole_node_and_nothing_else(
    two_nodes: tuple[str, list[list[int]]],
) -> None:
    run_id, (node0, node1) = two_nodes
    pids, ranks, groups = node_processes(run_id, 1)
    assert ranks == [2, 3]
    assert pids == sorted(node1[2:])  # the tagged ranks, not the helper nor the leader
    assert groups == [node1[0]]  # the node's session, found from its ranks' parent
    fds = {pid: os.pidfd_open(pid) for pid in node0 + node1}
    try:
        assert kill_node(run_id, 1) == (pids, ranks, groups)
        ended = _ended([fds[p] for p in node1], 30)
        assert ended == {fds[p] for p in node1}, "a process of node 1 survived its kill"
        assert not _ended([fds[p] for p in node0], 0), "node 0 was hit by node 1's kill"
        assert kill_node(run_id, 1) is None  # nothing of node 1 is left to kill
    finally:
        for fd in fds.values():
            os.close(fd)


def test_rank_kills_draw_as_before() -> None:
    """A seed repeats an older drill: rank targets come from the same draws as before nodes."""
    steps = [4, 6, 9]
    got = _targets(steps, KillMode.RANK, random.Random(7), 2, GPUS)
    old = random.Random(7)
    assert [r.rank for r in got] == [old.randrange(2 * GPUS) for _ in steps]
    assert all(r.node is None for r in got)
    assert [r.planned_step for r in got] == steps


def test_node_and_mixed_kills_name_the_node_and_its_ranks() -> None:
    nodes = _targets([3, 5], KillMode.NODE, random.Random(1), 3, GPUS)
    for r in nodes:
        assert r.rank is None and r.node is not None
        assert r.ranks == (2 * r.node, 2 * r.node + 1)
    mixed = _targets([3, 5, 7], KillMode.MIXED, random.Random(2), 2, GPUS)
    kinds = ["node" if r.node is not None else "rank" for r in mixed]
    assert kinds in (["rank", "node", "rank"], ["node", "rank", "node"])


def test_the_report_line_names_what_was_killed() -> None:
    r = Recovery(1, rank=None, planned_step=7, node=1, ranks=(2, 3), killed_step=7)
    r.killed_at, r.resumed_from, r.newest_ckpt, r.steps_redone = 1.0, 6, 6, 1
    assert r.line().startswith("kill 1: node 1 (ranks 2-3) at step 7: resumed from 6")
    assert r.line().endswith(": held")
    assert Recovery(2, rank=1, planned_step=5).target == "rank 1"
    assert Recovery(3, rank=None, planned_step=5, node=0, ranks=(0,)).target == "node 0 (rank 0)"


def test_the_cli_offers_every_kill_mode() -> None:
    assert tuple(m.value for m in KillMode) == KILL_MODES
    p = subprocess.run(
        [sys.executable, "-m", "cli", "drill", "--kill", "host"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert p.returncode == 2 and "--kill" in p.stderr, p.stderr
