"""SkyPilot backend: launch the bundle's ``sky.yaml`` through SkyPilot's Python SDK.

Called by the launcher for ``--backend skypilot``. The SDK (the ``sky`` extra requires
skypilot >= 0.10; checked against 0.14) is asynchronous: ``sky.launch`` / ``sky.cancel`` /
``sky.down`` return a request id that ``sky.stream_and_get`` follows (streaming provisioning
output) and resolves to the result, here ``(job_id, handle)``; ``sky.tail_logs(cluster, job_id,
follow=True, output_stream=...)`` streams the job's output and returns SkyPilot's job exit code
(``sky.exceptions.JobExitCode``: 0 succeeded, 100 failed, 103 cancelled).

SkyPilot prefixes each line of a multi-node job with the node it came from:
``(head, rank=0, pid=2843) `` or ``(worker1, rank=1, pid=2650, ip=10.128.0.33) `` (the task name
SkyPilot gives Ray, sky/backends/task_codegen.py, and the same words from its Slurm executor), a
single-node job with ``(<task name or "task">, pid=N) ``, and setup output with
``(setup pid=N) `` on the head or ``(setup pid=N, ip=X) `` on a worker. The node rank comes from
the prefix, then the global rank from torchrun's ``[default<local_rank>]:`` behind it. A head's
setup line loses its prefix; a worker's keeps it, since only the IP says which node it is. ANSI
colour codes are stripped first.

A hang's diagnosis asks every rank for its Flight Recorder dump with a second job on the same
cluster (``sky.exec`` of :meth:`SkyPilotDriver.dump_task`, no accelerator asked, so it runs beside
the training job): on each node it signals the run's ranks, found by ``DTRAIN_RUN_ID`` and
``SKYPILOT_NODE_RANK``, and their answers arrive in the training job's output.

``stop`` cancels the job (``sky.cancel``); the cluster is torn down (``sky.down``) only on
request: ``--sky-down`` or :meth:`SkyPilotBackend.down`.

The SDK starts a local API server on its first call when none runs (a process of about 1.5 GB
that outlives this one); one this launch started is stopped when the launch ends
(``sky.api_stop``), one that was running before is left alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import threading
from pathlib import Path
from typing import Any

from engine.launch.base import LaunchBackend
from engine.launch.driver import DumpReach
from engine.launch.options import LaunchOptions
from engine.launch.pump import ControlLine, Split
from engine.launch.run_state import LaunchError, RunContext
from engine.launch.torchrun_output import split_tee
from engine.rundir.events import STDOUT

_ANSI_RE = re.compile(rb"\x1b\[[0-9;]*[A-Za-z]")
_SKY_RE = re.compile(
    rb"^\((?:(?:head|worker(?P<idx>\d+)), rank=(?P<rank>\d+), |[A-Za-z0-9_.\-]+, )"
    rb"pid=\d+(?:, ip=[0-9A-Fa-f.:]+)?\) ?"
)
_SETUP_RE = re.compile(rb"^\(setup pid=\d+\) ?")
SKY_NODE_VAR = "SKYPILOT_NODE_RANK"
"""The variable SkyPilot numbers each node of a job by (0 on the head), in every process."""
JOB_CANCELLED = 103
"""SkyPilot's exit code of a cancelled job."""


def cluster_name_for(name: str) -> str:
    """A valid SkyPilot cluster name (lowercase letters, digits, dashes; starts with a letter)."""
    s = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not s or not s[0].isalpha():
        s = f"dtrain-{s}".rstrip("-")
    return s[:60]


