#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, as CI runs it.
#
#   scripts/sanitize.sh [--build DIR] [--jobs N] [-- CTEST_ARGS...]
#
# Configures DIR (default build-sanitize): CPU only (-DPL_CUDA=OFF), gcc, -DPL_SANITIZE=ON
# (-fsanitize=address,undefined -fno-sanitize-recover=undefined on the library, the apps, the tools and
# the tests), -O1 -g; builds it and runs ctest on it. Any ASan report (out-of-bounds, use-after-free, a
# leak at exit) or UBSan report (overflow, misaligned load, bad shift, ...) ends that process with an
# error and fails its test. Exit status: ctest's (0 when every test passed), 2 on a setup error.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build-sanitize
jobs=$(nproc)
ctest_args=()
while (($#)); do
  case "$1" in
    --build) build=${2:?--build needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    --) shift; ctest_args=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "sanitize: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

start=$(date +%s)
# RelWithDebInfo with its flags replaced: -O1 (fast enough to run the suite, keeps the stacks readable), -g,
# and NDEBUG as in Release so the code is the code CI tests elsewhere.
mkdir -p "$build"
if ! cmake -S . -B "$build" -G Ninja -DPL_CUDA=OFF -DPL_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG" -DCMAKE_C_COMPILER=gcc -DCMAKE_CXX_COMPILER=g++ \
       >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "sanitize: configuring $build failed" >&2
  exit 2
fi
rm -f "$build/configure.log"
cmake --build "$build" -j "$jobs" >"$build/build.log" 2>&1 || { tail -n 40 "$build/build.log" >&2; echo "sanitize: build failed (log $build/build.log)" >&2; exit 2; }
built=$(date +%s)
echo "sanitize: built $build in $((built - start)) s"

# LeakSanitizer suppressions: only leaks whose allocation stack lies in Open MPI's own libraries (it keeps
# its component and progress-thread state until exit by design; MPI_Finalize does not free all of it).
# A leak anywhere in our code is still reported.
supp="$build/lsan.supp"
cat >"$supp" <<'SUPP'
leak:libmpi.so
leak:libopen-pal.so
leak:libopen-rte.so
leak:mca_
SUPP
# abort_on_error: a report ends the process by SIGABRT (a test can never mistake it for a clean exit code).
# detect_leaks on, with the suppressions above. UBSan: a report is fatal and names its stack.
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=0:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$(realpath "$supp"):print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

rc=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" "${ctest_args[@]}" || rc=$?
echo "sanitize: ctest finished in $(( $(date +%s) - built )) s (exit $rc); $(( $(date +%s) - start )) s in all"
exit "$rc"
