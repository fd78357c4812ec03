"""A hang's dump request on SkyPilot: a second job on the run's cluster (``sky.exec``, SDK calls
bound to the installed SkyPilot's signatures), the real ``sky.Task`` it submits, and the count
its nodes print, read from that job's log in SkyPilot's prefixed format. The script the job
runs is run for real against the agent in tests/engine/test_rank_agent.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.launch import LaunchOptions
from engine.launch.driver import DumpReach
from engine.launch.frdump import dump_script
from engine.launch.skypilot import SKY_NODE_VAR, SkyPilotBackend
from engine.rundir.events import LineEvent, per_line
from tests.e2e.launch_util import collect, write_bundle
from tests.e2e.test_launch_skypilot import OK_LOG, FakeSky, _checked

sky = pytest.importorskip("sky")

DUMP_LOG = [
    "\x1b[36m(head, rank=0, pid=3001)\x1b[0m 2",
    "(worker1, rank=1, pid=2702, ip=10.128.0.33) 2",
    "Job finished (status: SUCCEEDED).",
]


class DumpingSky(FakeSky):
    """FakeSky with ``sky.exec``: the dump job is job 2, its log :data:`DUMP_LOG`."""

    def install(self, mp: pytest.MonkeyPatch) -> None:
        super().install(mp)
        mp.setattr(sky, "exec", _checked(sky.exec, self.exec))

    def exec(self, task: Any, **kw: Any) -> str:
        self.calls.append(("exec", (task, kw)))
        return "req-exec"

    def stream_and_get(self, request_id: str, output_stream: Any = None, **kw: Any) -> Any:
        if request_id == "req-exec":
            self.calls.append(("stream_and_get", request_id))
            return (2, object())
        return super().stream_and_get(request_id, output_stream, **kw)

    def tail_logs(
        self, cluster_name: str, job_id: int, follow: bool, tail: int = 0, output_stream: Any = None
    ) -> int:
        if job_id == 2:
            self.calls.append(("tail_logs", (cluster_name, job_id, follow)))
            for line in DUMP_LOG:
                output_stream.write(line + "\n")
            return 0
        return super().tail_logs(cluster_name, job_id, follow, tail, output_stream)


def test_a_dump_request_is_a_job_beside_the_training_job_on_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = write_bundle(
        tmp_path / "b", "--backend", "skypilot", "--sky-cluster", "my-run", nodes=2
    )  # fmt: skip
    fake = DumpingSky(OK_LOG[:4], 0, block=True)
    fake.install(monkeypatch)
    b = SkyPilotBackend(bundle, tmp_path / "run", LaunchOptions(sky_cluster="my-run"))
    assert b.driver.dump_reach is DumpReach.ALL_NODES
    assert b.driver.ask_dumps(None) == 0  # nothing running yet: nothing asked
    b.start()
    got: list[object] = []
    deadline = time.monotonic() + 30
    while not any(isinstance(e, LineEvent) and e.line.startswith("W1122") for e in got):
        assert time.monotonic() < deadline, "the job's first torchrun line never arrived"
        got.extend(per_line(b.poll(0.1)))
    assert b.driver.ask_dumps(None) == 4
    ((task, kw),) = [c[1] for c in fake.calls if c[0] == "exec"]
    assert kw == {"cluster_name": "my-run"}
    assert isinstance(task, sky.Task) and task.num_nodes == 2
    assert task.run == dump_script(b.run_id, None, node_var=SKY_NODE_VAR, here_var=SKY_NODE_VAR)
    # No accelerator asked: SkyPilot's job queue runs it beside the job that holds the GPUs.
    assert all(r.accelerators is None for r in task.resources)
    assert ("tail_logs", ("my-run", 2, True)) in fake.calls
    b.stop()
    collect(b, timeout=30)
    assert b.state == "stopped"
    calls = len(fake.calls)
    assert b.driver.ask_dumps(None) == 0  # the job is over: nothing asked
    assert len(fake.calls) == calls
