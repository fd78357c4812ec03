"""The shipped trainer on a real GPU, against the planner's estimates of the same runs.

The issue's "first real-hardware calibration points": ``engine/trainer/train.py`` (the trainer
every bundle ships) trains real model shapes on one GPU for a sweep of sequence length,
micro-batch and recompute, and its measured peak memory (``torch.cuda.max_memory_allocated``)
and steady step time stand beside what the planner predicts for that very layout (one GPU, DDP,
bf16, AdamW, the layout forced). The measurements live in ``tests/data/gpu_runs.json`` with the
machine and software they came from; this script re-estimates them with the current model and
prints the errors, so a change to the model shows what it does to real hardware.

Verbs:

``report`` (default)
    Read ``tests/data/gpu_runs.json``, estimate every row with the current planner, print one line
    a row and, for the sweep and the held-out runs apart, the mean absolute percentage error of
    step time and peak memory, the rank correlation of step time, and how many "fits" verdicts
    agreed with what ran or ran out of memory. Last line, for scripts: ``gpu_sweep_time_mape=...
    gpu_sweep_mem_mape=... gpu_sweep_time_spearman=... gpu_sweep_fit_agree=N/M`` and the same
    ``gpu_held_*``.
``prepare DIR [--held-out]``
    One bundle per configuration: ``DIR/<id>/plan.json``, the planner's plan with the layout
    forced (the trainer reads its model, layout and training from it). ``--held-out``: the
    held-out configurations, their predictions written to
    ``tests/data/gpu_heldout_predictions.json`` before they run.
``run DIR OUT``
    On the GPU machine, with torch only (no dtrain-tui there): train every bundle of DIR in this
    process, one after the other (the peak-memory counter reset between them), and write
    ``OUT/measured.json`` after each (a run cut short still leaves what it measured).
``probe DIR OUT`` / ``align OUT``
    On the GPU machine: the components of the models of :data:`PROBES` (``components.json``) and
    the head's products at aligned and unaligned vocabularies (``alignment.json``).
``attention OUT [--device cuda] [--seqs 2048,8192] [--head-dims 64,128]``
    On the GPU machine: PyTorch's scaled-dot-product attention, causal, forward and forward +
    backward, under each backend it offers (its own pick, FlashAttention-2, cuDNN,
    memory-efficient) over sequence lengths and head widths, beside a large bf16 product's rate
    in the same process (``attention.json``): the eager attention rate the planner assumes
    (the catalog's ``flash_attention_vs_gemm``) against what this torch runs.
``record MEASURED``
    Merge a ``measured.json`` (and ``components.json`` / ``alignment.json`` /
    ``attention.json`` beside it) into
    ``tests/data/gpu_runs.json`` (each row: the configuration, the per-step times and peak
    memory, the estimate when recorded, the prediction made before a held-out run).

The trainer is not Megatron: fp32 parameters with autocast to bf16 (a bf16 copy of each weight
waits for its backward), fused AdamW, cross-entropy on fp32 logits, learned positions and
LayerNorm. Those are the trainer's own costs, and the planner's DDP estimate is meant to cover
what any plain PyTorch script of that kind spends.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import io
import json
import math
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "gpu_runs.json"
TRAIN = ROOT / "engine" / "trainer" / "train.py"
STEPS = 9
"""Steps each configuration trains: the calibration's warm-up (2) leaves 7 for the median."""
GPU = "h100-sxm"

