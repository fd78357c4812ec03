"""Local backend, for real: torchrun over gloo on CPU with the shipped example trainer.

Each run is a few seconds of torch start-up, so cases are combined: one test per bundle kind
checks tagging, run directory, run.json and the CLI's output together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.launch import LaunchOptions
from engine.launch.local import LocalBackend
from engine.rundir.events import LineEvent, RankExit, RunStateChanged, per_line
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, make_bundle, rank_pid, wait_no_pids, write_bundle

pytestmark = pytest.mark.slow

STEP_RE = re.compile(
    r"^\[dtrain\] step=(\d+)/(\d+) loss=\S+ tokens_per_s=\S+ step_time_s=\S+ mem_gb=\S+$"
)


def _steps(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := STEP_RE.match(line))]


def _torchrun_own_log(run: Path, local_rank: int) -> list[str]:
    """torchrun's own per-rank copy (--log-dir): ground truth for which rank printed what."""
    files = sorted((run / "bundle" / "logs").glob(f"*/attempt_0/{local_rank}/stdout.log"))
    assert len(files) == 1, files
    return files[0].read_text().splitlines()


@pytest.mark.parametrize(
    ("kind", "args", "marker"),
    [
        ("deepspeed", ["--framework", "deepspeed", "--strategy", "zero2"], "framework=deepspeed"),
        ("fsdp", ["--framework", "fsdp", "--strategy", "fsdp-full"], "framework=fsdp"),
    ],
)
def test_local_launch_tags_every_line_with_its_rank(
    tmp_path: Path, kind: str, args: list[str], marker: str
) -> None:
    bundle = write_bundle(tmp_path / "b", *args, steps=3)
    run = tmp_path / "run"
    backend = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=120))
    backend.start()
    events = collect(backend)

    assert backend.state == "succeeded", read_run(run)
    assert backend.exit_code() == 0
    lines = {
        r: [
            e.line
            for e in events
            if isinstance(e, LineEvent) and e.rank == r and e.stream == "stdout"
        ]
        for r in (0, 1)
    }
    for r in (0, 1):
        assert _steps(lines[r]) == [1, 2, 3], lines[r]
        # Our attribution equals torchrun's own per-rank log.
        own = [ln for ln in _torchrun_own_log(run, r) if ln.startswith("[dtrain]")]
        ours = [ln for ln in lines[r] if ln.startswith("[dtrain]")]
        assert ours == own
        # Every line shown is in the run directory, in order.
        on_disk = (run / "logs" / f"rank{r}.stdout.log").read_text().splitlines()
        assert on_disk == lines[r]
    assert any(marker in ln for ln in lines[0])  # only rank 0 prints the start line
    assert not any(ln.startswith("[dtrain] start") for ln in lines[1])
    assert not any(isinstance(e, LineEvent) and e.rank is not None and e.rank > 1 for e in events)

    info = read_run(run)
    assert info["state"] == "succeeded"
    assert [
        (r["rank"], r["node_rank"], r["local_rank"], r["exit_code"]) for r in info["ranks"]
    ] == [
        (0, 0, 0, 0),
        (1, 0, 1, 0),
    ]
    assert info["started_at"] and info["ended_at"]
    assert (run / "plan.json").is_file() and (run / "bundle" / "bundle.json").is_file()
    assert "launch_node0.sh" in (run / "commands" / "node0.txt").read_text()
    exits = [e for e in events if isinstance(e, RankExit)]
    assert sorted((e.rank, e.exit_code) for e in exits) == [(0, 0), (1, 0)]
    states = [e.state for e in events if isinstance(e, RunStateChanged)]
    assert states[0] == "starting" and states[-1] == "succeeded"
    assert wait_no_pids(backend.run_id) == []


