"""SkyPilot backend without a cloud: the Task SkyPilot would receive (its own loader), the SDK
calls made (monkeypatched at the ``sky`` module boundary only, each call first bound to the
installed SkyPilot's own signature), and the splitting of SkyPilot's per-node prefixes on lines
in SkyPilot's real format (sky/backends/task_codegen.py, sky/skylet/executor/slurm.py)."""

from __future__ import annotations

import inspect
import io
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.launch import LaunchError, LaunchOptions
from engine.launch.skypilot import JOB_CANCELLED, SkyPilotBackend, cluster_name_for
from engine.rundir.events import LineEvent, RankExit, per_line
from engine.rundir.files import read_run
from tests.e2e.launch_util import collect, write_bundle

sky = pytest.importorskip("sky")
FAILED, CANCELLED = sky.exceptions.JobExitCode.FAILED, sky.exceptions.JobExitCode.CANCELLED

# Lines as SkyPilot prints them for a 2-node job (task names from sky/backends/task_codegen.py:
# "head, rank=0," / "worker1, rank=1,", setup as "setup" with the worker's IP; colours on).
CYAN, RED, RESET = "\x1b[36m", "\x1b[31m", "\x1b[0m"
OK_LOG = [
    "Running setup on 2 VMs.",
    f"{CYAN}(setup pid=2101){RESET} Collecting torch>=2.4",
    f"{CYAN}(setup pid=1712, ip=10.128.0.33){RESET} Collecting torch>=2.4",
    f"{CYAN}(head, rank=0, pid=2843){RESET} W1122 08:01:02.123000 2843 torch/distributed/run.py:793] *****",
    f"{CYAN}(worker1, rank=1, pid=2650, ip=10.128.0.33){RESET} [default0]:[dtrain] step=1/2 loss=5.8 tokens_per_s=10.0 step_time_s=0.1 mem_gb=1.0",
    f"{CYAN}(head, rank=0, pid=2843){RESET} [default1]:[dtrain] step=1/2 loss=5.7 tokens_per_s=10.0 step_time_s=0.1 mem_gb=1.0",
    f"{CYAN}(head, rank=0, pid=2843){RESET} [default0]:[dtrain] step=1/2 loss=5.6 tokens_per_s=10.0 step_time_s=0.1 mem_gb=1.0",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) [default1]:[dtrain] step=1/2 loss=5.9 tokens_per_s=10.0 step_time_s=0.1 mem_gb=1.0",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) [default1]:[dtrain] done steps=2 time_s=1.0",
]
FAIL_LOG = [
    "(head, rank=0, pid=2843) [default0]:[dtrain] step=1/9 loss=5.6 tokens_per_s=10.0 step_time_s=0.1 mem_gb=1.0",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) ============================================================",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) train.py FAILED",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) Failures:",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) [1]:",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33)   rank      : 2 (local_rank: 0)",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33)   exitcode  : -15 (pid: 31)",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) Root Cause (first observed failure):",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33) [0]:",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33)   host      : sky-worker1",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33)   rank      : 3 (local_rank: 1)",
    "(worker1, rank=1, pid=2650, ip=10.128.0.33)   exitcode  : -9 (pid: 32)",
    f"ERROR: {RED}Job 1 failed with return code list:{RESET} [0, 1] ",
]


