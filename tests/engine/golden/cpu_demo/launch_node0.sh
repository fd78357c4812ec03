#!/usr/bin/env bash
# dtrain-tui launch script for run custom-ddp-1x2: node 0 of 1, global ranks 0-1.
# Plan: custom (0.115M params) on 1 x 2 CPU rank (gloo); ddp; tp=1 pp=1 dp=2; fp32.
# Effective batch: micro_batch 4 x grad_accum 1 x dp 2 = 8 sequences = 512 tokens per optimizer step (seq_len 64).
# LR: none given; configs use 0.0003. If you tuned an LR at batch B, scale it by 8/B (linear rule; sqrt(8/B) is the safer start for Adam) and warm up.
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
  --nproc-per-node 2 \
  --node-rank 0 \
  --rdzv-backend c10d \
  --rdzv-endpoint "127.0.0.1:${MASTER_PORT}" \
  --rdzv-id custom-ddp-1x2 \
  --max-restarts 0 \
  --log-dir logs \
  --tee 3 \
  dtrain_agent.py "$ENTRY" --bundle .
