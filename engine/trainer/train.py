#!/usr/bin/env python3
"""dtrain-tui's example trainer: a small GPT-style model trained on generated tokens.

Shipped inside every bundle as ``train.py`` and started by torchrun (one process per rank). It is
the smoke test a user runs on a new cluster before their own script: it exercises the same
process group, sharding and collectives their job will use.

Self-contained on purpose: it needs torch only (and deepspeed for DeepSpeed bundles), never
dtrain-tui itself, so it runs on nodes where only torch is installed.

What it reads, from the bundle directory (``--bundle DIR``, default: the directory holding this
file):

- ``plan.json``: ``model`` (layers, hidden, heads, kv_heads, vocab, ffn, gated_mlp,
  tie_embeddings), the layout (``recommended`` or ``layout``: framework, zero_stage, micro_batch,
  grad_accum, precision, recompute), ``training`` (or ``spec.training``: seq_len, steps, lr,
  grad_clip, optimizer, warmup_steps) and ``checkpoint`` (dir, every, keep, milestone_every);
- ``ds_config.json`` for DeepSpeed plans (ZeRO 1/2/3, offload, precision, clipping);
- ``fsdp.json`` for FSDP plans (``fsdp_version`` 1 or 2, ``sharding_strategy``,
  ``mixed_precision``, ``activation_checkpointing``, ``cpu_offload``, ``reshard_after_forward``).

Every command-line option overrides the bundle. On CUDA it uses NCCL and one GPU per local rank;
without CUDA it runs on CPU over gloo. Every rank prints one line per optimizer step, exactly::

    [dtrain] step=<n>/<total> loss=<float> tokens_per_s=<float> step_time_s=<float> mem_gb=<float>

(``tokens_per_s`` is this rank's tokens per second; ``mem_gb`` the peak GPU memory allocated, or
the process's peak RSS on CPU) and at the end ``[dtrain] done steps=<n> time_s=<float>``.

Checkpoints (:class:`Checkpointer`): every ``--ckpt-every N`` steps and at the last step (0, the
default, saves none) into ``--ckpt-dir`` (default ``checkpoints/`` in the bundle), one
``step_<00000N>/`` directory each: DDP, FSDP and the 3D smoke test through
``torch.distributed.checkpoint`` (sharded, ``dcp.async_save``: the loop waits only while the
state is copied), DeepSpeed through its engine's ``save_checkpoint``; beside them each rank's
``rank<R>.pt`` (RNG states, LR schedule, loss scaler, step: the data position). A checkpoint
counts once rank 0 has written ``COMPLETE`` in it, last, after every rank's save returned. Rank 0
keeps the newest ``--ckpt-keep K`` (3) and every step ``--ckpt-milestone-every M`` divides, and
prints one line per save::

    [dtrain] checkpoint step=<n> dir=<path> save_s=<float> stall_s=<float>

(``stall_s``: how long the training loop was blocked) or, when a save fails (a full disk), one
line ``[dtrain] checkpoint step=<n> failed: <reason>; keeping step=<m>``, and trains on. A run
started again with the same command resumes from the newest complete checkpoint, removing
half-written ones, and says ``[dtrain] resumed from step=<n> (<dir>)``; ``--no-resume`` starts
afresh. The environment sets the same (DTRAIN_CKPT_DIR, DTRAIN_CKPT_EVERY, DTRAIN_RESUME:
``auto``, ``never`` or a checkpoint's path), as does plan.json's ``checkpoint`` section (dir,
every, keep, milestone_every); the command line overrides the environment, which overrides the
plan. DCP checkpoints reshard on load (FSDP2 saved by 2 ranks resumes on 1); DeepSpeed's ZeRO
ones load only at the world size that wrote them. Every rank must see the same directory.

Flight Recorder on demand: the bundle's rank agent (``dtrain_agent.py``, which starts every
rank's script, this one too) answers the launcher's request with the ``[dtrain] fr`` line and
writes ``logs/fr_rank<R>.json``; the trainer only keeps the recorder on (TORCH_FR_BUFFER_SIZE).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import errno
import functools
import json
import math
import os
import random
import resource
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

PREFIX = "[dtrain]"
FR_BUFFER = "2000"
"""Flight Recorder entries kept per process (TORCH_FR_BUFFER_SIZE) when nccl.env sets none."""


def log(msg: str) -> None:
    print(f"{PREFIX} {msg}", flush=True)


# --------------------------------------------------------------------------- configuration


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{PREFIX} error: cannot read {path}: {e}")
    return data if isinstance(data, dict) else {}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="dtrain-tui example trainer (small GPT on generated tokens)"
    )
    p.add_argument("--bundle", type=Path, default=Path(__file__).resolve().parent)
    p.add_argument("--steps", type=int)
    p.add_argument(
        "--sleep-per-step", type=float, default=0.0, help="seconds to sleep each step (fault tests)"
    )
    p.add_argument("--seq-len", type=int)
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--grad-accum", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--framework", choices=["ddp", "fsdp", "deepspeed"])
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--fail-at-step", type=int, help="raise at this step on --fail-rank (fault tests)"
    )
    p.add_argument("--fail-rank", type=int, default=0)
    p.add_argument(
        "--skip-collective-at-step",
        type=int,
        help="at this step every rank but --skip-rank enters an extra all-reduce that "
        "--skip-rank never enters: it stalls outside any collective (stuck-rank tests)",
    )
    p.add_argument("--skip-rank", type=int, default=1)
    p.add_argument(
        "--ckpt-dir",
        help="where checkpoints go (DTRAIN_CKPT_DIR; default checkpoints/ in the bundle)",
    )
    p.add_argument(
        "--ckpt-every", type=int, help="save every N steps (DTRAIN_CKPT_EVERY; default 0: never)"
    )
    p.add_argument("--ckpt-keep", type=int, help="complete checkpoints kept (default 3)")
    p.add_argument(
        "--ckpt-milestone-every", type=int, help="also keep every checkpoint whose step N divides"
    )
    p.add_argument("--no-resume", action="store_true", help="start afresh (DTRAIN_RESUME=never)")
    args, unknown = p.parse_known_args(argv)
    if unknown:
        # Launchers (deepspeed's) add their own flags, e.g. --local_rank; never die on them.
        print(
            f"{PREFIX} ignoring unknown arguments: {' '.join(unknown)}", file=sys.stderr, flush=True
        )
    return args


def _pick(cli: Any, *vals: Any, default: Any) -> Any:
    """The command line's value, else the first of ``vals`` that is set, else ``default``."""
    if cli is not None:
        return cli
    for v in vals:
        if v is not None:
            return v
    return default


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        sys.exit(f"{PREFIX} error: {name}={raw!r} is not a whole number; set it to steps, e.g. 100")


