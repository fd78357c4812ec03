#!/usr/bin/env bash
# Megatron-LM pretrain_gpt.py for run llama-2-70b-3d-4x8, written by dtrain-tui: the real
# training run of this 3D plan (the example trainer the launch backends start is a smoke
# test that trains its data-parallel part only).
# 4 node(s) x 8 GPU(s); on node i run: NODE_RANK=i ./pretrain_gpt.sh
# Environment:
#   MEGATRON_LM      your Megatron-LM checkout (required)
#   DATA_PATH        Megatron's --data-path (a preprocessed dataset prefix); unset: mock data
#   TOKENIZER_MODEL  a Hugging Face tokenizer (name or directory) for llama-2-70b
#   NODE_RANK        this node's rank (default 0)
#   MASTER_ADDR, MASTER_PORT, TORCHRUN as for launch_node*.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
: "${MEGATRON_LM:?set MEGATRON_LM to your Megatron-LM checkout (it holds pretrain_gpt.py)}"
set -a
# shellcheck source=nccl.env
source ./nccl.env
set +a
NODE_RANK="${NODE_RANK:-0}"
if [[ -z "${MASTER_PORT:-}" ]]; then MASTER_PORT=29500; fi
if [[ -z "${MASTER_ADDR:-}" ]]; then MASTER_ADDR=10.0.0.1; fi
export MASTER_ADDR MASTER_PORT
# Checkpoints (plan.json's checkpoint section): where to save, how often, where to
# resume from; any of them set before this script wins. README.md: Checkpoints.
if [[ -z "${DTRAIN_CKPT_DIR:-}" ]]; then DTRAIN_CKPT_DIR="$PWD"/checkpoints; fi
if [[ -z "${DTRAIN_CKPT_EVERY:-}" ]]; then DTRAIN_CKPT_EVERY=0; fi
if [[ -z "${DTRAIN_RESUME:-}" ]]; then DTRAIN_RESUME=auto; fi
export DTRAIN_CKPT_DIR DTRAIN_CKPT_EVERY DTRAIN_RESUME
CKPT_ARGS=()
if [[ "$DTRAIN_CKPT_EVERY" != 0 ]]; then
  CKPT_ARGS=(--save "$DTRAIN_CKPT_DIR" --load "$DTRAIN_CKPT_DIR")
fi
MEGATRON_ARGS=()
while read -r -a words; do
  [[ ${#words[@]} -eq 0 || ${words[0]} == \#* ]] && continue
  MEGATRON_ARGS+=("${words[@]}")
done < megatron_args.txt
if [[ -n "${DATA_PATH:-}" ]]; then
  : "${TOKENIZER_MODEL:?set TOKENIZER_MODEL to the tokenizer of your data}"
  DATA_ARGS=(--data-path "$DATA_PATH" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$TOKENIZER_MODEL")
else
  DATA_ARGS=(--mock-data --tokenizer-type NullTokenizer --vocab-size 32000)
fi
exec ${TORCHRUN:-torchrun} \
  --nnodes 4 --nproc-per-node 8 --node-rank "$NODE_RANK" \
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
  "$MEGATRON_LM/pretrain_gpt.py" "${MEGATRON_ARGS[@]}" "${DATA_ARGS[@]}" \
  ${CKPT_ARGS[@]+"${CKPT_ARGS[@]}"}