# (id, preset, seq_len, micro_batch, recompute); the order they run in (most telling first, so a
# run cut short keeps the sweep's core).
CONFIGS: tuple[tuple[str, str, int, int, str], ...] = (
    ("llama1b_s2048_mb1", "llama-3.2-1b", 2048, 1, "none"),
    ("llama1b_s2048_mb2", "llama-3.2-1b", 2048, 2, "none"),
    ("llama1b_s2048_mb4", "llama-3.2-1b", 2048, 4, "none"),
    ("llama1b_s2048_mb8", "llama-3.2-1b", 2048, 8, "none"),
    ("llama1b_s1024_mb16", "llama-3.2-1b", 1024, 16, "none"),
    ("llama1b_s4096_mb4", "llama-3.2-1b", 4096, 4, "none"),
    ("llama1b_s8192_mb2", "llama-3.2-1b", 8192, 2, "none"),
    ("llama1b_s4096_mb4_full", "llama-3.2-1b", 4096, 4, "full"),
    ("llama1b_s4096_mb4_mlp", "llama-3.2-1b", 4096, 4, "mlp"),
    ("llama1b_s2048_mb8_mlp", "llama-3.2-1b", 2048, 8, "mlp"),
    ("llama1b_s8192_mb4_full", "llama-3.2-1b", 8192, 4, "full"),
    ("llama1b_s2048_mb16_full", "llama-3.2-1b", 2048, 16, "full"),
    ("gpt2xl_s1024_mb4", "gpt2-xl", 1024, 4, "none"),
    ("gpt2xl_s1024_mb8", "gpt2-xl", 1024, 8, "none"),
    ("gpt2xl_s1024_mb16", "gpt2-xl", 1024, 16, "none"),
    ("gpt2xl_s2048_mb8", "gpt2-xl", 2048, 8, "none"),
    ("gpt2xl_s2048_mb8_full", "gpt2-xl", 2048, 8, "full"),
    ("gpt2xl_s2048_mb8_mlp", "gpt2-xl", 2048, 8, "mlp"),
    ("gpt2xl_s1024_mb16_full", "gpt2-xl", 1024, 16, "full"),
    ("gpt2_s1024_mb8", "gpt2", 1024, 8, "none"),
    ("gpt2_s1024_mb32", "gpt2", 1024, 32, "none"),
    ("gpt2_s1024_mb32_full", "gpt2", 1024, 32, "full"),
    ("gpt2_s2048_mb16", "gpt2", 2048, 16, "none"),
    ("phi3mini_s2048_mb1_full", "phi3-mini", 2048, 1, "full"),
    ("phi3mini_s4096_mb1_full", "phi3-mini", 4096, 1, "full"),
    ("phi3mini_s2048_mb2_none", "phi3-mini", 2048, 2, "none"),
    ("gemma2b_s2048_mb2", "gemma-2b", 2048, 2, "none"),
    ("gemma2b_s4096_mb2_full", "gemma-2b", 4096, 2, "full"),
)


# ------------------------------------------------------------------------------------ planner


HELD_OUT: tuple[tuple[str, str, int, int, str, int, str], ...] = (
    # (id, preset, seq_len, micro_batch, recompute, grad_accum, precision): measured after the
    # memory model was changed on the sweep above, its predictions committed first
    # (tests/data/gpu_heldout_predictions.json).
    ("ho_pythia160m_s2048_mb16", "pythia-160m", 2048, 16, "none", 1, "bf16"),
    ("ho_llama1b_s3000_mb4", "llama-3.2-1b", 3000, 4, "none", 1, "bf16"),
    ("ho_llama1b_s2048_mb4_ga2", "llama-3.2-1b", 2048, 4, "none", 2, "bf16"),
    ("ho_llama1b_s2048_mb2_fp32", "llama-3.2-1b", 2048, 2, "none", 1, "fp32"),
    ("ho_llama1b_s4096_mb6_full", "llama-3.2-1b", 4096, 6, "full", 1, "bf16"),
    ("ho_gpt2xl_s1536_mb8_mlp", "gpt2-xl", 1536, 8, "mlp", 1, "bf16"),
    ("ho_gpt2xl_s1024_mb12_none", "gpt2-xl", 1024, 12, "none", 1, "bf16"),
    ("ho_gemma2b_s2048_mb4_mlp", "gemma-2b", 2048, 4, "mlp", 1, "bf16"),
    ("ho_gemma2b_s1024_mb4_none", "gemma-2b", 1024, 4, "none", 1, "bf16"),
    ("ho_phi3mini_s1024_mb4_full", "phi3-mini", 1024, 4, "full", 1, "bf16"),
    ("ho_phi3mini_s2048_mb2_mlp", "phi3-mini", 2048, 2, "mlp", 1, "bf16"),
    ("ho_gpt2_s4096_mb8_none", "gpt2", 4096, 8, "none", 1, "bf16"),
    ("ho_gpt2_s512_mb64_mlp", "gpt2", 512, 64, "mlp", 1, "bf16"),
    ("ho_gpt2_s1024_mb16_ga4", "gpt2", 1024, 16, "none", 4, "bf16"),
)
PREDICTIONS = ROOT / "tests" / "data" / "gpu_heldout_predictions.json"