class FakeSky:
    """Stands in for the ``sky`` SDK functions only; records each call."""

    def __init__(self, log: list[str], code: int, block: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.log, self.code, self.block = log, code, block
        self.cancelled = threading.Event()

    def install(self, mp: pytest.MonkeyPatch) -> None:
        for name in ("launch", "stream_and_get", "tail_logs", "cancel", "down", "api_stop"):
            mp.setattr(sky, name, _checked(getattr(sky, name), getattr(self, name)))

    def launch(self, task: Any, **kw: Any) -> str:
        self.calls.append(("launch", (task, kw)))
        return "req-launch"

    def stream_and_get(
        self, request_id: str, output_stream: io.TextIOBase | None = None, **kw: Any
    ) -> Any:
        self.calls.append(("stream_and_get", request_id))
        if request_id == "req-launch":
            if output_stream is not None:
                output_stream.write("Launching on GCP us-central1\n")
            return (1, object())
        return None

    def tail_logs(
        self, cluster_name: str, job_id: int, follow: bool, tail: int = 0, output_stream: Any = None
    ) -> int:
        self.calls.append(("tail_logs", (cluster_name, job_id, follow)))
        for line in self.log:
            output_stream.write(line + "\n")
        if self.block:
            self.cancelled.wait(30)
            return CANCELLED
        return self.code

    def cancel(self, cluster_name: str, job_ids: list[int] | None = None, **kw: Any) -> str:
        self.calls.append(("cancel", (cluster_name, job_ids)))
        self.cancelled.set()
        return "req-cancel"

    def down(self, cluster_name: str, purge: bool = False) -> str:
        self.calls.append(("down", cluster_name))
        return "req-down"

    def api_stop(self) -> None:
        self.calls.append(("api_stop", None))


def _checked(real: Callable[..., Any], fake: Callable[..., Any]) -> Callable[..., Any]:
    """``fake``, after binding the call to ``real``'s signature: a keyword or argument that the
    installed SkyPilot does not take fails here, as it would against a cloud."""
    sig = inspect.signature(real)

    def call(*args: Any, **kw: Any) -> Any:
        sig.bind(*args, **kw)
        return fake(*args, **kw)

    return call


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(
        tmp_path / "b",
        "--backend",
        "skypilot",
        "--sky-cluster",
        "my-run",
        "--network",
        "efa",
        nodes=2,
    )


def _backend(bundle: Path, tmp: Path, **kw: Any) -> SkyPilotBackend:
    return SkyPilotBackend(bundle, tmp / "run", LaunchOptions(sky_cluster="my-run", **kw))


def test_task_is_what_skypilot_loads_from_the_bundle(bundle: Path, tmp_path: Path) -> None:
    b = _backend(bundle, tmp_path)
    b.run.create(bundle)
    task = b.build_task()
    assert task.num_nodes == 2
    assert "torchrun" in task.run and "--tee 3" in task.run
    assert task.workdir == str(b.run.bundle)
    assert task.envs["DTRAIN_RUN_ID"] == b.run_id
    best = sky.utils.resources_utils.NetworkTier.BEST
    assert {r.network_tier for r in task.resources} == {best}  # EFA plan: the fabric asked for
    aws = _backend(bundle, tmp_path / "aws", sky_cloud="aws")
    aws.run.create(bundle)
    resources = aws.build_task().resources
    assert {(str(r.cloud), r.network_tier) for r in resources} == {("AWS", best)}
    bad = _backend(bundle, tmp_path / "bad", sky_cloud="nocloud")
    bad.run.create(bundle)
    with pytest.raises(LaunchError, match="--sky-cloud"):
        bad.build_task()
    assert cluster_name_for("Custom ZeRO2 1x2!") == "custom-zero2-1x2"
    assert cluster_name_for("7b") == "dtrain-7b"
    assert JOB_CANCELLED == CANCELLED


def test_our_sdk_calls_bind_to_the_installed_skypilot() -> None:
    """The calls the backend makes, with its keywords, against the installed SDK's signatures
    (the FakeSky tests bind the same way; this one fails even if they change)."""
    calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = [
        (sky.launch, (None,), {"cluster_name": "c", "down": True, "idle_minutes_to_autostop": 5}),
        (sky.stream_and_get, ("req",), {"output_stream": io.StringIO()}),
        (sky.tail_logs, ("c", 1), {"follow": True, "output_stream": io.StringIO()}),
        (sky.cancel, ("c",), {"job_ids": [1]}),
        (sky.down, ("c",), {}),
    ]
    for fn, args, kw in calls:
        inspect.signature(fn).bind(*args, **kw)


def test_sdk_calls_and_prefix_splitting(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSky(OK_LOG, 0)
    fake.install(monkeypatch)
    b = _backend(bundle, tmp_path, sky_down=True, sky_autostop_min=30)
    b.start()
    events = collect(b, timeout=30)
    assert b.state == "succeeded", read_run(tmp_path / "run")["reason"]
    names = [c[0] for c in fake.calls]
    # api_stop: no API server ran before (the SDK would have started one)
    assert names == ["launch", "stream_and_get", "tail_logs", "api_stop"]
    task, kw = fake.calls[0][1]
    assert isinstance(task, sky.Task) and task.num_nodes == 2
    assert kw == {"cluster_name": "my-run", "down": True, "idle_minutes_to_autostop": 30}
    assert fake.calls[2][1] == ("my-run", 1, True)

    lines = [(e.node, e.rank, e.line) for e in events if isinstance(e, LineEvent)]
    steps = {(n, r): ln for n, r, ln in lines if r is not None and "step=1/2" in ln}
    assert set(steps) == {(0, 0), (0, 1), (1, 2), (1, 3)}
    assert steps[(1, 2)].startswith("[dtrain] step=1/2 loss=5.8 ")
    assert steps[(0, 0)].startswith("[dtrain] step=1/2 loss=5.6 ")
    # Setup output and provisioning: node lines, not a rank's. The head's setup prefix goes; a
    # worker's stays, its IP being the only sign of which node it is.
    assert (0, None, "Collecting torch>=2.4") in lines
    assert (0, None, "(setup pid=1712, ip=10.128.0.33) Collecting torch>=2.4") in lines
    assert (0, None, "Launching on GCP us-central1") in lines
    assert any(n == 0 and r is None and ln.startswith("W1122") for n, r, ln in lines)  # ANSI gone
    assert (
        (tmp_path / "run" / "logs" / "rank3.stdout.log")
        .read_text()
        .endswith("[dtrain] done steps=2 time_s=1.0\n")
    )
    assert sorted((e.rank, e.exit_code) for e in events if isinstance(e, RankExit)) == [
        (r, 0) for r in range(4)
    ]


def test_failed_job_names_rank_and_node_from_torchrun_table(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeSky(FAIL_LOG, FAILED).install(monkeypatch)
    b = _backend(bundle, tmp_path)
    b.start()
    collect(b, timeout=30)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    assert info["failed_rank"] == 3 and info["failed_node"] == 1
    assert "rank 3 on node 1 (my-run-worker1)" in info["reason"] and "SIGKILL" in info["reason"]
    assert {r["rank"]: r["exit_code"] for r in info["ranks"]}[3] == -9


# The head's torchrun also failed, first in the output: its rank 1 lost its peer (exit code 1)
# after the worker's rank 3 was killed. Both nodes end with the job, together.
HEAD = "(head, rank=0, pid=2843) "
PEER_LOST_LOG = [
    FAIL_LOG[0],
    HEAD + "[default1]:RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [10.128.0.33]:41235",
    HEAD + "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    HEAD + "Failures:",
    HEAD + "  <NO_OTHER_FAILURES>",
    HEAD + "Root Cause (first observed failure):",
    HEAD + "[0]:",
    HEAD + "  host      : sky-head",
    HEAD + "  rank      : 1 (local_rank: 1)",
    HEAD + "  exitcode  : 1 (pid: 2900)",
    *FAIL_LOG[1:],
]


def test_a_killed_rank_is_blamed_not_the_peer_that_lost_it(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes that end together each name a rank: the one killed by a signal is the cause."""
    FakeSky(PEER_LOST_LOG, FAILED).install(monkeypatch)
    b = _backend(bundle, tmp_path)
    b.start()
    collect(b, timeout=30)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed"
    assert (info["failed_rank"], info["failed_node"]) == (3, 1), info["reason"]
    assert "SIGKILL" in info["reason"]


def test_stop_cancels_the_job_and_downs_only_on_request(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSky(OK_LOG[:4], 0, block=True)  # up to the head's first torchrun line
    fake.install(monkeypatch)
    b = _backend(bundle, tmp_path, sky_down=False)
    b.start()
    got: list[object] = []
    deadline = time.monotonic() + 30
    while not any(isinstance(e, LineEvent) and e.line.startswith("W1122") for e in got):
        assert time.monotonic() < deadline, "the job's first torchrun line never arrived"
        got.extend(per_line(b.poll(0.1)))
    b.stop()
    collect(b, timeout=30)
    assert b.state == "stopped"
    assert ("cancel", ("my-run", [1])) in fake.calls
    assert not any(c[0] == "down" for c in fake.calls)
    b.down()
    assert fake.calls[-2:] == [("down", "my-run"), ("stream_and_get", "req-down")]


def test_a_node_is_not_finished_before_the_shared_stream_delivered_its_table(
    bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every node's lines come through one pipe (read as node 0's stream): node 1 must not count
    as finished, with no exit codes yet, while that pipe still holds its failure table. The pump
    is held back until the job ended and the supervisor looked at the nodes twice."""
    FakeSky(FAIL_LOG, FAILED).install(monkeypatch)
    b = _backend(bundle, tmp_path)
    checks = threading.Condition()
    count = [0]
    real_check, real_add = b.supervisor.check_nodes, b.pump.add_stream

    def check_nodes() -> None:
        real_check()
        with checks:
            count[0] += 1
            checks.notify_all()

    def add_stream(node: int, stream: str, read: Callable[[], bytes]) -> None:
        def held_read() -> bytes:
            data = read()
            if b"Failures:" in data:
                assert b.driver.finished.wait(30)
                with checks:
                    seen = count[0]
                    assert checks.wait_for(lambda: count[0] >= seen + 2, 30)
            return data

        real_add(node, stream, held_read)

    monkeypatch.setattr(b.supervisor, "check_nodes", check_nodes)
    monkeypatch.setattr(b.pump, "add_stream", add_stream)
    b.start()
    collect(b, timeout=60)
    info = read_run(tmp_path / "run")
    assert info["state"] == "failed", info["reason"]
    assert info["failed_rank"] == 3 and info["failed_node"] == 1, info["reason"]
    assert {r["rank"]: r["exit_code"] for r in info["ranks"]}[3] == -9
