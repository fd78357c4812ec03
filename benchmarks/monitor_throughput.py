"""Monitor throughput under a firehose: 16 real processes print NCCL-like lines as fast as they
can, through the same pipeline as a launch, into the monitor (headless Textual app).

Pipeline (``--mode launch``, the default): a bundle whose node script starts 16 printer processes
that prefix each line ``[default<i>]:`` as ``torchrun --tee 3`` does -> the launch package's
:class:`LocalBackend` (pipe reader, rank splitter, run-directory writer) -> the monitor's
:class:`engine.monitor.reader.BatchReader` (on ``MonitorScreen``'s thread worker) -> panes. ``--mode rundir``: the printers write ``RUN/logs/rank<R>.stdout.log``
(16 writer processes, as a launch's run directory fills) and the monitor tails the directory
(:class:`engine.monitor.tail.RunDirSource`), the ``dtrain-tui monitor RUN_DIR`` path.

Measured: lines/s delivered to panes (all lines, start to last line shown), the worst delay of a
key press (a key is pressed every 100 ms and timed until its action ran), the worst UI timer lag,
and RSS growth of the monitor process. Last line: ``key=value`` pairs.

    .venv/bin/python benchmarks/monitor_throughput.py                 # 5M lines, launch pipeline
    .venv/bin/python benchmarks/monitor_throughput.py --lines 500000 --mode rundir
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PRINTER = r"""
import os, sys
rank, count, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if mode == "launch":
    prefix, fd = f"[default{rank}]:", 1
