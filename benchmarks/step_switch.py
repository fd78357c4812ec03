"""Step switches and dialog opens, keystroke to painted, in a real terminal (tmux).

Runs ``dtrain-tui`` in a tmux pane (120×40) on the demo and on a 405B plan (llama-3.1-405b on
16×8 H100), sends the key that moves (Ctrl+N, Ctrl+B, Ctrl+O) and polls ``capture-pane`` until the
new step's marker in the sidebar and its title are on screen; prints p50 / p95 per move, and
the CPU time the app's UI thread spent on it (from ``/proc``: what the move costs, whatever else
the machine is doing; the wall time also counts the waits for a busy CPU). The target (issue
40): p95 < 100 ms.

    python benchmarks/step_switch.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

EXE = Path(sys.executable).parent / "dtrain-tui"
STEPS = ["Model", "Hardware", "Network", "Training", "Decision", "Configs", "Launch"]


class Pane:
    def __init__(self, workdir: Path) -> None:
        self.socket = f"dtrain-bench-{uuid.uuid4().hex[:10]}"
        self.workdir = workdir
        self.stat: Path | None = None

    def tmux(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        ).stdout

    def start(self, command: str) -> None:
        env = {"HOME": str(self.workdir), "TERM": "xterm-256color"}
        env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        self.tmux(
            "-f", os.devnull, "new-session", "-d", "-x", "120", "-y", "40",
            "-c", str(self.workdir), *env_args, command,
        )  # fmt: skip

    def ui_thread(self) -> Path | None:
        """The schedstat file of the app's main (UI) thread: the pane's process, or its child
        when a shell runs the command."""
        pid = self.tmux("display", "-p", "-t", "0", "#{pane_pid}").strip()
        for _ in range(3):
            if not pid:
                return None
            comm = Path(f"/proc/{pid}/comm")
            name = comm.read_text() if comm.exists() else ""
            if "python" in name or "dtrain" in name:
                return Path(f"/proc/{pid}/task/{pid}/schedstat")
            children = Path(f"/proc/{pid}/task/{pid}/children")
            pid = children.read_text().split()[0] if children.exists() else ""
        return None

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "0")

    def wait(self, *texts: str, timeout: float = 120.0) -> float:
        """Seconds until every one of ``texts`` is on screen."""
        t0 = time.perf_counter()
        while not all(t in (s := self.screen()) for t in texts):
            if time.perf_counter() - t0 > timeout:
                raise SystemExit(f"never saw {texts}; the screen was:\n{s}")
            time.sleep(0.002)
        return time.perf_counter() - t0

    def wait_idle(self, quiet_s: float = 0.5, timeout: float = 60.0) -> None:
        """Until the UI thread has run under 5 ms in ``quiet_s`` (or ``timeout``)."""
        t0 = time.perf_counter()
        last = ui_cpu(self.stat)
        while last is not None and time.perf_counter() - t0 < timeout:
            time.sleep(quiet_s)
            now = ui_cpu(self.stat)
            if now is None or now - last < 0.005:
                return
            last = now

    def press(self, key: str, *texts: str) -> float:
        t0 = time.perf_counter()
        self.tmux("send-keys", "-t", "0", key)
        self.wait(*texts)
        return time.perf_counter() - t0

    def press_timed(self, key: str, *texts: str) -> tuple[float, float | None]:
        """Wall seconds to the painted screen, and the UI thread's CPU seconds meanwhile."""
        before = ui_cpu(self.stat)
        wall = self.press(key, *texts)
        after = ui_cpu(self.stat)
        return wall, (after - before if before is not None and after is not None else None)

    def kill(self) -> None:
        self.tmux("kill-server")


def ui_cpu(stat: Path | None) -> float | None:
    """CPU seconds the thread has run (``schedstat``'s first field, in ns)."""
    try:
        return int(stat.read_text().split()[0]) / 1e9 if stat is not None else None
    except (OSError, ValueError, IndexError):
        return None


def close_dialog(pane: Pane) -> None:
    """Escape until the profiles dialog is gone (an Escape that lands while it is still being
    built is not taken: a known gap, issue 40)."""
    for _ in range(20):
        pane.tmux("send-keys", "-t", "0", "Escape")
        deadline = time.perf_counter() + 1.0
        while time.perf_counter() < deadline:
            if "enter load" not in pane.screen():
                return
            time.sleep(0.01)
    raise SystemExit("the profiles dialog never closed")


def measure(label: str, command: str, workdir: Path, rounds: int) -> None:
    pane = Pane(workdir)
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}

    def timed(move: str, key: str, text: str) -> None:
        wall, used = pane.press_timed(key, text)
        times.setdefault(move, []).append(wall)
        if used is not None:
            cpu.setdefault(move, []).append(used)

    try:
        pane.start(command)
        pane.wait("1 Model")
        pane.stat = pane.ui_thread()
        pane.wait("/step")  # the plan is ready
        pane.wait_idle()  # start-up done (the steps are built ahead): switches, not start-up
        for _ in range(rounds):
            for i in range(1, len(STEPS)):
                timed(f"{STEPS[i - 1]} → {STEPS[i]}", "C-n", f"› {i + 1} {STEPS[i]}")
            timed("profiles dialog", "C-o", "enter load · s save")
            close_dialog(pane)
            for i in range(len(STEPS) - 1, 0, -1):
                timed(f"{STEPS[i]} → {STEPS[i - 1]}", "C-b", f"› {i} {STEPS[i - 1]}")
    finally:
        pane.kill()
    print(f"\n{label}")
    for move, ts in times.items():
        line = f"  {move:22} p50 {_ms(median(ts))} p95 {_ms(p95(ts))}"
        if move in cpu:
            line += f"   UI-thread CPU p50 {_ms(median(cpu[move]))} p95 {_ms(p95(cpu[move]))}"
        print(line)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:6.0f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from engine.plan.specs import HardwareSpec, ModelSpec, demo_spec
    from profiles.store import ProfileStore

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = work / "profiles"
        big = demo_spec().model_copy(
            update={
                "model": ModelSpec(preset="llama-3.1-405b"),
                "hardware": HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=16),
            }
        )
        ProfileStore(cfg).save_spec("bench-405b", big)
        measure("demo", f"{EXE} --config-dir {cfg}", work, args.rounds)
        measure("405B on 16x8 H100", f"{EXE} --config-dir {cfg} --profile bench-405b", work,
                args.rounds)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
