"""engine.monitor.logparse against real multi-node logs (../shared/fixtures/logs) and the line formats of
public reports: prefixes, ANSI, NCCL classification, errors, step lines, broken lines."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.monitor.logparse import (
    ErrorKind,
    LineKind,
    classify_error,
    parse_line,
    parse_step,
    scan_batch,
    scan_steps,
    strip_ansi,
    summarize_nccl,
)

REPO = Path(__file__).resolve().parents[2]
FIXTURES = next(
    (
        p
        # A copy ships in tests/data/logs (licences in its README); ../shared is the original.
        for p in (
            REPO / "tests/data/logs",
            REPO / "shared/fixtures/logs",
            REPO.parent / "shared/fixtures/logs",
        )
        if p.is_dir()
    ),
    REPO.parent / "shared/fixtures/logs",
)
IB = FIXTURES / "01_ib_multinode_vllm_ray_prefixed.log"
SOCKET = FIXTURES / "02_socket_fallback_vllm_ray_ansi.log"
EFA = FIXTURES / "04_efa_ofi_nccltests_openmpi_prefixed.log"

needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason="shared log fixtures missing")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# ---- real logs ------------------------------------------------------------------------------


@needs_fixtures
def test_ib_log_ground_truth() -> None:
    lines = _lines(IB)
    s = summarize_nccl(lines)
    assert s.versions == {"2.21.5"}
    assert s.networks == {"IB"}
    assert s.hosts == {"deepseek-v2-5-0", "deepseek-v2-5-0-1"}
    assert s.warnings == 0  # README: no NCCL WARN in this log
    assert s.gdrdma and "NET/IB/GDRDMA" in s.transports and "P2P/IPC/read" in s.transports
    parsed = [parse_line(x) for x in lines]
    assert not any(p.error for p in parsed)
    ray = [p for p in parsed if "ray" in p.prefixes]
    assert ray and all(not p.text.startswith("(RayWorkerWrapper") for p in ray)
    assert {p.host for p in ray if p.host.startswith("10.")} == {"10.244.1.107"}
    # Ray's dedup suffix is taken off the text and counted.
    assert any(p.repeated == 14 and "repeated" not in p.text for p in parsed)
    # vLLM's "error message ... can be ignored" warning is not an error.
    assert classify_error(lines[11]) is None


@needs_fixtures
def test_socket_log_ansi_stripped_and_socket_fallback() -> None:
    raw = _lines(SOCKET)
    assert any("\x1b[" in x for x in raw)
    parsed = [parse_line(x) for x in raw]
    assert not any("\x1b" in p.text for p in parsed)
    s = summarize_nccl(raw)
    assert s.networks == {"Socket"}
    assert s.ib_no_device
    assert "NET/Socket" in s.transports and not s.gdrdma
    assert s.hosts == {"deepseek-v2-5-0", "deepseek-v2-5-0-1"}
    # The ANSI-wrapped Ray prefix is recognised once the colour codes are gone.
    p = parse_line(raw[53])
    assert p.prefixes == ("ray",) and p.host == "10.244.1.228"
    assert p.kind is LineKind.NCCL_INFO


@needs_fixtures
def test_efa_openmpi_log_ranks_hosts_and_init() -> None:
    lines = _lines(EFA)
    parsed = [parse_line(x) for x in lines]
    assert all(p.prefixes == ("openmpi",) and p.stream == "stdout" for p in parsed)
    assert {p.rank for p in parsed} == set(range(16))
    s = summarize_nccl(lines)
    assert s.init_complete == 16
    assert {r for _, r in s.init_ranks} == set(range(16))
    assert s.networks == {"AWS Libfabric"}
    assert s.gdrdma and "P2P/IPC/read" in s.transports
    assert s.versions == {"2.9.9"}
    assert s.avg_busbw_gbps == pytest.approx(11.2432)
    # ranks 0-7 on worker-0, 8-15 on worker-1 (from NCCL's own host:pid:tid headers)
    host_of: dict[int, set[str]] = {}
    for p in parsed:
        if p.nccl_host and p.rank is not None:
            host_of.setdefault(p.rank, set()).add(p.nccl_host)
    assert all(h == {"nccl-tests-efa-16-worker-0"} for r, h in host_of.items() if r < 8)
    assert all(h == {"nccl-tests-efa-16-worker-1"} for r, h in host_of.items() if r >= 8)
    kinds = Counter(p.kind for p in parsed)
    assert kinds[LineKind.NCCL_INFO] > 400 and kinds[LineKind.NCCL_WARN] == 0


@needs_fixtures
def test_spliced_fixture_line_keeps_going() -> None:
    # Line 50 of the socket log: NCCL line cut mid-word and spliced with a Ray-prefixed line.
    raw = _lines(SOCKET)[49]
    p = parse_line(raw)
    assert "\x1b" not in p.text and p.text.startswith("deepseek-v2-5-0:")


# ---- prefixes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "rank", "local_rank", "node", "host", "text", "prefixes"),
    [
        ("[default3]:hello", None, 3, None, "", "hello", ("torchrun",)),
        ("[rank5]:hello", 5, None, None, "", "hello", ("torchrun",)),
        ("[default1]:[rank9]:x", 9, 1, None, "", "x", ("torchrun", "torchrun")),
        ("[trainer-0:2]:x", None, 2, None, "trainer-0", "x", ("torchrun",)),
        ("[1,7]<stderr>:boom", 7, None, None, "", "boom", ("openmpi",)),
        ("worker-3: [default0]:x", None, 0, None, "worker-3", "x", ("pdsh", "torchrun")),
        ("10.0.0.2: [rank2]:x", 2, None, None, "10.0.0.2", "x", ("pdsh", "torchrun")),
        ("(head, rank=0, pid=123) [default1]:x", None, 1, 0, "head", "x", ("skypilot", "torchrun")),
        (
            "(worker1, rank=1, pid=77, ip=10.1.2.3) [default0]:[rank8]:x",
            8,
            0,
            1,
            "10.1.2.3",
            "x",
            ("skypilot", "torchrun", "torchrun"),
        ),
        ("(RayWorkerWrapper pid=5, ip=1.2.3.4) x", None, None, None, "1.2.3.4", "x", ("ray",)),
        ("trainer/1 [3]:x", None, 3, 1, "", "x", ("torchx",)),
        ("Warning: not a host", None, None, None, "", "Warning: not a host", ()),
        (
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            None,
            None,
            None,
            "",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            (),
        ),
    ],
)
def test_prefixes(
    raw: str,
    rank: int | None,
    local_rank: int | None,
    node: int | None,
    host: str,
    text: str,
    prefixes: tuple[str, ...],
) -> None:
    p = parse_line(raw)
    assert (p.rank, p.local_rank, p.node, p.host, p.text, p.prefixes) == (
        rank,
        local_rank,
        node,
        host,
        text,
        prefixes,
    )


def test_local_rank_becomes_global_with_node_context() -> None:
    assert parse_line("[default3]:x", node=2, gpus_per_node=8).rank == 19
    # SkyPilot's rank= is the node rank: with gpus_per_node known, local 1 on node 1 is rank 9.
    assert parse_line("(worker1, rank=1, pid=2) [default1]:x", gpus_per_node=8).rank == 9


def test_ansi_wrapped_prefix() -> None:
    p = parse_line("\x1b[36m[default2]:\x1b[0m\x1b[31mRuntimeError: bad\x1b[0m")
    assert p.local_rank == 2 and p.text == "RuntimeError: bad"
    assert p.error is ErrorKind.EXCEPTION
    assert strip_ansi("plain") == "plain"
    assert strip_ansi("cut \x1b[3") == "cut "


# ---- classification -----------------------------------------------------------------------------

ERRORS = [
    ("Traceback (most recent call last):", ErrorKind.TRACEBACK),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has",
        ErrorKind.CUDA_OOM,
    ),
    (
        "host:1:2 [0] misc/socket.cc:49 NCCL WARN Net : Connection closed by remote peer",
        ErrorKind.NCCL_WARN,
    ),
    (
        "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
        "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600086 milliseconds before timing out.",
        ErrorKind.WATCHDOG_TIMEOUT,
    ),
    ("[Rank 1] NCCL communicator was aborted on rank 1.", ErrorKind.COMM_ABORTED),
    (
        "RuntimeError: NCCL error in: ../torch/csrc/...: unhandled system error",
        ErrorKind.NCCL_ERROR,
    ),
    (
        "torch.distributed.DistNetworkError: The client socket has timed out after 60s while trying "
        "to connect to (10.0.0.1, 29500).",
        ErrorKind.RENDEZVOUS,
    ),
    ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: x", ErrorKind.RENDEZVOUS),
    (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        ErrorKind.CHILD_FAILED,
    ),
    ("ValueError: bad shape", ErrorKind.EXCEPTION),
]


@pytest.mark.parametrize(("line", "kind"), ERRORS)
def test_errors(line: str, kind: ErrorKind) -> None:
    assert classify_error(line) is kind
    assert parse_line(f"[default0]:{line}").error is kind


@pytest.mark.parametrize(
    "line",
    [
        "INFO 04-20 [x.py:1] The following error message 'x' can be ignored.",
        "[dtrain] step=1/2 loss=2.0 tokens_per_s=1.0 step_time_s=1.0 mem_gb=0.1",
        "host:1:1 [0] NCCL INFO NET/IB : No device found.",
        "  [0]:",  # a ChildFailedError table index is not a rank and not an error
    ],
)
def test_not_errors(line: str) -> None:
    assert classify_error(line) is None


def test_nccl_and_torch_dist_kinds() -> None:
    assert parse_line("h:1:2 [0] NCCL INFO Using network IB").kind is LineKind.NCCL_INFO
    assert parse_line("h:1:2 [0] NCCL WARN Cuda failure").kind is LineKind.NCCL_WARN
    assert parse_line("NCCL version 2.21.5+cuda12.4").kind is LineKind.NCCL_INFO
    line = "[I ProcessGroupNCCL.cpp:686] [Rank 0] ProcessGroupNCCL initialization options: ..."
    assert parse_line(line).kind is LineKind.TORCH_DIST
    w = "[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500"
    assert parse_line(w).kind is LineKind.TORCH_DIST
    batch = ["a", "h:1:2 [0] NCCL INFO x", w, "b"]
    assert scan_batch(batch).nccl == [batch[1], w]
    assert scan_batch(["plain", "text"]).nccl == []


def test_step_lines() -> None:
    line = "[dtrain] step=7/100 loss=2.3456 tokens_per_s=12345.6 step_time_s=0.25 mem_gb=1.5"
    s = parse_step(line)
    assert s is not None and (s.step, s.total, s.loss, s.mem_gb) == (7, 100, 2.3456, 1.5)
    p = parse_line("[default1]:" + line)
    assert p.kind is LineKind.STEP and p.step == s
    assert parse_line("[dtrain] done steps=100 time_s=12.5").kind is LineKind.DONE
    assert parse_step(line[:40]) is None  # cut
    assert parse_step(line.replace("2.3456", "2.3.4")) is None  # garbled number
    assert scan_steps(["x", line, line.replace("7/", "8/")])[1].step == 8
    assert scan_batch(["ok", "Traceback (most recent call last):", "fine"]).errors == [
        (1, ErrorKind.TRACEBACK)
    ]


# ---- broken input never raises ----------------------------------------------------------------


def test_cut_and_wrapped_lines() -> None:
    line = "(worker1, rank=1, pid=77, ip=10.1.2.3) [default0]:[rank8]:h:1:2 [0] NCCL WARN x"
    for i in range(len(line) + 1):
        parse_line(line[:i])
        parse_line(line[i:])
    wrapped = [line[i : i + 20] for i in range(0, len(line), 20)]
    assert [parse_line(w).text for w in wrapped]  # continuation pieces stay plain text


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "[default0]:",
                "[rank12]:",
                "[1,3]<stdout>:",
                "node-1: ",
                "(head, rank=0, pid=1) ",
                "(Actor pid=3, ip=1.2.3.4) ",
                "\x1b[36m",
                "\x1b[0m",
                "\x1b[",
                "NCCL WARN ",
                "[dtrain] step=",
                "1/2 loss=",
                "Traceback (most recent call last):",
                " [repeated 3x across cluster]",
                "\r",
                "\t",
                "é",
                "(",
                "[",
                ":",
            ]
        ),
        max_size=12,
    ),
    st.text(max_size=40),
)
def test_never_crashes_on_spliced_pieces(pieces: list[str], tail: str) -> None:
    raw = "".join(pieces) + tail
    p = parse_line(raw)
    assert isinstance(p.text, str) and "\x1b" not in p.text or "\x1b" in tail
    scan_batch([raw, tail])
    scan_steps([raw])
