#!/usr/bin/env bash
# The fast quantize and expand kernels keep their resource promises (issue 40, acceptance 2): no local
# memory stack (STACK 0: the exact RHT's integer paths and their 640-byte stack live only in the
# fallback and reference kernels) and at most 64 registers (4 blocks of 256 threads per SM) on sm_90a,
# the Hopper target the acceptance names (CHECK_ARCHS overrides: a space-separated list). The other
# architectures of the build are listed, not enforced: on sm_100a/103a/120 (CUDA 13.0's ptxas) the fast
# NVFP4 encode keeps a 128-144 byte local array and the plain F32 amax a 4-byte spill, left for the
# second part of issue 40. Reads `cuobjdump --dump-resource-usage` of the CUDA objects that hold them;
# needs no GPU.
#
#   [CHECK_ARCHS="sm_90a ..."] scripts/check_kernel_resources.sh [BUILD_DIR]        (default: build)
#
# Prints one line per checked kernel and architecture (registers, stack), then the other kernels of
# those files for information. cuobjdump is looked for as scripts/check_no_fp64.sh looks for it.
#
# Exit status: 0 every checked kernel within its limits, or nothing to check (no cuobjdump, or a build
# without CUDA objects: one line says which); 1 a kernel over a limit, a checked kernel missing from an
# object, or cuobjdump failing; 2 usage error (no such build directory).
set -uo pipefail

prog=check_kernel_resources
# shellcheck source=scripts/script_util.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_util.sh"
build_dir_arg "${1:-}"

# file (under lib/CMakeFiles/pl.dir/backend/cuda/) | demangled kernel name, template arguments included
# (a trailing '*' matches any rest) | register limit
checked=(
  "quantize.cu.o|amax_kernel<*|64"
  "quantize.cu.o|rht_amax_kernel<*|64"
  "quantize.cu.o|nvfp4_encode_kernel<unsigned short, true>|64"
  "quantize.cu.o|nvfp4_encode_kernel<float, true>|64"
  "quantize.cu.o|mxfp8_encode_kernel<*|64"
  "quantize.cu.o|fp8_encode_kernel<*|64"
  "quantized_gemm.cu.o|expand_nvfp4_bf16_kernel|64"
  "quantized_gemm.cu.o|expand_fp8_bf16_kernel|64"
)

cuobjdump="$(find_cuda_binutil cuobjdump)" || {
  echo "check_kernel_resources: cuobjdump not found (PATH, /usr/local/cuda/bin, the nvidia-cuda-cuobjdump wheel): skipped"
  exit 0
}
dir="$build/lib/CMakeFiles/pl.dir/backend/cuda"
if [[ ! -f "$dir/quantize.cu.o" ]]; then
  echo "check_kernel_resources: no $dir/quantize.cu.o (a build without CUDA?): nothing to check"
  exit 0
fi
demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi; }

# "file|arch|kernel|REG|STACK" for every kernel of a file.
usage() {
  local f="$1" out
  if ! out="$("$cuobjdump" --dump-resource-usage "$dir/$f" 2>&1)"; then
    echo "check_kernel_resources: cuobjdump --dump-resource-usage $dir/$f failed: $(head -c 300 <<< "$out")" >&2
    return 1
  fi
  awk -v file="$f" '
    /arch = / { arch = $3 }
    /Function [^ ]+:/ { fn = $2; sub(/:$/, "", fn) }
    /REG:[0-9]+/ {
      reg = $0; sub(/.*REG:/, "", reg); sub(/ .*/, "", reg)
      stack = $0; sub(/.*STACK:/, "", stack); sub(/ .*/, "", stack)
      print file "|" arch "|" fn "|" reg "|" stack
    }' <<< "$out"
}

status=0
records=""
for f in quantize.cu.o quantized_gemm.cu.o; do
  r="$(usage "$f")" || status=1
  records+="$r"$'\n'
done

enforced=" ${CHECK_ARCHS:-sm_90a} "
declare -A seen=()
fail_lines="" ok_lines="" other_lines=""
while IFS='|' read -r file arch fn reg stack; do
  [[ -z "${file:-}" ]] && continue
  name="$(demangle <<< "$fn")"
  name="${name//pl::cuda::(anonymous namespace)::/}"
  name="${name%%(*}"
  name="${name#void }"
  matched=""
  for c in "${checked[@]}"; do
    IFS='|' read -r cf pattern limit <<< "$c"
    [[ "$cf" != "$file" ]] && continue
    # shellcheck disable=SC2053  # the pattern's '*' is meant as a glob
    if [[ "$name" == $pattern ]]; then
      matched="$limit"
      [[ "$enforced" == *" $arch "* ]] && seen[$c]=1
      break
    fi
  done
  line="  $file $arch $name: REG $reg, STACK $stack"
  if [[ -z "$matched" ]]; then
    other_lines+="$line"$'\n'
  elif [[ "$enforced" != *" $arch "* ]]; then
    other_lines+="$line (fast kernel; $arch not enforced)"$'\n'
  elif (( stack != 0 || reg > matched )); then
    fail_lines+="$line (limits: STACK 0, REG <= $matched)"$'\n'
  else
    ok_lines+="$line"$'\n'
  fi
done < <(sort <<< "$records")

for c in "${checked[@]}"; do
  if [[ -z "${seen[$c]:-}" ]]; then
    IFS='|' read -r cf pattern _ <<< "$c"
    fail_lines+="  $cf: no kernel named '$pattern' (renamed? update the list in this script)"$'\n'
  fi
done

echo "check_kernel_resources: $(basename "$cuobjdump") --dump-resource-usage over $dir"
printf '%s' "$ok_lines"
if [[ -n "$other_lines" ]]; then
  echo "not checked (reference and fallback kernels, the rest, and the fast kernels on other architectures):"
  printf '%s' "$other_lines"
fi
if [[ -n "$fail_lines" ]]; then
  echo "FAIL:"
  printf '%s' "$fail_lines"
  exit 1
fi
if [[ $status -ne 0 ]]; then
  echo "FAIL: cuobjdump could not read every file"
  exit 1
fi
echo "check_kernel_resources: OK, every fast quantize and expand kernel has STACK 0 and <= its register limit on${enforced% }"
exit 0