def configs() -> list[tuple[str, str, int, int, str, int, str]]:
    """Every configuration, the sweep's with their defaults (no accumulation, bf16)."""
    return [(*c, 1, "bf16") for c in CONFIGS] + list(HELD_OUT)


def _engine() -> None:
    sys.path.insert(0, str(ROOT))


def spec_for(
    preset: str,
    seq_len: int,
    micro_batch: int,
    recompute: str,
    grad_accum: int = 1,
    precision: str = "bf16",
) -> Any:
    """The spec of one configuration: one GPU, DDP, AdamW, the layout forced."""
    _engine()
    from engine.plan.specs import HardwareSpec, LayoutSpec, ModelSpec, Spec, TrainingSpec

    return Spec(
        model=ModelSpec(preset=preset),
        hardware=HardwareSpec(gpu=GPU, gpus_per_node=1, nodes=1),
        training=TrainingSpec(
            seq_len=seq_len,
            global_batch=micro_batch * grad_accum,
            micro_batch=micro_batch,
            precision=precision,
            recompute=recompute,
            steps=STEPS,
        ),
        layout=LayoutSpec(strategy="ddp", framework="ddp", micro_batch=micro_batch),
    )


def estimate(
    preset: str, seq_len: int, micro_batch: int, recompute: str, *rest: Any
) -> dict[str, Any]:
    """The planner's plan of one configuration, as ``plan --json`` prints it."""
    _engine()
    from engine.plan.planner import plan

    return plan(spec_for(preset, seq_len, micro_batch, recompute, *rest)).to_json_dict()


def estimate_run(run: dict[str, Any]) -> dict[str, Any]:
    """The planner's recommended layout for a recorded run's configuration."""
    return estimate(
        run["model"],
        run["seq_len"],
        run["micro_batch"],
        run["recompute"],
        run.get("grad_accum", 1),
        run.get("precision", "bf16"),
    )["recommended"]


def prepare(out: Path, held_out: bool = False) -> None:
    chosen = [c for c in configs() if c[0].startswith("ho_") == held_out]
    predictions = {}
    for cid, *cfg in chosen:
        d = out / cid
        d.mkdir(parents=True, exist_ok=True)
        est = estimate(*cfg)
        (d / "plan.json").write_text(json.dumps(est, indent=1))
        r = est["recommended"]
        predictions[cid] = {
            "step_time_s": round(r["step_time_s"], 5),
            "memory_total_bytes": r["memory_per_gpu"]["total"],
            "fits": r["fits"],
        }
    if held_out:
        doc = {
            "about": "The planner's estimates of the held-out GPU runs, written before they ran "
            "(benchmarks/gpu_sweep.py prepare --held-out).",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "predictions": predictions,
        }
        PREDICTIONS.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(chosen)} bundles in {out}")


# ------------------------------------------------------------------------------------ GPU side

# The trainer's step line (engine.monitor.logparse reads it too; not imported: this side of the
# script runs where only torch is installed).
_STEP = re.compile(r"step=(\d+)/\d+ loss=(\S+) tokens_per_s=\S+ step_time_s=(\S+) mem_gb=(\S+)")


def _trainer() -> Any:
    spec = importlib.util.spec_from_file_location("dtrain_train", TRAIN)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _machine(torch: Any) -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    tflops = _gemm_rate(_Dev(torch, "cuda"))["tflops"]
    return {
        "gpu": props.name,
        "memory_bytes": props.total_memory,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "bf16_gemm_8192_tflops": round(tflops, 1),
    }


