"""Re-record the Flight Recorder fixtures of tests/engine/test_flight.py (real torch, gloo, CPU).

    .venv/bin/python tests/data/fr/record.py

1. ``skip_rank1.lines`` and ``skip_rank1_rank<R>.json``: the example trainer on 2 ranks
   (torchrun, through the rank agent) with ``--skip-collective-at-step 3 --skip-rank 1``: rank
   0 enters an extra all-reduce of 1024 floats that rank 1 never enters. Once rank 1 said it
   stalls, every rank process is sent the agent's request signal (SIGRTMIN+7); the ``[dtrain] fr`` lines they printed are kept, and the files they
   wrote (logs/fr_rank<R>.json, the whole buffer as JSON: pg_status numbers are strings).
2. ``subgroup_rank<R>.pkl``: 3 ranks, a group of ranks 1 and 2 (``group_desc="tp"``); two
   all-reduces on the default group, then rank 1 alone does a broadcast on the subgroup; each
   rank writes ``_dump_fr_trace()`` (pickle: numbers are ints) after a barrier on the default
   group that every rank reaches. Rank 2 never entered broadcast #2 of group "tp".
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
sys.path.insert(0, str(REPO))
from engine.launch.frdump import dump_signal, dump_signal_mask  # noqa: E402
from engine.launch.reaper import pids_with_env  # noqa: E402

SUBGROUP = r"""
import os, datetime, torch, torch.distributed as dist
os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "100")
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
tp = dist.new_group([1, 2], group_desc="tp")
for _ in range(2):
    dist.all_reduce(torch.ones(8))
if rank in (1, 2):
    dist.all_reduce(torch.ones(4, dtype=torch.bfloat16), group=tp)
if rank == 1:
    w = dist.broadcast(torch.ones(16, dtype=torch.int64), src=1, group=tp, async_op=True)
from torch._C._distributed_c10d import _dump_fr_trace
open(os.environ["OUT"] + f"/subgroup_rank{rank}.pkl", "wb").write(_dump_fr_trace())
os._exit(0)
"""


def skip_rank1() -> None:
    work = Path(tempfile.mkdtemp())
    shutil.copy(REPO / "engine" / "trainer" / "train.py", work / "train.py")
    shutil.copy(REPO / "engine" / "trainer" / "agent.py", work / "dtrain_agent.py")
    args = ["--steps", "4", "--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "64"]
    args += ["--seq-len", "16", "--skip-collective-at-step", "3", "--skip-rank", "1"]
    tag = f"{os.getpid()}-{time.time()}"
    proc = subprocess.Popen(
        [
            TORCHRUN,
            "--nproc-per-node",
            "2",
            "--tee",
            "3",
            "--log-dir",
            "tl",
            "dtrain_agent.py",
            "train.py",
            *args,
        ],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "DTRAIN_FR_RECORD": tag},  # this recording's processes only
    )
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        if "stalls" in line:
            break
    time.sleep(1.0)  # rank 0 reaches the extra all-reduce
    for pid in pids_with_env("DTRAIN_FR_RECORD", tag):
        status = Path(f"/proc/{pid}/status").read_text()
        blk = next(x.split()[1] for x in status.splitlines() if x.startswith("SigBlk"))
        if int(blk, 16) & dump_signal_mask():  # the rank agent's request signal
            os.kill(int(pid), dump_signal())
    for line in proc.stdout:
        if "[dtrain] fr " in line:
            lines.append("[dtrain] fr " + line.split("[dtrain] fr ", 1)[1])
        if len(lines) == 2:
            break
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(30)
    (HERE / "skip_rank1.lines").write_text("".join(sorted(lines)))
    for r in (0, 1):
        shutil.copy(work / "logs" / f"fr_rank{r}.json", HERE / f"skip_rank1_rank{r}.json")
    shutil.rmtree(work)


def subgroup() -> None:
    work = Path(tempfile.mkdtemp())
    (work / "sub.py").write_text(SUBGROUP)
    subprocess.run(
        [TORCHRUN, "--nproc-per-node", "3", "sub.py"],
        cwd=work,
        env={**os.environ, "OUT": str(HERE)},
        check=True,
        capture_output=True,
        timeout=120,
    )
    shutil.rmtree(work)


if __name__ == "__main__":
    skip_rank1()
    subgroup()
