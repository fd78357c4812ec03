"""Start-up time of the wizard: from running ``dtrain-tui`` in a real pseudo-terminal (80×24)
to the first screen drawn (the step sidebar on screen), median of several runs; and which heavy
modules the app has imported once it has planned and rendered the bundle (none may be).

Last line: ``startup_s=<median wall> startup_max_s=<max> startup_cpu_s=<median CPU>
first_step_ready_s=<median> load_avg_1m=<load> runs=<n> torch_imported=0|1 deepspeed_imported=0|1 sky_imported=0|1``
(target: startup_s < 0.8 on an otherwise idle machine, all three 0). The CPU figure is the work
done before the first frame, which other processes on a busy machine cannot inflate.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "dtrain-tui"
MARKER = b"Hardware"  # the sidebar's second step: drawn with the first frame
READY = b"Experts per token"  # the model step's last field: the first step is fully built
HEAVY = ("torch", "deepspeed", "sky")

# Drives the app headless through planning and bundle rendering, then reports sys.modules.
_IMPORT_PROBE = """
import asyncio, sys
from tui.app import DtrainApp
from engine.plan.specs import demo_spec

async def main():
    app = DtrainApp(demo_spec(), plan_delay_s=0.01)
    async with app.run_test(size=(120, 40)) as pilot:
        async def settle():
            for _ in range(400):
                await pilot.pause(0.02)
                if app.idle and not any(w.is_running for w in app.workers):
                    break
        for step in ("decision", "configs"):
            await settle()
            assert await app.wizard.go(step), step
        await settle()
        assert app.plan is not None and app.bundle, "no plan or bundle"
    print(" ".join(f"{m}={int(m in sys.modules)}" for m in %r))

asyncio.run(main())
"""


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (from /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_to_first_screen(timeout: float = 20.0) -> tuple[float, float, float]:
    """(wall seconds to the first frame, CPU seconds used by then, wall seconds until the first
    step's fields are all drawn) from spawning ``dtrain-tui`` in a pty. CPU time is what the
    machine's load can't inflate."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TERM="xterm-256color", COLUMNS="80", LINES="24", HOME=tmp)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [str(EXE), "--config-dir", tmp],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=tmp,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        seen = b""
        elapsed = ready_s = cpu = float("nan")
        try:
            while time.perf_counter() - t0 < timeout:
                ready, _, _ = select.select([master], [], [], 0.05)
                if not ready:
                    continue
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                seen += chunk
                if elapsed != elapsed and MARKER in seen:
                    elapsed = time.perf_counter() - t0
                    cpu = _cpu_seconds(proc.pid)
                if READY in seen:
                    ready_s = time.perf_counter() - t0
                    break
            os.write(master, b"\x11")  # Ctrl+Q
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            os.close(master)
    if elapsed != elapsed:
        raise SystemExit(f"the first screen never appeared within {timeout} s")
    return elapsed, cpu, ready_s


def heavy_imports() -> dict[str, int]:
    out = (
        subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE % (HEAVY,)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return {k: int(v) for k, v in (p.split("=") for p in out.split())}


def main() -> None:
    runs = int(os.environ.get("DTRAIN_BENCH_RUNS", "5"))
    time_to_first_screen()  # warm the file cache (byte-code, fonts of the terminal layer)
    results = [time_to_first_screen() for _ in range(runs)]
    for i, (wall, cpu, ready) in enumerate(results, 1):
        print(
            f"run {i}: first frame {wall:.3f} s ({cpu:.2f} s CPU), model step built {ready:.3f} s"
        )
    times = [r[0] for r in results]
    cpus = [r[1] for r in results]
    readies = [r[2] for r in results]
    imports = heavy_imports()
    load = os.getloadavg()[0]
    print(
        f"startup_s={statistics.median(times):.3f} startup_max_s={max(times):.3f} "
        f"startup_cpu_s={statistics.median(cpus):.3f} "
        f"first_step_ready_s={statistics.median(readies):.3f} load_avg_1m={load:.2f} runs={runs} "
        + " ".join(f"{m}_imported={imports[m]}" for m in HEAVY)
    )


if __name__ == "__main__":
    main()
