"""Runs that always end: however the local launcher goes (SIGHUP, SIGTERM, SIGKILL, Ctrl-C once or
twice, Ctrl-C while it is still starting, a full run directory, a stop asked for from the monitor),
no process of the run survives and run.json does not say ``running`` forever.

The bundle is plain bash (no torch): a node script that traps SIGTERM (so a polite stop is not
enough), keeps a child and forks ``setsid sleep 300`` into a session of its own, as torchrun's
ranks are. Tests wait for states (a line, a file, a process gone), never for a fixed time."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from engine.launch import LaunchOptions
from engine.launch.local import LocalBackend, kill_run_processes
from engine.monitor.tail import RunDirSource
from engine.rundir.files import RunDir, read_run
from tests.e2e.launch_util import collect, make_bundle, run_pids, wait_no_pids

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# Ignores SIGTERM (says so), leaves a grandchild in a session of its own, prints one line per
# rank, then waits on a child: three processes that only SIGKILL or the sweep end.
STUBBORN = (
    "trap 'echo \"[default0]:got TERM, ignoring it\"' TERM\n"
    "setsid sleep 300 &\n"
    "sleep 300 &\n"
    "echo '[default1]:hello'\n"
    "while true; do wait $! 2>/dev/null; sleep 0.1; done\n"
)


def stubborn_bundle(tmp_path: Path, body: str = STUBBORN) -> Path:
    b = make_bundle(tmp_path / "fake", steps=1)
    (b / "launch_node0.sh").write_text("#!/usr/bin/env bash\nset -u\n" + body)
    return b


class Launcher:
    """``python -m cli launch BUNDLE --run-dir RUN`` in a subprocess, its stderr read on a
    thread so a test can wait for a line of it."""

    def __init__(self, bundle: Path, run: Path, *extra: str, **popen: Any) -> None:
        self.run = run
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "launch", str(bundle), "--run-dir", str(run), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            **popen,
        )
        self.err: list[str] = []
        self._err_cond = threading.Condition()
        assert self.proc.stderr is not None
        self._reader = threading.Thread(target=self._read, args=(self.proc.stderr,), daemon=True)
        self._reader.start()

    def _read(self, f: IO[str]) -> None:
        for line in f:
            with self._err_cond:
                self.err.append(line)
                self._err_cond.notify_all()
        with self._err_cond:
            self.err.append("")  # EOF marker
            self._err_cond.notify_all()

    def wait_stdout(self, want: str, timeout: float = 60.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, f"launcher ended before printing {want!r}: {self.stderr()}"
            if line == want:
                return
        raise AssertionError(f"no {want!r} within {timeout}s")

    def wait_stderr(self, needle: str, timeout: float = 30.0) -> None:
        with self._err_cond:
            ok = self._err_cond.wait_for(
                lambda: any(needle in x for x in self.err) or "" in self.err, timeout
            )
        assert ok and any(needle in x for x in self.err), f"no {needle!r}: {self.stderr()}"

    def stderr(self) -> str:
        with self._err_cond:
            return "".join(self.err)

    def finish(self, timeout: float = 60.0) -> int:
        """Exit status (drains stdout); the test fails, without leaving anything, on a hang."""
        assert self.proc.stdout is not None
        # Drain stdout (stderr has its own reader: communicate() would take lines from it).
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"launcher still running after {timeout}s: {self.stderr()}"
            ) from None
        self._reader.join(10)
        return self.proc.returncode

    def run_id(self) -> str:
        return str(json.loads((self.run / "run.json").read_text())["run_id"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        with contextlib.suppress(OSError, KeyError, ValueError):
            kill_run_processes(self.run_id())


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Launcher]:
    lau = Launcher(stubborn_bundle(tmp_path), tmp_path / "run")
    try:
        lau.wait_stdout("[rank 1] hello\n")
        # The script, its sleep and its setsid'd sleep. A child that is between fork and exec
        # can read as no process of the run for a moment (its /proc environ unreadable): wait
        # for the state, with a deadline, rather than look once.
        deadline = time.monotonic() + 10
        while len(pids := run_pids(lau.run_id())) < 3:
            assert time.monotonic() < deadline, f"the run's processes: {pids}"
            time.sleep(0.02)  # polling the process table
        yield lau
    finally:
        lau.kill()  # whatever the test did, nothing of the run outlives it


# ---- point 1: SIGHUP / SIGTERM are a stop; SIGKILL leaves nothing and reads "launcher died" --


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_sighup_and_sigterm_stop_every_rank(launched: Launcher, sig: signal.Signals) -> None:
    run_id = launched.run_id()
    launched.proc.send_signal(sig)
    code = launched.finish()
    assert code == 128 + sig, launched.stderr()
    assert f"stopping every rank ({sig.name})" in launched.stderr()
    assert "Traceback" not in launched.stderr()
    assert wait_no_pids(run_id) == []
    info = read_run(launched.run)
    assert info["state"] == "stopped", info
    assert {r["reason"] for r in info["ranks"]} == {"stopped"}


def test_sigkill_of_the_launcher_leaves_no_rank_and_reads_launcher_died(
    launched: Launcher,
) -> None:
    run_id = launched.run_id()
    launched.proc.kill()
    launched.proc.wait(10)
    assert wait_no_pids(run_id) == []
    info = read_run(launched.run)
    assert info["state"] == "failed" and "launcher died" in info["reason"], info
    # `monitor --follow` ends, saying why.
    p = subprocess.run(
        [sys.executable, "-m", "cli", "monitor", str(launched.run), "--follow"],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr
    assert "[run] failed: launcher died" in p.stdout


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write_running(run: Path, launcher: dict[str, Any]) -> None:
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "rank0.stdout.log").write_text("a line\n")
    ranks = [{"rank": 0, "node_rank": 0, "local_rank": 0, "host": "localhost", "exit_code": None}]
    info = {"state": "running", "world_size": 1, "ranks": ranks, "launcher": launcher}
    (run / "run.json").write_text(json.dumps(info))


@pytest.mark.parametrize("how", ["pid gone", "pid reused"])
def test_a_reader_reports_a_dead_launcher_and_follow_ends(tmp_path: Path, how: str) -> None:
    from engine.rundir.launcher import launcher_record

    rec = launcher_record()
    if how == "pid gone":
        rec["pid"] = _dead_pid()
    else:  # this very pid, alive, but started at another time: not the launcher
        rec["start_ticks"] = int(rec["start_ticks"]) + 12345
    _write_running(tmp_path / "run", rec)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed" and info["reason"].startswith("launcher died"), info
    source = RunDirSource(tmp_path / "run")
    source.start()
    events: list[Any] = []
    deadline = time.monotonic() + 10
    while not source.done:
        assert time.monotonic() < deadline, "RunDirSource never ended"
        events += source.poll(0.1)
    assert [getattr(e, "state", None) for e in events if hasattr(e, "state")][-1] == "failed"
    # A live launcher (this process) is believed.
    _write_running(tmp_path / "live", launcher_record())
    assert read_run(tmp_path / "live")["state"] == "running"


# ---- point 2: a second Ctrl-C kills the tree at once, never abandons it -----------------------


def test_second_ctrl_c_kills_every_rank_and_exits_130(launched: Launcher) -> None:
    run_id = launched.run_id()
    launched.proc.send_signal(signal.SIGINT)
    launched.wait_stderr("stopping every rank")
    launched.proc.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    code = launched.finish()
    assert code == 130, launched.stderr()
    assert time.monotonic() - t0 < 4.0  # not the whole 5 s grace period
    assert "killing every rank" in launched.stderr()
    assert "Traceback" not in launched.stderr()
    assert wait_no_pids(run_id) == []
    assert read_run(launched.run)["state"] == "stopped"


# ---- point 3: a full run directory ends the run, no traceback ---------------------------------

FIREHOSE = (
    "trap 'true' TERM\n"
    "setsid sleep 300 &\n"
    "x=$(printf 'x%.0s' {1..60})\n"
    'for i in $(seq 1 20000); do echo "[default0]:line $i $x"; done\n'
    "sleep 300 &\n"
    "while true; do wait $! 2>/dev/null; sleep 0.1; done\n"
)


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "256k") -> Iterator[Path]:
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_full_run_directory_fails_the_run_and_stops_every_rank(tmp_path: Path) -> None:
    b = stubborn_bundle(tmp_path, FIREHOSE)
    with small_tmpfs(tmp_path / "small") as small:
        lau = Launcher(b, small / "run", "--quiet")
        try:
            code = lau.finish(timeout=60)
            run_id = lau.run_id()
        finally:
            lau.kill()
        err = lau.stderr()
        assert code == 1, err
        assert "Traceback" not in err and "Exception in thread" not in err, err
        assert "run directory full (" in err and "No space left on device" in err, err
        assert wait_no_pids(run_id) == []
        info = read_run(small / "run")
        assert info["state"] == "failed", info
        assert info["reason"].startswith("run directory full ("), info


def test_full_run_directory_in_process_no_thread_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same, where a tmpfs cannot be mounted: RunDir.append raises ENOSPC after 4 KiB."""
    written = [0]
    real = RunDir.append

    def append(self: RunDir, node: int, rank: int | None, stream: str, data: bytes) -> None:
        written[0] += len(data)
        if written[0] > 4096:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path / "logs"))
        real(self, node, rank, stream, data)

    died: list[BaseException | None] = []
    monkeypatch.setattr(RunDir, "append", append)
    monkeypatch.setattr(threading, "excepthook", lambda a: died.append(a.exc_value))
    b = stubborn_bundle(tmp_path, FIREHOSE)
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    backend.start()
    collect(backend, timeout=60)
    assert died == []
    assert backend.state == "failed"
    info = read_run(tmp_path / "run")
    assert info["reason"].startswith("run directory full (") and "No space left" in info["reason"]
    assert wait_no_pids(backend.run_id) == []


