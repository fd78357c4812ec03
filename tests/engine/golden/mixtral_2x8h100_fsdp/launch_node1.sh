#!/usr/bin/env bash
# dtrain-tui launch script for run mixtral-8x7b-fsdp-hybrid-2x8: node 1 of 2, global ranks 8-15.
# Plan: mixtral-8x7b (46.70B params) on 2 x 8 NVIDIA H100 SXM5 80GB; fsdp-hybrid via fsdp; tp=1 pp=1 dp=16; bf16.
# Effective batch: micro_batch 1 x grad_accum 4 x dp 16 = 64 sequences = 262,144 tokens per optimizer step (seq_len 4096).
# LR: none given; configs use 0.0003. If you tuned an LR at batch B, scale it by 64/B (linear rule; sqrt(64/B) is the safer start for Adam) and warm up.
# Start launch_node0.sh .. launch_node1.sh, one per node, in any order; node 0 hosts the rendezvous.
# Environment overrides: MASTER_ADDR, MASTER_PORT, TORCHRUN (e.g. 'python -m torch.distributed.run').
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
set -a
# shellcheck source=nccl.env
source ./nccl.env
set +a
: "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0 (no hosts in the spec)}"
if [[ -z "${MASTER_PORT:-}" ]]; then MASTER_PORT=29500; fi
export MASTER_ADDR MASTER_PORT
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
  --nnodes 2 \
  --nproc-per-node 8 \
  --node-rank 1 \
  --master-addr "$MASTER_ADDR" \
  --master-port "$MASTER_PORT" \
  --max-restarts 0 \
  --log-dir logs \
  --tee 3 \
  dtrain_agent.py "$ENTRY" --bundle .
