#!/usr/bin/env bash
# dtrain-tui launch script for run llama-2-70b-3d-4x8: node 2 of 4 on 10.0.0.3, global ranks 16-23.
# Plan: llama-2-70b (68.98B params) on 4 x 8 NVIDIA H100 SXM5 80GB; 3d via megatron; tp=8 pp=2 dp=2; bf16.
# Effective batch: micro_batch 1 x grad_accum 32 x dp 2 = 64 sequences = 262,144 tokens per optimizer step (seq_len 4096).
# LR: none given; configs use 0.0003. If you tuned an LR at batch B, scale it by 64/B (linear rule; sqrt(64/B) is the safer start for Adam) and warm up.
# Start launch_node0.sh .. launch_node3.sh, one per node, in any order; node 0 hosts the rendezvous.
# Environment overrides: MASTER_ADDR, MASTER_PORT, TORCHRUN (e.g. 'python -m torch.distributed.run').
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
set -a
# shellcheck source=nccl.env
source ./nccl.env
set +a
if [[ -z "${MASTER_ADDR:-}" ]]; then MASTER_ADDR=10.0.0.1; fi
if [[ -z "${MASTER_PORT:-}" ]]; then MASTER_PORT=29500; fi
export MASTER_ADDR MASTER_PORT
# Checkpoints (plan.json's checkpoint section): where to save, how often, where to
# resume from; any of them set before this script wins. README.md: Checkpoints.
if [[ -z "${DTRAIN_CKPT_DIR:-}" ]]; then DTRAIN_CKPT_DIR="$PWD"/checkpoints; fi
if [[ -z "${DTRAIN_CKPT_EVERY:-}" ]]; then DTRAIN_CKPT_EVERY=0; fi
if [[ -z "${DTRAIN_RESUME:-}" ]]; then DTRAIN_RESUME=auto; fi
export DTRAIN_CKPT_DIR DTRAIN_CKPT_EVERY DTRAIN_RESUME
# Megatron-LM arguments for this plan (one flag and its value per line).
MEGATRON_ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  MEGATRON_ARGS+=("${words[@]}")
done < megatron_args.txt
mkdir -p logs
# DTRAIN_PREFLIGHT=1 (set by `dtrain-tui preflight`): this same world runs the bundle's
# preflight.py (all-reduce sweep, node pairs, GEMM) instead of the training script.
ENTRY=/opt/Megatron-LM/pretrain_gpt.py
if [[ "${DTRAIN_PREFLIGHT:-}" == 1 ]]; then ENTRY=preflight.py; fi
exec ${TORCHRUN:-torchrun} \
  --nnodes 4 \
  --nproc-per-node 8 \
  --node-rank 2 \
  --master-addr "$MASTER_ADDR" \
  --master-port "$MASTER_PORT" \
  --max-restarts 0 \
  --log-dir logs \
  --tee 3 \
  dtrain_agent.py "$ENTRY" "${MEGATRON_ARGS[@]}"