def test_sigkill_one_rank_fails_the_run_naming_it_and_leaves_no_process(tmp_path: Path) -> None:
    bundle = make_bundle(
        tmp_path / "b", steps=200, script_args=["--bundle", ".", "--sleep-per-step", "0.2"]
    )
    run = tmp_path / "run"
    backend = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=120))
    backend.start()
    events: list[object] = []
    deadline = time.monotonic() + 120
    while not any(isinstance(e, LineEvent) and e.rank == 1 and "step=2/" in e.line for e in events):
        assert time.monotonic() < deadline and not backend.done, "rank 1 never reached step 2"
        events.extend(per_line(backend.poll(0.2)))
    pid = rank_pid(backend.run_id, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    events.extend(collect(backend, timeout=60))

    assert backend.state == "failed"
    assert backend.exit_code() == 1
    info = read_run(run)
    assert info["state"] == "failed"
    assert info["failed_rank"] == 1 and info["failed_node"] == 0
    assert "rank 1 on node 0 (localhost)" in info["reason"] and "SIGKILL" in info["reason"]
    codes = {r["rank"]: r["exit_code"] for r in info["ranks"]}
    assert codes[1] == -9
    assert codes[0] != 0  # stopped by torchrun after rank 1 died
    final = [e for e in events if isinstance(e, RunStateChanged)][-1]
    assert final.state == "failed" and final.failed_ranks == (1,)
    assert wait_no_pids(backend.run_id) == []


def _fake_bundle(tmp_path: Path, body: str) -> Path:
    """A bundle whose node script is plain bash (no torch): cheap fault cases."""
    b = make_bundle(tmp_path / "fake", steps=1)
    (b / "launch_node0.sh").write_text("#!/usr/bin/env bash\nset -u\n" + body)
    return b


def test_hang_is_detected_and_stop_kills_processes_in_other_sessions(tmp_path: Path) -> None:
    # A rank that prints once, then hangs; a grandchild in a session of its own (as torchrun's
    # ranks are) must not survive.
    body = (
        "echo '[default0]:[dtrain] step=1/9 loss=1 tokens_per_s=1 step_time_s=1 mem_gb=0'\n"
        "setsid sleep 300 &\n"
        "sleep 300\n"
    )
    b = _fake_bundle(tmp_path, body)
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=1.5))
    backend.start()
    collect(backend, timeout=60)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    assert "hang" in info["reason"] and "1.5" in info["reason"]
    assert wait_no_pids(backend.run_id) == []


def test_stop_ends_stopped_and_kills_everything(tmp_path: Path) -> None:
    b = _fake_bundle(tmp_path, "echo '[default1]:hello'\nsetsid sleep 300 &\nsleep 300\n")
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    backend.start()
    got: list[object] = []
    while not any(isinstance(e, LineEvent) and e.rank == 1 for e in got):
        got.extend(per_line(backend.poll(0.2)))
    # A line is on disk before any consumer sees it.
    assert (tmp_path / "run" / "logs" / "rank1.stdout.log").read_text() == "hello\n"
    backend.stop()
    collect(backend, timeout=30)
    assert backend.state == "stopped"
    assert read_run(tmp_path / "run")["state"] == "stopped"
    assert wait_no_pids(backend.run_id) == []
    assert (tmp_path / "run" / "logs" / "rank1.stdout.log").read_text() == "hello\n"