# ---- point 4: Ctrl-C while starting: 130, never a traceback ----------------------------------


# SIGINT from a thread inside the child, ``delay`` seconds after cli/__main__ began (waited
# for as a state: the module running as __main__). The delay is the test's subject, not a wait.
_CTRL_C_AFTER = """
import os, runpy, signal, sys, threading, time
def ctrl_c():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        main = sys.modules.get("__main__")
        if str(getattr(main, "__file__", "")).endswith(os.path.join("cli", "__main__.py")):
            break
        time.sleep(0.0005)
    time.sleep(DELAY)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c, daemon=True).start()
sys.argv = ["dtrain-tui", "launch", BUNDLE, "--run-dir", RUN]
runpy.run_module("cli", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03, 0.06, 0.1, 0.15, 0.2, 0.3])
def test_ctrl_c_while_starting_is_never_a_traceback(tmp_path: Path, delay: float) -> None:
    b = stubborn_bundle(tmp_path)
    run = tmp_path / "run"
    code = f"DELAY, BUNDLE, RUN = {delay!r}, {str(b)!r}, {str(run)!r}\n" + _CTRL_C_AFTER
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
        check=False,
    )  # fmt: skip
    assert "Traceback" not in p.stderr and "panicked" not in p.stderr, p.stderr
    assert p.returncode == 130, p.stderr
    if (run / "run.json").exists():
        info = read_run(run)
        assert info["state"] != "running", info
        assert wait_no_pids(str(info.get("run_id"))) == []


def test_a_ctrl_c_inside_thread_start_never_starts_the_watcher_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Ctrl-C of the test above, landing exactly inside ``Thread.start`` (after the new
    thread exists, before start() returns): it is delivered once the thread has started, so a
    caller's second supervise() finds it started and does not run a second copy (CPython then
    printed "KeyError ... del _limbo[self]" from the copy that lost)."""
    from engine.launch.base import start_whole

    runs: list[int] = []
    release = threading.Event()
    thread = threading.Thread(target=lambda: (runs.append(1), release.wait(30)), daemon=True)
    real = threading._start_new_thread  # type: ignore[attr-defined]

    def start_then_interrupt(*args: Any) -> Any:
        ident = real(*args)
        os.kill(os.getpid(), signal.SIGINT)  # handled at the main thread's next bytecode
        return ident

    monkeypatch.setattr(threading, "_start_new_thread", start_then_interrupt)
    with pytest.raises(KeyboardInterrupt):  # the Ctrl-C is not lost, only held
        start_whole(thread)
    monkeypatch.undo()
    assert thread.ident is not None  # started, and known to be: a retry does nothing
    with pytest.raises(RuntimeError):
        thread.start()
    release.set()
    thread.join(30)
    assert runs == [1]


