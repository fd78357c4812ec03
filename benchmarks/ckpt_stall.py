"""How long a checkpoint blocks the example trainer's loop: its asynchronous save
(``Checkpointer``, ``dcp.async_save`` on a gloo group of its own) against a synchronous
``dcp.save`` of the same state, and the training steps' time while the async save writes.

One process, world size 1 over gloo, on CPU: the trainer's own Config, GPT, AdamW and
Checkpointer, loaded from engine/trainer/train.py. Median of several saves.

Last line: ``sync_save_s=<median> async_stall_s=<median> async_save_s=<median>
stall_ratio=<async_stall/sync_save> step_s=<median step> step_during_save_s=<median>
state_mb=<size> load_avg_1m=<load>`` (goal: stall_ratio < 0.10).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TRAIN = Path(__file__).resolve().parent.parent / "engine" / "trainer" / "train.py"


def _trainer() -> Any:
    spec = importlib.util.spec_from_file_location("dtrain_train_bench", TRAIN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--dir", type=Path, help="where to write (default: a temporary directory)")
    a = ap.parse_args()

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch.nn.functional as F  # noqa: N812

    train = _trainer()
    root = Path(tempfile.mkdtemp(prefix="ckpt-stall-", dir=a.dir))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    argv = ["--bundle", str(root), "--device", "cpu", "--layers", str(a.layers)]
    argv += ["--hidden", str(a.hidden), "--heads", "8", "--vocab", "4096", "--seq-len", "128"]
    argv += ["--micro-batch", "4", "--ckpt-every", "1", "--ckpt-dir", str(root / "ck")]
    c = train.Config(train.parse_args(argv))
    device = torch.device("cpu")
    model = train.GPT(c)
    opt = train.make_optimizer(model.parameters(), c, device)
    ckpt = train.Checkpointer(c, 0, 1, device, {"model": model, "optimizer": opt})

    def step(i: int) -> float:
        t0 = time.perf_counter()
        x, y = train.batch(c, i, 0, device)
        loss = F.cross_entropy(model(x).flatten(0, -2), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    base = [step(i) for i in range(3)]
    state_mb = (
        sum(
            t.numel() * t.element_size()
            for t in [*model.state_dict().values()]
            + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
        )
        / 2**20
    )
    sync_s, stall_s, save_s, during = [], [], [], []
    for n in range(a.saves):
        t0 = time.perf_counter()
        dcp.save(ckpt._dcp_state(), checkpoint_id=str(root / f"sync_{n}"))
        sync_s.append(time.perf_counter() - t0)

        ckpt._save(100 + n)
        pending = ckpt.pending
        while not pending.local_done():  # train while the save writes, as the loop does
            during.append(step(10 + n))
        ckpt.close()
        stall_s.append(pending.stall)
        save_s.append((pending.t_done or time.perf_counter()) - pending.t0)
    dist.destroy_process_group()
    shutil.rmtree(root, ignore_errors=True)
    sync, stall = statistics.median(sync_s), statistics.median(stall_s)
    print(
        f"sync_save_s={sync:.3f} async_stall_s={stall:.3f} "
        f"async_save_s={statistics.median(save_s):.3f} stall_ratio={stall / sync:.3f} "
        f"step_s={statistics.median(base):.3f} "
        f"step_during_save_s={statistics.median(during) if during else float('nan'):.3f} "
        f"state_mb={state_mb:.0f} load_avg_1m={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
