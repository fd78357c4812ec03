"""Regenerate the README's and the docs' screenshots from the app itself (``make screenshots``).

Each picture is the real Textual app driven headless under ``run_test`` and saved with
``App.save_screenshot`` as SVG: the wizard's Decision step for a fixed spec (planning is pure,
so the picture is the planner's real answer), the monitor replaying a canned failed run (a
2-node, 4-rank run whose rank 3 runs out of memory), and the monitor's GPU panel (``g``) on a
healthy 2 × 8 H100 run of the Decision step's plan, whose telemetry lines the rank agent's own
NVML code (``engine/trainer/agent.py``) makes, reading a fake NVML with fixed readings, and the
monitor's charts (``p``) on a 4-rank run whose rank 2 falls behind. Nothing is
drawn by hand; run it again after a change to what those screens show and commit the SVGs under
``docs/images/``. A fixed clock and fixed readings: two runs write the same bytes.

Run: ``.venv/bin/python docs/screenshots.py [OUT_DIR]`` (default ``docs/images``).
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from textual.widget import Widget

from engine.monitor.tail import ListSource
from engine.plan.names import NetworkTier
from engine.plan.planner import plan
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from engine.trainer import agent
from engine.write.plan_json import plan_json
from tui.app import DtrainApp
from tui.screens.monitor import MonitorApp
from tui.widgets.charts import RankCharts
from tui.widgets.gpu_panel import GpuPanel

SIZE = (140, 42)
CLOCK = 1_700_000_000.0  # a fixed clock: the pictures do not change from one run to the next
DEADLINE_S = 60.0


def decision_spec() -> Spec:
    """Llama 3 8B on two 8 × H100 nodes over NDR InfiniBand, 4K tokens, a 1T-token budget."""
    return Spec(
        model=ModelSpec(preset="llama-3-8b"),
        hardware=HardwareSpec(gpu="h100-sxm", gpus_per_node=8, nodes=2),
        network=NetworkSpec(tier=NetworkTier.IB_NDR, socket_ifname="eth0"),
        training=TrainingSpec(seq_len=4096, global_batch=512, tokens=1e12),
    )


async def _wait(cond: object, what: str, pilot: object) -> None:
    """Wait for ``cond()`` with a deadline; the app gets a turn first (a freshly started app is
    idle before it has mounted anything)."""
    deadline = time.monotonic() + DEADLINE_S
    await pilot.pause(0.02)  # type: ignore[attr-defined]
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"screenshots: {what} did not happen within {DEADLINE_S:g} s")
        await pilot.pause(0.02)  # type: ignore[attr-defined]


def _shown(widget: Widget | None) -> bool:
    """The widget is mounted, displayed and laid out (has a size on the screen)."""
    return widget is not None and widget.is_mounted and widget.display and widget.region.area > 0


async def wizard_decision(out: Path) -> Path:
    app = DtrainApp(
        decision_spec(),
        out_dir=Path("never-written-screenshot-bundle"),
        run_root=Path("never-written-screenshot-runs"),
        plan_delay_s=0.01,
        show_timings=False,
    )
    async with app.run_test(size=SIZE) as pilot:

        def idle() -> bool:
            return app.idle and not any(w.is_running for w in app.workers)

        await _wait(idle, "the first plan", pilot)
        assert app.wizard is not None
        await app.wizard.go("decision")
        await _wait(
            lambda: (
                app.session.current == "decision"
                and app.wizard is not None
                and _shown(app.wizard.pane("decision"))
                and idle()
            ),
            "the Decision step",
            pilot,
        )
        for _ in range(10):  # a few refreshes: the step's pane lays out after it is mounted
            await pilot.pause(0.05)
        await _wait(idle, "the Decision step's plan", pilot)
        return Path(app.save_screenshot("wizard-decision.svg", path=str(out)))


def _step(rank: int, n: int, seconds: float) -> str:
    return (
        f"[dtrain] step={n}/20 loss={7.2 - 0.15 * n + 0.01 * rank:.4f} "
        f"tokens_per_s={65536 / seconds:.1f} step_time_s={seconds} mem_gb=71.42"
    )


def _nccl(rank: int, text: str) -> str:
    return f"gpu-{rank // 2}:{4100 + rank}:{4100 + rank} [{rank % 2}] NCCL INFO {text}"


def failed_run(world: int = 4, steps: int = 6) -> list[list[Event]]:
    """A 2-node run: NCCL set-up over InfiniBand, six steps (rank 2 slower), then rank 3 runs
    out of GPU memory and the launcher stops the others."""
    batches: list[list[Event]] = [[RunStateChanged("running", "started", CLOCK)]]
    batches.append(
        [
            LineBatch(
                r // 2,
                r,
                "stdout",
                (
                    _nccl(r, "NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:10.0.0.1<0>"),
                    _nccl(r, "Using network IB"),
                    _nccl(r, f"comm 0x1 rank {r} nranks {world} cudaDev {r % 2} - Init COMPLETE"),
                ),
            )
            for r in range(world)
        ]
    )
    batches.extend(
        [LineEvent(r // 2, r, "stdout", _step(r, n, 1.9 if r == 2 else 1.2)) for r in range(world)]
        for n in range(1, steps + 1)
    )
    batches.append(
        [
            LineBatch(
                1,
                3,
                "stderr",
                (
                    "Traceback (most recent call last):",
                    '  File "train.py", line 412, in <module>',
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                ),
            ),
            RankExit(1, 3, 1, reason="rank 3 exited 1"),
            RankExit(0, 0, -15),
            RankExit(0, 1, -15),
            RankExit(1, 2, -15),
            RunStateChanged("failed", "rank 3 on node 1 (gpu-1) exited 1", CLOCK, (3,)),
        ]
    )
    return batches


async def monitor_failed(out: Path) -> Path:
    app = MonitorApp(ListSource(failed_run()), world_size=4, clock=lambda: CLOCK)
    async with app.run_test(size=SIZE) as pilot:
        await _wait(
            lambda: app.monitor is not None and app.monitor.finished is not None,
            "the run's end",
            pilot,
        )
        await pilot.pause(0.05)
        app.clear_notifications()
        await pilot.pause()
        return Path(app.save_screenshot("monitor-failed.svg", path=str(out)))


# ---- the GPU panel: a healthy 2 × 8 H100 run ---------------------------------------------

GPU_SIZE = (140, 48)
"""Taller than :data:`SIZE`: the panel (at most 45 % of the screen) holds all 16 rows."""
GPUS_PER_NODE = 8
H100_TOTAL_BYTES = 81559 * 1024**2
"""What NVML reports as an H100 80GB HBM3's total memory (79.6 GiB)."""
GPU_STEP = 1200
GPU_STEP_S = 11.4


