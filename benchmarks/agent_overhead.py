"""The rank agent's cost on a training step, three ways:

1. **Its own threads' CPU, counted directly.** The loop reads the CPU clock of each of the
   agent's threads (``dtrain-agent-telemetry``, ``dtrain-agent-dump``; ``time.pthread_getcpuclockid``,
   nanoseconds) over the timed steps, against the main thread's CPU over the same steps: the
   share of a rank's compute the agent takes, a figure a busy neighbour cannot blur. Its one-off
   start (before the script's first line) is the process CPU the loop finds already spent,
   agent run against plain run.
2. **An A/B of the step.** The same loop run alone (``python loop.py``) and through the agent
   (``python dtrain_agent.py loop.py``, telemetry on), in turn, ``--rounds`` times; each round
   gives a ratio agent / alone of the median step time and of the process's CPU per step, and
   the figures are the median ratio over the rounds with its interquartile range (paired rounds:
   a drift in the machine's load cancels within a round).
3. **One telemetry sample**, timed in-process: its share of a rank's time is its cost over the
   interval.

The loop is a CPU training step of a small MLP (forward, backward, SGD) in torch; ``--width``
sets its size (the default gives steps of about 10-40 ms on a laptop core; real training steps
are 0.1-10 s, so a fixed cost weighs less there). The telemetry thread wakes every
``--telemetry-s`` seconds (default 1: five times more often than the agent's default of 5 s).
Last line: ``key=value`` pairs; the issue's bar is overhead < 1 %.

    .venv/bin/python benchmarks/agent_overhead.py
    .venv/bin/python benchmarks/agent_overhead.py --rounds 5 --steps 400 --telemetry-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "engine" / "trainer" / "agent.py"

LOOP = r"""
import json, statistics, sys, threading, time
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
steps, width = int(sys.argv[1]), int(sys.argv[2])
model = torch.nn.Sequential(
    torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width)
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, width)


def agent_cpu():
    # Each agent thread's own CPU clock (ns resolution); none when run alone.
    out = 0.0
    for t in threading.enumerate():
        if t.name.startswith("dtrain-agent") and t.ident is not None:
            out += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return out


times = []
for i in range(steps + 20):
    if i == 20:  # warm-up steps left out
        cpu0, main0, agent0 = time.process_time(), time.thread_time(), agent_cpu()
    t = time.perf_counter()
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if i >= 20:
        times.append(time.perf_counter() - t)
n = len(times)
print(json.dumps({
    "median_s": statistics.median(times),
    "cpu_s": (time.process_time() - cpu0) / n,  # every thread's CPU: the agent's too
    "main_cpu_s": time.thread_time() - main0,
    "agent_cpu_s": agent_cpu() - agent0,
    "start_cpu_s": cpu0,  # the process's CPU before the first timed step
    "steps": n,
}))
"""


def _run(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """The loop's figures (seconds): median step, CPU per step, main thread's and agent threads'
    CPU over the timed steps, process CPU before them."""
    out = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return {k: float(v) for k, v in json.loads(line).items()}


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def sample_cost_s(n: int = 200) -> float:
    """Median seconds one telemetry sample takes (the agent's only periodic work), in-process:
    a bound free of the machine's noise (its share of a rank's time is cost / interval)."""
    import importlib.util
    import statistics
    import time

    spec = importlib.util.spec_from_file_location("dtrain_agent_bench", AGENT)
    assert spec is not None and spec.loader is not None
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    sampler = agent.Sampler(agent.Nvml.open())
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sampler.line()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=1024, help="the MLP's width (step size)")
    ap.add_argument("--telemetry-s", type=float, default=1.0)
    a = ap.parse_args()
    rounds: list[tuple[dict[str, float], dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        loop = Path(tmp) / "loop.py"
        loop.write_text(LOOP)
        env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1"}
        env["DTRAIN_TELEMETRY_S"] = str(a.telemetry_s)
        argvs = {
            "alone": [sys.executable, str(loop)],
            "agent": [sys.executable, str(AGENT), str(loop)],
        }
        for r in range(a.rounds):
            got: dict[str, dict[str, float]] = {}
            # Alternate which goes first, so a drift in the machine's load favours neither.
            for name in ("alone", "agent") if r % 2 == 0 else ("agent", "alone"):
                got[name] = _run([*argvs[name], str(a.steps), str(a.width)], env)
                t = got[name]
                print(
                    f"round {r + 1} {name:5s} median step {t['median_s'] * 1e3:8.3f} ms, "
                    f"CPU {t['cpu_s'] * 1e3:8.3f} ms/step, agent threads "
                    f"{t['agent_cpu_s'] * 1e6:7.1f} us",
                    flush=True,
                )
            rounds.append((got["alone"], got["agent"]))
    cost = sample_cost_s()
    wall = _quartiles([b["median_s"] / a_["median_s"] - 1 for a_, b in rounds])
    cpu = _quartiles([b["cpu_s"] / a_["cpu_s"] - 1 for a_, b in rounds])
    threads = statistics.median(b["agent_cpu_s"] / b["main_cpu_s"] for _, b in rounds)
    start = statistics.median(b["start_cpu_s"] - a_["start_cpu_s"] for a_, b in rounds)
    step_ms = statistics.median(a_["median_s"] for a_, _ in rounds) * 1e3
    print(
        f"step_ms={step_ms:.3f} "
        f"agent_threads_cpu_pct={100.0 * threads:.4f} agent_start_cpu_ms={start * 1e3:.1f} "
        f"wall_overhead_pct={100.0 * wall[1]:.2f} "
        f"wall_iqr_pct={100.0 * wall[0]:.2f}..{100.0 * wall[2]:.2f} "
        f"cpu_overhead_pct={100.0 * cpu[1]:.2f} "
        f"cpu_iqr_pct={100.0 * cpu[0]:.2f}..{100.0 * cpu[2]:.2f} "
        f"sample_us={cost * 1e6:.1f} sample_share_pct={100.0 * cost / a.telemetry_s:.4f} "
        f"telemetry_s={a.telemetry_s} rounds={a.rounds} steps={a.steps} width={a.width}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