def test_cli_write_then_launch_trains_and_exits_0(tmp_path: Path) -> None:
    """The issue's own commands, as a user types them (tiny step count to stay fast)."""
    exe = [sys.executable, "-m", "cli"]
    b, r = tmp_path / "B", tmp_path / "R"
    w = subprocess.run(
        [*exe, "write", "--layers", "4", "--hidden", "256", "--heads", "4", "--vocab", "1024",
         "--gpu", "cpu", "--gpus-per-node", "2", "--nodes", "1", "--seq-len", "64",
         "--global-batch", "8", "--steps", "2", "--out", str(b)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert w.returncode == 0, w.stderr
    p = subprocess.run(
        [*exe, "launch", str(b), "--backend", "local", "--run-dir", str(r)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.splitlines()
    assert any(ln.startswith("[rank 0] [dtrain] step=2/2 ") for ln in out)
    assert any(ln.startswith("[rank 1] [dtrain] done steps=2 ") for ln in out)
    assert json.loads((r / "run.json").read_text())["state"] == "succeeded"
    # A bad bundle directory is one clear line, exit 2.
    bad = subprocess.run(
        [*exe, "launch", str(tmp_path / "nope"), "--run-dir", str(tmp_path / "R2")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "is not a bundle" in bad.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_on_the_cli_stops_every_rank_and_exits_130(tmp_path: Path, inherited: str) -> None:
    # "ignored": started as `cmd &` from a script (or a harness) leaves SIGINT ignored, and
    # Python then never turns it into KeyboardInterrupt: the launcher must take it anyway.
    b = _fake_bundle(tmp_path, "echo '[default1]:hello'\nsetsid sleep 300 &\nsleep 300\n")
    run = tmp_path / "run"
    p = subprocess.Popen(
        [sys.executable, "-m", "cli", "launch", str(b), "--run-dir", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if inherited == "ignored" else None,  # noqa: PLW1509
    )
    try:
        assert p.stdout is not None
        assert p.stdout.readline() == "[rank 1] hello\n"  # the run is going: now Ctrl-C
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 130, err
        assert "stopping every rank (Ctrl-C)" in err
        info = json.loads((run / "run.json").read_text())
        assert info["state"] == "stopped"
        assert wait_no_pids(info["run_id"]) == []
    finally:
        if p.poll() is None:  # a failure must not leave the launcher and its ranks running
            p.kill()
            p.wait(10)


def test_leftover_child_holding_the_output_does_not_keep_the_run_alive(tmp_path: Path) -> None:
    b = _fake_bundle(tmp_path, "setsid sleep 300 &\necho '[default0]:bye'\nexit 0\n")
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    backend.start()
    collect(backend, timeout=30)
    assert backend.state == "succeeded"
    assert wait_no_pids(backend.run_id) == []


def test_odd_output_is_split_per_rank_exactly_on_disk_and_in_events(tmp_path: Path) -> None:
    # Runs of one rank, interleaved ranks, lines with no rank prefix, CRLF, empty lines,
    # prefix look-alikes inside a line, bad UTF-8 and a last line with no newline. (A real tee
    # prefix inside a line is torchrun's splice of a partial line: tests/engine/
    # test_torchrun_splice.py.)
    raw = (
        b"[default0]:a1\n[default0]:a2\r\n[default1]:b1\n\nlauncher says hi\r\n"
        b"[default1]:b2 [default]:not a prefix [defaultx]:\n[default0]:\n[default]:no rank\n"
        b"[default1]:bad \xff\xfe utf8\n[default0]:a3\n[default1]:b3 no newline"
    )
    (tmp_path / "raw.bin").write_bytes(raw)
    b = _fake_bundle(tmp_path, f"cat {tmp_path / 'raw.bin'}\ncat {tmp_path / 'raw.bin'} >&2\n")
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=60))
    backend.start()
    events = collect(backend, timeout=60)

    # What each target must hold, line by line (an independent, obvious split).
    want: dict[int | None, list[bytes]] = {}
    for line in raw.split(b"\n"):
        line = line.removesuffix(b"\r")
        rank = None
        for r in (0, 1):
            if line.startswith(f"[default{r}]:".encode()):
                rank, line = r, line[len(f"[default{r}]:") :]
        want.setdefault(rank, []).append(line + b"\n")
    logs = tmp_path / "run" / "logs"
    for stream in ("stdout", "stderr"):
        for r in (0, 1):
            assert (logs / f"rank{r}.{stream}.log").read_bytes() == b"".join(want[r])
            shown = [
                e.line
                for e in events
                if isinstance(e, LineEvent) and e.rank == r and e.stream == stream
            ]
            assert shown == [x[:-1].decode("utf-8", "replace") for x in want[r]]
    # Unattributed lines of both streams go to the node log.
    assert (logs / "node0.log").read_bytes().count(b"launcher says hi\n") == 2
    assert backend.state == "succeeded"


def test_a_consumer_that_falls_behind_slows_the_readers_but_loses_nothing(tmp_path: Path) -> None:
    # Past the pump's max_pending_bytes unread, the stream reader pauses (bounded): the run still ends
    # while nobody polls, and then every line is there, in order, on disk and in the events.
    n = 3000
    body = (
        f"python3 -c 'import sys\nfor i in range({n}): "
        f'print(f"[default0]:line {{i:05d}} " + "x" * 100)\''
        "\n"
    )
    b = _fake_bundle(tmp_path, body)
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=60))
    backend.pump.max_pending_bytes = 4096
    backend.start()
    assert backend.wait(60) == "succeeded"
    events = collect(backend, timeout=10)
    want = [f"line {i:05d} " + "x" * 100 for i in range(n)]
    assert [e.line for e in events if isinstance(e, LineEvent) and e.rank == 0] == want
    assert (tmp_path / "run" / "logs" / "rank0.stdout.log").read_text().splitlines() == want
