#!/usr/bin/env python3
"""dtrain-tui's rank agent: every rank of a bundle runs its training script through it.

Shipped inside every bundle as ``dtrain_agent.py``; the node scripts start each rank as::

    torchrun ... dtrain_agent.py [--telemetry-s SECONDS] [--] SCRIPT ARGS...

It runs SCRIPT as ``__main__`` with ``sys.argv == [SCRIPT, *ARGS]`` and ``sys.path[0]`` the
script's directory, exactly as ``python SCRIPT ARGS...`` would: its exit code, its exceptions and
their tracebacks (without the agent's frames) are the script's own. Around it, two daemon
threads:

- **Diagnosis on request.** :data:`DUMP_SIGNAL_OFFSET` (``SIGRTMIN+7``, a real-time signal no
  framework uses) is blocked in every thread before the script starts, and a thread takes it with
  ``sigwait``: each one makes the rank print one line ``[dtrain] fr {json}`` on stdout (its rank,
  node, host, the Flight Recorder's last collectives per process group, the main thread's
  innermost frames of the script's own code, and every thread's Python stack), and write the
  whole Flight Recorder buffer to ``logs/fr_rank<R>.json`` next to this file. It answers while
  the script is blocked inside a collective (torch waits with the GIL released), whatever the
  script does with SIGUSR1 (Lightning's Slurm requeue installs a handler for it). The launcher
  (``engine/launch/frdump.py``) signals only processes that block this signal.
- **Telemetry.** Every :data:`TELEMETRY_ENV` seconds (default 5; 0: off) one line
  ``[dtrain] telemetry {json}`` on stderr: CPU use and resident memory from /proc, the GPU's
  utilisation, memory, power, temperature, SM clock, throttle reasons and ECC/XID errors through
  NVML (``nvidia-ml-py``) where there is one, and torch's peak allocated CUDA memory once the
  script uses CUDA.

Self-contained on purpose: the standard library only (torch and pynvml are used when the script
or the node has them), nothing of dtrain-tui, so it runs on nodes where only torch is installed.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import threading
import time
import types
from pathlib import Path
from types import TracebackType
from typing import Any

DUMP_SIGNAL_OFFSET = 7
"""The launcher's diagnosis request is ``SIGRTMIN + DUMP_SIGNAL_OFFSET`` (41 with glibc). The
same constant is in ``engine/launch/frdump.py`` (a test checks they agree); a real-time signal,
as SIGUSR1 belongs to the script (and to Lightning's requeue)."""
FR_PREFIX = "[dtrain] fr "
"""The dump line's start (``engine.diagnose.flight.FR_PREFIX``)."""
TELEMETRY_PREFIX = "[dtrain] telemetry "
"""The telemetry line's start (``engine.diagnose.flight.TELEMETRY_PREFIX``)."""
TELEMETRY_ENV = "DTRAIN_TELEMETRY_S"
"""Seconds between telemetry samples (``--telemetry-s`` overrides; 0 turns them off)."""
DEFAULT_TELEMETRY_S = 5.0
FR_DIR_ENV = "DTRAIN_FR_DIR"
"""Where ``fr_rank<R>.json`` goes (default: ``logs/`` next to this file, in the bundle)."""
FR_BUFFER = "2000"
"""Flight Recorder entries kept per process (TORCH_FR_BUFFER_SIZE) when nothing sets one."""
FR_LINE_ENTRIES = 8
"""Entries (the newest) carried by the ``[dtrain] fr`` line; the file holds the whole buffer."""
THREAD_DEPTH = 12
"""Innermost frames kept of each thread's stack."""
_FR_KEYS = (
    "pg_id",
    "process_group",
    "collective_seq_id",
    "p2p_seq_id",
    "is_p2p",
    "profiling_name",
    "input_sizes",
    "input_dtypes",
    "output_sizes",
    "state",
    "retired",
    "time_created_ns",
    "timeout_ms",
)
_THROTTLE = {
    0x1: "idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
"""NVML's clock throttle (clock event) reason bits, by name."""
_HERE = os.path.abspath(__file__)
_RUNPY = os.path.abspath(runpy.__file__)
_OURS = frozenset({_HERE, _RUNPY, "<frozen runpy>"})
"""The files of the frames between Python and the script: the agent's (and runpy's, where a
script of the agent's tests is run by it; a frozen module's frames are ``<frozen runpy>``)."""
USAGE = "usage: dtrain_agent.py [--telemetry-s SECONDS] [--] SCRIPT [ARGS...]"


def dump_signal() -> int:
    """The request signal's number on this machine."""
    return int(signal.SIGRTMIN) + DUMP_SIGNAL_OFFSET


def _write_line(fd: int, text: str) -> None:
    """One whole line on ``fd``, past whatever the script did to sys.stdout / sys.stderr."""
    data = (text + "\n").encode("utf-8", "replace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data) :]


def _env_int(name: str, default: int = 0) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _identity() -> dict[str, Any]:
    return {
        "rank": _env_int("RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
        "node": _env_int("GROUP_RANK"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


# --------------------------------------------------------------------------- diagnosis


def fr_dump() -> dict[str, Any] | None:
    """This process's Flight Recorder buffer as JSON values; None before any process group (or
    where torch is not loaded: the script has not imported it, so it is in no collective)."""
    if "torch" not in sys.modules:
        return None
    try:
        from torch._C._distributed_c10d import _dump_fr_trace_json

        data = json.loads(_dump_fr_trace_json())
    except Exception:  # noqa: BLE001 - an older torch, or no process group yet
        return None
    return data if isinstance(data, dict) else None


def _frames(frame: Any, depth: int, own_only: bool) -> list[str]:
    """``file:line function``, innermost first; ``own_only``: the script's own code only (not
    the standard library's, an installed package's or the agent's)."""
    libs: tuple[str, ...] = ()
    if own_only:
        import sysconfig

        paths = sysconfig.get_paths()
        libs = tuple({os.path.realpath(paths["stdlib"]), os.path.realpath(paths["purelib"])})
    out: list[str] = []
    while frame is not None and len(out) < depth:
        code = frame.f_code
        name = os.path.realpath(code.co_filename)
        skip = own_only and (name.startswith(libs) or _ours(code.co_filename))
        if not skip and not code.co_filename.startswith("<frozen"):
            out.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return out


def thread_stacks(skip: int | None = None) -> dict[str, list[str]]:
    """Every thread's innermost frames, by ``name (ident)``; ``skip``: a thread left out."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        f"{names.get(ident, 'thread')} ({ident})": _frames(frame, THREAD_DEPTH, own_only=False)
        for ident, frame in sys._current_frames().items()
        if ident != skip
    }


def fr_line(dump: dict[str, Any] | None, skip_thread: int | None = None) -> str:
    """The one line a rank prints when asked (compact JSON after :data:`FR_PREFIX`)."""
    data = dump or {}
    entries = data.get("entries")
    entries = entries if isinstance(entries, list) else []
    main = threading.main_thread().ident
    body = {
        **_identity(),
        "time": round(time.time(), 3),
        "recorder": dump is not None,
        "pg_config": data.get("pg_config") or {},
        "pg_status": data.get("pg_status") or {},
        "entries": [
            {k: e[k] for k in _FR_KEYS if k in e}
            for e in entries[-FR_LINE_ENTRIES:]
            if isinstance(e, dict)
        ],
        "stack": _frames(sys._current_frames().get(main or -1), 4, own_only=True),
        "threads": thread_stacks(skip_thread),
    }
    return FR_PREFIX + json.dumps(body, separators=(",", ":"), default=str)


def _fr_dir() -> Path:
    return Path(os.environ.get(FR_DIR_ENV) or Path(_HERE).parent / "logs")


def answer_dump(skip_thread: int | None = None) -> None:
    """Write the whole buffer to ``fr_rank<R>.json`` (temp file, rename), then print the dump
    line (so whoever reads the line finds the file)."""
    dump = fr_dump()
    if dump is not None:
        _save_dump(dump)
    try:
        _write_line(1, fr_line(dump, skip_thread))
    except Exception as e:  # noqa: BLE001 - a dump must never end the run
        _write_line(2, f"[dtrain] warning: flight recorder dump failed: {e}")


def _save_dump(dump: dict[str, Any]) -> None:
    where = _fr_dir()
    path = where / f"fr_rank{_env_int('RANK')}.json"
    tmp = where / f".fr_rank{_env_int('RANK')}.{os.getpid()}.tmp"
    try:
        where.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(dump, default=str), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


def start_dump_thread() -> bool:
    """Block the request signal in this thread (every thread started later inherits the mask)
    and take it in a daemon thread. False where the platform has no real-time signals."""
    if not hasattr(signal, "pthread_sigmask") or not hasattr(signal, "SIGRTMIN"):
        return False
    sig = dump_signal()
    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})

    def serve() -> None:
        me = threading.get_ident()
        while True:
            signal.sigwait({sig})
            answer_dump(skip_thread=me)

    threading.Thread(target=serve, name="dtrain-agent-dump", daemon=True).start()
    return True


# --------------------------------------------------------------------------- telemetry


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Nvml:
    """This rank's GPU through NVML: opened once (:meth:`open`; None without a GPU or pynvml),
    then :meth:`sample` reads it; a field the GPU does not report is left out."""

    def __init__(self, nv: Any, handle: Any, index: str) -> None:
        self.nv = nv
        self.handle = handle
        self.index = index
        self.events: Any = None
        self.xid_total = 0
        with contextlib.suppress(Exception):
            es = nv.nvmlEventSetCreate()
            nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, es)
            self.events = es

    @classmethod
    def open(cls) -> Nvml | None:
        try:
            import pynvml as nv  # type: ignore[import-not-found,unused-ignore]

            nv.nvmlInit()
        except Exception:  # noqa: BLE001 - no NVML library, no driver, no GPU: CPU only
            return None
        local = _env_int("LOCAL_RANK")
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
        entry = visible[local] if local < len(visible) and visible[local] else str(local)
        try:
            if entry.isdigit():
                if int(entry) >= nv.nvmlDeviceGetCount():
                    return None
                handle = nv.nvmlDeviceGetHandleByIndex(int(entry))
            else:  # a UUID (GPU-..., MIG-...)
                handle = nv.nvmlDeviceGetHandleByUUID(entry)
        except Exception:  # noqa: BLE001 - a device this rank cannot see
            return None
        return cls(nv, handle, entry)

    def _get(self, name: str, *args: Any) -> Any:
        fn = getattr(self.nv, name, None)
        if fn is None:
            return None
        try:
            return fn(self.handle, *args)
        except Exception:  # noqa: BLE001 - not supported on this GPU
            return None

    def sample(self) -> dict[str, Any]:
        nv = self.nv
        out: dict[str, Any] = {"index": self.index}
        name = self._get("nvmlDeviceGetName")
        if name is not None:
            out["name"] = name.decode() if isinstance(name, bytes) else str(name)
        util = self._get("nvmlDeviceGetUtilizationRates")
        if util is not None:
            out["util_pct"] = float(util.gpu)
        mem = self._get("nvmlDeviceGetMemoryInfo")
        if mem is not None:
            out["mem_used_bytes"] = int(mem.used)
            out["mem_total_bytes"] = int(mem.total)
        power = self._get("nvmlDeviceGetPowerUsage")
        if power is not None:
            out["power_w"] = round(power / 1000.0, 1)
        limit = self._get("nvmlDeviceGetEnforcedPowerLimit")
        if limit is not None:
            out["power_limit_w"] = round(limit / 1000.0, 1)
        temp = self._get("nvmlDeviceGetTemperature", getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        if temp is not None:
            out["temp_c"] = float(temp)
        sm = self._get("nvmlDeviceGetClockInfo", getattr(nv, "NVML_CLOCK_SM", 1))
        if sm is not None:
            out["sm_clock_mhz"] = int(sm)
        reasons = self._get("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None:
            reasons = self._get("nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons is not None:
            out["throttle"] = [n for bit, n in _THROTTLE.items() if int(reasons) & bit]
        ecc = self._get(
            "nvmlDeviceGetTotalEccErrors",
            getattr(nv, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(nv, "NVML_VOLATILE_ECC", 0),
        )
        if ecc is not None:
            out["ecc_uncorrected"] = int(ecc)
        xids = self._xids()
        if self.events is not None:
            out["xid_total"] = self.xid_total
        if xids:
            out["xids"] = xids
        return out

    def _xids(self) -> list[int]:
        """XID errors since the last sample (NVML's event set, polled without waiting)."""
        if self.events is None:
            return []
        wait = getattr(self.nv, "nvmlEventSetWait_v2", None) or getattr(
            self.nv, "nvmlEventSetWait", None
        )
        got: list[int] = []
        for _ in range(64):
            try:
                ev = wait(self.events, 0)
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: none pending
                break
            got.append(int(getattr(ev, "eventData", 0)))
        self.xid_total += len(got)
        return got


def _torch_cuda() -> dict[str, Any]:
    """Peak and current allocated CUDA memory, once the script has initialised CUDA."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return {}
        dev = _env_int("LOCAL_RANK")
        if dev >= cuda.device_count():
            dev = 0
        return {
            "cuda_peak_bytes": int(cuda.max_memory_allocated(dev)),
            "cuda_allocated_bytes": int(cuda.memory_allocated(dev)),
        }
    except Exception:  # noqa: BLE001 - telemetry must never end the run
        return {}


class Sampler:
    """One telemetry line per :meth:`line` call: CPU use since the previous call (100 = one
    core busy), resident memory, and the GPU where there is one."""

    def __init__(self, gpu: Nvml | None) -> None:
        self.gpu = gpu
        self._wall = time.monotonic()
        t = os.times()
        self._cpu = t.user + t.system

    def sample(self) -> dict[str, Any]:
        wall = time.monotonic()
        t = os.times()
        cpu = t.user + t.system
        span = wall - self._wall
        body: dict[str, Any] = {**_identity(), "time": round(time.time(), 3)}
        if span > 0:
            body["cpu_pct"] = round(100.0 * (cpu - self._cpu) / span, 1)
        self._wall, self._cpu = wall, cpu
        rss = _rss_bytes()
        if rss is not None:
            body["rss_bytes"] = rss
        body.update(_torch_cuda())
        if self.gpu is not None:
            with contextlib.suppress(Exception):
                body["gpu"] = self.gpu.sample()
        return body

    def line(self) -> str:
        return TELEMETRY_PREFIX + json.dumps(self.sample(), separators=(",", ":"))


def start_telemetry(interval_s: float) -> threading.Event | None:
    """A daemon thread printing a telemetry line every ``interval_s`` seconds; set the returned
    event to stop it. None when ``interval_s`` is 0 or less."""
    if interval_s <= 0:
        return None
    stop = threading.Event()

    def serve() -> None:
        sampler = Sampler(Nvml.open())
        while not stop.wait(interval_s):
            try:
                _write_line(2, sampler.line())
            except Exception:  # noqa: BLE001 - telemetry must never end the run
                continue

    threading.Thread(target=serve, name="dtrain-agent-telemetry", daemon=True).start()
    return stop


# --------------------------------------------------------------------------- the script


def _ours(filename: str) -> bool:
    return filename in _OURS or os.path.abspath(filename) in _OURS


def _script_tb(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the script's first frame on (the agent's and runpy's cut off)."""
    while tb is not None and _ours(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _new_main(path: str) -> types.ModuleType:
    """A fresh ``__main__`` module for the script (the agent's own stays importable as
    ``dtrain_agent``: its threads' functions use its globals)."""
    import importlib.machinery

    sys.modules.setdefault("dtrain_agent", sys.modules["__main__"])
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    main.__spec__ = None
    main.__package__ = None
    main.__cached__ = None  # type: ignore[attr-defined]
    main.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return main


def _main_code(source: bytes, path: str) -> types.CodeType:
    """The script compiled as Python compiles a ``__main__`` file (no flags of the agent's)."""
    return compile(source, path, "exec", dont_inherit=True)


def run_script(script: str, args: list[str]) -> None:
    """Run ``script`` as ``__main__`` as ``python script args`` would: argv, sys.path[0], its
    exit (SystemExit passes through), an uncaught exception printed by sys.excepthook without
    the agent's frames and exit status 1 (KeyboardInterrupt: death by SIGINT, as Python does)."""
    sys.argv = [script, *args]
    where = os.path.dirname(os.path.realpath(script))
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.dirname(_HERE):
        sys.path[0] = where
    else:
        sys.path.insert(0, where)
    # An absolute path, as Python gives a script's __file__ and its tracebacks since 3.9.
    path = os.path.abspath(script)
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as e:
        _write_line(
            2, f"{sys.executable}: can't open file {path!r}: [Errno {e.errno}] {e.strerror}"
        )
        sys.exit(2)
    try:
        exec(_main_code(source, path), _new_main(path).__dict__)  # noqa: S102 - the script
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the script's own: reported as Python would
        e.__traceback__ = _script_tb(e.__traceback__)
        sys.excepthook(type(e), e, e.__traceback__)
        if isinstance(e, KeyboardInterrupt):
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        sys.exit(1)


def parse_args(argv: list[str]) -> tuple[float, str, list[str]]:
    """(telemetry seconds, script, its arguments); raises SystemExit(2) with the usage."""
    interval = DEFAULT_TELEMETRY_S
    env = os.environ.get(TELEMETRY_ENV)
    if env:
        try:
            interval = float(env)
        except ValueError:
            _write_line(2, f"dtrain_agent: {TELEMETRY_ENV}={env!r} is not a number of seconds")
            raise SystemExit(2) from None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            i += 1
            break
        if a == "--telemetry-s" and i + 1 < len(argv):
            try:
                interval = float(argv[i + 1])
            except ValueError:
                _write_line(2, f"dtrain_agent: --telemetry-s {argv[i + 1]!r} is not a number")
                raise SystemExit(2) from None
            i += 2
            continue
        if a.startswith("--telemetry-s="):
            try:
                interval = float(a.split("=", 1)[1])
            except ValueError:
                _write_line(2, f"dtrain_agent: {a!r}: not a number of seconds")
                raise SystemExit(2) from None
            i += 1
            continue
        break
    if i >= len(argv):
        _write_line(2, f"dtrain_agent: no training script given\n{USAGE}")
        raise SystemExit(2)
    return interval, argv[i], argv[i + 1 :]


def main(argv: list[str]) -> None:
    interval, script, args = parse_args(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER)
    start_dump_thread()
    start_telemetry(interval)
    run_script(script, args)


if __name__ == "__main__":
    main(sys.argv[1:])