def run(bundles: Path, out: Path) -> None:
    import torch

    for key in ("MASTER_ADDR", "WORLD_SIZE", "RANK"):
        os.environ.pop(key, None)
    train = _trainer()
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"machine": _machine(torch), "runs": []}
    logs = out / "logs.txt"
    logs.write_text("")
    for cid, *_ in [c for c in configs() if (bundles / c[0]).is_dir()]:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        buf = io.StringIO()
        row: dict[str, Any] = {"id": cid, "baseline_bytes": before}
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(buf):
                train.main(
                    ["--bundle", str(bundles / cid), "--steps", str(STEPS), "--device", "cuda"]
                )
            row["status"] = "ok"
        except torch.OutOfMemoryError as e:
            row["status"] = "oom"
            row["error"] = str(e).splitlines()[0][:300]
        except (RuntimeError, SystemExit) as e:
            row["status"] = "error"
            row["error"] = str(e).splitlines()[0][:300] if str(e) else repr(e)
        row["wall_s"] = round(time.perf_counter() - t0, 2)
        row["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        row["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        steps = [_STEP.search(line) for line in buf.getvalue().splitlines()]
        row["steps"] = [
            {
                "step": int(m[1]),
                "loss": float(m[2]),
                "step_time_s": float(m[3]),
                "mem_gb": float(m[4]),
            }
            for m in steps
            if m
        ]
        result["runs"].append(row)
        with logs.open("a") as f:
            f.write(f"## {cid}\n{buf.getvalue()}\n")
        tmp = out / ".measured.json.tmp"
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out / "measured.json")
        kept = [s["step_time_s"] for s in row["steps"][2:]]
        med = statistics.median(kept) if kept else math.nan
        print(
            f"{cid:28s} {row['status']:5s} step {med:.4f} s  peak "
            f"{row['max_allocated_bytes'] / 2**30:.2f} GiB  ({row['wall_s']} s)",
            flush=True,
        )


PROBES = ("gpt2_s1024_mb8", "llama1b_s2048_mb1", "gpt2xl_s1024_mb4", "gemma2b_s2048_mb2")
"""Bundles whose models the component probe measures (their shapes, not their layouts)."""
PROBE_TOKENS = 8192


class _Dev:
    """Timing and memory readings on the probe's device (``cpu``: a dry run of the code, with
    no memory figures)."""

    def __init__(self, torch: Any, name: str) -> None:
        self.torch, self.name, self.cuda = torch, name, name == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def time(self, fn: Any, iters: int = 5, warmup: int = 2) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        self.sync()
        return (time.perf_counter() - t0) / iters

    def peak_during(self, fn: Any) -> int:
        """Bytes allocated at the peak of ``fn`` above what was allocated before it."""
        self.sync()
        before = self.allocated()
        if self.cuda:
            self.torch.cuda.reset_peak_memory_stats()
        fn()
        self.sync()
        return (self.torch.cuda.max_memory_allocated() if self.cuda else 0) - before

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()


def probe_model(dev: _Dev, train: Any, bundle: Path, tokens: int) -> dict[str, Any]:
    """One model's components: the optimizer step (torch's multi-tensor AdamW and the fused
    one), gradient clipping, one block's saved activations and forward+backward time, the loss
    head's cross-entropy peak and time, each per parameter, token or logit."""
    c = train.Config(train.parse_args(["--bundle", str(bundle), "--device", dev.name]))
    out: dict[str, Any] = {"id": bundle.name, "hidden": c.hidden, "vocab": c.vocab}
    with dev.torch.device(dev.name):
        model = train.GPT(c)
    out.update(_probe_optimizer(dev, list(model.parameters())))
    out.update(_probe_block(dev, model.blocks[0], c, tokens))
    del model
    dev.free()
    out.update(_probe_cross_entropy(dev, c.vocab, tokens))
    dev.free()
    return out


def _probe_optimizer(dev: _Dev, params: list[Any]) -> dict[str, Any]:
    torch, out = dev.torch, {"params": sum(p.numel() for p in params)}
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    for fused in (False, True) if dev.cuda else (False,):
        tag = "fused" if fused else "foreach"
        opt = torch.optim.AdamW(params, lr=1e-4, fused=fused or None)
        opt.step()  # the moments exist from here on
        out[f"adamw_{tag}_s"] = dev.time(opt.step)
        out[f"adamw_{tag}_peak_bytes"] = dev.peak_during(opt.step)
        del opt
        dev.free()
    out["clip_s"] = dev.time(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))
    for p in params:
        p.grad = None
    return out