else:
    fd = os.open(sys.argv[4], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    prefix = ""
head = f"{prefix}bench-host:{4000 + rank}:{4000 + rank} [{rank}] NCCL INFO Channel "
# Like NCCL (C code) the printers spend next to no CPU per line, so the 2 cores go to the
# pipeline under test: 64 distinct blocks of whole lines are rendered once, then written in turn,
# each write under PIPE_BUF (4096 bytes) so it is atomic on a shared pipe, as torchrun's are.
blocks, lines, size, i = [], [], 0, 0
while len(blocks) < 64:
    line = f"{head}{i % 32:02d}/0 : {rank}[{rank}] -> {(rank + 1) % 16}[{(rank + 1) % 16}] via P2P/IPC/read seq={i}\n"
    i += 1
    if size + len(line) > 4000:
        blocks.append(lines)
        lines, size = [], 0
    lines.append(line)
    size += len(line)
encoded = [("".join(b).encode(), len(b)) for b in blocks]
sent, k = 0, 0
while sent < count:
    data, n = encoded[k % 64]
    k += 1
    if sent + n > count:
        n = count - sent
        data = "".join(blocks[(k - 1) % 64][:n]).encode()
    os.write(fd, data)
    sent += n
"""


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def make_bundle(root: Path, procs: int, per_proc: int) -> Path:
    from engine.write.manifest import BundleManifest

    b = root / "bundle"
    b.mkdir(parents=True)
    (b / "printer.py").write_text(PRINTER)
    (b / "nccl.env").write_text("")
    script = textwrap.dedent(
        f"""\
        #!/usr/bin/env bash
        cd "$(dirname "${{BASH_SOURCE[0]}}")"
        for i in $(seq 0 {procs - 1}); do
          python printer.py "$i" {per_proc} launch &
        done
        wait
        """
    )
    (b / "launch_node0.sh").write_text(script)
    m = BundleManifest(
        name="bench",
        framework="ddp",
        dist_backend="gloo",
        nodes=1,
        gpus_per_node=procs,
        node_scripts=["launch_node0.sh"],
        script="printer.py",
    )
    (b / "bundle.json").write_text(m.model_dump_json())
    (b / "plan.json").write_text("{}")
    return b


def make_run_dir(run: Path, procs: int) -> None:
    from engine.rundir.record import RunState

    (run / "logs").mkdir(parents=True)
    ranks = [
        {"rank": r, "node_rank": 0, "local_rank": r, "host": "localhost", "exit_code": None}
        for r in range(procs)
    ]
    (run / "run.json").write_text(
        json.dumps({"state": RunState.RUNNING, "world_size": procs, "ranks": ranks})
    )
    (run / "printer.py").write_text(PRINTER)


def start_rundir_writers(run: Path, procs: int, per_proc: int) -> list[Any]:
    import subprocess

    return [
        subprocess.Popen(
            [
                sys.executable,
                str(run / "printer.py"),
                str(r),
                str(per_proc),
                "rundir",
                str(run / "logs" / f"rank{r}.stdout.log"),
            ]
        )
        for r in range(procs)
    ]


async def bench(args: argparse.Namespace) -> dict[str, float]:
    from textual.binding import Binding

    from engine.rundir.record import RunState
    from tui.screens.monitor import MonitorApp

    procs, per_proc = args.procs, args.lines // args.procs
    total = procs * per_proc
    tmp = Path(tempfile.mkdtemp(prefix="dtrain-bench-"))
    run = tmp / "run"
    writers: list[Any] = []
    if args.mode == "launch":
        from engine.launch.base import LaunchOptions
        from engine.launch.local import LocalBackend

        bundle = make_bundle(tmp, procs, per_proc)
        source: Any = LocalBackend(bundle, run, LaunchOptions(hang_timeout_s=600))
    else:
        from engine.monitor.tail import RunDirSource

        make_run_dir(run, procs)
        source = RunDirSource(run)

    pings: list[float] = []

    class BenchApp(MonitorApp):
        BINDINGS = [*MonitorApp.BINDINGS, Binding("f12", "ping", show=False, priority=True)]

        def action_ping(self) -> None:
            pings.append(time.perf_counter())

    app = BenchApp(source, run, world_size=procs, stop_source_on_exit=True)
    key_delays: list[float] = []
    lags: list[float] = []
    # The clock starts before the app and the printers do: start-up is part of the figure.
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    if args.mode == "rundir":
        writers = start_rundir_writers(run, procs, per_proc)
    async with app.run_test(size=(160, 48)) as pilot:
        while app.monitor is None:
            await pilot.pause(0.01)
        m = app.monitor
        rss0 = rss_mb()
        expected = [time.perf_counter() + 0.05]

        def tick() -> None:
            now = time.perf_counter()
            lags.append(now - expected[0])
            if args.verbose and now - expected[0] > 0.2:
                print(
                    f"# lag {now - expected[0]:.2f}s at t={now - t0:.1f}s, {m.delivered:,} lines",
                    file=sys.stderr,
                )
            expected[0] = now + 0.05

        app.set_interval(0.05, tick)
        deadline = t0 + args.timeout
        next_key = t0 + 0.1
        while m.delivered < total and time.perf_counter() < deadline:
            now = time.perf_counter()
            if now >= next_key:
                n = len(pings)
                sent = time.perf_counter()
                app.post_message(_key("f12"))
                while len(pings) == n and time.perf_counter() - sent < 5:
                    await asyncio.sleep(0.001)
                if len(pings) > n:
                    key_delays.append(pings[-1] - sent)
                    if args.verbose and key_delays[-1] > 0.1:
                        print(
                            f"# key {1000 * key_delays[-1]:.0f} ms at t={sent - t0:.1f}s, "
                            f"{m.delivered:,} lines",
                            file=sys.stderr,
                        )
                next_key = time.perf_counter() + 0.1
            if writers and all(w.poll() is not None for w in writers):
                ranks = json.loads((run / "run.json").read_text())["ranks"]
                for r in ranks:
                    r["exit_code"] = 0
                (run / "run.json").write_text(
                    json.dumps({"state": RunState.SUCCEEDED, "world_size": procs, "ranks": ranks})
                )
                writers = []
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        delivered = m.delivered
        rss1 = rss_mb()
        batch_ms = m.max_batch_ms
        batches = m.batches
        panes_ok = all(len(m.pane_lines(f"r{r}")) > 0 for r in range(procs))
        await pilot.press("q")
    for w in writers:
        w.kill()
    if args.mode == "launch":
        source.stop()
    shutil.rmtree(tmp, ignore_errors=True)  # 5M lines leave ~500 MB of logs
    return {
        "lines": float(delivered),
        "expected_lines": float(total),
        "elapsed_s": elapsed,
        "lines_per_s": delivered / elapsed if elapsed else 0.0,
        "max_key_delay_ms": 1000 * max(key_delays) if key_delays else -1.0,
        "p50_key_delay_ms": 1000 * sorted(key_delays)[len(key_delays) // 2] if key_delays else -1.0,
        "p95_key_delay_ms": (
            1000 * sorted(key_delays)[int(len(key_delays) * 0.95)] if key_delays else -1.0
        ),
        "keys": float(len(key_delays)),
        "max_timer_lag_ms": 1000 * max(lags) if lags else -1.0,
        "rss_growth_mb": rss1 - rss0,
        # CPU seconds of this process (monitor, plus the launch backend in launch mode) per
        # line: the capacity figure that does not depend on what else the machine runs.
        "cpu_us_per_line": 1e6 * cpu / delivered if delivered else -1.0,
        "load_avg_1m": os.getloadavg()[0],
        "panes_ok": float(panes_ok),
        "batches": float(batches),
        "max_batch_ui_ms": batch_ms,
    }


def _key(key: str) -> Any:
    from textual import events

    return events.Key(key, None)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--lines", type=int, default=5_000_000)
    ap.add_argument("--procs", type=int, default=16)
    ap.add_argument("--mode", choices=("launch", "rundir"), default="launch")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--verbose", action="store_true", help="report each UI stall over 200 ms")
    args = ap.parse_args()
    res = asyncio.run(bench(args))
    for k, v in res.items():
        print(f"# {k}: {v:,.1f}")
    ok = res["lines"] == res["expected_lines"]
    print(
        f"mode={args.mode} lines={int(res['lines'])} complete={int(ok)} "
        f"lines_per_s={res['lines_per_s']:.0f} max_key_delay_ms={res['max_key_delay_ms']:.1f} "
        f"p95_key_delay_ms={res['p95_key_delay_ms']:.1f} "
        f"max_timer_lag_ms={res['max_timer_lag_ms']:.1f} rss_growth_mb={res['rss_growth_mb']:.1f} "
        f"cpu_us_per_line={res['cpu_us_per_line']:.2f} max_batch_ui_ms={res['max_batch_ui_ms']:.1f} "
        f"load_avg={res['load_avg_1m']:.1f}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
