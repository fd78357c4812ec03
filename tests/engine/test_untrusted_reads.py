"""Every file the CLI reads that a person names or a run directory holds is read only when it is
a regular file, and only up to a cap: ``/dev/zero`` (or a symlink to it) and a FIFO in place of
any of them are one line within a deadline, never a hang, a traceback or a blown memory limit.

Each case runs the real CLI (``python -m cli``) in a subprocess under an address-space limit."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.errors import DtrainError
from engine.fsio import JSON_LIMIT, read_regular_bytes, read_regular_text
from engine.rundir.launcher import launcher_record
from tests.engine.test_calibration import TINY, make_run

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0
"""Far more than one CLI start takes on a loaded machine; a FIFO read blocks for ever."""
MEMORY_LIMIT = 3 << 30
"""Address space for each CLI run: reading /dev/zero whole would pass it in seconds."""


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _cli(*argv: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(cwd / "cfg")}
    env["XDG_DATA_HOME"] = str(cwd / "data")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=DEADLINE_S,
        preexec_fn=_limit_memory,
    )
    return proc, time.monotonic() - t0


def _bad(path: Path, kind: str) -> Path:
    """Make ``path`` a FIFO, or a symlink to /dev/zero."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    return path


def _arg(tmp: Path, kind: str, name: str) -> str:
    """A path for a command-line option: /dev/zero itself, or a FIFO named ``name``."""
    return "/dev/zero" if kind == "zero" else str(_bad(tmp / name, "fifo"))


def _finished_run(tmp: Path) -> Path:
    run = tmp / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank0.stdout.log").write_text(
        "h:4242:4242 [0] NCCL INFO NET/IB : No device found.\n"
    )
    info = {
        "state": "succeeded",
        "world_size": 1,
        "nodes": 1,
        "ranks": [{"rank": 0, "node_rank": 0, "host": "localhost", "exit_code": 0}],
        "launcher": launcher_record(),
    }
    (run / "run.json").write_text(json.dumps(info))
    return run


def _bundle(tmp: Path) -> Path:
    from engine.write import write_bundle
    from tests.engine.writers_fixtures import make_plan

    out = tmp / "b"
    write_bundle(make_plan(), out)
    return out


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Path, str], list[str]]
    """Builds the input under the tmp dir (a FIFO or /dev/zero: the kind) and returns argv."""
    ends_ok: bool = False
    """The input is optional (a transport hint): the command ends as it would without it."""
    needles: tuple[str, ...] = ("not a regular file", "symlink")
    """The one line names why (one of these)."""


def _spec(tmp: Path, kind: str) -> list[str]:
    return ["plan", "--spec", _arg(tmp, kind, "spec.toml")]


def _plan_model_config(tmp: Path, kind: str) -> list[str]:
    return ["plan", "--model-config", _arg(tmp, kind, "config.json"), "--gpu", "h100"]


def _model_inspect(tmp: Path, kind: str) -> list[str]:
    return ["model", "inspect", "--model-config", _arg(tmp, kind, "config.json")]


def _calibration(tmp: Path, kind: str) -> list[str]:
    return ["plan", "--model", "llama-3-8b", "--calibration", _arg(tmp, kind, "cal.json")]


def _profiles_import(tmp: Path, kind: str) -> list[str]:
    return ["profiles", "import", _arg(tmp, kind, "p.toml")]


def _monitor(tmp: Path, kind: str) -> list[str]:
    run = _finished_run(tmp)
    _bad(run / "run.json", kind)
    return ["monitor", str(run)]


def _follow_run_json(tmp: Path, kind: str) -> list[str]:
    return [*_monitor(tmp, kind), "--follow"]


def _follow_plan_json(tmp: Path, kind: str) -> list[str]:
    run = _finished_run(tmp)
    _bad(run / "plan.json", kind)
    return ["monitor", str(run), "--follow"]


def _follow_nccl_env(tmp: Path, kind: str) -> list[str]:
    run = _finished_run(tmp)
    _bad(run / "bundle" / "nccl.env", kind)
    return ["monitor", str(run), "--follow"]


def _calibrate_plan(tmp: Path, kind: str) -> list[str]:
    run, _ = make_run(tmp, TINY, [0.1] * 12)
    _bad(run / "plan.json", kind)
    return ["calibrate", str(run), "--dry-run"]


def _calibrate_log(tmp: Path, kind: str) -> list[str]:
    run, _ = make_run(tmp, TINY, [0.1] * 12)
    _bad(run / "logs" / "rank1.stdout.log", kind)
    return ["calibrate", str(run), "--dry-run"]


