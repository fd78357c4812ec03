"""A failed run's summary carries the blamed rank's own error line (``launch --script fail.py``
said only "exit code 2"): the exception its Traceback ends with, the interpreter's "can't open
file" for a wrong script (which ``--errors-only`` and the error list now keep too); read from
the run directory only, and nothing at all where nothing can be read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cli import launch_cmd
from engine.monitor.logparse import classify_error
from engine.monitor.root_error import TAIL_BYTES, failure_line, rank_error_line

TRACEBACK = [
    "[dtrain] step=1/20 loss=2.9",
    "Traceback (most recent call last):",
    '  File "/work/fail.py", line 6, in <module>',
    "    1 / 0",
    "ZeroDivisionError: division by zero",
]
CANT_OPEN = (
    "/usr/bin/python: can't open file '/run/bundle/fail.py': [Errno 2] No such file or directory"
)


def run_dir(tmp_path: Path, failed_rank: int | None, logs: dict[str, list[str]]) -> Path:
    (tmp_path / "logs").mkdir(parents=True)
    for name, lines in logs.items():
        (tmp_path / "logs" / name).write_text("\n".join(lines) + "\n")
    ranks = [{"rank": r, "node_rank": 0, "local_rank": r} for r in (0, 1)]
    info = {"state": "failed", "world_size": 2, "ranks": ranks, "failed_rank": failed_rank}
    (tmp_path / "run.json").write_text(json.dumps(info))
    return tmp_path


def test_the_blamed_ranks_exception_is_the_line(tmp_path: Path) -> None:
    run = run_dir(
        tmp_path,
        1,
        {
            "rank0.stderr.log": ["RuntimeError: peer went away"],
            "rank1.stdout.log": ["[dtrain] step=1/20 loss=2.9"],
            "rank1.stderr.log": TRACEBACK[1:],
        },
    )
    assert failure_line(run) == "rank 1: ZeroDivisionError: division by zero"


def test_a_script_that_cannot_be_opened_is_an_error_line(tmp_path: Path) -> None:
    assert classify_error(CANT_OPEN) is not None  # --errors-only, the error list keep it
    run = run_dir(tmp_path, 0, {"rank0.stderr.log": [CANT_OPEN]})
    assert failure_line(run) == f"rank 0: {CANT_OPEN}"


def test_a_bare_traceback_header_is_taken_only_when_nothing_states_the_error(
    tmp_path: Path,
) -> None:
    run = run_dir(tmp_path, 1, {"rank1.stderr.log": ["Traceback (most recent call last):"]})
    assert rank_error_line(run, 1) == "Traceback (most recent call last):"
    assert rank_error_line(run, 0) == ""


def test_no_blamed_rank_or_no_error_line_gives_nothing(tmp_path: Path) -> None:
    assert failure_line(run_dir(tmp_path / "a", None, {"rank1.stderr.log": TRACEBACK})) == ""
    assert failure_line(run_dir(tmp_path / "b", 1, {"rank1.stdout.log": ["hello"]})) == ""
    assert failure_line(tmp_path / "missing") == ""


def test_only_the_logs_end_is_read_and_a_symlinked_log_not_at_all(tmp_path: Path) -> None:
    filler = ["x" * 100] * (2 * TAIL_BYTES // 100)
    run = run_dir(tmp_path / "big", 1, {"rank1.stderr.log": ["OldError: early", *filler]})
    assert rank_error_line(run, 1) == ""  # the early line lies before the tail searched
    secret = tmp_path / "secret.log"
    secret.write_text("ZeroDivisionError: not this run's\n")
    run = run_dir(tmp_path / "link", 1, {})
    os.symlink(secret, run / "logs" / "rank1.stderr.log")
    assert failure_line(run) == ""


class FakeBackend:
    """What ``launch``'s drive loop reads of a backend that already ended ``failed``."""

    def __init__(self, path: Path) -> None:
        reason = "rank 1 on node 0 (localhost) exited with exit code 1"
        self.run = SimpleNamespace(path=path, record=SimpleNamespace(reason=reason))
        self.state = "failed"
        self.done = True
        self.stopping = False

    def exit_code(self) -> int:
        return 1


def test_launch_summary_carries_the_rank_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = run_dir(tmp_path, 1, {"rank1.stderr.log": TRACEBACK})
    stop: Any = SimpleNamespace(got=[])
    assert launch_cmd._drive(FakeBackend(run), stop, quiet=True) == 1
    summary = capsys.readouterr().err.strip().splitlines()[-1]
    assert summary == (
        "dtrain-tui: run failed: rank 1 on node 0 (localhost) exited with exit code 1; "
        f"rank 1: ZeroDivisionError: division by zero ({run})"
    )
