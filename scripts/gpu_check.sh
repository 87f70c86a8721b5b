#!/usr/bin/env bash
# On a GPU machine: build with CUDA, run the GPU conformance suite (every CUDA op against the CPU
# backend) and print one table of what passed, failed or skipped. Exit status non-zero on a failure.
# A short BF16-vs-NVFP4 training comparison joins this table once the CUDA backend trains.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:${PATH}"
BUILD=${BUILD:-build-gpu}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPL_CUDA=ON >/dev/null || exit 1
cmake --build "$BUILD" -j "$(nproc)" >/dev/null || { echo "gpu_check: build failed" >&2; exit 1; }
xml="$BUILD/gpu_check.xml"
"$BUILD/tests/pl_tests" --gtest_filter='Cuda*' --gtest_output="xml:$xml" >"$BUILD/gpu_check.log" 2>&1
status=$?
printf '%-60s %s\n' "test" "result"
python3 - "$xml" <<'PY' 2>/dev/null || grep -E "^\[ +(OK|FAILED|SKIPPED) +\]" "$BUILD/gpu_check.log"
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    name = f'{case.get("classname")}.{case.get("name")}'
    res = "FAILED" if case.find("failure") is not None else ("SKIPPED" if case.get("result") == "skipped" or case.find("skipped") is not None else "ok")
    print(f"{name:<60} {res}")
PY
echo "gpu_check: full log in $BUILD/gpu_check.log"
exit $status
