"""A followed run directory from someone else, or whose logs change under the follower: symlinks
are not read (one line says so), a truncated or rotated log is followed on with every new line,
and a run.json no run will ever finish (unknown state, no launcher) ends the follow."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cli.monitor_cmd import follow
from engine.fsio import atomic_write_text
from engine.monitor.tail import RunDirSource
from engine.rundir.events import Event, LineBatch, RunStateChanged
from engine.rundir.launcher import launcher_record

REPO = Path(__file__).resolve().parents[2]
SECRET = "root:$6$secret-hash:19000:0:99999:7:::"


def _run(run: Path, state: str = "succeeded", **extra: object) -> None:
    info = {
        "state": state,
        "world_size": 1,
        "nodes": 1,
        "ranks": [{"rank": 0, "node_rank": 0, "host": "localhost", "exit_code": 0}],
        **extra,
    }
    atomic_write_text(run / "run.json", json.dumps(info))


def _secret(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text(SECRET + "\n")
    (outside / "rank0.stdout.log").write_text(SECRET + "\n")
    return outside


def test_a_symlinked_log_is_not_shown_and_one_line_says_so(tmp_path: Path) -> None:
    outside = _secret(tmp_path)
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank0.stdout.log").symlink_to(outside / "shadow")
    (run / "logs" / "rank0.stderr.log").write_text("real line\n")
    _run(run)
    out = io.StringIO()
    follow(run, out)
    text = out.getvalue()
    assert "secret-hash" not in text, text
    assert "[rank 0] real line" in text
    notes = [x for x in text.splitlines() if "rank0.stdout.log" in x]
    assert len(notes) == 1 and "symlink" in notes[0] and "not read" in notes[0], text


def test_a_symlinked_logs_dir_is_not_read_and_one_line_says_so(tmp_path: Path) -> None:
    outside = _secret(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "logs").symlink_to(outside)
    _run(run)
    out = io.StringIO()
    follow(run, out)
    text = out.getvalue()
    assert "secret-hash" not in text, text
    notes = [x for x in text.splitlines() if "logs" in x]
    assert len(notes) == 1 and "symlink" in notes[0], text


def test_a_fifo_log_never_blocks_the_follow(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    os.mkfifo(tmp_path / "logs" / "rank0.stdout.log")
    (tmp_path / "logs" / "rank0.stderr.log").write_text("after\n")
    _run(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(tmp_path), "--follow"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[rank 0] after" in proc.stdout and "FIFO" in proc.stdout, proc.stdout


# ---- truncation and rotation while followed -----------------------------------------------


class _Follower:
    def __init__(self, run: Path) -> None:
        self.src = RunDirSource(run, rescan_s=0.0)
        self.src.start()
        self.lines: list[str] = []
        self.events: list[Event] = []

    def until(self, want: list[str], timeout: float = 30.0) -> None:
        """Poll until ``want`` ends what was shown (or the deadline)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.lines[-len(want) :] == want:
                return
            for ev in self.src.poll(0.05):
                self.events.append(ev)
                if isinstance(ev, LineBatch):
                    self.lines.extend(ev.lines)
        raise AssertionError(f"never showed {want[-1]!r}; got {self.lines[-5:]}")


def _live(run: Path) -> None:
    (run / "logs").mkdir()
    _run(run, "running", launcher=launcher_record())


def test_a_truncated_log_is_followed_from_its_start(tmp_path: Path) -> None:
    _live(tmp_path)
    log = tmp_path / "logs" / "rank0.stdout.log"
    old = [f"old line {i:04d} with some padding to make it long" for i in range(200)]
    log.write_text("".join(x + "\n" for x in old))
    f = _Follower(tmp_path)
    f.until(old)
    with open(log, "w") as fh:  # copytruncate: the same file, emptied, written again
        fh.write("".join(f"new {i}\n" for i in range(86)))
    f.until([f"new {i}" for i in range(86)])
    assert f.lines == old + [f"new {i}" for i in range(86)]


def test_a_rotated_log_is_read_to_its_end_then_the_new_one_followed(tmp_path: Path) -> None:
    _live(tmp_path)
    log = tmp_path / "logs" / "rank0.stdout.log"
    log.write_text("".join(f"a {i}\n" for i in range(50)))
    f = _Follower(tmp_path)
    f.until([f"a {i}" for i in range(50)])
    with open(log, "a") as fh:  # the writer's last lines into the old file, then the rename
        fh.write("a last\n")
    os.rename(log, log.with_name("rank0.stdout.log.1"))
    log.write_text("".join(f"b {i}\n" for i in range(86)))
    f.until([f"b {i}" for i in range(86)])
    with open(log, "a") as fh:  # and the new file is followed on
        fh.write("b more\n")
    f.until(["b more"])
    want = [f"a {i}" for i in range(50)] + ["a last"] + [f"b {i}" for i in range(86)]
    assert f.lines == [*want, "b more"]


# ---- a run.json no run will finish --------------------------------------------------------


def test_an_unknown_state_ends_the_follow_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.stdout.log").write_text("hello\n")
    _run(tmp_path, "paused", launcher=launcher_record())
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(tmp_path), "--follow"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[rank 0] hello" in proc.stdout
    said = [x for x in proc.stdout.splitlines() if "'paused'" in x]
    assert len(said) == 1 and said[0].startswith("[run] failed: "), proc.stdout


def test_no_launcher_and_nothing_changing_ends_the_follow(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rank0.stdout.log").write_text("hello\n")
    _run(tmp_path, "running")
    src = RunDirSource(tmp_path, no_launcher_quiet_s=0.5)
    states: list[RunStateChanged] = []
    deadline = time.monotonic() + 30
    while not src.done and time.monotonic() < deadline:
        states += [e for e in src.poll(0.1) if isinstance(e, RunStateChanged)]
    assert src.done
    assert states[-1].state == "failed" and "no launcher" in states[-1].message