def _probe_block(dev: _Dev, blk: Any, c: Any, tokens: int) -> dict[str, Any]:
    torch, out = dev.torch, {}
    mb = max(1, tokens // c.seq_len)
    x = torch.randn(mb, tokens // mb, c.hidden, device=dev.name, requires_grad=True)

    def fwd() -> Any:
        with torch.autocast(dev.name, dtype=torch.bfloat16):
            return blk(x)

    def step() -> None:
        fwd().float().sum().backward()

    for mode in ("none", "mlp"):
        blk.recompute_mlp = mode == "mlp"
        dev.sync()
        before = dev.allocated()
        y = fwd()
        dev.sync()
        saved = dev.allocated() - before - y.numel() * y.element_size()
        out[f"block_saved_bytes_per_token_{mode}"] = saved / tokens
        del y
        out[f"block_fwd_bwd_s_{mode}"] = dev.time(step)
        with torch.no_grad():
            out[f"block_fwd_s_{mode}"] = dev.time(fwd)
        x.grad = None
        for p in blk.parameters():
            p.grad = None
    blk.recompute_mlp = False
    return out


def _probe_cross_entropy(dev: _Dev, vocab: int, tokens: int) -> dict[str, Any]:
    torch = dev.torch
    import torch.nn.functional as F  # noqa: N812

    logits = torch.randn(tokens, vocab, device=dev.name).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=dev.name)

    def ce() -> None:
        F.cross_entropy(logits.float(), y).backward()
        logits.grad = None

    return {
        "ce_fwd_bwd_s": dev.time(ce),
        "ce_peak_bytes_per_logit": dev.peak_during(ce) / (tokens * vocab),
    }


def probe_alignment(out: Path) -> None:
    """The LM head's products and cross-entropy at a vocabulary that is not a multiple of 8
    (GPT-2's 50257, and 128257) against the same padded (50304, 128256), 16K tokens, bf16:
    forward, and the two backward products."""
    import torch

    dev = _Dev(torch, "cuda")
    rows = []
    for v in (50257, 50304, 128256, 128257):
        rows.append(_align_row(dev, v, 16384, 768))
        print(json.dumps(rows[-1]), flush=True)
        dev.free()
    (out / "alignment.json").write_text(json.dumps(rows, indent=1))


def _align_row(dev: _Dev, v: int, t: int, h: int) -> dict[str, Any]:
    torch = dev.torch
    x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(t, v, device="cuda", dtype=torch.bfloat16)
    ce = _probe_cross_entropy(dev, v, t)
    return {
        "vocab": v,
        "tokens": t,
        "hidden": h,
        "fwd_s": dev.time(lambda: x @ w.t(), iters=10),
        "dgrad_s": dev.time(lambda: g @ w, iters=10),
        "wgrad_s": dev.time(lambda: g.t() @ x, iters=10),
        "ce_fwd_bwd_s": ce["ce_fwd_bwd_s"],
    }


ATTENTION_SEQS = (2048, 4096, 8192, 16384, 32768)
ATTENTION_HEAD_DIMS = (64, 128)
ATTENTION_TOKENS = 32768
"""Tokens a probe call attends over (batch x sequence), so every length does the same work per
token position."""
ATTENTION_BACKENDS = ("default", "flash", "cudnn", "efficient")


def probe_attention(
    out: Path,
    device: str = "cuda",
    seqs: tuple[int, ...] = ATTENTION_SEQS,
    head_dims: tuple[int, ...] = ATTENTION_HEAD_DIMS,
) -> dict[str, Any]:
    """Causal SDPA forward and forward + backward, 32 query heads over 8 key/value heads (a
    Llama-style GQA layout), bf16 (fp32 on a CPU dry run), under each backend torch offers; a
    backend that refuses a shape is recorded with its error. Written to ``OUT/attention.json``
    after every row."""
    import torch

    dev = _Dev(torch, device)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "machine": _machine(torch) if dev.cuda else {"gpu": "cpu", "torch": torch.__version__},
        "gemm": _gemm_rate(dev),
        "rows": [],
    }
    for d in head_dims:
        for seq in seqs:
            for name in ATTENTION_BACKENDS:
                doc["rows"].append(_attention_row(dev, name, seq, d))
                print(json.dumps(doc["rows"][-1]), flush=True)
                tmp = out / ".attention.json.tmp"
                tmp.write_text(json.dumps(doc, indent=1))
                tmp.replace(out / "attention.json")
                dev.free()
    return doc


def _dtype(dev: _Dev) -> Any:
    return dev.torch.bfloat16 if dev.cuda else dev.torch.float32


def _gemm_rate(dev: _Dev) -> dict[str, float]:
    """A large square product's rate on the probe's device (8192³ in bf16 on a GPU)."""
    n = 8192 if dev.cuda else 256
    a = dev.torch.randn(n, n, device=dev.name, dtype=_dtype(dev))
    seconds = dev.time(lambda: a @ a, iters=10)
    return {"m": n, "seconds": seconds, "tflops": 2 * n**3 / seconds / 1e12}


