#!/usr/bin/env bash
# CPU throughput of llama_small with the BF16 baseline and with the playbook's NVFP4 recipe (emulated
# on the CPU), from each run's --log-jsonl end record (the summary's mean over iterations 40%-100%), then PyTorch on the same
# shape, batch, threads and iterations (scripts/bench_torch.py: FP32 eager and BF16 autocast) when
# PyTorch is installed (one line says it is skipped when not), and the ratios: tokens/s of ours BF16 over
# each PyTorch mode's (>1: ours faster), and each other recipe's step time over ours BF16 (the first
# recipe when bf16_mixed is not run). Both programs run in the caller's OpenMP environment (libgomp's default
# wait policy unless OMP_WAIT_POLICY is set): on the quiet 2-core machine it is the faster one for both
# (2026-11-26, 10 iterations: ours 0.68 s/step against 0.83 s under PASSIVE, PyTorch's BF16 autocast
# 1.30-1.36 s against 1.54-1.66 s); PASSIVE helps only when another busy process shares the cores.
# bench_torch.py's model must have as many parameters as ours (both print the count): the script stops
# when they differ. Run it alone on the machine: with one other busy process on the 2 cores PyTorch's
# spinning threads slowed 10-20x (30 s FP32 and 15 s BF16 steps, measured) and ours 1.8x. Before each run
# a line warns when the cores were more than 25% busy over one second.
# Usage: scripts/bench_cpu.sh [extra pretrain_llama flags]
# Env: BUILD (default build), ITERS (10), GBS (8), MBS (2), SEQ (256), THREADS (all cores),
#      RECIPES (default "bf16_mixed bf16_with_nvfp4_mixed"), PYTHON (a python3 with torch; default
#      /usr/bin/python3 when it has torch, else python3), TORCH_MODES (default "fp32_eager bf16_autocast";
#      empty: no PyTorch rows).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bin="${BUILD}/apps/pretrain_llama"
[[ -x "$bin" ]] || { echo "bench_cpu: $bin not found; build first (cmake -S . -B $BUILD && cmake --build $BUILD)" >&2; exit 1; }
ITERS=${ITERS:-10} GBS=${GBS:-8} MBS=${MBS:-2} SEQ=${SEQ:-256} THREADS=${THREADS:-$(nproc)}
RECIPES=${RECIPES:-"bf16_mixed bf16_with_nvfp4_mixed"}
TORCH_MODES=${TORCH_MODES-"fp32_eager bf16_autocast"}
log=$(mktemp)
jsonl=$log.jsonl  # each run's --log-jsonl, where its figures are read
trap 'rm -f "$log" "$jsonl"' EXIT

label() {  # a recipe's or PyTorch mode's name in the ratio lines
  case "$1" in
    bf16_mixed) echo "ours BF16" ;;
    bf16_with_nvfp4_mixed) echo "ours NVFP4" ;;
    fp32_eager) echo "PyTorch FP32 eager" ;;
    bf16_autocast) echo "PyTorch BF16 autocast" ;;
    *) echo "ours $1" ;;
  esac
}

echo "bench_cpu: OMP_WAIT_POLICY ${OMP_WAIT_POLICY:-unset (the libgomp default)} for both programs"
# Warns when the cores were busy (not idle or waiting on I/O, in /proc/stat) over one second before run $1.
warn_if_busy() {
  [[ -r /proc/stat ]] || return 0
  local before after
  before=$(head -1 /proc/stat); sleep 1; after=$(head -1 /proc/stat)
  awk -v a="$before" -v b="$after" -v what="$1" 'BEGIN {
    n = split(a, x); split(b, y); total = 0
    for (i = 2; i <= n; i++) total += y[i] - x[i]
    busy = total - (y[5] - x[5]) - (y[6] - x[6])
    if (total > 0 && busy > 0.25 * total)
      printf "bench_cpu: warning: the cores were %.0f%% busy before %s: its timing is not on a quiet machine\n", 100 * busy / total, what }'
}

declare -A step_of toks_of
order=()
params=""
for recipe in $RECIPES; do
  warn_if_busy "$recipe"
  rm -f "$jsonl"
  "$bin" --model llama_small --device cpu --recipe "$recipe" --train-iters "$ITERS" \
    --global-batch-size "$GBS" --micro-batch-size "$MBS" --seq-length "$SEQ" --threads "$THREADS" \
    --log-jsonl "$jsonl" "$@" >"$log"
  # The run's numbers from its JSON-lines log (scripts/jsonl_log.py; the summary's window and figures).
  [[ -n "$params" ]] || params="$(python3 scripts/jsonl_log.py "$jsonl" start model.parameters | awk '{printf "%.3f", $1 / 1e6}') M parameters"
  IFS=$'\t' read -r first last step toks tflops loss < <(python3 scripts/jsonl_log.py "$jsonl" end summary_first \
    summary_last mean_step_ms tokens_per_s tflops final_lm_loss | awk -F'\t' '{printf "%s\t%s\t%.3f\t%.0f\t%.3f\t%.6E\n", $1, $2, $3 / 1e3, $4, $5, $6}')
  range="iterations $first-$last"
  printf 'bench_cpu: llama_small %-36s | threads %s | gbs %s mbs %s seq %s | %s | step time %s s | %s tokens/s | %s TFLOP/s | final loss %s\n' \
    "$recipe" "$THREADS" "$GBS" "$MBS" "$SEQ" "$range" "$step" "$toks" "$tflops" "$loss"
  step_of[$recipe]=$step toks_of[$recipe]=$toks
  order+=("$recipe")
done

if [[ -n "$TORCH_MODES" ]]; then
  if [[ -n "${PYTHON:-}" ]]; then python=$PYTHON
  elif /usr/bin/python3 -c 'import torch' 2>/dev/null; then python=/usr/bin/python3
  else python=python3
  fi
  if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "bench_cpu: PyTorch not installed (python3-torch); its rows skipped"
    TORCH_MODES=""
  fi
fi
for mode in $TORCH_MODES; do
  warn_if_busy "PyTorch $mode"
  "$python" scripts/bench_torch.py --mode "$mode" --threads "$THREADS" --gbs "$GBS" --mbs "$MBS" --seq "$SEQ" \
    --iters "$ITERS" >"$log"
  cat "$log"
  theirs=$(grep -m1 -oE '\(([0-9.]+ M)\)' "$log" | tr -d '()')
  if [[ -n "$params" && "$theirs parameters" != "$params" ]]; then
    echo "bench_cpu: error: bench_torch.py's model has $theirs parameters, ours $params: not the same model" >&2
    exit 1
  fi
  result=$(grep "step time" "$log")
  step_of[$mode]=$(sed -E 's/.*step time ([0-9.]+) s.*/\1/' <<<"$result")
  toks_of[$mode]=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$result")
done

# Ours BF16 against each PyTorch mode (tokens/s), then every other recipe's step time against it.
base=bf16_mixed
[[ -n "${step_of[$base]:-}" ]] || base=${order[0]}
for mode in $TORCH_MODES; do
  awk -v a="${toks_of[$base]}" -v b="${toks_of[$mode]}" -v l="$(label "$base") / $(label "$mode")" \
    'BEGIN { printf "bench_cpu: %s speed = %.2f (tokens/s ratio; >1: ours faster)\n", l, a / b }'
done
for recipe in "${order[@]}"; do
  [[ "$recipe" != "$base" ]] || continue
  awk -v a="${step_of[$recipe]}" -v b="${step_of[$base]}" -v l="$(label "$recipe") step / $(label "$base") step" \
    'BEGIN { printf "bench_cpu: %s = %.2f\n", l, a / b }'
done
