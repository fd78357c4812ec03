"""engine.monitor.tail (tailing a run directory) and ``dtrain-tui monitor RUN_DIR --follow``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cli import main
from cli.monitor_cmd import follow
from engine.errors import DtrainError
from engine.fsio import atomic_write_text
from engine.monitor.tail import RunDirSource
from engine.rundir.events import LineBatch, RankExit, RunStateChanged

REPO = Path(__file__).resolve().parents[2]


def write_run(
    run: Path, state: str, exits: dict[int, int | None] | None = None, **extra: object
) -> None:
    exits = exits or {}
    ranks = [
        {
            "rank": r,
            "node_rank": r // 2,
            "local_rank": r % 2,
            "host": "localhost",
            "exit_code": exits.get(r),
        }
        for r in range(4)
    ]
    info = {"state": state, "world_size": 4, "nodes": 2, "ranks": ranks, **extra}
    atomic_write_text(run / "run.json", json.dumps(info))


def drain(src: RunDirSource, timeout: float = 10.0) -> list[object]:
    out: list[object] = []
    deadline = time.monotonic() + timeout
    while not src.done and time.monotonic() < deadline:
        out += src.poll(0.05)
    assert src.done
    return out


def test_finished_run_reads_every_line_then_exits_then_state(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(4):
        (logs / f"rank{r}.stdout.log").write_text("".join(f"r{r} {i}\n" for i in range(1000)))
    (logs / "rank3.stderr.log").write_text(
        "Traceback (most recent call last):\nboom"
    )  # no final \n
    (logs / "node1.log").write_text("launcher chatter\n")
    write_run(tmp_path, "failed", {0: 0, 1: 0, 2: 0, 3: 1}, failed_rank=3, reason="rank 3 exited 1")
    src = RunDirSource(tmp_path, chunk_bytes=4096)
    src.start()
    assert src.world_size == 4
    events = drain(src)
    per: dict[tuple[int | None, str], list[str]] = {}
    for ev in events:
        if isinstance(ev, LineBatch):
            per.setdefault((ev.rank, ev.stream), []).extend(ev.lines)
    for r in range(4):
        assert per[(r, "stdout")] == [f"r{r} {i}" for i in range(1000)]
    assert per[(3, "stderr")] == ["Traceback (most recent call last):", "boom"]
    assert per[(None, "stdout")] == ["launcher chatter"]
    kinds = [type(e).__name__ for e in events]
    last_line = max(i for i, k in enumerate(kinds) if k == "LineBatch")
    exits = [e for e in events if isinstance(e, RankExit)]
    assert min(events.index(e) for e in exits) > last_line
    assert {(e.rank, e.exit_code) for e in exits} == {(0, 0), (1, 0), (2, 0), (3, 1)}
    assert next(e for e in exits if e.rank == 3).reason == "rank 3 exited 1"
    assert next(e for e in exits if e.rank == 3).node == 1
    assert isinstance(events[-1], RunStateChanged) and events[-1].state == "failed"
    assert events[-1].failed_ranks == (3,)


def test_live_run_is_tailed_until_it_ends(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    write_run(tmp_path, "running")
    src = RunDirSource(tmp_path, rescan_s=0.0)
    src.start()
    got: list[str] = []

    def writer() -> None:
        with open(tmp_path / "logs" / "rank0.stdout.log", "a") as f:
            for i in range(500):
                f.write(f"line {i}\n")
                if i % 50 == 0:
                    f.flush()
                    time.sleep(0.01)
            f.write("half a li")
            f.flush()
            time.sleep(0.05)
            f.write("ne\n")
        write_run(tmp_path, "succeeded", {0: 0, 1: 0, 2: 0, 3: 0})

    t = threading.Thread(target=writer)
    t.start()
    deadline = time.monotonic() + 15
    while not src.done and time.monotonic() < deadline:
        for ev in src.poll(0.05):
            if isinstance(ev, LineBatch):
                got.extend(ev.lines)
    t.join()
    assert got == [f"line {i}" for i in range(500)] + ["half a line"]


def test_bad_run_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DtrainError, match="run.json"):
        RunDirSource(tmp_path).start()
    assert main(["monitor", str(tmp_path / "nope"), "--follow"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RUN_DIR" in err


def test_follow_prints_rank_prefixed_lines(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank2.stdout.log").write_text("a\nb\n")
    (tmp_path / "logs" / "node0.log").write_text("chatter\n")
    write_run(tmp_path, "succeeded", {0: 0, 1: 0, 2: 0, 3: 0})
    out = io.StringIO()
    assert follow(tmp_path, out) == 0
    text = out.getvalue().splitlines()
    assert "[rank 2] a" in text and "[rank 2] b" in text and "[node 0] chatter" in text
    assert text.index("[rank 2] b") < text.index("[rank 2] exited 0")
    assert text[-1] == "[run] succeeded"


def test_follow_cli_subprocess_exit_code(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank1.stderr.log").write_text("RuntimeError: boom\n")
    write_run(tmp_path, "failed", {0: 0, 1: 1, 2: 0, 3: 0}, failed_rank=1, reason="rank 1 exited 1")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(tmp_path), "--follow", "--errors-only"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "[rank 1] RuntimeError: boom" in proc.stdout
    assert "[rank 1] failed 1 (rank 1 exited 1)" in proc.stdout


def test_the_reaper_writes_run_json_as_run_record_reads_it(tmp_path: Path) -> None:
    """The reaper runs as a bare script with its own copy of the final states and its own patch
    of run.json: both must agree with RunRecord."""
    from engine.launch import reaper
    from engine.rundir.record import FINAL_STATES, RunRecord, RunState, read_record

    assert set(reaper.FINAL_STATES) == set(FINAL_STATES)
    write_run(tmp_path, "running", {0: 0})
    reaper.mark_launcher_died(tmp_path, 12345)
    rec = read_record(tmp_path)
    assert rec.state == RunState.FAILED and rec.launcher_died and rec.ended_at
    assert rec.reason.startswith("launcher died (pid 12345)")
    assert [r.reason for r in rec.ranks] == ["", "stopped", "stopped", "stopped"]
    assert set(json.loads((tmp_path / "run.json").read_text())) <= set(RunRecord.model_fields)
