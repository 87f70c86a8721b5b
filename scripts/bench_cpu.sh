#!/usr/bin/env bash
# CPU throughput of llama_small with the BF16 baseline and with the playbook's NVFP4 recipe (emulated
# on the CPU), from each run's own summary line (mean over iterations 40%-100%), and their ratio.
# Usage: scripts/bench_cpu.sh [extra pretrain_llama flags]
# Env: BUILD (default build), ITERS (10), GBS (8), MBS (2), SEQ (256), THREADS (all cores),
#      RECIPES (default "bf16_mixed bf16_with_nvfp4_mixed").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bin="${BUILD}/apps/pretrain_llama"
[[ -x "$bin" ]] || { echo "bench_cpu: $bin not found; build first (cmake -S . -B $BUILD && cmake --build $BUILD)" >&2; exit 1; }
ITERS=${ITERS:-10} GBS=${GBS:-8} MBS=${MBS:-2} SEQ=${SEQ:-256} THREADS=${THREADS:-$(nproc)}
RECIPES=${RECIPES:-"bf16_mixed bf16_with_nvfp4_mixed"}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
first=""
for recipe in $RECIPES; do
  "$bin" --model llama_small --device cpu --recipe "$recipe" --train-iters "$ITERS" --global-batch-size "$GBS" \
    --micro-batch-size "$MBS" --seq-length "$SEQ" --threads "$THREADS" "$@" >"$log"
  summary=$(grep "summary:" "$log")
  step=$(sed -E 's/.*mean step time ([0-9.]+) s.*/\1/' <<<"$summary")
  toks=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$summary")
  tflops=$(sed -E 's/.*s, ([0-9.]+) MODEL_TFLOP.*/\1/' <<<"$summary")
  loss=$(sed -E 's/.*final lm loss ([0-9.E+-]+).*/\1/' <<<"$summary")
  range=$(sed -E 's/.*summary: (iterations [0-9]+-[0-9]+) .*/\1/' <<<"$summary")
  printf 'bench_cpu: llama_small %-36s | threads %s | gbs %s mbs %s seq %s | %s | step time %s s | %s tokens/s | %s TFLOP/s | final loss %s\n' \
    "$recipe" "$THREADS" "$GBS" "$MBS" "$SEQ" "$range" "$step" "$toks" "$tflops" "$loss"
  if [[ -z "$first" ]]; then first=$step; else
    awk -v a="$step" -v b="$first" -v r="$recipe" 'BEGIN { printf "bench_cpu: step-time ratio %s / first recipe = %.2f\n", r, a / b }'
  fi
done
