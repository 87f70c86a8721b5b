#!/usr/bin/env bash
# Set up, build and run the CPU demo: the BF16 baseline of llama_small (22.7 M parameters) on
# Megatron's mock data, logging in Megatron-Bridge's format. Extra arguments go to pretrain_llama.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:${PATH}"
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)"
exec build/apps/pretrain_llama --model llama_small --device cpu --disable-fp4 --train-iters 50 --warmup-iters 2 \
  --global-batch-size 8 --micro-batch-size 2 --seq-length 256 "$@"