class _PipeWriter(io.TextIOBase):
    """A text stream SkyPilot writes into; bytes go to our pipe, read by the line pump."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, s: str) -> int:
        data = s.encode("utf-8", "replace")
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


class SkyPilotDriver:
    """Launches, follows and cancels the run's one SkyPilot job; its lines are attributed to
    nodes by SkyPilot's prefixes."""

    dump_reach: DumpReach = DumpReach.ALL_NODES
    control: ControlLine | None = None

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.split: Split | None = self._split
        self.cluster = cluster_name_for(ctx.options.sky_cluster or ctx.manifest.name)
        self.job_id: int | None = None
        self._result: int | None = None
        self.finished = threading.Event()
        """Set once SkyPilot's job ended (or its launch failed)."""
        self._cancelled = False
        self._worker: threading.Thread | None = None
        self._started_api_server = False
        """No local API server ran before this launch's first SDK call: stop it at the end."""

    def hosts(self) -> list[str]:
        return [
            f"{self.cluster}-head" if i == 0 else f"{self.cluster}-worker{i}"
            for i in range(self.ctx.manifest.nodes)
        ]

    def build_task(self) -> Any:
        """The ``sky.Task`` SkyPilot receives: the bundle's sky.yaml, run from the run
        directory's copy of the bundle, with the run's environment added."""
        import sky

        yaml_name = self.ctx.manifest.sky_yaml or "sky.yaml"
        path = self.ctx.run.bundle / yaml_name
        if not path.is_file():
            raise LaunchError(f"{yaml_name} is missing from the bundle", field="bundle")
        try:
            task = sky.Task.from_yaml(str(path))
        except Exception as e:  # noqa: BLE001 - SkyPilot's own validation message, one line
            hint = ""
            if "unsupported field 'network_tier'" in str(e):
                # SkyPilot < 0.10's words: its schema has no network_tier; IB / EFA plans write it.
                hint = "; network_tier needs SkyPilot >= 0.10: pip install -U 'skypilot>=0.10'"
            raise LaunchError(
                f"{path}: SkyPilot refused the task: {e}{hint}", field="sky.yaml"
            ) from None
        task.workdir = str(self.ctx.run.bundle)
        task.update_envs(self.ctx.node_env())
        if self.ctx.options.sky_cloud:
            try:
                cloud = sky.CLOUD_REGISTRY.from_str(self.ctx.options.sky_cloud)
            except Exception as e:  # noqa: BLE001
                raise LaunchError(f"{e}", field="--sky-cloud") from None
            task.set_resources({r.copy(cloud=cloud) for r in task.resources})
        return task

    def start_nodes(self) -> None:
        task = self.build_task()
        self._started_api_server = not api_server_running()
        r, w = os.pipe()
        out = _PipeWriter(w)
        self.ctx.add_stream(0, STDOUT, lambda: os.read(r, 65536))
        for i in range(self.ctx.manifest.nodes):
            self.ctx.run.write_command(
                i,
                f"sky.launch(sky.Task.from_yaml({str(self.ctx.run.bundle / 'sky.yaml')!r}), "
                f"cluster_name={self.cluster!r}, down={self.ctx.options.sky_down!r}, "
                f"idle_minutes_to_autostop={self.ctx.options.sky_autostop_min!r}); node {i} is "
                + ("the head" if i == 0 else f"worker{i}"),
            )

        def work() -> None:
            import sky

            try:
                req = sky.launch(
                    task,
                    cluster_name=self.cluster,
                    down=self.ctx.options.sky_down,
                    idle_minutes_to_autostop=self.ctx.options.sky_autostop_min,
                )
                result = sky.stream_and_get(req, output_stream=out)
                job_id = result[0] if isinstance(result, tuple) else result
                self.job_id = int(job_id) if job_id is not None else None
                if self._cancelled:
                    self._do_cancel()
                code = sky.tail_logs(self.cluster, self.job_id, follow=True, output_stream=out)
                self._result = int(code) if code is not None else None
            except Exception as e:  # noqa: BLE001 - becomes the node's failure, on screen
                with contextlib.suppress(OSError):
                    out.write(f"[dtrain-tui] SkyPilot: {type(e).__name__}: {e}\n")
                self._result = 1
            finally:
                self.finished.set()
                os.close(w)

        self._worker = threading.Thread(target=work, name="dtrain-sky", daemon=True)
        self._worker.start()

    def _split(self, node: int, raw: bytes) -> tuple[int, int | None, bytes]:
        raw = _ANSI_RE.sub(b"", raw)
        m = _SKY_RE.match(raw)
        if not m:
            setup = _SETUP_RE.match(raw)
            return 0, None, raw[setup.end() :] if setup else raw
        n = int(m.group("rank")) if m.group("rank") is not None else 0
        if not 0 <= n < self.ctx.manifest.nodes:
            return 0, None, raw
        return split_tee(n, self.ctx.manifest.gpus_per_node, raw[m.end() :])

    def node_exit(self, node: int) -> tuple[bool, int | None]:
        if not self.finished.is_set():
            return False, None
        if node != 0:
            # Every node's lines come through one pipe, counted as node 0's stream, so the base
            # sees no open stream for this node: it is finished only once that pipe is drained,
            # or it would end before its torchrun failure table (its ranks' exit codes) arrived.
            if self.ctx.pump.open_streams(0) > 0:
                return False, None
        code = self._result
        if code == JOB_CANCELLED and (self._cancelled or self.ctx.stop_requested):
            return True, -15
        return True, code

    def _do_cancel(self) -> None:
        import sky

        if self.job_id is None:
            return
        sky.stream_and_get(sky.cancel(self.cluster, job_ids=[self.job_id]))

    def kill_node(self, node: int, reason: str) -> None:
        if node != 0 or self._cancelled:
            return
        self._cancelled = True
        self._do_cancel()
        self.finished.wait(30)

    def kill_node_now(self, node: int) -> None:
        self.kill_node(node, "killed by the user")

    def dump_task(self) -> Any:
        """The job that asks every node's ranks for their Flight Recorder dumps: the request
        script (:func:`~engine.launch.frdump.dump_script`) on each node of the cluster, which
        finds the run's ranks by ``DTRAIN_RUN_ID`` and their ``SKYPILOT_NODE_RANK``. It asks
        for no accelerator, so SkyPilot's job queue runs it beside the training job."""
        import sky

        from engine.launch.frdump import dump_script

        script = dump_script(self.ctx.run_id, None, node_var=SKY_NODE_VAR, here_var=SKY_NODE_VAR)
        return sky.Task(name="dtrain-dump", run=script, num_nodes=self.ctx.manifest.nodes)

    def ask_dumps(self, node: int | None) -> int:
        """Every node's ranks asked at once (:attr:`DumpReach.ALL_NODES`): :meth:`dump_task`
        run on the cluster with ``sky.exec``; each node prints how many it asked. The answers
        come through the training job's own output. 0 when the job is not running."""
        import sky

        if self.job_id is None or self.finished.is_set() or self._cancelled:
            return 0
        result = sky.stream_and_get(sky.exec(self.dump_task(), cluster_name=self.cluster))
        job_id = result[0] if isinstance(result, tuple) else result
        if job_id is None:
            return 0
        out = io.StringIO()
        sky.tail_logs(self.cluster, int(job_id), follow=True, output_stream=out)
        asked = 0
        for raw in out.getvalue().splitlines():
            line = _ANSI_RE.sub(b"", raw.encode()).decode()
            m = _SKY_RE.match(line.encode())
            word = line[m.end() :].strip() if m else line.strip()
            if word.isdigit():
                asked += int(word)
        return asked

    def down(self) -> None:
        """Tear the cluster down (``sky down``)."""
        import sky

        sky.stream_and_get(sky.down(self.cluster))

    def close(self) -> None:
        try:
            if self.ctx.options.sky_down and self._cancelled:
                # launch(down=True) tears down after a finished job; a cancelled one needs asking.
                with contextlib.suppress(Exception):
                    self.down()
        finally:
            self._stop_api_server()

    def teardown_after_failed_start(self) -> None:
        self._stop_api_server()

    def _stop_api_server(self) -> None:
        """Stop the local API server if this launch started it (once)."""
        if not self._started_api_server:
            return
        self._started_api_server = False
        import sky

        try:
            sky.api_stop()
        except Exception as e:  # noqa: BLE001 - said, never a traceback at the end of a run
            self.ctx.say(0, f"could not stop the SkyPilot API server this launch started: {e}")
        else:
            self.ctx.say(0, "stopped the SkyPilot API server this launch started")


