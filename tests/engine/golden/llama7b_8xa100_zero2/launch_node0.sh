#!/usr/bin/env bash
# dtrain-tui launch script for run llama-2-7b-zero2-1x8: node 0 of 1, global ranks 0-7.
# Plan: llama-2-7b (6.74B params) on 1 x 8 NVIDIA A100 SXM4 80GB; zero2 via deepspeed; tp=1 pp=1 dp=8; bf16.
# Effective batch: micro_batch 4 x grad_accum 2 x dp 8 = 64 sequences = 262,144 tokens per optimizer step (seq_len 4096).
# LR: 0.0003 was tuned at batch 32; this run uses 64 (x2). Linear scaling suggests 0.0006, sqrt scaling 0.000424 (safer for Adam); warm up over the first steps. Configs use the LR as given.
# Environment overrides: MASTER_PORT, TORCHRUN (e.g. 'python -m torch.distributed.run').
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
set -a
# shellcheck source=nccl.env
source ./nccl.env
set +a
if [[ -z "${MASTER_PORT:-}" ]]; then MASTER_PORT=29500; fi
export MASTER_PORT
# Checkpoints (plan.json's checkpoint section): where to save, how often, where to
# resume from; any of them set before this script wins. README.md: Checkpoints.
if [[ -z "${DTRAIN_CKPT_DIR:-}" ]]; then DTRAIN_CKPT_DIR="$PWD"/checkpoints; fi
if [[ -z "${DTRAIN_CKPT_EVERY:-}" ]]; then DTRAIN_CKPT_EVERY=0; fi
if [[ -z "${DTRAIN_RESUME:-}" ]]; then DTRAIN_RESUME=auto; fi
export DTRAIN_CKPT_DIR DTRAIN_CKPT_EVERY DTRAIN_RESUME
mkdir -p logs
# DTRAIN_PREFLIGHT=1 (set by `dtrain-tui preflight`): this same world runs the bundle's
# preflight.py (all-reduce sweep, node pairs, GEMM) instead of the training script.
ENTRY=train.py
if [[ "${DTRAIN_PREFLIGHT:-}" == 1 ]]; then ENTRY=preflight.py; fi
exec ${TORCHRUN:-torchrun} \
  --nnodes 1 \
  --nproc-per-node 8 \
  --node-rank 0 \
  --rdzv-backend c10d \
  --rdzv-endpoint "127.0.0.1:${MASTER_PORT}" \
  --rdzv-id llama-2-7b-zero2-1x8 \
  --max-restarts 0 \
  --log-dir logs \
  --tee 3 \
  dtrain_agent.py "$ENTRY" --bundle .