def _calibrate_preflight(tmp: Path, kind: str) -> list[str]:
    run, _ = make_run(tmp, TINY, [0.1] * 12)
    return ["calibrate", str(run), "--dry-run", "--preflight", _arg(tmp, kind, "preflight.json")]


def _launch_bundle(tmp: Path, kind: str) -> list[str]:
    out = _bundle(tmp)
    _bad(out / "bundle.json", kind)
    return ["launch", str(out)]


def _launch_identity(tmp: Path, kind: str) -> list[str]:
    out = _bundle(tmp)
    key = _arg(tmp, kind, "id_ed25519")
    return ["launch", str(out), "--backend", "ssh", "--hosts", "127.0.0.9", "--identity", key]


def _write_over(tmp: Path, kind: str) -> list[str]:
    out = _bundle(tmp)
    _bad(out / "bundle.json", kind)
    return ["write", "--model", "llama-3-8b", "--gpu", "h100", "--out", str(out)]


def _profiles_state(tmp: Path, kind: str) -> list[str]:
    _bad(tmp / "c" / "profiles" / ".state.toml", kind)
    return ["profiles", "--config-dir", str(tmp / "c"), "list"]


CASES = [
    Case("plan --spec", _spec),
    Case("plan --model-config", _plan_model_config),
    Case("model inspect --model-config", _model_inspect),
    Case("plan --calibration", _calibration),
    Case("profiles import", _profiles_import),
    Case("profiles list (presets' last-use file)", _profiles_state, ends_ok=True),
    Case("monitor RUN (run.json)", _monitor),
    Case("monitor --follow (run.json)", _follow_run_json),
    Case("monitor --follow (plan.json)", _follow_plan_json, ends_ok=True),
    Case("monitor --follow (bundle/nccl.env)", _follow_nccl_env, ends_ok=True),
    Case("calibrate (plan.json)", _calibrate_plan),
    Case("calibrate (rank log)", _calibrate_log),
    Case("calibrate --preflight", _calibrate_preflight),
    Case("launch (bundle.json)", _launch_bundle),
    Case("launch --identity", _launch_identity),
    Case("write --out (bundle.json)", _write_over, needles=("bundle.json (not a dtrain-tui",)),
]


@pytest.mark.parametrize("kind", ["zero", "fifo"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_device_or_fifo_input_is_one_line_in_time(tmp_path: Path, case: Case, kind: str) -> None:
    argv = case.setup(tmp_path, kind)
    proc, took = _cli(*argv, cwd=tmp_path)
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
    assert took < DEADLINE_S
    if case.ends_ok:
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode not in (0, None), (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert any(w in lines[0] for w in case.needles), lines[0]


# ---- the helper itself ------------------------------------------------------------------


def test_the_reader_refuses_all_but_a_regular_file_each_in_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to("/etc/hostname")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (JSON_LIMIT + 1))
    for path, why in [
        (Path("/dev/zero"), "not a regular file (a character device)"),
        (fifo, "not a regular file (a FIFO)"),
        (tmp_path / "dir", "not a regular file (a directory)"),
        (tmp_path / "link", "is a symlink"),
        (big, "more than the 8 MiB allowed"),
    ]:
        with pytest.raises(DtrainError) as e:
            read_regular_bytes(path, JSON_LIMIT, label=f"--x {path.name}")
        assert str(e.value).startswith(f"--x {path.name}: ") and why in str(e.value)
        assert "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError):
        read_regular_bytes(tmp_path / "none", JSON_LIMIT)
    (tmp_path / "ok").write_text("fine")
    assert read_regular_text(tmp_path / "ok", 4) == "fine"
    assert (
        read_regular_text(tmp_path / "link", 100, follow=True) == Path("/etc/hostname").read_text()
    )


def test_a_file_behind_a_symlinked_dir_is_refused_within_the_run(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "run.json").write_text("{}")
    run = tmp_path / "run"
    run.mkdir()
    (run / "sub").symlink_to(outside)
    with pytest.raises(DtrainError, match="leads out of"):
        read_regular_bytes(run / "sub" / "run.json", JSON_LIMIT, within=run)
    shutil.rmtree(outside)


def test_a_flight_recorder_dump_that_is_a_fifo_is_no_dump(tmp_path: Path) -> None:
    from engine.diagnose.flight import read_trace_file

    os.mkfifo(tmp_path / "dump")
    assert read_trace_file(tmp_path / "dump") is None
    assert read_trace_file(Path("/dev/zero")) is None
