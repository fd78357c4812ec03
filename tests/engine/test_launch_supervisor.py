"""The launch backend's collaborators, alone: a canned node driver (no process, no torchrun)
composed with the real run state (:class:`engine.launch.run_state.RunContext`) and supervisor
(:class:`engine.launch.supervise.Supervisor`) behind the :class:`LaunchBackend` facade. The
fault policy, a stop and a failed start are decided without any backend of ours; the real ones
are pinned by tests/e2e (real torchrun, sshd, Slurm)."""

from __future__ import annotations

import contextlib
import io
import threading
from pathlib import Path

import pytest

from cli import main
from engine.launch import LaunchBackend, LaunchError
from engine.launch.driver import DumpReach, NodeDriver
from engine.launch.options import LaunchOptions
from engine.launch.pump import ControlLine, Split
from engine.launch.restart import RestartingRun, RestartPolicy
from engine.launch.run_state import RunContext
from engine.rundir.events import STDOUT, RankExit
from engine.rundir.files import read_run

TWO_NODES = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--gpu", "cpu"]
TWO_NODES += ["--gpus-per-node", "1", "--nodes", "2", "--seq-len", "32", "--steps", "3"]
TWO_NODES += ["--global-batch", "4"]


@pytest.fixture
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("DTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "b"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["write", *TWO_NODES, "--out", str(out)]) == 0
    return out


class CannedDriver:
    """Nodes whose exits the test decides; each prints one line and closes its output."""

    dump_reach: DumpReach = DumpReach.NONE
    split: Split | None = None
    control: ControlLine | None = None

    def __init__(self, ctx: RunContext, *, fail_start: bool = False) -> None:
        self.ctx = ctx
        self.fail_start = fail_start
        self.exits: dict[int, int] = {}
        self.killed: list[int] = []
        self.closed = 0
        self.torn_down = False
        self._lock = threading.Lock()

    def hosts(self) -> list[str]:
        return [f"n{i}" for i in range(self.ctx.manifest.nodes)]

    def start_nodes(self) -> None:
        if self.fail_start:
            raise LaunchError("node 1 (n1): cannot start")
        for node in range(self.ctx.manifest.nodes):
            lines = [f"[default0]:hello from node {node}\n".encode(), b""]
            self.ctx.add_stream(node, STDOUT, lambda lines=lines: lines.pop(0))

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        with self._lock:
            code = self.exits.get(node)
        return code is not None, code

    def kill_node(self, node: int, reason: str) -> None:
        with self._lock:
            self.killed.append(node)
            self.exits.setdefault(node, -15)

    def kill_node_now(self, node: int) -> None:
        self.kill_node(node, "killed by the user")

    def ask_dumps(self, node: int | None) -> int:
        return 0

    def teardown_after_failed_start(self) -> None:
        self.torn_down = True

    def close(self) -> None:
        self.closed += 1


def _compose(
    bundle: Path, run: Path, *, fail_start: bool = False
) -> tuple[LaunchBackend, CannedDriver]:
    ctx = RunContext(bundle, run, None, backend="local")
    driver = CannedDriver(ctx, fail_start=fail_start)
    typed: NodeDriver = driver  # the protocol is all the facade needs
    return LaunchBackend(ctx, typed), driver


def test_every_node_exiting_0_ends_the_run_succeeded(bundle: Path, tmp_path: Path) -> None:
    backend, driver = _compose(bundle, tmp_path / "run")
    backend.start()
    assert backend.hosts == ["n0", "n1"]
    driver.exits.update({0: 0, 1: 0})
    assert backend.wait(30) == "succeeded"
    assert driver.closed == 1 and driver.killed == []
    info = read_run(tmp_path / "run")
    assert info["state"] == "succeeded" and info["hosts"] == ["n0", "n1"]
    assert (tmp_path / "run" / "logs" / "rank1.stdout.log").read_text() == "hello from node 1\n"


def test_the_first_failure_stops_the_other_node_and_names_it(bundle: Path, tmp_path: Path) -> None:
    backend, driver = _compose(bundle, tmp_path / "run")
    backend.start()
    driver.exits[1] = 1
    assert backend.wait(30) == "failed"
    assert driver.killed == [0]
    info = read_run(tmp_path / "run")
    assert info["failed_node"] == 1, info["reason"]
    exits: list[RankExit] = []
    while not backend.done:
        exits += [e for e in backend.poll(0.1) if isinstance(e, RankExit)]
    assert sorted(e.rank for e in exits) == [0, 1]


def test_a_stop_kills_every_running_node_and_ends_stopped(bundle: Path, tmp_path: Path) -> None:
    backend, driver = _compose(bundle, tmp_path / "run")
    backend.start()
    backend.request_stop("stopped by the test")
    assert backend.wait(30) == "stopped"
    assert sorted(driver.killed) == [0, 1]
    assert read_run(tmp_path / "run")["reason"] == "stopped by the test"


def test_a_failed_start_is_torn_down_and_raised_as_one_line(bundle: Path, tmp_path: Path) -> None:
    backend, driver = _compose(bundle, tmp_path / "run", fail_start=True)
    with pytest.raises(LaunchError, match="cannot start"):
        backend.start()
    assert driver.torn_down and driver.closed == 1
    assert backend.state == "failed" and not backend.supervisor.watching


class SilentNode1(CannedDriver):
    """Node 0's rank prints a line; node 1's never does, its output open until it is stopped."""

    def start_nodes(self) -> None:
        self.gone = threading.Event()
        lines = [b"[default0]:hello from node 0\n", b""]
        self.ctx.add_stream(0, STDOUT, lambda: lines.pop(0))

        def silent() -> bytes:
            self.gone.wait(60)
            return b""

        self.ctx.add_stream(1, STDOUT, silent)

    def kill_node(self, node: int, reason: str) -> None:
        super().kill_node(node, reason)
        if node == 1:
            self.gone.set()


def test_a_rank_that_never_started_fails_the_run_as_a_hang_would(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DTRAIN_TELEMETRY_S", raising=False)
    options = LaunchOptions(hang_timeout_s=600, start_timeout_s=0.5)
    ctx = RunContext(bundle, tmp_path / "run", options, backend="local")
    assert ctx.rank_starts
    driver = SilentNode1(ctx)
    backend = LaunchBackend(ctx, driver)
    backend.start()
    assert backend.wait(30) == "failed"
    info = read_run(tmp_path / "run")
    assert info["reason"] == (
        "rank 1 never started in 0.5 s (--start-timeout); node 1 (n1) printed nothing"
    )
    assert (info["failed_rank"], info["failed_node"]) == (1, 1), info
    assert sorted(driver.killed) == [0, 1]  # every node stopped


def test_telemetry_off_turns_the_per_rank_check_off(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DTRAIN_TELEMETRY_S", raising=False)

    def known(options: LaunchOptions | None = None, backend: str = "ssh") -> bool:
        return RunContext(bundle, tmp_path / "run", options, backend=backend).rank_starts

    assert known()
    assert not known(LaunchOptions(env={"DTRAIN_TELEMETRY_S": "0"}))
    monkeypatch.setenv("DTRAIN_TELEMETRY_S", "0")
    assert known()  # not this machine's environment: the ranks run elsewhere
    assert not known(backend="local")  # local ranks inherit it
    monkeypatch.delenv("DTRAIN_TELEMETRY_S")
    env = bundle / "nccl.env"
    env.write_text(env.read_text() + "DTRAIN_TELEMETRY_S='0'\n")
    assert not known()
    env.write_text(env.read_text() + "DTRAIN_TELEMETRY_S=2\n")  # the last assignment wins
    assert known()
    (bundle / "dtrain_agent.py").unlink()  # a bundle without the agent: no sign of life known
    assert not known()


def test_a_rank_that_never_started_is_restarted_as_a_hang_is(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DTRAIN_TELEMETRY_S", raising=False)

    def make(run: Path, options: LaunchOptions) -> LaunchBackend:
        ctx = RunContext(bundle, run, options, backend="local")
        return LaunchBackend(ctx, SilentNode1(ctx))

    options = LaunchOptions(hang_timeout_s=600, start_timeout_s=0.5)
    run = RestartingRun(make, options, RestartPolicy(max_restarts=1, backoff_s=0.01), tmp_path)
    run.start()
    assert run.wait(60) == "failed"
    causes = [a.cause for a in run.attempts]
    assert len(causes) == 2 and all(c.startswith("rank 1 never started") for c in causes), causes
    assert "gave up after 1 restart" in str(read_run(tmp_path)["reason"])
