#!/usr/bin/env bash
# expect_abort.sh SECONDS LINE -- COMMAND...: runs COMMAND (an mpirun of a program whose one rank fails)
# and passes when it ends within SECONDS with a non-zero status and LINE in its output: an error on one
# rank must end every rank (no rank left waiting in a collective) and leave its line visible.
set -uo pipefail
limit=${1:?seconds}; line=${2:?expected line}; shift 2
[[ ${1:-} == -- ]] && shift
start=$(date +%s)
out=$(timeout -k 5 "$((limit * 3))" "$@" 2>&1)
rc=$?
took=$(( $(date +%s) - start ))
printf '%s\n' "$out"
echo "expect_abort: exit status $rc after ${took} s"
if ((rc == 124 || rc == 137)); then echo "expect_abort: FAILED: still running after $((limit * 3)) s (a rank hangs)"; exit 1; fi
if ((rc == 0)); then echo "expect_abort: FAILED: exit status 0, expected non-zero"; exit 1; fi
if ((took > limit)); then echo "expect_abort: FAILED: took ${took} s, more than ${limit} s"; exit 1; fi
if ! grep -qF -- "$line" <<<"$out"; then echo "expect_abort: FAILED: the line '$line' is not in the output"; exit 1; fi
echo "expect_abort: passed: non-zero exit in ${took} s with '$line'"
