"""The rank agent (engine/trainer/agent.py, ``dtrain_agent.py`` in every bundle), for real: a
script runs through it exactly as it runs alone (argv, sys.path[0], exit codes, tracebacks);
the launcher's request signal (one constant in the agent and in engine/launch/frdump.py) gets a
``[dtrain] fr`` line from any script, one with its own SIGUSR1 handler too, through the same bash
the SSH and Slurm backends run; telemetry lines carry CPU and memory from /proc, and the NVML
path reads a fake pynvml module."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.diagnose import flight
from engine.diagnose.flight import parse_fr_line
from engine.launch import frdump
from engine.monitor.telemetry import parse_telemetry_line

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "engine" / "trainer" / "agent.py"
DEADLINE_S = 90.0
"""Generous: torch's import on a loaded machine."""


def _agent() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("dtrain_agent_under_test", AGENT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_agent_and_the_launcher_agree_on_the_signal_and_the_lines() -> None:
    agent = _agent()
    assert agent.DUMP_SIGNAL_OFFSET == frdump.DUMP_SIGNAL_OFFSET
    assert agent.dump_signal() == frdump.dump_signal() == signal.SIGRTMIN + 7
    assert agent.FR_PREFIX == flight.FR_PREFIX
    assert agent.TELEMETRY_PREFIX == flight.TELEMETRY_PREFIX
    assert frdump.dump_signal_mask() == 1 << (signal.SIGRTMIN + 7 - 1)
    # bash on the nodes names the same number.
    got = subprocess.run(["bash", "-c", f"kill -l {frdump.DUMP_SIGNAL_NAME}"], capture_output=True)
    assert got.stdout.decode().strip() == str(frdump.dump_signal())


# --------------------------------------------------------------------------- as if run alone

SCRIPTS = {
    "ok": "import sys, os\nprint(sys.argv, sys.path[0] == os.path.dirname(os.path.realpath(__file__)), __name__)\n",
    "exit3": "import sys\nprint('bye')\nsys.exit(3)\n",
    "exit_msg": "raise SystemExit('a message of its own')\n",
    "raises": "def f():\n    raise ValueError('bad value')\n\ndef g():\n    f()\n\ng()\n",
    "chained": (
        "try:\n    {}['k']\nexcept KeyError as e:\n    raise RuntimeError('while handling') from e\n"
    ),
    "syntax": "def broken(:\n    pass\n",
    "interrupt": "raise KeyboardInterrupt\n",
    "imports_sibling": "import helper_mod\nprint(helper_mod.X)\n",
    "pickles_main": (
        "import pickle\nclass P:\n    x = 1\n"
        "print(type(pickle.loads(pickle.dumps(P()))).__name__)\n"
    ),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_script_runs_through_the_agent_exactly_as_alone(name: str, tmp_path: Path) -> None:
    d = tmp_path / "scripts"
    d.mkdir()
    (d / "helper_mod.py").write_text("X = 42\n")
    script = d / f"{name}.py"
    script.write_text(SCRIPTS[name])
    shutil_agent = tmp_path / "bundle" / "dtrain_agent.py"
    shutil_agent.parent.mkdir()
    shutil_agent.write_text(AGENT.read_text())
    args = ["--flag", "value with space", "--", "-x"]
    env = {**os.environ, "DTRAIN_TELEMETRY_S": "0"}
    rel = os.path.relpath(script, tmp_path)
    alone = subprocess.run(
        [sys.executable, rel, *args], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    through = subprocess.run(
        [sys.executable, str(shutil_agent), rel, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert (through.returncode, through.stdout, through.stderr) == (
        alone.returncode,
        alone.stdout,
        alone.stderr,
    )
    assert "dtrain_agent" not in through.stderr and "runpy" not in through.stderr


def test_the_agent_without_a_script_says_so_in_one_line(tmp_path: Path) -> None:
    got = subprocess.run([sys.executable, str(AGENT)], capture_output=True, text=True)
    assert got.returncode == 2
    assert got.stderr.splitlines()[0] == "dtrain_agent: no training script given"
    got = subprocess.run(
        [sys.executable, str(AGENT), "x.py"],
        capture_output=True,
        text=True,
        env={**os.environ, "DTRAIN_TELEMETRY_S": "soon"},
    )
    assert got.returncode == 2 and "DTRAIN_TELEMETRY_S" in got.stderr
    assert "Traceback" not in got.stderr


# --------------------------------------------------------------------------- the dump request


class _Lines:
    """A child's stdout and stderr, line by line, waited on with a deadline."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.cond = threading.Condition()
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, text: str, after: int = 0, timeout: float = DEADLINE_S) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = [x for x in self.lines[after:] if text in x]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                assert left > 0, f"no {text!r} in {self.lines[-20:]}"
                self.cond.wait(left)


USER_SCRIPT = """
import os, signal, sys, threading, time
def on_usr1(signum, frame):
    print("user handler ran", flush=True)
signal.signal(signal.SIGUSR1, on_usr1)
WITH_TORCH = os.environ.get("WITH_TORCH") == "1"
if WITH_TORCH:
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
    dist.all_reduce(torch.ones(16))
def waits_for_ever():
    print("ready", flush=True)
    while True:
        time.sleep(0.05)
waits_for_ever()
"""


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(env: dict[str, str]) -> _Lines:
        script = tmp_path / "user_train.py"
        script.write_text(USER_SCRIPT)
        proc = subprocess.Popen(
            [sys.executable, str(AGENT), str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DTRAIN_TELEMETRY_S": "0", **env},
        )
        procs.append(proc)
        return _Lines(proc)

    yield start
    for p in procs:
        p.kill()
        p.wait(30)


def test_any_script_answers_the_request_and_keeps_its_own_sigusr1(running: Any) -> None:
    env = {"DTRAIN_RUN_ID": "r-agent-1", "GROUP_RANK": "0", "LOCAL_RANK": "0", "RANK": "0"}
    out = running(env)
    out.wait_for("ready")
    pid = out.proc.pid
    assert frdump.takes_dump_signal(pid)
    assert frdump.signal_local("r-agent-1", 0) == 1
    d = parse_fr_line(out.wait_for("[dtrain] fr "))
    assert d is not None and d.rank == 0 and d.pid == pid
    assert d.recorder is False  # no torch in this script: no Flight Recorder, still an answer
    assert d.stack[0].startswith("user_train.py:") and d.stack[0].endswith(" waits_for_ever")
    (main,) = [v for k, v in d.threads.items() if k.startswith("MainThread")]
    assert any("waits_for_ever" in f for f in main)
    # The script's own SIGUSR1 handler still runs, and the process lives on.
    n = len(out.lines)
    os.kill(pid, signal.SIGUSR1)
    out.wait_for("user handler ran", after=n)
    assert out.proc.poll() is None


def test_the_nodes_bash_finds_and_signals_the_rank(running: Any) -> None:
    """The SSH/Slurm request script, run by real bash: the agent's rank and only it."""
    env = {"DTRAIN_RUN_ID": "r-agent-2", "DTRAIN_NODE": "1", "LOCAL_RANK": "0", "RANK": "1"}
    out = running(env)
    out.wait_for("ready")
    # A process of the run that does not block the signal (torchrun itself) is left alone.
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env={**os.environ, **env},
    )
    try:
        got = subprocess.run(
            ["bash", "-c", frdump.dump_script("r-agent-2", 1)], capture_output=True, text=True
        )
        assert got.stdout.strip() == "1", got
        d = parse_fr_line(out.wait_for("[dtrain] fr "))
        assert d is not None and d.rank == 1
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(30)


def test_skypilots_dump_job_finds_the_rank_by_its_node_rank(running: Any) -> None:
    """The SkyPilot dump job's script (engine/launch/skypilot.py), run by real bash as SkyPilot
    runs it on a node (``SKYPILOT_NODE_RANK`` set): the rank of that node answers, a rank of
    another node is left alone."""
    from engine.launch.skypilot import SKY_NODE_VAR

    base = {"DTRAIN_RUN_ID": "r-agent-sky", "LOCAL_RANK": "0"}
    here = running({**base, SKY_NODE_VAR: "1", "RANK": "2"})
    other = running({**base, SKY_NODE_VAR: "0", "RANK": "0"})
    here.wait_for("ready")
    other.wait_for("ready")
    script = frdump.dump_script("r-agent-sky", None, node_var=SKY_NODE_VAR, here_var=SKY_NODE_VAR)
    got = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, SKY_NODE_VAR: "1"},
    )
    assert got.stdout.strip() == "1", got
    d = parse_fr_line(here.wait_for("[dtrain] fr "))
    assert d is not None and d.rank == 2
    assert not any("[dtrain] fr " in x for x in other.lines), other.lines[-5:]


def test_the_flight_recorder_buffer_comes_with_the_answer(running: Any, tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = running({"WITH_TORCH": "1", "PORT": str(port), "DTRAIN_FR_DIR": str(tmp_path / "fr")})
    out.wait_for("ready")
    os.kill(out.proc.pid, signal.SIGRTMIN + frdump.DUMP_SIGNAL_OFFSET)
    d = parse_fr_line(out.wait_for("[dtrain] fr "))
    assert d is not None and d.recorder is True
    assert [(e.op, e.seq, e.input_sizes) for e in d.entries] == [("all_reduce", 1, [[16]])]
    whole = json.loads((tmp_path / "fr" / "fr_rank0.json").read_text())
    assert whole["entries"][0]["profiling_name"] == "gloo:all_reduce"


# --------------------------------------------------------------------------- telemetry


def test_cpu_telemetry_lines_from_proc(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text("while True:\n    sum(range(10000))\n")
    proc = subprocess.Popen(
        [sys.executable, str(AGENT), "--telemetry-s", "0.2", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RANK": "3", "GROUP_RANK": "1", "DTRAIN_TELEMETRY_S": "9"},
    )
    try:
        out = _Lines(proc)
        t = parse_telemetry_line(out.wait_for("[dtrain] telemetry "))
        assert t is not None and t.rank == 3 and t.node == 1
        assert t.rss_bytes is not None and t.rss_bytes > 1 << 20
        assert t.cpu_pct is not None and t.cpu_pct > 0
        assert t.gpu is None  # no NVML here
    finally:
        proc.kill()
        proc.wait(30)


class _NvmlError(Exception):
    pass


def _fake_pynvml(xids: list[int]) -> types.ModuleType:
    """What nvidia-ml-py's pynvml offers, for one GPU, with recorded readings."""
    nv = types.ModuleType("pynvml")
    seen: dict[str, Any] = {}

    def handle_by_uuid(uuid: str) -> str:
        seen["uuid"] = uuid
        return "h-" + uuid

    def event_wait(es: object, timeout_ms: int) -> object:
        assert timeout_ms == 0  # never blocks the sampler
        if not xids:
            raise _NvmlError("NVML_ERROR_TIMEOUT")
        return types.SimpleNamespace(eventData=xids.pop(0))

    def no_ecc(h: object, kind: int, counter: int) -> int:
        raise _NvmlError("NVML_ERROR_NOT_SUPPORTED")

    nv.__dict__.update(
        NVML_TEMPERATURE_GPU=0,
        NVML_CLOCK_SM=1,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 8,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetHandleByUUID=handle_by_uuid,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            used=60 << 30, total=80 << 30, free=20 << 30
        ),
        nvmlDeviceGetPowerUsage=lambda h: 612345,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700000,
        nvmlDeviceGetTemperature=lambda h, s: 84,
        nvmlDeviceGetClockInfo=lambda h, c: 1410 if c == 1 else 0,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x4 | 0x40,
        nvmlDeviceGetTotalEccErrors=no_ecc,
        nvmlEventSetCreate=lambda: "es",
        nvmlDeviceRegisterEvents=lambda h, kinds, es: None,
        nvmlEventSetWait_v2=event_wait,
    )
    nv.seen = seen  # type: ignore[attr-defined]
    return nv


def test_the_nvml_path_against_a_fake_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_pynvml(xids=[79])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "9")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa,GPU-bbbb")
    agent = _agent()
    gpu = agent.Nvml.open()
    assert gpu is not None and fake.seen["uuid"] == "GPU-bbbb"  # type: ignore[attr-defined]
    sampler = agent.Sampler(gpu)
    t = parse_telemetry_line("[default1]:" + sampler.line())
    assert t is not None and t.rank == 9 and t.gpu is not None
    g = t.gpu
    assert (g.name, g.util_pct, g.temp_c, g.sm_clock_mhz) == ("NVIDIA H100 80GB HBM3", 97, 84, 1410)
    assert (g.mem_used_bytes, g.mem_total_bytes) == (60 << 30, 80 << 30)
    assert (g.power_w, g.power_limit_w) == (612.3, 700.0)
    assert g.throttle == ("sw_power_cap", "hw_thermal")
    assert g.ecc_uncorrected is None  # not supported on this GPU: left out, no error
    assert (g.xids, g.xid_total) == ((79,), 1)
    again = parse_telemetry_line(sampler.line())
    assert again is not None and again.gpu is not None
    assert (again.gpu.xids, again.gpu.xid_total) == ((), 1)


def test_no_nvml_or_no_such_gpu_means_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = _agent()
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert agent.Nvml.open() is None
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([]))
    monkeypatch.setenv("LOCAL_RANK", "9")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert agent.Nvml.open() is None  # 8 GPUs: no GPU 9
    monkeypatch.setenv("LOCAL_RANK", "2")
    gpu = agent.Nvml.open()
    assert gpu is not None and gpu.handle == "h2"


@pytest.mark.parametrize(
    "line",
    [
        "[dtrain] telemetry ",
        "[dtrain] telemetry {",
        "[dtrain] telemetry []",
        '[dtrain] telemetry {"rank": -1}',
        '[dtrain] telemetry {"rank": "zero"}',
        "[dtrain] step=1/2 loss=1.0",
    ],
)
def test_other_lines_are_no_sample(line: str) -> None:
    assert parse_telemetry_line(line) is None


def test_odd_values_in_a_sample_are_no_reading() -> None:
    t = parse_telemetry_line(
        ' 45%|###  | 9/20 [dtrain] telemetry {"rank": 2, "cpu_pct": "x", "rss_bytes": true,'
        ' "gpu": {"util_pct": 1e999, "throttle": "hw", "xids": [1, "2"]}}'
    )
    assert t is not None and t.rank == 2 and t.cpu_pct is None and t.rss_bytes is None
    assert t.gpu is not None and t.gpu.util_pct is None and t.gpu.throttle == ()
    assert t.gpu.xids == (1,)
