"""How fast planning is: the wall time of ``dtrain-tui plan ... --json`` as a user runs it (a fresh
process each time, median of several runs), the CPU time those processes used (which other load
on the machine does not inflate), the in-process ``plan()`` call (warm: repeated plans, as the
wizard re-plans), whether planning imported torch, and the same wall time for the issue's
scenarios at scale (the largest searches: DeepSeek-V3 on 2048 GPUs, 405B on 8192, ...).
Target: ``cli_wall_s`` and ``scale_worst_s`` < 0.5 on an otherwise idle 2-core CI machine.

With ``--presets``: every built-in model preset on the catalog's largest cluster the issue
names (2,048 H100 SXM, 256 nodes of 8 on InfiniBand NDR, 4K tokens, a global batch of 4,096),
one fresh ``plan --json`` process each (the best of three, and its CPU time), then where that
CPU time goes, from one more fresh process (:data:`SPLIT_PROBE`): interpreter start-up and the
imports (``import``), the ``plan()`` call (``plan``) and writing the JSON (``json``), one line a
preset.

Last line, for scripts: ``cli_wall_s=0.27 cli_best_s=0.24 cli_cpu_s=0.27 plan_ms=18.0
scale_worst_s=0.45 torch_imported=0``.
"""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCENARIOS = [
    ["--model", "llama-2-7b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--seq-len", "4096"],
    [
        "--model",
        "llama-2-70b",
        "--gpu",
        "h100-sxm",
        "--gpus-per-node",
        "8",
        "--nodes",
        "4",
        "--network",
        "ib",
    ],
    [
        "--model",
        "mixtral-8x7b",
        "--gpu",
        "h100-sxm",
        "--gpus-per-node",
        "8",
        "--nodes",
        "4",
        "--network",
        "ib",
    ],
]
SCALE_SCENARIOS = {
    # The scenarios at scale: the largest searches the planner runs.
    "405b-8192gpu": ["--model", "llama-3.1-405b", "--nodes", "1024", "--seq-len", "8192"]
    + ["--global-batch", "1024"],
    "70b-128gpu": ["--model", "llama-3-70b", "--nodes", "16", "--seq-len", "8192"]
    + ["--global-batch", "1024"],
    "dsv3-2048gpu": ["--model", "deepseek-v3", "--nodes", "256", "--seq-len", "4096"]
    + ["--global-batch", "4096"],
    "mixtral-256gpu": ["--model", "mixtral-8x7b", "--nodes", "32", "--seq-len", "4096"]
    + ["--global-batch", "1024"],
    "8b-128k-16gpu": ["--model", "llama-3-8b", "--nodes", "2", "--seq-len", "131072"]
    + ["--global-batch", "16"],
}
SCALE_FABRIC = ["--gpu", "h100", "--gpus-per-node", "8", "--network", "ib-ndr"]
RUNS = 5


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("dtrain-tui")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("dtrain-tui")
    return [found] if found else [sys.executable, "-m", "cli"]


LARGEST = ["--gpu", "h100", "--gpus-per-node", "8", "--nodes", "256", "--network", "ib-ndr"]
LARGEST += ["--seq-len", "4096", "--global-batch", "4096"]


SPLIT_PROBE = (
    "import sys, time\n"
    "import json\n"
    "from cli import build_parser\n"
    "from cli.spec_options import spec_from_args\n"
    "from engine.plan.planner import plan\n"
    "args = build_parser('cli.plan_cmd').parse_args(sys.argv[1:])\n"
    "spec = spec_from_args(args)\n"
    "t1 = time.process_time()\n"
    "p = plan(spec)\n"
    "t2 = time.process_time()\n"
    "json.dumps(p.to_json_dict(), indent=2)\n"
    "t3 = time.process_time()\n"
    "print(f'{t1 * 1000:.0f} {(t2 - t1) * 1000:.0f} {(t3 - t2) * 1000:.0f}')\n"
)
"""One ``plan --json`` in-process, its CPU milliseconds split: start-up and imports (the process
clock counts from the interpreter's start: what it had used before the plan, the spec parsed),
``plan()``, and the JSON."""