@pytest.mark.parametrize(
    "where",
    [
        "while the run directory is made",
        "once run.json is begun",
        "after the nodes started",
        "before the watcher started",
    ],
)
def test_an_interrupt_anywhere_in_the_start_leaves_no_run_half_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # Deterministic forms of a Ctrl-C landing inside start(): before anything runs (the run
    # ends there), or once every node runs but before start() returned, while it records the
    # run as running or between making the watcher thread and starting it (the run must still
    # end when stopped). Either way nothing is left and run.json does not say it runs.
    b = stubborn_bundle(tmp_path)
    backend = LocalBackend(b, tmp_path / "run", LaunchOptions(hang_timeout_s=600))
    real_emit = backend.ctx.emit

    def interrupt(*_a: Any, **_kw: Any) -> None:
        raise KeyboardInterrupt

    if where == "while the run directory is made":
        monkeypatch.setattr(backend.run, "create", interrupt)
    elif where == "once run.json is begun":

        def emit(ev: Any) -> None:
            real_emit(ev)
            if getattr(ev, "state", None) == "starting":
                raise KeyboardInterrupt

        monkeypatch.setattr(backend.ctx, "emit", emit)
    elif where == "after the nodes started":
        real_record = backend.ctx.record

        def record(**kw: Any) -> None:
            real_record(**kw)
            raise KeyboardInterrupt

        monkeypatch.setattr(backend.ctx, "record", record)
    else:
        real_start = threading.Thread.start

        def start(self: threading.Thread) -> None:
            if self.name == "dtrain-supervise" and not hasattr(start, "done"):
                start.done = True  # type: ignore[attr-defined]
                raise KeyboardInterrupt
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", start)
    with pytest.raises(KeyboardInterrupt):
        backend.start()
    monkeypatch.undo()
    if not backend.state.final:  # the nodes run: what `dtrain-tui launch` does then
        backend.supervise()
        assert backend.supervisor.watching
        backend.stop()
    collect(backend, timeout=60)
    assert backend.state == "stopped"
    if where == "while the run directory is made":
        assert not (tmp_path / "run" / "run.json").exists()
    else:
        assert read_run(tmp_path / "run")["state"] == "stopped"
    assert wait_no_pids(backend.run_id) == []


# ---- point 5: a stop asked for through the run directory --------------------------------------


def test_stop_request_in_the_run_directory_stops_the_run(launched: Launcher) -> None:
    from engine.rundir.launcher import request_stop

    run_id = launched.run_id()
    request_stop(launched.run)
    code = launched.finish()
    assert code == 1, launched.stderr()
    assert "stop requested from the monitor" in launched.stderr()
    # A polite stop (SIGTERM, grace period), not the second request's SIGKILL.
    assert "killing every rank now" not in launched.stderr(), launched.stderr()
    assert wait_no_pids(run_id) == []
    info = read_run(launched.run)
    assert info["state"] == "stopped"
    assert {r["reason"] for r in info["ranks"]} == {"stopped"}
    assert not (launched.run / "stop.request").exists()
