#!/usr/bin/env bash
# The shape limits of lib/ and apps/ (issue 23; they stand for all later work), checked by CI (.ci/run):
#   - no function longer than 80 lines (lizard's "length": its first to its last line, comments included);
#     the dispatcher generated from backend/op_list.h is one macro, which lizard does not count as functions;
#   - no source file (.cpp .h .cu .cuh) longer than 700 lines;
#   - apps/ includes nothing under backend/cuda/ and no CUDA header (the device layer prints its own banner);
#   - lib/ reads no test hook from the environment (getenv("PL_TEST...")): tests install hooks in-process
#     or run the test-only builds of tests/tools/.
# lizard comes from PyPI (scripts/setup.sh pins it). Prints every violation, one line each, and exits 1 if
# there is any; exits 2 when lizard is missing.
# Usage: scripts/check_code_limits.sh [--max-function N] [--max-file N] [--help]
set -euo pipefail
cd "$(dirname "$0")/.."
max_function=80
max_file=700
while (($#)); do
  case "$1" in
    --max-function) max_function=$2; shift 2 ;;
    --max-file) max_file=$2; shift 2 ;;
    --help|-h) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check_code_limits: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
py=$(command -v python3 || true)
if [[ -z "$py" ]] || ! "$py" -m lizard --version >/dev/null 2>&1; then
  echo "check_code_limits: lizard is not installed (bash scripts/setup.sh installs it from PyPI)" >&2
  exit 2
fi

mapfile -t sources < <(git ls-files -co --exclude-standard lib apps | grep -E '\.(cpp|h|cu|cuh)$' | sort)
bad=0
# lizard --csv: nloc, ccn, tokens, params, length, "name@first-last@file", file, name, long name, first, last.
while IFS=, read -r _ _ _ _ length location _; do
  if ((length > max_function)); then
    echo "function over ${max_function} lines: ${location//\"/} (${length} lines)"
    bad=1
  fi
done < <("$py" -m lizard -l cpp --csv "${sources[@]}")
for f in "${sources[@]}"; do
  n=$(wc -l < "$f")
  if ((n > max_file)); then
    echo "file over ${max_file} lines: $f (${n} lines)"
    bad=1
  fi
done
if grep -rnE 'backend/cuda|cuda_runtime|cuda\.h|cuda_bf16|cublas|cudnn\.h|nccl\.h' apps/; then
  echo "apps/ reaches into the CUDA backend (above): ask the device layer (backend/) instead"
  bad=1
fi
if grep -rn 'getenv("PL_TEST' lib/; then
  echo "lib/ reads a test hook from the environment (above): install hooks in-process or in a tests/tools build"
  bad=1
fi
if ((bad)); then exit 1; fi
echo "check_code_limits: ${#sources[@]} files of lib/ and apps/: functions <= ${max_function} lines, files <= ${max_file} lines, no CUDA header in apps/, no test hook read from the environment in lib/"