class _Nvml:
    """A fake ``pynvml`` with fixed readings (a device's handle is its readings): the calls
    :class:`engine.trainer.agent.Nvml` makes, answered in NVML's units (mW, bytes, a clock
    event reason bit mask: 0, nothing holds the clocks down). Calls it lacks (XID events) read
    as not supported, as on a GPU without them."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    @staticmethod
    def nvmlDeviceGetName(h: dict[str, Any]) -> bytes:  # noqa: N802 - pynvml's names
        return b"NVIDIA H100 80GB HBM3"

    @staticmethod
    def nvmlDeviceGetUtilizationRates(h: dict[str, Any]) -> object:  # noqa: N802
        return types.SimpleNamespace(gpu=h["util"], memory=h["util"] // 3)

    @staticmethod
    def nvmlDeviceGetMemoryInfo(h: dict[str, Any]) -> object:  # noqa: N802
        return types.SimpleNamespace(used=h["used"], total=H100_TOTAL_BYTES)

    @staticmethod
    def nvmlDeviceGetPowerUsage(h: dict[str, Any]) -> int:  # noqa: N802
        return int(h["power_mw"])

    @staticmethod
    def nvmlDeviceGetEnforcedPowerLimit(h: dict[str, Any]) -> int:  # noqa: N802
        return 700_000

    @staticmethod
    def nvmlDeviceGetTemperature(h: dict[str, Any], sensor: int) -> int:  # noqa: N802
        return int(h["temp"])

    @staticmethod
    def nvmlDeviceGetClockInfo(h: dict[str, Any], clock: int) -> int:  # noqa: N802
        return 1980

    @staticmethod
    def nvmlDeviceGetCurrentClocksEventReasons(h: dict[str, Any]) -> int:  # noqa: N802
        return 0

    @staticmethod
    def nvmlDeviceGetTotalEccErrors(h: dict[str, Any], kind: int, counter: int) -> int:  # noqa: N802
        return 0


def _readings(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s GPU: busy, about 70 of 79.6 GiB used, 640-690 of 700 W, 58-71 °C: a
    healthy node (nothing flagged), spread by a fixed pattern, not random numbers."""
    k = (rank * 5) % 7
    return {
        "util": 100 - k % 4,
        "used": (70 << 30) + k * (96 << 20),
        "power_mw": 640_000 + 7_300 * k + 1_100 * (rank % 3),
        "temp": 58 + 2 * k + rank % 2,
    }