class SkyPilotBackend(LaunchBackend):
    """The whole job is one SkyPilot job; lines are attributed to nodes by SkyPilot's prefixes."""

    name = "skypilot"

    def __init__(
        self, bundle_dir: Path, run_dir: Path | None = None, options: LaunchOptions | None = None
    ) -> None:
        ctx = RunContext(bundle_dir, run_dir, options, backend=self.name)
        self.driver: SkyPilotDriver = SkyPilotDriver(ctx)
        super().__init__(ctx, self.driver)

    @property
    def cluster(self) -> str:
        return self.driver.cluster

    @property
    def job_id(self) -> int | None:
        return self.driver.job_id

    def build_task(self) -> Any:
        """The ``sky.Task`` SkyPilot receives (:meth:`SkyPilotDriver.build_task`)."""
        return self.driver.build_task()

    def down(self) -> None:
        """Tear the cluster down (``sky down``)."""
        self.driver.down()


def api_server_running() -> bool:
    """A SkyPilot API server answers (or one is configured that is not local: never ours to
    stop). SkyPilot's own health probe of its endpoint."""
    from sky.server import common

    try:
        if not common.is_api_server_local():
            return True
        return bool(common.get_api_server_status().status == common.ApiServerStatus.HEALTHY)
    except Exception:  # noqa: BLE001 - cannot tell: leave whatever runs alone
        return True
