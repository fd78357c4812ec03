"""A user's own training script, as a new user writes it: plain torch.distributed over gloo, no
dtrain-tui code in it. Every rank all-reduces a tensor each step; at step ``--skip-at`` the rank
``--skip-rank`` does not join the all-reduce and waits outside any collective (a data-dependent
branch gone wrong), so the others wait in it forever. It installs its own SIGUSR1 handler (as
Lightning's Slurm requeue does), which must keep working under the rank agent.

Used by tests/e2e/test_stuck_rank_user_script.py and test_stuck_rank_slurm.py.
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def on_usr1(signum, frame):
    print(f"user handler: SIGUSR1 on rank {os.environ.get('RANK')}", flush=True)


def wait_for_data_that_never_comes():
    while True:
        time.sleep(0.5)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--skip-at", type=int, default=3)
    p.add_argument("--skip-rank", type=int, default=1)
    args = p.parse_args()
    signal.signal(signal.SIGUSR1, on_usr1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x = torch.ones(1024)
    for step in range(1, args.steps + 1):
        if step == args.skip_at and rank == args.skip_rank:
            print(f"rank {rank} waits for its data at step {step}", file=sys.stderr, flush=True)
            wait_for_data_that_never_comes()
        dist.all_reduce(x)
        print(f"step {step} sum {x[0].item():.0f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
