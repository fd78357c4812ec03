"""The output pump alone (engine.launch.pump.OutputPump): byte streams in, per-rank logs on disk
and events out, with no backend, process or supervisor around it."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from engine.launch.policy import NodeState
from engine.launch.pump import MAX_PENDING_LINE, OutputPump
from engine.launch.torchrun_output import MAX_SHOWN_LINE
from engine.rundir.events import LineEvent, per_line
from engine.rundir.files import RunDir
from tests.e2e.launch_util import make_bundle

DEADLINE_S = 60.0
NCCL_PG = (
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=8, OpType=ALLREDUCE)"
)
GLOO = "RuntimeError: [../gloo/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation"


def _pump(tmp_path: Path, nodes: int = 1) -> tuple[OutputPump, RunDir]:
    bundle = make_bundle(tmp_path / "b", nodes=nodes, hosts=[f"h{i}" for i in range(nodes)])
    run = RunDir(tmp_path / "run")
    run.create(bundle)
    states = [NodeState(node=i, host=f"h{i}") for i in range(nodes)]
    return OutputPump(run, states, 2, ended=threading.Event()), run


def _reader(chunks: list[bytes], at_end: Callable[[], None] | None = None) -> Callable[[], bytes]:
    """read() over ``chunks`` then EOF; ``at_end`` runs when the reader asks past the last
    chunk, i.e. once the pump handled every chunk before it."""
    left = list(chunks)

    def read() -> bytes:
        if not left:
            return b""
        if len(left) == 1 and at_end is not None:
            at_end()
        return left.pop(0)

    return read


def _drain(pump: OutputPump, node: int = 0) -> list[LineEvent]:
    pump.join(DEADLINE_S)
    assert pump.open_streams(node) == 0
    return [e for e in per_line(pump.take(0)) if isinstance(e, LineEvent)]


def test_lines_are_split_per_rank_and_on_disk_before_they_are_events(tmp_path: Path) -> None:
    pump, run = _pump(tmp_path)
    pump.add_stream(0, "stdout", _reader([b"[default0]:a\n[default1]:b\nchat", b"ter\n"]))
    lines = _drain(pump)
    assert [(e.rank, e.line, e.host) for e in lines] == [
        (0, "a", "h0"),
        (1, "b", "h0"),
        (None, "chatter", "h0"),
    ]
    run.close()
    logs = tmp_path / "run" / "logs"
    assert (logs / "rank0.stdout.log").read_text() == "a\n"
    assert (logs / "rank1.stdout.log").read_text() == "b\n"


def test_a_line_that_never_ends_goes_to_disk_as_it_comes_and_is_not_held(tmp_path: Path) -> None:
    # A rank printing without a newline: the old reader kept the whole line in memory (and
    # copied it on every read) until its end. Now its bytes reach the rank's log as they come
    # and the reader holds the shown part only.
    pump, run = _pump(tmp_path)
    piece = 256 << 10
    body = b"x" * (48 << 20)
    chunks = [b"[default1]:" + body[:piece]] + [
        body[i : i + piece] for i in range(piece, len(body), piece)
    ]
    log = tmp_path / "run" / "logs" / "rank1.stdout.log"
    seen: dict[str, int] = {}

    def before_the_newline() -> None:
        seen["on_disk"] = log.stat().st_size if log.exists() else 0
        seen["peak"] = tracemalloc.get_traced_memory()[1]

    tracemalloc.start()
    try:
        pump.add_stream(
            0, "stdout", _reader([*chunks, b"\n[default0]:small\n"], before_the_newline)
        )
        lines = _drain(pump)
    finally:
        tracemalloc.stop()
    assert seen["on_disk"] >= len(body) - piece - MAX_PENDING_LINE, seen
    assert seen["peak"] < 8 << 20, seen  # a few chunks, never the 48 MiB line
    assert [(e.rank, e.line) for e in lines] == [
        (1, "x" * MAX_SHOWN_LINE + f"… [{len(body) - MAX_SHOWN_LINE} bytes cut]"),
        (0, "small"),
    ]
    run.close()
    assert log.read_bytes() == body + b"\n"


def test_a_line_cut_off_by_the_stream_end_is_logged_and_shown_cut(tmp_path: Path) -> None:
    pump, run = _pump(tmp_path)
    body = "é" * (
        MAX_PENDING_LINE
    )  # two bytes a character: past the cap, the shown cut in characters
    pump.add_stream(0, "stderr", _reader([f"[default0]:{body}".encode()]))
    (line,) = _drain(pump)
    cut = len(body[MAX_SHOWN_LINE:].encode())
    assert (line.rank, line.line) == (0, "é" * MAX_SHOWN_LINE + f"… [{cut} bytes cut]")
    run.close()
    assert (tmp_path / "run" / "logs" / "rank0.stderr.log").read_text() == body + "\n"


def test_the_first_collective_timeout_line_of_a_run_is_kept(tmp_path: Path) -> None:
    pump, run = _pump(tmp_path, nodes=2)
    pump.add_stream(0, "stdout", _reader([b"[default0]:[dtrain] step=3/6\n[default0]:x\n"]))
    pump.join(DEADLINE_S)
    assert pump.timeout_line is None
    pump.add_stream(
        1, "stdout", _reader([b"[default0]:boom\n", f"[default1]:{NCCL_PG}\n".encode()])
    )
    pump.join(DEADLINE_S)
    assert pump.timeout_line == (1, 3, NCCL_PG)
    pump.add_stream(0, "stdout", _reader([f"[default1]:{GLOO}\n".encode()]))
    pump.join(DEADLINE_S)
    assert pump.timeout_line == (1, 3, NCCL_PG)  # a later one does not replace it: one diagnosis
    run.close()


def test_a_dropped_stream_marks_its_node_lost(tmp_path: Path) -> None:
    pump, run = _pump(tmp_path)

    def read() -> bytes:
        raise OSError("connection reset")

    pump.add_stream(0, "stdout", read)
    _drain(pump)
    assert pump.nodes[0].lost == "connection lost: connection reset"
    run.close()
