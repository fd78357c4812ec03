"""A stand-in for a user's training script: prints the progress lines of one framework, with
that framework's own format strings (the sources are named in this folder's .txt files), for
``--steps`` steps of ``--step-time`` seconds each (``--slow`` times that on rank ``--slow-rank``).
No torch, no dtrain-tui code, no sleeping: the times and the timestamps are the ones given, so
what the monitor and ``calibrate`` read back is known exactly.

    python fake_trainer.py torchtitan --steps 120 --step-time 0.02   # RANK from the environment
"""

from __future__ import annotations

import argparse
import os
import sys
import time

BASE = 1737367200.0  # 2025-01-20 10:00:00 UTC: every timestamp is BASE + the run's own time


def stamp(t: float, sep: str = ",") -> str:
    ms = int(round((t % 1) * 1000))
    if ms == 1000:
        t, ms = t + 1, 0
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) + f"{sep}{ms:03d}"


def tqdm_bar(
    n: int, total: int, elapsed: float, rate: float, desc: str = "", post: str = ""
) -> str:
    """tqdm's default format_meter line (ascii=False bar of width 10)."""
    pct = 100 * n // total
    filled = 10 * n // total
    bar = "█" * filled + " " * (10 - filled)
    left = (total - n) / rate if rate else 0

    def clock(s: float) -> str:
        return f"{int(s) // 60:02d}:{int(s) % 60:02d}"

    head = f"{desc}: " if desc else ""
    return f"{head}{pct:3d}%|{bar}| {n}/{total} [{clock(elapsed)}<{clock(left)}, {rate:5.2f}it/s{post}]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("framework")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-time", type=float, default=0.02)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--slow", type=float, default=2.0)
    ap.add_argument("--every", type=int, default=1, help="log every N steps")
    a = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    dt = a.step_time * (a.slow if rank == a.slow_rank else 1.0)
    out, err = sys.stdout, sys.stderr
    t = BASE
    bars: list[str] = []
    for step in range(1, a.steps + 1):
        t += dt
        loss = 10.0 / (1 + 0.1 * step)
        lr = 3e-4 * min(1.0, step / 10)
        if step % a.every:
            continue
        fw = a.framework
        if fw == "hf_trainer":  # ProgressCallback: the bar on stderr, the log dict written above it
            bars.append("\r" + tqdm_bar(step, a.steps, t - BASE, 1 / dt))
            epoch = step / a.steps
            print(f"{{'loss': '{loss:.4g}', 'grad_norm': '1.5', 'learning_rate': '{lr:.4g}', "
                  f"'epoch': '{epoch:.4g}'}}", file=out)  # fmt: skip
        elif fw == "accelerate":  # tqdm(range(max_train_steps)) + set_postfix(loss=...)
            bars.append("\r" + tqdm_bar(step, a.steps, t - BASE, 1 / dt, post=f", loss={loss:.3f}"))
        elif fw == "lightning":  # two epochs; the bar on stdout as TQDMProgressBar's default
            per = a.steps // 2
            epoch, n = divmod(step - 1, per)
            bar = tqdm_bar(n + 1, per, t - BASE, 1 / dt, desc=f"Epoch {epoch}",
                           post=f", v_num=0, train_loss={loss:.3f}")  # fmt: skip
            out.write("\r" + bar)
            if n + 1 == per:
                out.write("\n")
        elif fw == "torchtitan":  # MetricsProcessor.log, colours and all
            tps = 2048 / dt
            print(f"[titan] {stamp(t)} - root - INFO - \x1b[31mstep: {step:2}  "
                  f"\x1b[32mloss: {loss:7.4f}  \x1b[38;2;180;60;0mgrad_norm: {1.5:7.4f}  "
                  f"\x1b[38;2;54;234;195mmemory: {0.29:5.2f}GiB({1.23:.2f}%)  "
                  f"\x1b[34mtps: {round(tps):,}  \x1b[36mtflops: {0.01:,.2f}  "
                  f"\x1b[35mmfu: {0.01:.2f}%\x1b[39m", file=err)  # fmt: skip
        elif fw == "megatron":  # training_log's log_string
            print(f" [{stamp(t)[:19]}] iteration {step:8d}/{a.steps:8d} | consumed samples: "
                  f"{step * 4:12d} | elapsed time per iteration (ms): {dt * 1000:.1f} | "
                  f"throughput per GPU (TFLOP/s/GPU): {0.1:.1f} | learning rate: {lr:.6E} | "
                  f"global batch size: {4:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | "
                  f"grad norm: 1.500 | number of skipped iterations:   0 | "
                  f"number of nan iterations:   0 |", file=out)  # fmt: skip
        elif fw == "deepspeed":  # engine progress, ThroughputTimer, PipelineEngine.train_batch
            print(f"[{stamp(t)}] [INFO] [logging.py:96:log_dist] [Rank 0] step={step}, "
                  f"skipped=0, lr=[{lr}], mom=[(0.9, 0.999)]", file=out)  # fmt: skip
            print(f"[{stamp(t)}] [INFO] [timer.py:260:stop] epoch=0/micro_step={step}/"
                  f"global_step={step}, RunningAvgSamplesPerSec={4 / dt}, CurrSamplesPerSec="
                  f"{4 / dt}, MemAllocated=0.05GB, MaxMemAllocated=0.31GB", file=out)  # fmt: skip
            print(f"steps: {step} loss: {loss:0.4f} iter time (s): {dt:0.3f} "
                  f"samples/sec: {4 / dt:0.3f}", file=out)  # fmt: skip
        elif fw == "nanogpt":  # train.py
            if step % 5 == 0:
                print(f"step {step}: train loss {loss:.4f}, val loss {loss + 0.1:.4f}", file=out)
            print(
                f"iter {step}: loss {loss:.4f}, time {dt * 1000:.2f}ms, mfu {1.23:.2f}%", file=out
            )
        else:
            sys.exit(f"unknown framework {fw!r}")
    if a.framework == "hf_trainer":
        err.write("".join(bars) + "\n")
        print(f"{{'train_runtime': {t - BASE:.4f}, 'train_samples_per_second': "
              f"{4 * a.steps / (t - BASE):.3f}, 'train_steps_per_second': {a.steps / (t - BASE):.3f}, "
              f"'train_loss': {loss:.4f}, 'epoch': 1.0}}", file=out)  # fmt: skip
    elif a.framework == "accelerate":
        err.write("".join(bars) + "\n")
        print(f"epoch 0: perplexity: 21.347 eval_loss: {loss + 0.1}", file=out)


if __name__ == "__main__":
    main()
