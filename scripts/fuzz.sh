#!/usr/bin/env bash
# Bounded libFuzzer runs of every parser's fuzz target (tests/fuzz/fuzz_<parser>.cpp), as CI runs them.
#
#   scripts/fuzz.sh [--seconds N] [--build DIR] [--jobs N] [PARSER...]
#
# Configures DIR (default build-fuzz) with clang and -DPL_FUZZ=ON (only the fuzz targets and the parser
# sources they need, with -fsanitize=fuzzer-no-link,address,undefined), builds it, then runs each target
# for N seconds (default 10; -max_total_time), --jobs of them at a time (default the core count), over a copy
# of its seed corpus tests/fuzz/corpus/<parser>/ (the seeds are never written to; the copy, the logs and any
# crash input live under DIR/fuzz-run/<parser>/),
# after replaying its regression inputs tests/fuzz/regressions/<parser>/* when there are any.
# A pl::Error is an accepted outcome; a crash, another exception, a sanitizer report, a timeout (-timeout=10
# per input), more than 2 GB of RSS or one allocation over 2 GB is a finding. One line per target;
# exit status 1 when any target found something (its log and crash input are named, and an input of at
# most 4 KB is printed as base64), 2 on a setup error.
# Needs clang and libFuzzer (Debian: clang, libclang-rt-14-dev; scripts/setup.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=10
build=build-fuzz
jobs=$(nproc)
only=()
while (($#)); do
  case "$1" in
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --build) build=${2:?--build needs a value}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a value}; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) only+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz: --seconds must be a positive integer, got '$seconds'" >&2; exit 2; }

cc=$(command -v clang || true)
cxx=$(command -v clang++ || true)
if [[ -z "$cc" || -z "$cxx" ]]; then
  echo "fuzz: clang/clang++ not found (scripts/setup.sh installs clang and libclang-rt-14-dev)" >&2
  exit 2
fi

start=$(date +%s)
mkdir -p "$build"
if ! cmake -S . -B "$build" -G Ninja -DPL_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
       -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "fuzz: configuring $build failed" >&2
  exit 2
fi
rm -f "$build/configure.log"
cmake --build "$build" -j "$jobs" >/dev/null || { cmake --build "$build" -j 1 >&2 || true; echo "fuzz: build failed" >&2; exit 2; }
echo "fuzz: built the targets in $(( $(date +%s) - start )) s; ${seconds} s per target"

parsers=()
if ((${#only[@]})); then
  parsers=("${only[@]}")
else
  for d in tests/fuzz/corpus/*/; do parsers+=("$(basename "$d")"); done
fi

run_root="$build/fuzz-run"
rm -rf "$run_root"
for p in "${parsers[@]}"; do
  [[ -x "$build/tests/fuzz/fuzz_$p" && -d "tests/fuzz/corpus/$p" ]] || { echo "fuzz: no target or seed corpus for '$p'" >&2; exit 2; }
done
# UBSan: a report is fatal and names its stack (the build already has -fno-sanitize-recover=undefined).
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

# One target: replays its regression inputs, fuzzes a copy of its seed corpus, prints its line(s); exit 1 on
# a finding.
fuzz_one() {
  local p=$1 bin="$build/tests/fuzz/fuzz_$1" dir="$run_root/$1" rc=0 runs cov artifact what
  mkdir -p "$dir/corpus" "$dir/tmp"
  cp -r "tests/fuzz/corpus/$p/." "$dir/corpus/"
  local opts=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 -artifact_prefix="$dir/")
  if compgen -G "tests/fuzz/regressions/$p/*" >/dev/null; then
    TMPDIR="$dir/tmp" "$bin" "${opts[@]}" tests/fuzz/regressions/"$p"/* >"$dir/regressions.log" 2>&1 || rc=$?
    if ((rc != 0)); then
      printf 'fuzz: %-20s FINDING: a regression input fails again (rc %d); log %s\n' "$p" "$rc" "$dir/regressions.log"
      return 1
    fi
  fi
  TMPDIR="$dir/tmp" "$bin" "${opts[@]}" -max_total_time="$seconds" -print_final_stats=1 "$dir/corpus" \
    >"$dir/fuzz.log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$dir/fuzz.log" | tail -n 1 | cut -d' ' -f2 || true)
  if ((rc == 0)); then
    printf 'fuzz: %-20s ok       %8s runs  cov %5s  corpus %d -> %d files\n' "$p" "${runs:-?}" "${cov:-?}" \
      "$(find "tests/fuzz/corpus/$p" -type f | wc -l)" "$(find "$dir/corpus" -type f | wc -l)"
    return 0
  fi
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$dir/fuzz.log" | tail -n 1)
  what=$(grep -m1 -oE 'ERROR: (AddressSanitizer|libFuzzer|LeakSanitizer): [^ ]+( [^ ]+)?|runtime error: .*|FINDING: .*' "$dir/fuzz.log" || true)
  printf 'fuzz: %-20s FINDING  %8s runs  %s\n' "$p" "${runs:-?}" "${what:-exit status $rc}"
  printf 'fuzz: %-20s          input %s; log %s\n' "" "${artifact:-(none written)}" "$dir/fuzz.log"
  printf 'fuzz: %-20s          replay: %s %s; keep it as tests/fuzz/regressions/%s/<name> once fixed\n' \
    "" "$bin" "${artifact:-<input>}" "$p"
  # CI runs in a throw-away clone, so its log is the only copy of the input: a small one is printed whole
  # (decode with: base64 -d > input).
  if [[ -n "$artifact" && -f "$artifact" && $(stat -c %s "$artifact") -le 4096 ]]; then
    printf 'fuzz: %-20s          input as base64: %s\n' "" "$(base64 -w0 "$artifact")"
  fi
  return 1
}

# $jobs targets at a time (each fuzzes on one core for $seconds), their lines printed in the targets' order
# once all have finished.
for p in "${parsers[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  mkdir -p "$run_root/$p"
  { fuzz_one "$p" >"$run_root/$p/summary" || touch "$run_root/$p/finding"; } &
done
wait
findings=0
for p in "${parsers[@]}"; do
  cat "$run_root/$p/summary"
  [[ ! -e "$run_root/$p/finding" ]] || findings=$((findings + 1))
done
echo "fuzz: ${#parsers[@]} targets, ${findings} with findings, $(( $(date +%s) - start )) s in all"
((findings == 0))
