"""The monitor on a real local launch (engine.launch's LocalBackend: real processes, real pipes,
the real run directory): every sequence-numbered line reaches the run directory and the monitor
in order; a real torchrun run whose rank fails shows the failure in the rank states."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from engine.monitor.state import RankStatus
from engine.monitor.tail import RunDirSource
from engine.rundir.events import LineBatch
from tui.screens.monitor import MonitorApp

launch_util = pytest.importorskip("tests.e2e.launch_util")
local = pytest.importorskip("engine.launch.local")
base = pytest.importorskip("engine.launch.base")

pytestmark = pytest.mark.slow

PRINTER = """
import os, sys
rank, count = int(sys.argv[1]), int(sys.argv[2])
buf = []
for i in range(count):
    buf.append(f"[default{rank}]:seq={i}" + (" NCCL INFO tick" if i % 1000 == 0 else "") + "\\n")
    if len(buf) == 40:  # whole lines, one write under PIPE_BUF: atomic on the shared pipe
        os.write(1, "".join(buf).encode())
        buf = []
os.write(1, "".join(buf).encode())
"""


def run_monitor(backend: Any, world: int, timeout: float = 120.0) -> Any:
    """Run the monitor on ``backend`` until the run ends; returns the screen and, taken while
    the app still runs, which grid panes carry the failed style."""

    async def go() -> Any:
        app = MonitorApp(backend, backend.run.path, world_size=world, max_lines=500)
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(int(timeout / 0.05)):
                await pilot.pause(0.05)
                if app.monitor is not None and app.monitor.finished is not None:
                    break
            await pilot.pause(0.1)
            m = app.monitor
            assert m is not None and m.finished is not None, "the run did not finish in time"
            failed = {p.key for p in m.grid.panes() if p.has_class("-failed")}
            return m, failed

    return asyncio.run(go())


def test_no_line_lost_or_reordered_from_process_to_run_dir_and_monitor(tmp_path: Path) -> None:
    ranks, count = 4, 20_000
    bundle = launch_util.make_bundle(tmp_path / "bundle", gpus_per_node=ranks, name="seq")
    (bundle / "printer.py").write_text(PRINTER)
    script = textwrap.dedent(
        f"""\
        #!/usr/bin/env bash
        cd "$(dirname "${{BASH_SOURCE[0]}}")"
        for i in $(seq 0 {ranks - 1}); do python printer.py "$i" {count} & done
        wait
        """
    )
    (bundle / "launch_node0.sh").write_text(script)
    backend = local.LocalBackend(bundle, tmp_path / "run", base.LaunchOptions(hang_timeout_s=120))
    m, _ = run_monitor(backend, ranks)
    expected = [f"seq={i}" + (" NCCL INFO tick" if i % 1000 == 0 else "") for i in range(count)]
    logs = tmp_path / "run" / "logs"
    for r in range(ranks):
        # process -> run directory: every line, in order
        assert (logs / f"rank{r}.stdout.log").read_text().splitlines() == expected
        # process -> monitor: every line counted, the pane holds the exact tail
        assert m.snapshot.ranks[r].lines == count
        assert m.pane_lines(f"r{r}") == expected[-500:]
        assert m.snapshot.ranks[r].status is RankStatus.EXITED
    assert m.delivered == ranks * count
    nccl = m.pane_lines("nccl")
    assert len(nccl) == ranks * (count // 1000) and all("NCCL INFO tick" in x for x in nccl)
    assert m.finished == "succeeded"
    # run directory -> `monitor RUN_DIR`: the same lines again, in order
    src = RunDirSource(tmp_path / "run")
    src.start()
    got: dict[int | None, list[str]] = {}
    while not src.done:
        for ev in src.poll(0.05):
            if isinstance(ev, LineBatch) and ev.stream == "stdout":
                got.setdefault(ev.rank, []).extend(ev.lines)
    assert all(got[r] == expected for r in range(ranks))


FAILING = """
import os, sys, time
rank = int(os.environ["RANK"])
print("host:1:1 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>", flush=True)
for n in (1, 2):
    print(f"[dtrain] step={n}/5 loss={3.0 - n / 10} tokens_per_s=1000.0 step_time_s=0.1 mem_gb=0.5", flush=True)
if rank == 1:
    raise RuntimeError("rank 1 gives up")
time.sleep(60)
"""


def test_real_torchrun_launch_rank_failure_shows_in_states(tmp_path: Path) -> None:
    bundle = launch_util.make_bundle(tmp_path / "bundle", gpus_per_node=2, name="fail")
    (bundle / "train.py").write_text(FAILING)
    backend = local.LocalBackend(bundle, tmp_path / "run", base.LaunchOptions(hang_timeout_s=120))
    m, failed_panes = run_monitor(backend, 2)
    snap = m.snapshot
    assert m.finished == "failed"
    r0, r1 = snap.ranks[0], snap.ranks[1]
    assert r1.status is RankStatus.FAILED and r1.exit_code == 1
    assert r0.status is not RankStatus.RUNNING
    assert r0.step == 2 and r1.step == 2 and list(r1.loss_history) == [2.9, 2.8]
    assert any(e.rank == 1 and e.kind.value in ("traceback", "exception") for e in snap.errors)
    assert any("RuntimeError: rank 1 gives up" in x for x in m.pane_lines("r1"))
    assert any(x.startswith("r0: ") and "Bootstrap" in x for x in m.pane_lines("nccl"))
    assert any(x.startswith("r1: ") and "Bootstrap" in x for x in m.pane_lines("nccl"))
    assert "r1" in failed_panes
