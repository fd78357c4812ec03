"""Commands the documentation shows, run as a user runs them (a real ``python -m cli`` subprocess):
what they print must agree with itself and with what the pages claim (docs/planning.md's usable
memory, docs/monitor.md's stuck-rank example, the gpus table). That every command of the README
and the docs runs as written is tests/test_docs.py's check."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_plan_table_states_the_usable_memory_the_decision_path_used() -> None:
    """The memory table's ``(usable: X GiB of Y)`` footer is the figure the planner judged fit by
    (76.1 GiB of an 80 GiB part less the 3 % headroom a dense plan keeps), not a fixed 90 %."""
    r = _cli(
        "plan",
        "--model",
        "llama-2-7b",
        "--gpu",
        "a100-80gb",
        "--gpus-per-node",
        "8",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
    )
    assert r.returncode == 0, r.stderr
    path = re.search(r"of ([\d.]+) GiB usable", r.stdout)
    table = re.search(r"\(usable: ([\d.]+) GiB of 80\.0[;)]", r.stdout)
    assert path and table, r.stdout
    assert table.group(1) == path.group(1) == "73.8"


def test_launch_words_a_rank_exit_as_monitor_follow_does() -> None:
    """``launch`` printed ``[rank 0] exited: None stopped`` for a rank it stopped after a hang
    (the stuck-rank example of docs/monitor.md); it says ``stopped`` / ``failed SIGKILL (…)`` as
    ``monitor --follow`` does."""
    import io

    from cli.launch_cmd import _print_events
    from engine.rundir.events import RankExit

    out = io.StringIO()
    _print_events(
        [
            RankExit(node=0, rank=0, exit_code=None, reason="stopped"),
            RankExit(node=0, rank=1, exit_code=-9, reason="killed"),
            RankExit(node=0, rank=2, exit_code=0),
        ],
        out,
    )
    assert out.getvalue() == "[rank 0] stopped\n[rank 1] failed SIGKILL (killed)\n"


def test_gpus_table_columns_line_up() -> None:
    """``dtrain-tui gpus``: every row's memory ends in the header's column, also for a key wider
    than the others (``h100-sxm-500w`` pushed its row two columns right)."""
    r = _cli("gpus")
    assert r.returncode == 0, r.stderr
    table = r.stdout.split("\n\n")[0].splitlines()
    end = table[0].index("memory") + len("memory")
    assert len(table) > 10
    assert all(row.index("GiB") + len("GiB") == end for row in table[1:]), r.stdout
    h100 = next(row.split() for row in table if row.startswith("h100-sxm "))
    assert h100[1] == "h100", h100  # the README's `--gpu h100` is in the list
    nets = r.stdout.split("\n\n")[1].splitlines()
    assert "pick it for" in nets[0] and "NDR" in next(x for x in nets if x.startswith("ib-ndr"))
