"""``monitor RUN --export csv|json`` through the real CLI over a run directory (rank logs with
step lines and the agent's telemetry), ``--out FILE`` written whole, bad input one line; and
``monitor --follow`` printing the GPU flags and the plan-against-measured line."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from cli import main
from cli.monitor_cmd import follow
from tests.engine.test_machines import PLAN, tel

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    code: int | str | None
    out: str
    err: str


def run_cli(argv: list[str]) -> Result:
    """``cli.main`` in-process, its output caught."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str | None = main(argv)
        except SystemExit as e:
            code = e.code
    return Result(code, out.getvalue(), err.getvalue())


def step(n: int, t: float) -> str:
    return (
        f"[dtrain] step={n}/3 loss={3.0 - 0.5 * n:.2f} tokens_per_s={4096 / t:.1f} "
        f"step_time_s={t} mem_gb=1.25"
    )


def run_dir(tmp: Path) -> Path:
    logs = tmp / "logs"
    logs.mkdir(parents=True)
    (logs / "rank0.stdout.log").write_text("\n".join(step(n, 1.8) for n in (1, 2, 3)) + "\n")
    (logs / "rank0.stderr.log").write_text(tel(0) + "\n")
    throttled = tel(1, temp_c=70.0, throttle=["hw_slowdown"])
    (logs / "rank1.stdout.log").write_text("\n".join(step(n, 1.8) for n in (1, 2, 3)) + "\n")
    (logs / "rank1.stderr.log").write_text(throttled + "\nTraceback? no: a plain line\n")
    ranks = [
        {"rank": r, "node_rank": 0, "local_rank": r, "host": "h0", "exit_code": 0} for r in (0, 1)
    ]
    info = {"state": "succeeded", "world_size": 2, "ranks": ranks}
    (tmp / "run.json").write_text(json.dumps(info))
    (tmp / "plan.json").write_text(json.dumps(PLAN))
    return tmp


def test_export_csv_through_the_real_cli(tmp_path: Path) -> None:
    run = run_dir(tmp_path / "run")
    got = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(run), "--export", "csv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert got.returncode == 0, got.stderr
    rows = list(csv.DictReader(io.StringIO(got.stdout)))
    steps = [r for r in rows if r["kind"] == "step"]
    assert [(r["rank"], r["step"], r["loss"]) for r in steps][:3] == [
        ("0", "1", "2.5"),
        ("0", "2", "2.0"),
        ("0", "3", "1.5"),
    ]
    assert len(steps) == 6
    s = steps[0]
    assert (s["unit"], s["step_time_s"], s["mem_gb"], s["source"]) == (
        "tokens/s",
        "1.8",
        "1.25",
        "dtrain",
    )
    assert float(s["throughput"]) == round(4096 / 1.8, 1)
    tele = [r for r in rows if r["kind"] == "telemetry"]
    assert [(r["rank"], r["cpu_pct"], r["rss_bytes"]) for r in tele] == [
        ("0", "99.0", str(3 << 30)),
        ("1", "99.0", str(3 << 30)),
    ]
    assert (tele[1]["gpu"], tele[1]["util_pct"], tele[1]["throttle"]) == (
        "1",
        "97.0",
        "hw_slowdown",
    )
    assert tele[0]["gpu"] == ""  # rank 0 is a CPU rank


def test_export_json_to_a_file_and_bad_input_is_one_line(tmp_path: Path) -> None:
    run = run_dir(tmp_path / "run")
    out = tmp_path / "series.json"
    out.write_text("old")
    r = run_cli(["monitor", str(run), "--export", "json", "--out", str(out)])
    assert r.code == 0 and r.out == ""
    data = json.loads(out.read_text())
    assert len(data["steps"]) == 6 and len(data["telemetry"]) == 2
    assert data["steps"][-1] == {
        "rank": 1,
        "step": 3,
        "time": None,
        "loss": 1.5,
        "lr": None,
        "throughput": round(4096 / 1.8, 1),
        "unit": "tokens/s",
        "step_time_s": 1.8,
        "mem_gb": 1.25,
        "source": "dtrain",
    }
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".series.json")]  # no temp
    for argv, name in (
        (["monitor", str(run), "--export", "xml"], "--export"),
        (["monitor", str(run), "--out", str(out)], "--out"),
        (
            ["monitor", str(run), "--export", "csv", "--out", str(tmp_path)],  # a directory
            "--out",
        ),
    ):
        r = run_cli(argv)
        assert r.code == 2 and "Traceback" not in r.err, argv
        assert len(r.err.strip().splitlines()) == 1 and name in r.err, r.err
    assert json.loads(out.read_text()) == data  # a refused export leaves the file as it was


def test_follow_prints_the_gpu_flags_and_the_plan_line(tmp_path: Path) -> None:
    run = run_dir(tmp_path / "run")
    buf = io.StringIO()
    assert follow(run, buf) == 0
    text = buf.getvalue()
    assert "[gpu] GPU 1 on node 0: throttled (HW slowdown)\n" in text
    assert text.count("[gpu] ") == 1
    assert "[plan] plan vs measured (±15 %): step 1.80 s vs 1.20 s planned (+50 %)" in text
    # In text the offer is the command to run, not the TUI's key.
    assert text.rstrip().endswith(
        f"run `dtrain-tui calibrate {run}` to fit the estimates to this run"
    ), text
    assert "press k" not in text
