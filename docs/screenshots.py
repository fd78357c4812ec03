"""Regenerate the README's and the docs' screenshots from the app itself (``make screenshots``).

Each picture is the real Textual app driven headless under ``run_test`` and saved with
``App.save_screenshot`` as SVG: the wizard's Decision step for a fixed spec (planning is pure,
so the picture is the planner's real answer), and the monitor replaying a canned failed run (a
2-node, 4-rank run whose rank 3 runs out of memory). Nothing here is drawn by hand; run it again
after a change to what those screens show and commit the SVGs under ``docs/images/``.

Run: ``.venv/bin/python docs/screenshots.py [OUT_DIR]`` (default ``docs/images``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from textual.widget import Widget

from engine.monitor.tail import ListSource
from engine.plan.names import NetworkTier
from engine.plan.specs import HardwareSpec, ModelSpec, NetworkSpec, Spec, TrainingSpec
from engine.rundir.events import Event, LineBatch, LineEvent, RankExit, RunStateChanged
from tui.app import DtrainApp
from tui.screens.monitor import MonitorApp

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


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for shot in (wizard_decision, monitor_failed):
        print(f"wrote {await shot(out)}")


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/images")))
