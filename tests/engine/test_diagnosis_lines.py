"""The stuck-rank diagnosis as the monitor sees it, and the timeout lines that ask for one.

``[dtrain-tui] diagnosis: …`` (engine.launch.frdump) is an error line: the monitor's error list
and ``monitor --follow --errors-only`` show it. A rank's collective-timeout line (NCCL's
watchdog, gloo's ``Timed out waiting``) is recognised by :data:`TIMEOUT_LINE_RE` and remembered
once per run by the output pump (:func:`find_timeout_line`) (the real launch path: tests/e2e/test_timeout_line_diagnosis).
"""

from __future__ import annotations

import pytest

from engine.launch.frdump import TIMEOUT_GATE, TIMEOUT_LINE_RE, find_timeout_line
from engine.monitor.logparse import ErrorKind, classify, classify_error, scan_batch
from engine.monitor.state import MonitorState
from engine.rundir.events import LineEvent

DIAG = (
    "[dtrain-tui] diagnosis: rank 1 (node 0, host localhost) never entered all_reduce #8 "
    "(pg default, [1024] float32); rank 0 waiting in it (rank 1 at skip_collective, train.py:560)"
)
# Real lines: gloo's from torch 2.13 on this machine (rank 0 of a 2-rank job, timeout 3 s), NCCL's
# in the format of /work/shared/fixtures/logs/README.md (with and without torch's PG prefix).
GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 3000ms for recv operation to complete"
)
NCCL = (
    "[rank1]:[E1125 01:26:38.693000 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective "
    "operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, "
    "Timeout(ms)=600000) ran for 600086 milliseconds before timing out."
)
NCCL_PG = (
    "[PG ID 0 PG GUID 0(default_pg) Rank 3] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=12, OpType=BROADCAST, NumelIn=16, NumelOut=16, Timeout(ms)=60000) ran for "
    "60011 milliseconds before timing out."
)


def test_the_diagnosis_line_is_an_error() -> None:
    assert classify_error(DIAG) is ErrorKind.DIAGNOSIS
    kind, err = classify(DIAG)
    assert err is ErrorKind.DIAGNOSIS and kind.value == "error"
    facts = scan_batch(["[dtrain] step=2/6 loss=1 tokens_per_s=1 step_time_s=1 mem_gb=1", DIAG])
    assert facts.errors == [(1, ErrorKind.DIAGNOSIS)]


@pytest.mark.parametrize(
    "line",
    [
        "[dtrain-tui] hang: no output from any rank for 8s (--hang-timeout 8); stopping",
        "[dtrain] note: see the [dtrain-tui] diagnosis: line above",  # not at the start
        "[dtrain-tui] diagnosis requested",
    ],
)
def test_other_launcher_lines_are_not_diagnoses(line: str) -> None:
    assert classify_error(line) is not ErrorKind.DIAGNOSIS


def test_the_monitor_lists_the_diagnosis_among_the_errors() -> None:
    """The launcher emits the line as node 0's own (no rank): it is in the error list."""
    s = MonitorState(2)
    found = s.apply([LineEvent(0, None, "stderr", DIAG)], now=1.0)
    assert [(e.rank, e.kind) for e in found] == [(None, ErrorKind.DIAGNOSIS)]
    assert s.errors[-1].kind is ErrorKind.DIAGNOSIS


@pytest.mark.parametrize("line", [GLOO, NCCL, NCCL_PG])
def test_collective_timeout_lines_are_recognised(line: str) -> None:
    assert any(g in line for g in TIMEOUT_GATE)  # the streams' cheap gate lets it through
    assert TIMEOUT_LINE_RE.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "[W socket.cpp:464] The client socket has timed out after 60s while trying to connect",
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients.",
        "[dtrain] step=3/6 loss=1 tokens_per_s=1 step_time_s=1 mem_gb=1",
        "ProcessGroupNCCL's watchdog got stuck for 480 seconds without making progress",
    ],
)
def test_other_timeouts_are_not_collective_timeouts(line: str) -> None:
    assert not TIMEOUT_LINE_RE.search(line)


def test_the_first_timeout_line_of_a_batch_is_found() -> None:
    assert find_timeout_line({(0, 0): ["[dtrain] step=3/6", "x"]}) is None
    got = find_timeout_line({(0, 0): ["boom"], (1, 3): [NCCL_PG], (0, 1): [GLOO]})
    assert got == (1, 3, NCCL_PG)
