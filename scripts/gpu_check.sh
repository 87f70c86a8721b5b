#!/usr/bin/env bash
# The first thing to run on a new GPU machine: build with CUDA, run the GPU conformance suite (every
# CUDA op against the CPU backend, a whole-model step), then 10 training iterations of llama_tiny and
# (when its memory plan fits) llama3_8b with the NVFP4 recipe and with --disable-fp4, and print one
# table. Exit status non-zero when a conformance test failed or a run failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:${PATH}"
BUILD=${BUILD:-build-gpu}
ITERS=${ITERS:-10}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
bash scripts/setup.sh >/dev/null || echo "gpu_check: setup.sh failed (continuing with what is installed)" >&2
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPL_CUDA=ON | grep -E "✓|✗"
cmake --build "$BUILD" -j "$(nproc)" >"$BUILD.build.log" 2>&1 || { echo "gpu_check: build failed, see $BUILD.build.log" >&2; exit 1; }
bin="$BUILD/apps/pretrain_llama"

echo "== conformance (pl_tests --gtest_filter='Cuda*')"
xml="$BUILD/gpu_check.xml"
"$BUILD/tests/pl_tests" --gtest_filter='Cuda*' --gtest_output="xml:$xml" >"$BUILD/gpu_check.log" 2>&1
status=$?
python3 - "$xml" <<'PY' || grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$BUILD/gpu_check.log"
import sys, xml.etree.ElementTree as ET
counts = {}
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    name = f'{case.get("classname")}.{case.get("name")}'
    res = "FAILED" if case.find("failure") is not None else ("SKIPPED" if case.find("skipped") is not None else "ok")
    counts[res] = counts.get(res, 0) + 1
    print(f"  {name:<70} {res}")
print("  " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
PY

echo "== training, $ITERS iterations each"
printf '%-12s %-8s %10s %10s %12s %12s %12s  %s\n' model recipe "step (s)" "TFLOP/s" "tokens/s" "peak (GB)" "final loss" "GEMMs"
run() {  # model, flags...
  local model=$1; shift
  local log="$BUILD/gpu_check_${model}_$(echo "$*" | tr -dc 'a-z0-9').log"
  if ! "$bin" --device cuda --model "$model" --train-iters "$ITERS" "$@" >"$log" 2>&1; then
    printf '%-12s %-8s %s\n' "$model" "$recipe" "FAILED: $(tail -n 1 "$log")"
    status=1
    return
  fi
  local s=$(grep "summary:" "$log")
  local step=$(sed -E 's/.*mean step time ([0-9.]+) s.*/\1/' <<<"$s")
  local tf=$(sed -E 's/.*s, ([0-9.]+) MODEL_TFLOP.*/\1/' <<<"$s")
  local tok=$(sed -E 's/.* ([0-9]+) tokens\/s.*/\1/' <<<"$s")
  local loss=$(sed -E 's/.*final lm loss ([0-9.E+-]+).*/\1/' <<<"$s")
  local peak=$(grep -oE "mem-max-allocated-gigabytes: [0-9.]+" "$log" | tail -n 1 | awk '{print $2}')
  local gemm=$(grep -oE "(NVFP4|BF16) GEMMs [a-z]+" "$log" | head -n 1)
  printf '%-12s %-8s %10s %10s %12s %12s %12s  %s\n' "$model" "$recipe" "$step" "$tf" "$tok" "$peak" "$loss" "${gemm:-bf16}"
}
for model in llama_tiny llama3_8b; do
  if [[ $model == llama_tiny ]]; then shape=(--global-batch-size 8 --micro-batch-size 2 --seq-length 128)
  else shape=(--global-batch-size 64 --micro-batch-size 1 --seq-length 4096); fi
  for recipe in nvfp4 bf16; do
    flags=("${shape[@]}")
    [[ $recipe == bf16 ]] && flags+=(--disable-fp4)
    # A plan that does not fit the GPU stops at start-up with one line naming the categories; the
    # table shows that line.
    run "$model" "${flags[@]}"
  done
done
echo "gpu_check: logs in $BUILD/"
exit $status