class Config:
    """Everything one run needs, from plan.json then environment, then command-line overrides."""

    def __init__(self, args: argparse.Namespace) -> None:
        bundle = Path(args.bundle)
        plan = _read_json(bundle / "plan.json")
        model = plan.get("model") or {}
        layout = plan.get("recommended") or plan.get("layout") or {}
        training = plan.get("training") or (plan.get("spec") or {}).get("training") or {}
        self.bundle = bundle
        self._read_model(args, model)
        self._read_training(args, layout, training)
        self._read_framework(args, plan, model, layout)
        self._read_hooks(args)
        self._read_checkpoint(args, plan.get("checkpoint") or {})
        self.ds_config = (
            _read_json(bundle / "ds_config.json") if self.framework == "deepspeed" else {}
        )
        self.fsdp = _read_json(bundle / "fsdp.json") if self.framework == "fsdp" else {}

    def _read_model(self, args: argparse.Namespace, model: dict[str, Any]) -> None:
        self.layers = int(_pick(args.layers, model.get("layers"), default=2))
        self.hidden = int(_pick(args.hidden, model.get("hidden"), default=128))
        self.heads = int(_pick(args.heads, model.get("heads"), default=4))
        # The model's own head width (Qwen3, GPT-OSS: not hidden / heads), unless the command
        # line reshaped the model.
        head_dim = model.get("head_dim") if args.hidden is None and args.heads is None else None
        self.head_dim = int(head_dim or self.hidden // self.heads)
        kv = model.get("kv_heads") or self.heads
        self.kv_heads = int(kv) if self.heads % int(kv) == 0 else self.heads
        self.vocab = int(_pick(args.vocab, model.get("vocab"), default=512))
        self.gated = bool(model.get("gated_mlp", False))
        self.ffn = int(model.get("ffn") or 4 * self.hidden)
        if args.hidden is not None and args.hidden != model.get("hidden"):
            self.ffn = 4 * self.hidden
        self.tie = bool(model.get("tie_embeddings", False))

    def _read_training(
        self, args: argparse.Namespace, layout: dict[str, Any], training: dict[str, Any]
    ) -> None:
        self.seq_len = int(_pick(args.seq_len, training.get("seq_len"), default=64))
        self.micro_batch = int(
            _pick(
                args.micro_batch, layout.get("micro_batch"), training.get("micro_batch"), default=1
            )
        )
        self.grad_accum = int(_pick(args.grad_accum, layout.get("grad_accum"), default=1))
        self.steps = int(_pick(args.steps, training.get("steps"), default=20))
        self.lr = float(_pick(args.lr, training.get("lr"), default=3e-3))
        # Linear warm-up of the learning rate over the first N steps (0: constant).
        self.warmup_steps = int(training.get("warmup_steps") or 0)
        self.grad_clip = float(training.get("grad_clip", 1.0) or 0.0)
        self.optimizer = str(training.get("optimizer") or "adamw")
        self.precision = str(
            _pick(
                args.precision, layout.get("precision"), training.get("precision"), default="fp32"
            )
        )
        self.recompute = str(layout.get("recompute") or "none")
        # Full recompute of only the first N blocks (Megatron's block method); 0: every block.
        self.recompute_layers = int(layout.get("recompute_layers") or 0)

    def _read_framework(
        self,
        args: argparse.Namespace,
        plan: dict[str, Any],
        model: dict[str, Any],
        layout: dict[str, Any],
    ) -> None:
        bundle = self.bundle
        fw = _pick(args.framework, layout.get("framework"), plan.get("framework"), default=None)
        if fw is None:
            fw = (
                "deepspeed"
                if (bundle / "ds_config.json").exists()
                else ("fsdp" if (bundle / "fsdp.json").exists() else "ddp")
            )
        self.megatron_smoke = fw == "megatron"
        experts = int(model.get("num_experts") or 0)
        if fw == "megatron":
            # A 3D plan exists because one replica does not fit: a full-size DDP replica would
            # run out of memory. Keep the real widths (so collectives have the real shapes) but
            # only two blocks, and say so: this is a cluster smoke test, not the real run.
            if args.layers is None and self.layers > 2:
                self.layers = 2
            print(
                f"{PREFIX} note: the example trainer has no TP/PP"
                f"{' or experts' if experts > 1 else ''}; this 3D plan runs as a "
                f"{self.layers}-block data-parallel smoke test over every rank. Train the real "
                "model with Megatron-LM and megatron_args.txt",
                flush=True,
            )
            fw = "ddp"
        self.framework = str(fw)
        if experts > 1 and not self.megatron_smoke:
            # The 3D note above already says the smoke test is not the real run.
            print(
                f"{PREFIX} note: the example trainer has no experts: this mixture-of-experts "
                f"plan ({experts} experts, top-{model.get('experts_per_token') or 1}, "
                f"ep={layout.get('ep') or 1}) runs a dense model with one expert-sized MLP a "
                "block, so its memory and step time are not the plan's; train the model with "
                "your script (--script)",
                flush=True,
            )
        # Context parallelism (FSDP2 + CP, as torchtitan): each group of ``cp`` consecutive
        # ranks trains the same sequences, a contiguous 1/cp of each per rank. The 3D smoke test
        # above runs every rank data-parallel, so it has none.
        self.cp = 1 if self.megatron_smoke else int(layout.get("cp") or 1)
        self.cp_group: Any = None
        self.cp_rank = 0

    def _read_hooks(self, args: argparse.Namespace) -> None:
        self.sleep = float(args.sleep_per_step)
        self.seed = int(args.seed)
        self.device_pref = args.device
        self.fail_at_step = args.fail_at_step
        self.fail_rank = int(args.fail_rank)
        self.skip_at_step = args.skip_collective_at_step
        self.skip_rank = int(args.skip_rank)

    def _read_checkpoint(self, args: argparse.Namespace, section: dict[str, Any]) -> None:
        """Checkpoint settings: the command line, else DTRAIN_CKPT_* / DTRAIN_RESUME, else
        plan.json's ``checkpoint`` section (dir, every, keep, milestone_every)."""
        where = _pick(
            args.ckpt_dir,
            os.environ.get("DTRAIN_CKPT_DIR") or None,
            section.get("dir"),
            default="checkpoints",
        )
        path = Path(str(where)).expanduser()
        self.ckpt_dir = path if path.is_absolute() else self.bundle / path
        self.ckpt_every = int(
            _pick(args.ckpt_every, _env_int("DTRAIN_CKPT_EVERY"), section.get("every"), default=0)
        )
        self.ckpt_keep = int(_pick(args.ckpt_keep, section.get("keep"), default=3))
        self.ckpt_milestone_every = int(
            _pick(args.ckpt_milestone_every, section.get("milestone_every"), default=0)
        )
        if self.ckpt_every < 0 or self.ckpt_keep < 1 or self.ckpt_milestone_every < 0:
            sys.exit(
                f"{PREFIX} error: checkpoint every={self.ckpt_every} keep={self.ckpt_keep} "
                f"milestone_every={self.ckpt_milestone_every}: every and milestone_every must be "
                "0 (off) or more, keep 1 or more"
            )
        resume = "never" if args.no_resume else os.environ.get("DTRAIN_RESUME") or "auto"
        self.resume = resume.strip()


# --------------------------------------------------------------------------- model


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads, self.kv_heads = c.heads, c.kv_heads
        self.head_dim = c.head_dim
        self.ln1 = nn.LayerNorm(c.hidden)
        self.q = nn.Linear(c.hidden, c.heads * self.head_dim, bias=False)
        self.kv = nn.Linear(c.hidden, 2 * c.kv_heads * self.head_dim, bias=False)
        self.proj = nn.Linear(c.heads * self.head_dim, c.hidden, bias=False)
        self.ln2 = nn.LayerNorm(c.hidden)
        self.gated = c.gated
        self.up = nn.Linear(c.hidden, (2 if c.gated else 1) * c.ffn, bias=False)
        self.down = nn.Linear(c.ffn, c.hidden, bias=False)
        self.recompute_mlp = c.recompute == "mlp"
        self.recompute_light = c.recompute == "light"
        self.cp, self.cp_group, self.cp_rank = c.cp, c.cp_group, c.cp_rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute_light and self.training:
            # Light recompute (layout recompute = "light"): the matmul and attention outputs
            # are kept, the norms and activations run again in backward (Megatron-Core's
            # --recompute-modules layernorm moe_act), as a selective activation checkpoint.
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.body, x, use_reentrant=False, context_fn=_keep_matmuls)
        return self.body(x)

    def body(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(b, t, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        if self.kv_heads != self.heads:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if self.cp > 1:
            a = self.context_parallel_attention(q, k, v)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, -1))
        if self.recompute_mlp and self.training:
            # Partial recompute (layout recompute = "mlp"): the MLP's intermediates are not kept;
            # backward runs its forward again (Megatron-Core's --recompute-modules mlp).
            from torch.utils.checkpoint import checkpoint

            return x + checkpoint(self.mlp, x, use_reentrant=False)
        return x + self.mlp(x)

    def context_parallel_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Causal attention of this rank's slice of the sequence against every rank's keys and
        values, all-gathered over the context-parallel group (the all-gather variant of context
        parallelism, Accelerate's default ``cp_comm_strategy``; its backward reduce-scatters
        their gradients): query ``i`` of slice ``r`` sees the keys up to its own position."""
        from torch.distributed.nn.functional import all_gather

        k = torch.cat(all_gather(k.contiguous(), group=self.cp_group), dim=2)
        v = torch.cat(all_gather(v.contiguous(), group=self.cp_group), dim=2)
        t = q.shape[2]
        q_pos = torch.arange(t, device=q.device) + self.cp_rank * t
        kv_pos = torch.arange(k.shape[2], device=q.device)
        mask = kv_pos[None, :] <= q_pos[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(self.ln2(x))
        if self.gated:
            g, u = h.chunk(2, dim=-1)
            h = F.silu(g) * u
        else:
            h = F.gelu(h)
        return self.down(h)


def _keep_matmuls() -> tuple[Any, Any]:
    """Selective checkpoint contexts that save what matrix products and attention kernels
    return and recompute every other operation (norms, activations, element-wise work)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    keep = {getattr(aten, n).default for n in names if hasattr(aten, n)}

    def policy(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> Any:
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def padded_vocab(vocab: int) -> int:
    """Embedding and head rows: the vocabulary rounded up to a multiple of 64, as Megatron pads
    it and nanoGPT pads GPT-2's 50257 to 50304. A vocabulary that is not a multiple of 8 puts
    the head's matrix products off cuBLAS's tensor-core kernels (GPT-2 on an H100: 0.157 s a
    step unpadded, 0.102 s padded). The data never uses the extra rows."""
    return -(-vocab // 64) * 64


class GPT(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        rows = padded_vocab(c.vocab)
        self.embed = nn.Embedding(rows, c.hidden)
        self.pos = nn.Embedding(c.seq_len, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.hidden)
        self.head = nn.Linear(c.hidden, rows, bias=False)
        if c.tie:
            self.head.weight = self.embed.weight
        self.recompute = c.recompute == "full"
        self.recompute_layers = c.recompute_layers
        self.cp_rank = c.cp_rank

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device) + self.cp_rank * idx.shape[1]
        x = self.embed(idx) + self.pos(pos)
        for i, blk in enumerate(self.blocks):
            block_recomputes = not self.recompute_layers or i < self.recompute_layers
            if self.recompute and self.training and block_recomputes:
                from torch.utils.checkpoint import checkpoint

                x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.ln_f(x))


@functools.cache
def _rule(seq_len: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Coefficients (a_t, b_t) with x[t] = (a_t * x[0] + b_t) mod vocab for the rule
    x[t+1] = (7 * x[t] + 3) mod vocab, t = 0..seq_len: each token of a sequence in one
    vectorised step instead of a Python loop over positions (which, at a few thousand tokens,
    cost tens of milliseconds a micro-batch, longer than a small model's whole step on a GPU)."""
    a, b = [1], [0]
    for _ in range(seq_len):
        a.append(a[-1] * 7 % vocab)
        b.append((b[-1] * 7 + 3) % vocab)
    return torch.tensor(a), torch.tensor(b)


def batch(
    c: Config, step: int, rank: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generated tokens with a learnable rule (x[t+1] = 7*x[t] + 3 mod vocab): loss must fall.
    ``rank`` is the data-parallel rank: a context-parallel group draws the same sequences."""
    g = torch.Generator().manual_seed(c.seed + 1000 * step + rank)
    start = torch.randint(0, c.vocab, (c.micro_batch, 1), generator=g)
    a, b = _rule(c.seq_len, c.vocab)
    seq = ((start * a + b) % c.vocab).to(device)
    x, y = seq[:, :-1], seq[:, 1:]
    if c.cp > 1:
        # This rank's contiguous slice of every sequence its context-parallel group trains.
        part = c.seq_len // c.cp
        x, y = (t[:, c.cp_rank * part : (c.cp_rank + 1) * part] for t in (x, y))
    return x, y


# --------------------------------------------------------------------------- distributed set-up


def pick_device(c: Config, local_rank: int) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and c.device_pref != "cpu"
    if c.device_pref == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{PREFIX} error: --device cuda but torch sees no GPU")
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        # fp32 matrix products on TF32 tensor cores, as the planner's fp32 peak assumes (torch
        # leaves them off by default: an H100 then runs them at about a seventh of that rate,
        # measured 0.71 s a step against 0.22 planned for Llama 3.2 1B in fp32).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        return torch.device("cuda", torch.cuda.current_device()), "nccl"
    return torch.device("cpu"), "gloo"


def dtype_of(precision: str, device: torch.device) -> torch.dtype:
    # fp8 plans: the example trainer has no FP8 linears; it runs their bf16 mixed precision.
    if precision in ("bf16", "fp8"):
        return torch.bfloat16
    if precision == "fp16" and device.type == "cuda":
        return torch.float16
    return torch.float32


def peak_mem_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    return (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    )  # ru_maxrss is KiB on Linux


# --------------------------------------------------------------------------- frameworks


def wrap_ddp(model: nn.Module, device: torch.device, world: int) -> nn.Module:
    if world == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def wrap_fsdp(model: GPT, c: Config, device: torch.device) -> nn.Module:
    cfg = c.fsdp
    version = int(cfg.get("fsdp_version", cfg.get("version", 2)) or 2)
    mp = cfg.get("mixed_precision", c.precision)
    if isinstance(mp, dict):
        mp = mp.get("param_dtype", c.precision)
    mp_dtype = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }.get(str(mp).lower())
    if mp_dtype is torch.float16 and device.type != "cuda":
        mp_dtype = None
    strategy = str(cfg.get("sharding_strategy", "FULL_SHARD")).upper()
    if cfg.get("activation_checkpointing") and c.recompute not in ("mlp", "light"):
        model.recompute = True  # a whole block ("mlp", "light": a part, see Block.forward)
    if version == 1 and device.type != "cuda":
        # FSDP1 refuses to run without an accelerator; FSDP2 (fully_shard) shards the same way on CPU.
        if dist.get_rank() == 0:
            log("FSDP1 needs a GPU: running FSDP2 (fully_shard) with the same sharding on CPU")
        version = 2
    if version == 2:
        try:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:  # torch 2.4/2.5 kept FSDP2 under _composable
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

        reshard = cfg.get("reshard_after_forward")
        if reshard is None:
            reshard = strategy not in ("SHARD_GRAD_OP", "NO_SHARD")
        kw: dict[str, Any] = {"reshard_after_forward": bool(reshard)}
        if mp_dtype is not None:
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32)
        if cfg.get("cpu_offload") and device.type == "cuda":
            try:
                from torch.distributed.fsdp import CPUOffloadPolicy
            except ImportError:
                from torch.distributed._composable.fsdp import CPUOffloadPolicy

            kw["offload_policy"] = CPUOffloadPolicy()
        for blk in model.blocks:
            fully_shard(blk, **kw)
        fully_shard(model, **kw)
        return model
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: N817
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    ss = getattr(ShardingStrategy, strategy, ShardingStrategy.FULL_SHARD)
    if (
        ss in (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
        and device.type != "cuda"
    ):
        ss = ShardingStrategy.FULL_SHARD  # hybrid needs a per-node mesh; on CPU shard fully
    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({Block}),
        sharding_strategy=ss,
        mixed_precision=MixedPrecision(
            param_dtype=mp_dtype, reduce_dtype=torch.float32, buffer_dtype=mp_dtype
        )
        if mp_dtype is not None
        else None,
        cpu_offload=CPUOffload(offload_params=True)
        if cfg.get("cpu_offload") and device.type == "cuda"
        else None,
        device_id=device if device.type == "cuda" else None,
        use_orig_params=True,
    )


def init_deepspeed(model: nn.Module, c: Config, device: torch.device, world: int) -> Any:
    import deepspeed

    if device.type != "cuda":
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce kernel (a C++ build
        # of minutes, serialised by a file lock across ranks) the first time comm starts; gloo
        # does the same collectives, so skip the build.
        import importlib

        # (import_module: `import deepspeed.comm.torch as m` would bind the torch package,
        # which deepspeed.comm holds as an attribute of the same name)
        importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    ds = json.loads(json.dumps(c.ds_config))
    ds.pop("train_batch_size", None)  # recomputed by DeepSpeed from micro x accum x dp
    ds["train_micro_batch_size_per_gpu"] = c.micro_batch
    ds["gradient_accumulation_steps"] = c.grad_accum
    ds.setdefault("steps_per_print", 10**9)
    ds.setdefault("wall_clock_breakdown", False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = None
    if device.type != "cuda":
        # DeepSpeed's fused optimizers need compiled CUDA/CPU ops: train with torch's AdamW on CPU.
        ds.pop("optimizer", None)
        ds.pop("scheduler", None)
        ds["zero_allow_untested_optimizer"] = True
        if ds.get("fp16", {}).get("enabled"):
            ds["fp16"] = {"enabled": False}
        zo = ds.get("zero_optimization", {})
        for key in ("offload_optimizer", "offload_param"):
            zo.pop(key, None)
        optimizer = make_optimizer(params, c, device)
    elif "optimizer" not in ds:
        # adam8bit (bitsandbytes) is not a DeepSpeed optimizer: built here, handed to it.
        optimizer = make_optimizer(params, c, device)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=params,
        optimizer=optimizer,
        config=ds,
        lr_scheduler=make_schedule(optimizer, c) if optimizer is not None else None,
    )
    return engine


def make_optimizer(params: Any, c: Config, device: torch.device) -> torch.optim.Optimizer:
    """The plan's optimizer (``training.optimizer``), as the planner counted its states: AdamW,
    SGD with momentum 0.9 (DeepSpeed's config and Megatron's ``--sgd-momentum`` say the same),
    or bitsandbytes' 8-bit AdamW where it is installed and the run is on a GPU; elsewhere AdamW,
    said once by every rank (its states take 8 bytes a parameter, not the planned 2)."""
    if c.optimizer == "sgd":
        return torch.optim.SGD(params, lr=c.lr, momentum=0.9)
    if c.optimizer == "adam8bit":
        try:
            import bitsandbytes as bnb  # type: ignore[import-not-found]
        except ImportError:
            bnb = None
        if bnb is not None and device.type == "cuda":
            return bnb.optim.AdamW8bit(params, lr=c.lr)  # type: ignore[no-any-return]
        print(
            f"{PREFIX} note: adam8bit needs bitsandbytes on a CUDA GPU; this run steps with "
            "AdamW, whose states take 8 bytes a parameter where the plan counted 2",
            flush=True,
        )
    return adamw(params, c, device)


def adamw(params: Any, c: Config, device: torch.device) -> torch.optim.Optimizer:
    """AdamW, fused on a GPU (one kernel over every parameter, as Megatron, DeepSpeed and
    torchtitan step theirs and the planner's time model assumes: measured on an H100 with
    Llama 3.2 1B, torch's default multi-tensor step took 37 ms against 13.5, and a
    parameter-sized temporary). Not where FSDP offloads parameters to the host."""
    fused = device.type == "cuda" and not c.fsdp.get("cpu_offload")
    return torch.optim.AdamW(params, lr=c.lr, fused=fused or None)


# --------------------------------------------------------------------------- files


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def skip_collective(c: Config, step: int, rank: int, device: torch.device) -> None:
    """Test hook (--skip-collective-at-step): every rank but --skip-rank enters an extra
    all-reduce of 1024 floats; --skip-rank never does and stalls outside any collective (as a
    rank stuck in its data loader would), so the others wait in it until the run is stopped."""
    if c.skip_at_step != step or not dist.is_initialized():
        return
    if rank == c.skip_rank:
        print(
            f"{PREFIX} test hook: rank {rank} skips the all-reduce of step {step} and stalls",
            file=sys.stderr,
            flush=True,
        )
        threading.Event().wait()
    dist.all_reduce(torch.ones(1024, device=device))


# --------------------------------------------------------------------------- checkpoints

CKPT_MARKER = "COMPLETE"
"""Written last, by rank 0 and atomically, once every rank's save has returned: a step directory
without it is half-written (a crash, a full disk) and is never resumed from."""
CKPT_PREFIX = "step_"
DS_TAG = "ds"
"""DeepSpeed's tag inside a step directory (its ``save_checkpoint(dir, tag)``)."""


def ckpt_dir_of(root: Path, step: int) -> Path:
    return root / f"{CKPT_PREFIX}{step:08d}"


def ckpt_scan(root: Path) -> tuple[list[int], list[Path]]:
    """The steps of the complete checkpoints under ``root`` (ascending) and the half-written
    step directories (no completion marker)."""
    complete: list[int] = []
    broken: list[Path] = []
    try:
        entries = sorted(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    for d in entries:
        if not d.name.startswith(CKPT_PREFIX) or not d.is_dir():
            continue
        try:
            step = int(d.name[len(CKPT_PREFIX) :])
        except ValueError:
            continue
        if (d / CKPT_MARKER).is_file():
            complete.append(step)
        else:
            broken.append(d)
    return sorted(complete), broken


def ckpt_to_prune(steps: list[int], keep: int, milestone_every: int) -> list[int]:
    """The complete checkpoints to delete: all but the newest ``keep`` (never fewer than one, so
    the only complete checkpoint is never deleted) and the milestones (steps ``milestone_every``
    divides)."""
    ordered = sorted(set(steps))
    kept = set(ordered[-max(keep, 1) :])
    if milestone_every > 0:
        kept |= {s for s in ordered if s % milestone_every == 0}
    return [s for s in ordered if s not in kept]


def _disk_error(where: Path, e: RuntimeError) -> BaseException:
    """torch.save's zip writer reports a full disk as a RuntimeError with no errno: name it
    ENOSPC when the file system has no room left, else keep the error as it is."""
    try:
        full = shutil.disk_usage(where).free < (1 << 20)
    except OSError:
        full = False
    return OSError(errno.ENOSPC, "No space left on device", str(where)) if full else e


def _failure_reason(e: BaseException | None) -> str:
    """One short reason for a failed save: a full disk said plainly, else the first line."""
    seen: list[BaseException] = []
    stack = [e] if e is not None else []
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.append(x)
        if getattr(x, "errno", None) == errno.ENOSPC or "No space left on device" in str(x):
            return "no space left on device"
        stack += [y for y in (x.__cause__, x.__context__) if y is not None]
        failures = getattr(x, "failures", None)  # DCP's CheckpointException: rank -> error
        if isinstance(failures, dict):
            stack += [y for y in failures.values() if isinstance(y, BaseException)]
    if e is None:
        return "a rank's save failed (see its log)"
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _test_hold(step: int) -> None:
    """Test hook (DTRAIN_TEST_CKPT_HOLD=STEP:FILE): with every rank's shards written and the
    marker not yet, rank 0 creates FILE and waits forever, so a test can kill a save midway."""
    raw = os.environ.get("DTRAIN_TEST_CKPT_HOLD", "")
    at, _, path = raw.partition(":")
    if path and at.strip() == str(step):
        Path(path).write_text(str(os.getpid()), encoding="utf-8")
        log(f"test hook: holding checkpoint step={step} before its marker ({path})")
        threading.Event().wait()


class _Pending:
    """A save that every rank started and not every rank has seen finish."""

    def __init__(self, step: int, where: Path, t0: float) -> None:
        self.step, self.dir, self.t0 = step, where, t0
        self.future: Any = None
        self.error: BaseException | None = None
        self.t_done: float | None = None
        self.stall = 0.0

    def local_done(self) -> bool:
        return self.future is None or bool(self.future.done())

    def local_error(self) -> BaseException | None:
        if self.error is None and self.future is not None and self.future.done():
            self.error = self.future.exception()
        return self.error


class Checkpointer:
    """Saves and resumes one run: DDP, FSDP (and the 3D smoke test, which runs as DDP) through
    torch.distributed.checkpoint, sharded and asynchronous (``dcp.async_save`` on a gloo group of
    its own, so its collectives never interleave with training's); DeepSpeed through its engine's
    ``save_checkpoint``/``load_checkpoint``. Beside the shards every rank writes ``rank<R>.pt``
    (step, RNG states, LR schedule, loss scaler, data position). A checkpoint counts once rank 0
    has written ``COMPLETE`` after an all-reduce showed every rank's save succeeded."""

    def __init__(
        self, c: Config, rank: int, world: int, device: torch.device, parts: dict[str, Any]
    ) -> None:
        self.c, self.rank, self.world, self.device = c, rank, world, device
        self.model = parts.get("model")
        self.optimizer = parts.get("optimizer")
        self.schedule = parts.get("schedule")
        self.scaler = parts.get("scaler")
        self.ds = parts.get("ds_engine")
        self.root = c.ckpt_dir
        self.pending: _Pending | None = None
        complete, _ = ckpt_scan(self.root) if rank == 0 else ([], [])
        self.last: int | None = complete[-1] if complete else None
        self.pg: Any = None
        if c.ckpt_every > 0 and self.ds is None and dist.is_initialized():
            self.pg = dist.new_group(backend="gloo")

    # ------------------------------------------------------------------ resume

    def resume(self) -> int:
        """Load the newest complete checkpoint (or DTRAIN_RESUME's), say which; the step to
        continue after (0: a fresh run). Rank 0 decides, every rank loads."""
        found = self._broadcast(self._pick_resume() if self.rank == 0 else None)
        if found is None:
            return 0
        if "error" in found:
            sys.exit(found["error"])
        d, meta = Path(found["dir"]), found["meta"]
        self._check_compatible(d, meta)
        if self.ds is not None:
            self.ds.load_checkpoint(str(d), tag=DS_TAG)
        else:
            from torch.distributed.checkpoint import load
            from torch.distributed.checkpoint.state_dict import set_state_dict

            state = self._dcp_state()
            load(state, checkpoint_id=str(d))
            set_state_dict(
                self.model,
                self.optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optim"],
            )
        self._load_extras(d)
        step = int(meta["step"])
        if self.rank == 0:
            log(f"resumed from step={step} ({d})")
        return step

    def _pick_resume(self) -> dict[str, Any] | None:
        """Rank 0: the checkpoint to resume from and its marker, or the error every rank
        leaves with; half-written checkpoints under the root removed."""
        target = self.c.resume
        complete, broken = ckpt_scan(self.root)
        if target == "never":
            if self.c.ckpt_every > 0 and complete:
                # Saving beside an earlier run's checkpoints would mix the two (and pruning,
                # newest first, would delete this run's): keep theirs, ask for a place.
                return {
                    "error": f"{PREFIX} error: --no-resume, but {self.root} holds an earlier "
                    f"run's checkpoints (newest step={complete[-1]}); move them or set "
                    "--ckpt-dir (DTRAIN_CKPT_DIR) to a new directory"
                }
            return None
        if target != "auto":
            p = Path(target).expanduser()
            if not (p / CKPT_MARKER).is_file():
                found, _ = ckpt_scan(p)
                if not found:
                    return {
                        "error": f"{PREFIX} error: DTRAIN_RESUME={target}: no complete "
                        f"checkpoint there (a step directory with {CKPT_MARKER}); set "
                        "DTRAIN_RESUME=auto or never"
                    }
                p = ckpt_dir_of(p, found[-1])
        else:
            for d in broken:
                log(f"removing half-written checkpoint {d}")
                shutil.rmtree(d, ignore_errors=True)
            if not complete:
                return None
            p = ckpt_dir_of(self.root, complete[-1])
        try:
            meta = json.loads((p / CKPT_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            return {"error": f"{PREFIX} error: cannot read {p / CKPT_MARKER}: {e}"}
        self.last = int(meta["step"]) if p.parent == self.root else self.last
        return {"dir": str(p), "meta": meta}

    def _broadcast(self, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if not dist.is_initialized():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def _check_compatible(self, d: Path, meta: dict[str, Any]) -> None:
        saved = "deepspeed" if meta.get("format") == "deepspeed" else "dcp"
        wanted = "deepspeed" if self.ds is not None else "dcp"
        if saved != wanted:
            sys.exit(
                f"{PREFIX} error: checkpoint {d} was written by "
                f"{'DeepSpeed' if saved == 'deepspeed' else 'torch.distributed.checkpoint'}, "
                f"this run is {self.c.framework}; resume it with the same framework or start "
                "afresh with --no-resume"
            )
        if self.ds is not None and int(meta.get("world", self.world)) != self.world:
            sys.exit(
                f"{PREFIX} error: checkpoint {d} was saved by {meta.get('world')} ranks and "
                f"DeepSpeed's ZeRO checkpoints load only at the same world size ({self.world} "
                "now); convert it with DeepSpeed's ds_to_universal.py, or --no-resume"
            )

    def _load_extras(self, d: Path) -> None:
        own = d / f"rank{self.rank}.pt"
        extras = torch.load(own if own.is_file() else d / "rank0.pt", weights_only=False)
        if own.is_file():  # another world size: the random streams are not this rank's
            torch.set_rng_state(extras["rng_cpu"])
            random.setstate(extras["rng_python"])
            if self.device.type == "cuda" and extras.get("rng_cuda") is not None:
                torch.cuda.set_rng_state(extras["rng_cuda"], self.device)
        if self.schedule is not None and extras.get("schedule") is not None:
            self.schedule.load_state_dict(extras["schedule"])
        if self.scaler is not None and extras.get("scaler") is not None:
            self.scaler.load_state_dict(extras["scaler"])

    # ------------------------------------------------------------------ save

    def after_step(self, step: int) -> None:
        """Called by every rank after each optimizer step: see a running save through, and
        start one when it is due (every N steps, and the last step)."""
        if self.pending is not None:
            self._poll(block=False)
        every = self.c.ckpt_every
        if every > 0 and (step % every == 0 or step == self.c.steps):
            if self.pending is not None:
                self._poll(block=True)
            self._save(step)

    def close(self) -> None:
        """Wait for the save in flight (the run's last) and finish it."""
        if self.pending is not None:
            self._poll(block=True)

    def _state_extras(self, step: int) -> dict[str, Any]:
        return {
            "step": step,
            "data_step": step,  # batch() is a function of (step, rank): the data position
            "rng_cpu": torch.get_rng_state(),
            "rng_cuda": torch.cuda.get_rng_state(self.device)
            if self.device.type == "cuda"
            else None,
            "rng_python": random.getstate(),
            "schedule": self.schedule.state_dict() if self.schedule is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

    def _save(self, step: int) -> None:
        t0 = time.perf_counter()
        p = _Pending(step, ckpt_dir_of(self.root, step), t0)
        try:
            p.dir.mkdir(parents=True, exist_ok=True)
            # A marker left from an earlier save of this step must not vouch for this one.
            (p.dir / CKPT_MARKER).unlink(missing_ok=True)
            torch.save(self._state_extras(step), p.dir / f"rank{self.rank}.pt")
        except OSError as e:
            p.error = e
        except RuntimeError as e:  # torch's zip writer on a full disk: "unexpected pos 64 vs 0"
            p.error = _disk_error(p.dir, e)
        # Every rank enters the save whatever happened above: its collectives must match.
        try:
            if self.ds is not None:
                self.ds.save_checkpoint(str(p.dir), tag=DS_TAG)
            else:
                from torch.distributed.checkpoint import async_save

                p.future = async_save(
                    self._dcp_state(), checkpoint_id=str(p.dir), process_group=self.pg
                )
                p.future.add_done_callback(lambda _f: setattr(p, "t_done", time.perf_counter()))
        except (
            BaseException
        ) as e:  # DCP's CheckpointException is one; a failed save never ends the run
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            p.error = p.error or e
        if p.t_done is None and p.future is None:
            p.t_done = time.perf_counter()
        p.stall += time.perf_counter() - t0
        self.pending = p
        if self.ds is not None:
            self._poll(block=True)

    def _poll(self, block: bool) -> None:
        """Every rank together: once every rank's save has returned, rank 0 marks it complete
        (or says why not and removes it)."""
        p = self.pending
        assert p is not None
        t0 = time.perf_counter()
        if block and p.future is not None:
            # (DCP's CheckpointException is a BaseException: local_error() reads it below)
            concurrent.futures.wait([p.future])
        err = p.local_error() if p.local_done() else None
        if err is not None and _failure_reason(err) != "no space left on device":
            # DCP's CheckpointException may carry its writers' errors without an errno.
            full_err = _disk_error(p.dir, RuntimeError(str(err)))
            if isinstance(full_err, OSError):
                err = full_err
        full = _failure_reason(err) == "no space left on device" if err is not None else False
        flags = torch.tensor(
            [float(p.local_done()), float(p.local_done() and err is None), float(full)],
            device=self.device,
        )
        if dist.is_initialized():
            dist.all_reduce(flags)
        done, ok, full = (int(v) for v in flags.tolist())
        p.stall += time.perf_counter() - t0
        if done < self.world:
            return
        self.pending = None
        if self.rank == 0:
            if full and err is None:
                err = OSError(errno.ENOSPC, "No space left on device")
            self._finish(p, ok == self.world, err)

    def _finish(self, p: _Pending, ok: bool, err: BaseException | None) -> None:
        """Rank 0: write the marker (last), say so, prune; or say why the save failed."""
        t0 = time.perf_counter()
        if ok:
            _test_hold(p.step)
            meta = {
                "step": p.step,
                "world": self.world,
                "framework": self.c.framework,
                "format": "deepspeed" if self.ds is not None else "dcp",
                "time": round(time.time(), 3),
            }
            try:
                _write_atomic(p.dir / CKPT_MARKER, json.dumps(meta).encode())
            except OSError as e:
                ok, err = False, e
        if not ok:
            shutil.rmtree(p.dir, ignore_errors=True)
            keeping = f"step={self.last}" if self.last is not None else "no checkpoint yet"
            log(f"checkpoint step={p.step} failed: {_failure_reason(err)}; keeping {keeping}")
            return
        self.last = p.step
        save_s = (p.t_done or time.perf_counter()) - p.t0
        stall = p.stall + time.perf_counter() - t0
        log(f"checkpoint step={p.step} dir={p.dir} save_s={save_s:.3f} stall_s={stall:.3f}")
        complete, _ = ckpt_scan(self.root)
        for s in ckpt_to_prune(complete, self.c.ckpt_keep, self.c.ckpt_milestone_every):
            shutil.rmtree(ckpt_dir_of(self.root, s), ignore_errors=True)


def make_schedule(optimizer: Any, c: Config) -> Any:
    """The learning-rate schedule: a linear warm-up over ``training.warmup_steps`` (0: the
    plan's rate throughout), saved and restored with every checkpoint."""
    warmup = c.warmup_steps

    def factor(i: int) -> float:
        return min(1.0, (i + 1) / warmup) if warmup > 0 else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    c = Config(args)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend = pick_device(c, local_rank)
    if c.framework == "deepspeed" and device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # Flight Recorder for every backend (gloo included): nccl.env sets it; older bundles not.
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", FR_BUFFER)
    if world > 1 or "MASTER_ADDR" in os.environ:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world,
            device_id=device if device.type == "cuda" else None,
        )
    data_rank = rank
    if c.cp > 1:
        if world % c.cp or c.seq_len % c.cp:
            sys.exit(
                f"{PREFIX} error: context parallelism cp={c.cp} needs a world size ({world}) and "
                f"a sequence length ({c.seq_len}) it divides; re-plan for these ranks"
            )
        # Consecutive ranks share a sequence (TP innermost, then CP, then DP, as the plan orders
        # them); every rank builds every group, as torch.distributed requires.
        for first in range(0, world, c.cp):
            group = dist.new_group(list(range(first, first + c.cp)))
            if first <= rank < first + c.cp:
                c.cp_group = group
        c.cp_rank, data_rank = rank % c.cp, rank // c.cp
    torch.manual_seed(c.seed)
    if rank == 0:
        log(
            f"start framework={c.framework} world_size={world} backend={backend} device={device.type} "
            f"layers={c.layers} hidden={c.hidden} heads={c.heads} vocab={c.vocab} seq_len={c.seq_len} "
            f"micro_batch={c.micro_batch} grad_accum={c.grad_accum} precision={c.precision} steps={c.steps}"
            + (f" cp={c.cp}" if c.cp > 1 else "")
        )
    with device:
        # Built where it trains: no full-size copy on the host first (a billion-parameter
        # model's initialisation on CPU alone took seconds).
        model = GPT(c)
    amp_dtype = dtype_of(c.precision, device)
    ds_engine = None
    if c.framework == "deepspeed":
        ds_engine = init_deepspeed(model, c, device, world)
        optimizer = None
    else:
        if c.framework == "fsdp" and world > 1:
            model = wrap_fsdp(model, c, device)  # type: ignore[assignment]
            amp_dtype = torch.float32  # FSDP's own mixed-precision policy casts
        else:
            model = wrap_ddp(model, device, world)  # type: ignore[assignment]
        optimizer = make_optimizer(model.parameters(), c, device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype is torch.float16 else None
    schedule = make_schedule(optimizer, c) if optimizer is not None else None
    parts = {"model": model, "optimizer": optimizer, "schedule": schedule, "scaler": scaler}
    ckpt = Checkpointer(c, rank, world, device, parts | {"ds_engine": ds_engine})
    first = ckpt.resume() + 1
    tokens_per_step = c.micro_batch * c.grad_accum * c.seq_len // c.cp
    t_start = time.perf_counter()
    for step in range(first, c.steps + 1):
        t0 = time.perf_counter()
        if c.fail_at_step == step and rank == c.fail_rank:
            raise RuntimeError(f"injected failure at step {step} on rank {rank} (--fail-at-step)")
        skip_collective(c, step, rank, device)
        total = 0.0
        for micro in range(c.grad_accum):
            x, y = batch(c, step * c.grad_accum + micro, data_rank, device)
            if ds_engine is not None:
                logits = ds_engine(x)
                loss = F.cross_entropy(logits.float().flatten(0, -2), y.reshape(-1))
                ds_engine.backward(loss)
                ds_engine.step()
            else:
                ctx = (
                    torch.autocast(device.type, dtype=amp_dtype)
                    if amp_dtype is not torch.float32
                    else contextlib.nullcontext()
                )
                sync = (
                    model.no_sync()  # type: ignore[operator]
                    if hasattr(model, "no_sync")
                    and micro < c.grad_accum - 1
                    and c.framework == "ddp"
                    else contextlib.nullcontext()
                )
                with sync, ctx:
                    logits = model(x)
                    loss = (
                        F.cross_entropy(logits.float().flatten(0, -2), y.reshape(-1)) / c.grad_accum
                    )
                if scaler is not None:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                loss = loss * c.grad_accum
            total += float(loss.detach())
        if optimizer is not None:
            if scaler is not None:
                scaler.unscale_(optimizer)
            if c.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), c.grad_clip)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
        if c.sleep > 0:
            time.sleep(c.sleep)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        avg = total / c.grad_accum
        if c.cp > 1:
            # The sequences' loss: the mean of the group's equal slices, the same on each rank.
            mean = torch.tensor([avg], device=device)
            dist.all_reduce(mean, group=c.cp_group)
            avg = float(mean) / c.cp
        if not math.isfinite(avg):
            print(f"{PREFIX} warning: loss is {avg} at step {step}", file=sys.stderr, flush=True)
        log(
            f"step={step}/{c.steps} loss={avg:.4f} tokens_per_s={tokens_per_step / max(dt, 1e-9):.1f} "
            f"step_time_s={dt:.4f} mem_gb={peak_mem_gb(device):.3f}"
        )
        ckpt.after_step(step)
    ckpt.close()
    log(f"done steps={c.steps} time_s={time.perf_counter() - t_start:.3f}")
    if dist.is_initialized():
        # Every rank past its last collective before any tears its groups down, DeepSpeed's
        # engine (its own groups, the ZeRO buckets' async work) released first.
        dist.barrier()
        if ds_engine is not None and hasattr(ds_engine, "destroy"):
            ds_engine.destroy()
        dist.destroy_process_group()
    return 0


def _exit(code: int) -> NoReturn:
    """Leave without the interpreter's finalization once the work is done and the groups are
    destroyed: Gloo's worker threads can still hold async work whose tensors, freed during
    finalization, abort the process ("terminate called without an active exception",
    SIGABRT: seen once in CI, a DeepSpeed ZeRO-2 rank on a busy CPU after its last step;
    pytorch/pytorch#179291 describes the finalization crash), failing a run that trained to
    the end."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