def _attention_row(dev: _Dev, backend: str, seq: int, d: int) -> dict[str, Any]:
    torch = dev.torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    heads, kv = 32, 8
    batch = max(1, ATTENTION_TOKENS // seq) if dev.cuda else 1
    q, k, v = (
        torch.randn(batch, n, seq, d, device=dev.name, dtype=_dtype(dev), requires_grad=True)
        for n in (heads, kv, kv)
    )
    grad = torch.randn(batch, heads, seq, d, device=dev.name, dtype=_dtype(dev))

    def fwd() -> Any:
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )

    # Causal: half of the 4·s²·d score and context FLOPs a head; the backward 2.5x that.
    flops = 4 * batch * heads * seq * seq * d / 2
    row: dict[str, Any] = {"backend": backend, "seq": seq, "head_dim": d, "batch": batch}
    ctx = sdpa_kernel([kernels[backend]]) if backend in kernels else contextlib.nullcontext()
    try:
        with ctx:
            f = dev.time(fwd, iters=5)
            fb = dev.time(lambda: fwd().backward(grad), iters=5)
    except RuntimeError as e:
        row["error"] = str(e).splitlines()[0][:200]
        return row
    return {
        **row,
        "fwd_s": f,
        "fwd_bwd_s": fb,
        "fwd_tflops": flops / f / 1e12,
        "fwd_bwd_tflops": 3.5 * flops / fb / 1e12,
    }


def probe(bundles: Path, out: Path, device: str = "cuda", tokens: int = PROBE_TOKENS) -> None:
    import torch

    dev = _Dev(torch, device)
    train = _trainer()
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cid in PROBES:
        dev.free()
        try:
            rows.append(probe_model(dev, train, bundles / cid, tokens))
        except torch.OutOfMemoryError as e:
            rows.append({"id": cid, "error": str(e).splitlines()[0][:200]})
        print(json.dumps(rows[-1]), flush=True)
        tmp = out / ".components.json.tmp"
        tmp.write_text(json.dumps(rows, indent=1))
        tmp.replace(out / "components.json")


# ------------------------------------------------------------------------------------ here


def _steady(row: dict[str, Any]) -> float:
    _engine()
    from engine.plan.calibration import steady_step_time

    per = {s["step"]: [s["step_time_s"]] for s in row["steps"]}
    return steady_step_time(per, row["id"])[0]


def _components(measured: Path) -> list[dict[str, Any]]:
    """The component probe's rows (``components.json`` beside ``measured``), if it ran."""
    path = measured.parent / "components.json"
    return json.loads(path.read_text()) if path.exists() else []


def _alignment(measured: Path) -> dict[str, Any]:
    """The alignment probe's rows (``alignment.json`` beside ``measured``), if it ran."""
    path = measured.parent / "alignment.json"
    return {"products": json.loads(path.read_text())} if path.exists() else {}


def _attention(measured: Path) -> dict[str, Any]:
    """The attention probe's document (``attention.json`` beside ``measured``), if it ran."""
    path = measured.parent / "attention.json"
    return json.loads(path.read_text()) if path.exists() else {}