def _split(args: list[str]) -> str:
    """``import 120 plan 95 json 1 ms`` for one plan (:data:`SPLIT_PROBE`)."""
    r = subprocess.run(
        [sys.executable, "-c", SPLIT_PROBE, "plan", *args, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if r.returncode != 0:
        return ""
    imp, planned, dumped = r.stdout.split()
    return f"  import {imp} plan {planned} json {dumped} ms"


def presets() -> int:
    """Each built-in preset's ``plan --json`` wall and CPU time on :data:`LARGEST`, and where
    the CPU time goes (:func:`_split`)."""
    from engine.plan.models import list_presets

    cli = _cli()
    worst = ("", 0.0)
    for name in list_presets():
        walls: list[float] = []
        cpus: list[float] = []
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(
                [*cli, "plan", "--model", name, *LARGEST, "--json"],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        status = "ok" if r.returncode == 0 else r.stderr.strip().splitlines()[-1][:60]
        split = _split(["--model", name, *LARGEST]) if r.returncode == 0 else ""
        print(f"{name:20s} wall {min(walls):.3f} s  cpu {min(cpus):.3f} s  {status}{split}")
        if min(walls) > worst[1]:
            worst = (name, min(walls))
    print(f"presets_worst_s={worst[1]:.3f} presets_worst={worst[0]}")
    return 0


def main() -> int:
    if "--presets" in sys.argv[1:]:
        return presets()
    cli = _cli()
    walls: list[float] = []
    cpus: list[float] = []
    for args in SCENARIOS:
        for _ in range(RUNS):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = subprocess.run(
                [*cli, "plan", *args, "--json"], capture_output=True, text=True, cwd=ROOT
            )
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
    scale: dict[str, float] = {}
    for name, args in SCALE_SCENARIOS.items():
        runs: list[float] = []
        for _ in range(RUNS):
            t0 = time.perf_counter()
            r = subprocess.run(
                [*cli, "plan", *args, *SCALE_FABRIC, "--json"],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            runs.append(time.perf_counter() - t0)
            if r.returncode != 0:
                print(r.stderr, file=sys.stderr)
                return 1
        scale[name] = statistics.median(runs)
    probe = (
        "import sys, time\n"
        "from engine.plan.planner import plan\n"
        "from engine.plan.specs import Spec, ModelSpec, HardwareSpec, NetworkSpec\n"
        "specs = [Spec(model=ModelSpec(preset=m), hardware=HardwareSpec(gpu=g, gpus_per_node=8, nodes=n),"
        " network=NetworkSpec(tier='ib')) for m, g, n in"
        " [('llama-2-7b', 'a100-80gb', 1), ('llama-2-70b', 'h100-sxm', 4), ('mixtral-8x7b', 'h100-sxm', 4)]]\n"
        "plan(specs[0])\n"
        "ts = []\n"
        "for _ in range(5):\n"
        "    for s in specs:\n"
        "        t = time.perf_counter(); plan(s); ts.append(time.perf_counter() - t)\n"
        "ts.sort()\n"
        "print(ts[len(ts) // 2] * 1000, int('torch' in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
        return 1
    plan_ms, torch_imported = r.stdout.split()
    med = statistics.median(walls)
    print(
        f"cli runs: {len(walls)}, median {med:.3f} s, best {min(walls):.3f} s, worst {max(walls):.3f} s"
    )
    print("at scale (median of each): " + ", ".join(f"{k} {v:.3f} s" for k, v in scale.items()))
    print(
        f"cli_wall_s={med:.3f} cli_best_s={min(walls):.3f} cli_cpu_s={statistics.median(cpus):.3f} "
        f"plan_ms={float(plan_ms):.1f} scale_worst_s={max(scale.values()):.3f} "
        f"torch_imported={torch_imported}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