def telemetry_line(rank: int) -> str:
    """The line the rank agent prints on rank ``rank``'s stderr, as its ``Sampler.line`` does:
    the GPU part from the agent's own :class:`engine.trainer.agent.Nvml` reading
    :class:`_Nvml`; identity, CPU, memory and time fixed."""
    node, local = divmod(rank, GPUS_PER_NODE)
    gpu = agent.Nvml(_Nvml(), _readings(rank), str(local)).sample()
    body = {
        "rank": rank,
        "local_rank": local,
        "node": node,
        "host": f"gpu-{node}",
        "pid": 4100 + rank,
        "time": CLOCK - 2.0,
        "cpu_pct": 101.5 + rank % 4,
        "rss_bytes": (9 << 30) + rank * (12 << 20),
        "cuda_peak_bytes": (64 << 30) + (rank % 2) * (80 << 20),
        "cuda_allocated_bytes": (41 << 30) + (rank % 2) * (80 << 20),
        "gpu": gpu,
    }
    return agent.TELEMETRY_PREFIX + json.dumps(body, separators=(",", ":"))


def _gpu_step(rank: int, n: int, seconds: float) -> str:
    """The example trainer's step line (tokens_per_s: this rank's 4 × 16 × 4096 tokens)."""
    loss = 2.31 - 0.002 * (n - GPU_STEP) + 0.003 * (rank % 4)
    return (
        f"[dtrain] step={n}/476837 loss={loss:.4f} tokens_per_s={262144 / seconds:.1f} "
        f"step_time_s={seconds:.2f} mem_gb=68.79"
    )