def record(measured: Path) -> None:
    """Merge ``measured`` into :data:`DATA` (a row of the same id is replaced)."""
    doc = json.loads(DATA.read_text()) if DATA.exists() else {"runs": []}
    # A probe may run alone (``attention`` only): no runs, the runs' machine and date kept.
    got = (
        json.loads(measured.read_text())
        if measured.exists()
        else {"runs": [], "machine": doc.get("machine"), "date": doc.get("date")}
    )
    by_id = {c[0]: c for c in configs()}
    rows = {r["id"]: r for r in doc["runs"]}
    before = json.loads(PREDICTIONS.read_text())["predictions"] if PREDICTIONS.exists() else {}
    for r in got["runs"]:
        cid, preset, seq, mb, rc, ga, precision = by_id[r["id"]]
        est = estimate(preset, seq, mb, rc, ga, precision)["recommended"]
        row = {
            "id": cid,
            "held_out": cid.startswith("ho_"),
            "model": preset,
            "seq_len": seq,
            "micro_batch": mb,
            "grad_accum": ga,
            "precision": precision,
            "recompute": rc,
            "status": r["status"],
            "error": r.get("error"),
            "step_time_s": round(_steady(r), 5) if r["status"] == "ok" else None,
            "peak_allocated_bytes": r["max_allocated_bytes"] - r["baseline_bytes"],
            "peak_reserved_bytes": r["max_reserved_bytes"],
            "steps": r["steps"],
            "estimate_when_recorded": {
                "step_time_s": round(est["step_time_s"], 5),
                "memory_total_bytes": est["memory_per_gpu"]["total"],
                "fits": est["fits"],
            },
        }
        if cid in before:
            row["predicted_before_run"] = before[cid]
        rows[cid] = row
    order = {c[0]: i for i, c in enumerate(configs())}
    doc = {
        "about": (
            "The shipped trainer (engine/trainer/train.py) on one real GPU: measured steady step "
            "time (median after the warm-up, engine.plan.calibration.steady_step_time) and peak "
            "memory (torch.cuda.max_memory_allocated, less what was allocated before the run), "
            "beside the planner's estimate for the same forced layout (one GPU, DDP, autocast, "
            "fused AdamW). Rows marked held_out ran after the model was changed on the others, "
            "with predicted_before_run written first. Produced by benchmarks/gpu_sweep.py "
            "(prepare here, run on the GPU machine, record here); its report re-estimates them."
        ),
        "date": time.strftime("%Y-%m-%d") if got["runs"] else got.get("date"),
        "machine": got["machine"],
        "planner_gpu": GPU,
        "steps_per_run": STEPS,
        "components": _components(measured) or doc.get("components") or [],
        "alignment": _alignment(measured) or doc.get("alignment") or {},
        "attention": _attention(measured) or doc.get("attention") or {},
        "runs": sorted(rows.values(), key=lambda r: order.get(r["id"], len(order))),
    }
    tmp = DATA.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(DATA)
    probes = [k for k in ("components", "alignment", "attention") if doc[k]]
    print(f"{len(got['runs'])} runs recorded in {DATA} (probes: {', '.join(probes) or 'none'})")


def attention_report(att: dict[str, Any], verbose: bool = True) -> dict[str, float]:
    """The attention probe's rates as a share of the large product's, beside the planner's
    eager (SDPA) and fused (Transformer Engine) shares for the planner's GPU at each head
    width (:func:`engine.plan.perf.head_dim_factor`)."""
    _engine()
    from engine.plan.catalog import get_gpu
    from engine.plan.names import Precision
    from engine.plan.perf import head_dim_factor

    gpu = get_gpu(GPU)
    soft = gpu.peak_tflops(Precision.BF16) / (4 * gpu.exp_tops) if gpu.exp_tops else 0.0
    gemm = att["gemm"]["tflops"]
    shares: dict[str, list[float]] = defaultdict(list)
    if verbose:
        print(f"\nattention (SDPA, causal, GQA 32/8): large bf16 product {gemm:.0f} TFLOP/s")
        print(
            f"{'backend':10s} {'seq':>6s} {'d':>4s} {'fwd+bwd TF/s':>12s} {'/ gemm':>7s}  planner"
        )
    for r in att["rows"]:
        if "fwd_bwd_tflops" not in r:
            if verbose:
                print(f"{r['backend']:10s} {r['seq']:6d} {r['head_dim']:4d}  {r['error'][:60]}")
            continue
        share = r["fwd_bwd_tflops"] / gemm
        hdf = head_dim_factor(r["head_dim"], soft)
        shares[r["backend"]].append(share / hdf)  # at the catalog's reference width
        if verbose:
            print(
                f"{r['backend']:10s} {r['seq']:6d} {r['head_dim']:4d} "
                f"{r['fwd_bwd_tflops']:12.0f} {share:7.2f}  eager "
                f"{gpu.flash_attention_vs_gemm * hdf:.2f}, fused "
                f"{(gpu.fused_attention_vs_gemm or gpu.flash_attention_vs_gemm) * hdf:.2f}"
            )
    out = {f"gpu_attention_{b}_vs_gemm": statistics.median(v) for b, v in shares.items()}
    out["planner_eager_vs_gemm"] = gpu.flash_attention_vs_gemm
    print(" ".join(f"{k}={v:.3f}" for k, v in out.items()))
    return out


