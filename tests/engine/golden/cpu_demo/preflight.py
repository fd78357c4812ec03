#!/usr/bin/env python3
"""dtrain-tui's preflight: measure the fabric and the GPUs in the run's own torchrun world.

Shipped inside every bundle as ``preflight.py``, beside ``train.py``. The node scripts run it
instead of the training script when ``DTRAIN_PREFLIGHT=1`` is in their environment (``dtrain-tui
preflight`` sets it), so it runs on exactly the nodes, ranks, rendezvous and ``nccl.env`` of the
run. Self-contained: torch and the standard library only. Arguments are ignored (the node
scripts pass the training script's).

What it measures (NCCL on CUDA, one GPU per local rank; gloo on CPU):

1. An all-reduce sweep over the whole world, 1 MiB to 1 GiB on GPU (1 MiB to 64 MiB on CPU), with
   nccl-tests' definitions: ``algbw = bytes / time`` and ``busbw = algbw * 2(n-1)/n``. The time of
   a size is the slowest rank's mean over the timed iterations.
2. With several nodes: each node's own ranks all-reduce among themselves (the intra-node link),
   then a pairwise pass over nodes as DLRover's network check does it: round 1 pairs node 0 with 1,
   2 with 3, ...; round 2 (three nodes or more) re-pairs them by round-1 time, slowest with
   fastest, so a slow node is slow in both of its pairs while a slow link is slow in one.
3. A GEMM on every rank: bf16 (fp16 without bf16) 8192^3 matmuls on GPU, all ranks at once;
   fp32 384^3 on CPU, one rank at a time on one thread, the best iteration in the thread's CPU
   time (CPU ranks share cores with each other and the machine: wall time would measure them).

Rank 0 prints one line, read by the launcher from rank 0's output on every backend::

    [dtrain] preflight {json}

(keys: ``version``, ``backend``, ``device``, ``world_size``, ``nodes``, ``gpus_per_node``,
``hostnames``, ``allreduce``, ``intra_node``, ``pairs``, ``gemm``, ``elapsed_s``;
:mod:`engine.diagnose.preflight` reads it), after a few ``[dtrain] preflight: ...`` progress lines.

Environment:

- ``DTRAIN_PREFLIGHT_MAX_MB``: the largest all-reduce of the sweep, MiB (default 1024 on GPU, 64
  on CPU); the pair and intra-node passes use a quarter of it (at least 1 MiB, at most 256 MiB).
- Test hook, for tests only: ``DTRAIN_PREFLIGHT_SLOW`` = a comma list of ``node<N>`` and
  ``rank<R>``; each rank named (or on a node named) sleeps ``DTRAIN_PREFLIGHT_SLOW_S`` seconds
  (default 0.05) before every timed collective and GEMM (spins that long before a CPU GEMM), as a
  rank behind a slow link or on a throttled GPU would be late. The result records the hook (``slow_hook``).
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

MARK = "[dtrain] preflight "
MIB = 1 << 20
VERSION = 1


def log(text: str) -> None:
    print(f"[dtrain] preflight: {text}", flush=True)


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class World:
    """This rank's place in the run and how to time things on its device."""

    def __init__(self) -> None:
        self.rank = _int_env("RANK", 0)
        self.world = _int_env("WORLD_SIZE", 1)
        self.local_rank = _int_env("LOCAL_RANK", 0)
        self.per_node = max(1, _int_env("LOCAL_WORLD_SIZE", 1))
        self.nodes = max(1, self.world // self.per_node)
        self.node = _int_env("GROUP_RANK", self.rank // self.per_node)
        self.cuda = torch.cuda.is_available()
        if self.cuda:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(1)
        self.backend = "nccl" if self.cuda else "gloo"
        self.delay_s = self._slow_delay()

    def _slow_delay(self) -> float:
        """Test hook: seconds to sleep before each timed operation (0: none)."""
        named = {w.strip() for w in os.environ.get("DTRAIN_PREFLIGHT_SLOW", "").split(",")}
        if f"rank{self.rank}" not in named and f"node{self.node}" not in named:
            return 0.0
        try:
            return max(0.0, float(os.environ.get("DTRAIN_PREFLIGHT_SLOW_S", "0.05")))
        except ValueError:
            return 0.05

    def node_ranks(self, node: int) -> list[int]:
        return list(range(node * self.per_node, (node + 1) * self.per_node))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def barrier(self) -> None:
        t = torch.zeros(1, device=self.device)
        dist.all_reduce(t)
        self.sync()

    def late(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)

    def spin(self) -> None:
        """The hook's delay as CPU work (a CPU GEMM is timed in CPU time, where sleep is free)."""
        end = time.thread_time() + self.delay_s
        while self.delay_s and time.thread_time() < end:
            pass

    def max_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [float(x) for x in t.tolist()]

    def sum_over_ranks(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(x) for x in t.tolist()]


def busbw_factor(n: int) -> float:
    """nccl-tests' all-reduce bus factor 2(n-1)/n."""
    return 2.0 * (n - 1) / n if n > 0 else 0.0


def timed(w: World, op: Any, iters: int, warmup: int) -> float:
    """Seconds of one ``op()`` on this rank: on GPU the mean over ``iters`` (as nccl-tests);
    on CPU the median of the iterations timed one by one, as CPU ranks share cores with the
    machine and a burst of someone else's work must not make a healthy rank look slow."""
    for _ in range(warmup):
        op()
    w.sync()
    if w.cuda:
        t0 = time.perf_counter()
        for _ in range(iters):
            w.late()
            op()
        w.sync()
        return (time.perf_counter() - t0) / iters
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        w.late()
        op()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_allreduce(w: World, nbytes: int, group: Any, iters: int, warmup: int) -> float:
    """Seconds of one all-reduce of ``nbytes`` in ``group`` on this rank."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=w.device)
    return timed(w, lambda: dist.all_reduce(buf, group=group), iters, warmup)


def sizes(w: World) -> list[int]:
    top = _int_env("DTRAIN_PREFLIGHT_MAX_MB", 1024 if w.cuda else 64)
    out, s = [], 1
    while s <= max(1, top):
        out.append(s * MIB)
        s *= 4 if not w.cuda else 2
    return out


def sweep(w: World) -> list[dict[str, Any]]:
    rows = []
    for nbytes in sizes(w):
        iters = 20 if w.cuda else max(2, min(5, (16 * MIB) // nbytes))
        w.barrier()
        t = time_allreduce(w, nbytes, None, iters, warmup=2 if w.cuda else 1)
        t = w.max_over_ranks([t])[0]
        alg = nbytes / t / 1e9
        rows.append(
            {
                "bytes": nbytes,
                "seconds": t,
                "algbw_gbps": alg,
                "busbw_gbps": alg * busbw_factor(w.world),
            }
        )
    return rows


def pass_bytes(w: World) -> int:
    top = sizes(w)[-1]
    return int(min(256 * MIB, max(MIB, top // 4)))


def timed_groups(w: World, groups: list[list[int]], nbytes: int) -> list[float]:
    """Seconds of an all-reduce of ``nbytes`` in each group of ranks. Every rank creates every
    group (torch asks that); on GPU the groups run at once, on CPU one after another."""
    handles = [dist.new_group(g) for g in groups]
    times = [0.0] * len(groups)
    iters = 10 if w.cuda else 5
    mine = [i for i, g in enumerate(groups) if w.rank in g]
    order: list[list[int]] = [mine] if w.cuda else [[i] for i in range(len(groups))]
    for step in order:
        w.barrier()
        for i in step:
            if i in mine:
                times[i] = time_allreduce(w, nbytes, handles[i], iters, warmup=1)
    return w.max_over_ranks(times)


def node_group(w: World, nodes: tuple[int, ...]) -> list[int]:
    return [r for n in nodes for r in w.node_ranks(n)]


def intra_node(w: World, nbytes: int) -> list[dict[str, Any]]:
    if w.nodes < 2 or w.per_node < 2:
        return []
    groups = [w.node_ranks(n) for n in range(w.nodes)]
    times = timed_groups(w, groups, nbytes)
    f = busbw_factor(w.per_node)
    return [
        {
            "node": n,
            "ranks": w.per_node,
            "bytes": nbytes,
            "seconds": t,
            "busbw_gbps": nbytes / t / 1e9 * f,
        }
        for n, t in enumerate(times)
    ]


def round_pairs(
    w: World, pairs: list[tuple[int, int]], nbytes: int, rnd: int
) -> list[dict[str, Any]]:
    times = timed_groups(w, [node_group(w, p) for p in pairs], nbytes)
    f = busbw_factor(2 * w.per_node)
    return [
        {
            "round": rnd,
            "nodes": list(p),
            "bytes": nbytes,
            "seconds": t,
            "busbw_gbps": nbytes / t / 1e9 * f,
        }
        for p, t in zip(pairs, times, strict=True)
    ]


def first_pairs(n: int) -> list[list[tuple[int, int]]]:
    """Round 1 as batches of disjoint pairs: 0-1, 2-3, ...; an odd last node pairs with node 0
    in a batch of its own."""
    batches = [[(i, i + 1) for i in range(0, n - 1, 2)]]
    if n % 2:
        batches.append([(n - 1, 0)])
    return batches


def second_pairs(n: int, node_time: dict[int, float]) -> list[list[tuple[int, int]]]:
    """Round 2: nodes by round-1 time, fastest first; the i-th fastest with the i-th slowest.
    An odd middle node pairs with the fastest, in a batch of its own."""
    order = sorted(range(n), key=lambda k: (node_time[k], k))
    batches = [[(order[i], order[n - 1 - i]) for i in range(n // 2)]]
    if n % 2:
        batches.append([(order[n // 2], order[0])])
    return batches


def pairwise(w: World, nbytes: int) -> list[dict[str, Any]]:
    if w.nodes < 2:
        return []
    rows: list[dict[str, Any]] = []
    for batch in first_pairs(w.nodes):
        rows += round_pairs(w, batch, nbytes, 1)
    if w.nodes >= 3:
        worst = {n: 0.0 for n in range(w.nodes)}
        for r in rows:
            for n in r["nodes"]:
                worst[n] = max(worst[n], r["seconds"])
        for batch in second_pairs(w.nodes, worst):
            rows += round_pairs(w, batch, nbytes, 2)
    return rows


def gemm(w: World) -> list[dict[str, Any]]:
    if w.cuda:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        n, iters, warm = 8192, 20, 3
    else:
        dtype, n, iters, warm = torch.float32, 384, 7, 1
    a = torch.randn(n, n, dtype=dtype, device=w.device)
    b = torch.randn(n, n, dtype=dtype, device=w.device)

    def run() -> float:
        if w.cuda:
            return 2.0 * n**3 / timed(w, lambda: torch.matmul(a, b), iters, warm) / 1e12
        # CPU: this thread's CPU time (torch runs a one-thread matmul in the calling thread),
        # so a rank that shares its core with others is not mistaken for a slow one.
        torch.matmul(a, b)
        best = float("inf")
        for _ in range(iters):
            t0 = time.thread_time()
            w.spin()
            torch.matmul(a, b)
            best = min(best, time.thread_time() - t0)
        return 2.0 * n**3 / max(best, 1e-9) / 1e12

    tflops = [0.0] * w.world
    if w.cuda:
        w.barrier()
        tflops[w.rank] = run()
    else:
        for r in range(w.world):
            w.barrier()
            if r == w.rank:
                tflops[r] = run()
    tflops = w.sum_over_ranks(tflops)
    name = str(dtype).removeprefix("torch.")
    return [
        {"rank": r, "node": r // w.per_node, "tflops": t, "n": n, "dtype": name}
        for r, t in enumerate(tflops)
    ]


def main() -> int:
    t_start = time.perf_counter()
    w = World()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(
        backend=w.backend,
        rank=w.rank,
        world_size=w.world,
        device_id=w.device if w.cuda else None,
    )
    try:
        if w.rank == 0:
            log(f"{w.world} ranks on {w.nodes} node(s), {w.backend} on {w.device.type}")
        rows = sweep(w)
        if w.rank == 0:
            log(f"all-reduce sweep done ({len(rows)} sizes)")
        nbytes = pass_bytes(w)
        intra = intra_node(w, nbytes)
        pairs = pairwise(w, nbytes)
        if w.rank == 0 and pairs:
            log(f"node pairs done ({len(pairs)} pairs)")
        gemms = gemm(w)
        hostnames: list[Any] = [None] * w.world
        dist.all_gather_object(hostnames, socket.gethostname())
        delays = w.max_over_ranks([w.delay_s if r == w.rank else 0.0 for r in range(w.world)])
        if w.rank == 0:
            device = torch.cuda.get_device_name(w.device) if w.cuda else "cpu"
            result: dict[str, Any] = {
                "version": VERSION,
                "backend": w.backend,
                "device": device,
                "torch": torch.__version__,
                "world_size": w.world,
                "nodes": w.nodes,
                "gpus_per_node": w.per_node,
                "hostnames": hostnames,
                "allreduce": rows,
                "intra_node": intra,
                "pairs": pairs,
                "gemm": gemms,
                "elapsed_s": time.perf_counter() - t_start,
            }
            slow = {str(r): d for r, d in enumerate(delays) if d > 0}
            if slow:
                result["slow_hook"] = {"delay_s_by_rank": slow}
            print(MARK + json.dumps(result, separators=(",", ":")), flush=True)
        w.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
