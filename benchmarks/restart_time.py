"""Time from a rank's death to every rank training again, on a local 2-rank bundle (tiny GPT on
CPU over gloo, the shipped trainer through the rank agent), under the launcher's restart policy
(engine/launch/restart.py). Goal: under 30 s. Printed, not asserted.

Each round: start the run with a checkpoint every 2 steps, SIGKILL one rank once step 3 is printed
and a checkpoint is complete, then measure, from the kill:

- detect: the killed attempt ended (every rank stopped, the cause recorded);
- restart: the next attempt's ranks were started (the policy's back-off included);
- training: every rank printed a training step in the new attempt.

    .venv/bin/python benchmarks/restart_time.py [--rounds 3] [--backoff 1.0]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.launch.drill import newest_complete, rank_pid  # noqa: E402
from engine.launch.options import LaunchOptions  # noqa: E402
from engine.launch.restart import STEP_RE, RestartingRun, RestartPolicy  # noqa: E402
from engine.rundir.events import LineBatch  # noqa: E402
from tests.e2e.launch_util import make_bundle  # noqa: E402

DEADLINE_S = 300.0


def one_round(root: Path, backoff: float, world: int = 2) -> tuple[float, float, float]:
    bundle = make_bundle(
        root / "bundle", steps=12, gpus_per_node=world, script_args=["--sleep-per-step", "0.2"]
    )
    opts = LaunchOptions(hang_timeout_s=120, env={"DTRAIN_CKPT_EVERY": "2"})
    run = RestartingRun.for_bundle(
        "local", bundle, root / "run", opts, RestartPolicy(max_restarts=1, backoff_s=backoff)
    )
    ckpt = Path(run.options.env["DTRAIN_CKPT_DIR"])
    killed_at: float | None = None
    training: dict[int, float] = {}
    run.start()
    end = time.monotonic() + DEADLINE_S
    while not run.done and time.monotonic() < end:
        events = run.poll(0.05)
        now = time.time()
        w = run.watches[-1]
        if killed_at is None and run.current is not None and (w.last_step or 0) >= 3:
            pid = rank_pid(run.current.run_id, 1)
            if pid is not None and newest_complete(ckpt) is not None:
                killed_at = time.time()
                os.kill(pid, signal.SIGKILL)
        if killed_at is not None and len(run.watches) == 2:
            for ev in events:
                if isinstance(ev, LineBatch) and ev.rank is not None and ev.rank not in training:
                    if any(STEP_RE.search(x) for x in ev.lines):
                        training[ev.rank] = ev.ts or now
    if not run.done:
        run.kill()
        run.wait(60)
    if killed_at is None or len(run.watches) < 2 or len(training) < world:
        raise SystemExit(f"round failed: {run.state}: {run.record.reason}")
    first, second = run.watches[0], run.watches[1]
    assert first.ended is not None and second.running_at is not None
    return (
        first.ended - killed_at,
        second.running_at - killed_at,
        max(training.values()) - killed_at,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--backoff", type=float, default=1.0, help="the policy's first back-off (s)")
    args = ap.parse_args()
    rows: list[tuple[float, float, float]] = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="dtrain-restart-") as tmp:
            row = one_round(Path(tmp), args.backoff)
        rows.append(row)
        print(
            f"round {i + 1}: detect {row[0]:.2f}s, restart {row[1]:.2f}s, "
            f"every rank training again {row[2]:.2f}s",
            flush=True,
        )
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    verdict = "goal met" if med[2] < 30 else "goal MISSED"
    print(
        f"median of {len(rows)}: detect {med[0]:.2f}s, restart {med[1]:.2f}s, "
        f"every rank training again {med[2]:.2f}s (goal < 30 s: {verdict}; "
        f"back-off {args.backoff:.1f}s included)"
    )


if __name__ == "__main__":
    main()