def report(verbose: bool = True) -> dict[str, float]:
    """Re-estimate every recorded run; print the errors and the figures per set."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from estimate_accuracy import spearman

    doc = json.loads(DATA.read_text())
    gib = 2**30
    sets: dict[str, dict[str, list[Any]]] = {}
    if verbose:
        print(f"machine: {doc['machine']['gpu']}, torch {doc['machine']['torch']}, {doc['date']}")
        print(
            f"{'run':28s} {'step s':>8s} {'pred':>8s} {'err':>7s}  "
            f"{'peak GiB':>8s} {'pred':>7s} {'err':>7s}  fits"
        )
    for r in doc["runs"]:
        est = estimate_run(r)
        acc = sets.setdefault("held" if r.get("held_out") else "sweep", defaultdict(list))
        ran = r["status"] == "ok"
        if ran or r["status"] == "oom":
            acc["fit"].append(est["fits"] == ran)
        pm = est["memory_per_gpu"]["total"]
        if not ran:
            if verbose:
                print(
                    f"{r['id']:28s} {r['status']:>8s} {est['step_time_s']:8.4f} {'':7s}  "
                    f"{'':8s} {pm / gib:7.2f} {'':7s}  {est['fits']}"
                )
            continue
        te = est["step_time_s"] / r["step_time_s"] - 1
        me = pm / r["peak_allocated_bytes"] - 1
        acc["time"].append(abs(te))
        acc["mem"].append(abs(me))
        acc["pred"].append(est["step_time_s"])
        acc["meas"].append(r["step_time_s"])
        if verbose:
            print(
                f"{r['id']:28s} {r['step_time_s']:8.4f} {est['step_time_s']:8.4f} {te:+7.1%}  "
                f"{r['peak_allocated_bytes'] / gib:8.2f} {pm / gib:7.2f} {me:+7.1%}  {est['fits']}"
            )
    out: dict[str, float] = {}
    line = []
    for tag, acc in sets.items():
        out[f"gpu_{tag}_time_mape"] = statistics.fmean(acc["time"]) if acc["time"] else math.nan
        out[f"gpu_{tag}_mem_mape"] = statistics.fmean(acc["mem"]) if acc["mem"] else math.nan
        out[f"gpu_{tag}_time_spearman"] = (
            spearman(acc["pred"], acc["meas"]) if len(acc["pred"]) >= 3 else math.nan
        )
        line += [f"{k}={v:.3f}" for k, v in out.items() if k.startswith(f"gpu_{tag}_")]
        line.append(f"gpu_{tag}_fit_agree={sum(acc['fit'])}/{len(acc['fit'])}")
    print(" ".join(line))
    if doc.get("attention", {}).get("rows"):
        out.update(attention_report(doc["attention"], verbose))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb")
    sub.add_parser("report").add_argument("-q", "--quiet", action="store_true")
    sub.add_parser("prepare").add_argument("dir", type=Path)
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    sub.add_parser("record").add_argument("measured", type=Path)
    sub.choices["prepare"].add_argument("--held-out", action="store_true")
    pr = sub.add_parser("probe")
    pr.add_argument("dir", type=Path)
    pr.add_argument("out", type=Path)
    pr.add_argument("--device", default="cuda")
    pr.add_argument("--tokens", type=int, default=PROBE_TOKENS)
    sub.add_parser("align").add_argument("out", type=Path)
    at = sub.add_parser("attention")
    at.add_argument("out", type=Path)
    at.add_argument("--device", default="cuda")
    at.add_argument("--seqs", default=",".join(map(str, ATTENTION_SEQS)))
    at.add_argument("--head-dims", default=",".join(map(str, ATTENTION_HEAD_DIMS)))
    a = p.parse_args(argv)
    if a.verb == "prepare":
        prepare(a.dir, a.held_out)
    elif a.verb == "run":
        run(a.dir, a.out)
    elif a.verb == "align":
        probe_alignment(a.out)
    elif a.verb == "attention":
        probe_attention(
            a.out,
            a.device,
            tuple(int(x) for x in a.seqs.split(",")),
            tuple(int(x) for x in a.head_dims.split(",")),
        )
    elif a.verb == "probe":
        probe(a.dir, a.out, a.device, a.tokens)
    elif a.verb == "record":
        record(a.measured)
    else:
        report(verbose=not getattr(a, "quiet", False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