def healthy_gpu_run(world: int = 2 * GPUS_PER_NODE, steps: int = 4) -> list[list[Event]]:
    """Two 8-GPU nodes well into training: each rank's last steps (11.3-11.4 s, the plan's
    11.1 s within the margin) and one telemetry sample; the run goes on."""
    started = CLOCK - GPU_STEP * GPU_STEP_S
    batches: list[list[Event]] = [[RunStateChanged("running", "started", started)]]
    for r in range(world):
        node = r // GPUS_PER_NODE
        seconds = GPU_STEP_S + 0.05 * (r % 3 - 1)
        lines = [_gpu_step(r, GPU_STEP - steps + n, seconds) for n in range(1, steps + 1)]
        batches.append([LineBatch(node, r, "stdout", tuple(lines), CLOCK - 3.0, f"gpu-{node}")])
    batches.append(
        [
            LineBatch(r // GPUS_PER_NODE, r, "stderr", (telemetry_line(r),), CLOCK - 2.0)
            for r in range(world)
        ]
    )
    return batches


class _Running(ListSource):
    """A canned run that has not ended: done only once stopped (the monitor shows it live)."""

    @property
    def done(self) -> bool:
        return self._stopped


async def monitor_gpus(out: Path) -> Path:
    """The monitor's GPU panel (``g``) on :func:`healthy_gpu_run`, with the run's plan.json (the
    wizard picture's plan) so the bars mark the plan's per-GPU memory estimate."""
    world = 2 * GPUS_PER_NODE
    with tempfile.TemporaryDirectory(prefix="dtrain-screenshot-") as tmp:
        run_dir = Path(tmp)  # only plan.json: the plan's per-GPU estimate, marked on the bars
        (run_dir / "plan.json").write_text(plan_json(plan(decision_spec())))
        app = MonitorApp(
            _Running(healthy_gpu_run(world)),
            run_dir,
            title="llama-3-8b · 2 × 8 H100",
            world_size=world,
            clock=lambda: CLOCK,
        )
        async with app.run_test(size=GPU_SIZE) as pilot:
            await _wait(lambda: app.monitor is not None, "the monitor", pilot)
            m = app.monitor
            assert m is not None
            await _wait(
                lambda: (
                    len(m.snapshot.ranks) == world
                    and all(st.telemetry for st in m.snapshot.ranks.values())
                ),
                "every rank's telemetry",
                pilot,
            )
            await pilot.press("g", "c")  # the GPU panel shown, the (empty) NCCL pane hidden
            panel = m.query_one(GpuPanel)
            await _wait(
                lambda: _shown(panel) and f" r{world - 1} " in panel.text.plain,
                "the GPU panel",
                pilot,
            )
            for _ in range(10):  # the grid lays out again around the panel
                await pilot.pause(0.05)
            return Path(app.save_screenshot("monitor-gpus.svg", path=str(out)))


CHART_STEPS = 40


def _chart_step(rank: int, n: int) -> str:
    """Step ``n`` of a 4-rank run: the loss falling with a fixed wobble, rank 2 about 60 %
    slower from step 12 on (a GPU throttling), the others steady."""
    wobble = ((n * 7 + rank * 3) % 11 - 5) * 0.012
    loss = 2.2 + 5.0 * 0.93**n + wobble
    seconds = 1.2 + 0.01 * ((n + rank) % 5) + (0.75 if rank == 2 and n >= 12 else 0.0)
    return (
        f"[dtrain] step={n}/2000 loss={loss:.4f} tokens_per_s={65536 / seconds:.1f} "
        f"step_time_s={seconds:.2f} mem_gb=71.42"
    )


def charted_run(world: int = 4) -> list[list[Event]]:
    """A 2-node run 40 steps in, rank 2 falling behind; the run goes on."""
    batches: list[list[Event]] = [[RunStateChanged("running", "started", CLOCK - 60.0)]]
    for r in range(world):
        lines = tuple(_chart_step(r, n) for n in range(1, CHART_STEPS + 1))
        batches.append([LineBatch(r // 2, r, "stdout", lines, CLOCK - 1.0, f"gpu-{r // 2}")])
    return batches


async def monitor_charts(out: Path) -> Path:
    """The monitor's charts (``p``): loss, tokens/s and step time per rank, rank 2 SLOW."""
    world = 4
    app = MonitorApp(
        _Running(charted_run(world)),
        title="llama-3-8b · 2 × 2 H100",
        world_size=world,
        clock=lambda: CLOCK,
    )
    async with app.run_test(size=SIZE) as pilot:
        await _wait(lambda: app.monitor is not None, "the monitor", pilot)
        m = app.monitor
        assert m is not None
        await _wait(
            lambda: (
                len(m.snapshot.ranks) == world
                and all(st.step == CHART_STEPS for st in m.snapshot.ranks.values())
            ),
            "every rank's steps",
            pilot,
        )
        await pilot.press("p", "c")  # the charts shown, the (empty) NCCL pane hidden
        charts = m.query_one(RankCharts)
        await _wait(
            lambda: _shown(charts) and len(charts.drawn.get("step", {})) == world,
            "the charts",
            pilot,
        )
        for _ in range(10):  # the grid lays out again around the charts
            await pilot.pause(0.05)
        return Path(app.save_screenshot("monitor-charts.svg", path=str(out)))


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for shot in (wizard_decision, monitor_failed, monitor_gpus, monitor_charts):
        print(f"wrote {await shot(out)}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/images")))
