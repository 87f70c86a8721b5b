#!/usr/bin/env bash
# No FP64 arithmetic in the CUDA kernels (issue 10, acceptance 3; DESIGN: GB300-class GPUs have almost
# no FP64). Disassembles the device code of a build with `cuobjdump -sass` and fails, naming each kernel
# (demangled) and architecture, when a kernel outside the allowlist contains DADD, DMUL, DFMA or DMMA.
# Other FP64 instructions (DSETP, DMNMX, DSET, and F2F/I2F/F2I conversions to or from F64) are listed
# as notes but do not fail the check.
#
#   scripts/check_no_fp64.sh [BUILD_DIR]        (default: build)
#
# Looks at the CUDA objects BUILD_DIR/lib/CMakeFiles/pl.dir/**/*.cu.o (one per .cu file, so a report
# names the file), or, when there are none, at the linked programs in BUILD_DIR/apps.
# cuobjdump (and the nvdisasm it runs) are looked for on PATH, in /usr/local/cuda/bin, and in the
# `nvidia-cuda-cuobjdump` / `nvidia-cuda-nvdisasm` Python wheels (scripts/setup.sh installs them when
# nvcc is present; 13.x reads CUDA 13.0 binaries).
#
# Exit status: 0 no FP64 arithmetic found, or nothing to check (no cuobjdump/nvdisasm, or a build
# without CUDA objects: one line says which); 1 FP64 arithmetic found in a kernel outside the
# allowlist (or cuobjdump failed on a file); 2 usage error (no such build directory).
set -uo pipefail

prog=check_no_fp64
# shellcheck source=scripts/script_util.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_util.sh"
build_dir_arg "${1:-}"

# Kernels allowed to keep FP64 (demangled-name substrings), each with its reason. Only kernels that are
# not on the training path belong here.
#   quant_stats_kernel, quant_stats_final_kernel (backend/cuda/quant_stats.cu): the quantization
#   telemetry behind quant_stats (LinearLayer statistics, quantize_tensor). They run only when
#   statistics are collected, never in a training step, and their error sums are doubles by design
#   (relative errors of whole tensors, reduced in a fixed order).
allow=(
  "quant_stats_kernel"
  "quant_stats_final_kernel"
)

# ---- find cuobjdump and nvdisasm ---------------------------------------------------------------------
cuobjdump="$(find_cuda_binutil cuobjdump)" || {
  echo "check_no_fp64: cuobjdump not found (PATH, /usr/local/cuda/bin, the nvidia-cuda-cuobjdump wheel): FP64 check skipped"
  exit 0
}
nvdisasm="$(find_cuda_binutil nvdisasm)" || {
  echo "check_no_fp64: nvdisasm not found (cuobjdump -sass needs it; the nvidia-cuda-nvdisasm wheel has it): FP64 check skipped"
  exit 0
}
export PATH="$(dirname "$nvdisasm"):$PATH"

# ---- the files to disassemble -------------------------------------------------------------------------
files=()
if [[ -d "$build/lib/CMakeFiles/pl.dir" ]]; then
  while IFS= read -r f; do files+=("$f"); done < <(find "$build/lib/CMakeFiles/pl.dir" -name '*.cu.o' | sort)
fi
if [[ ${#files[@]} -eq 0 && -d "$build/apps" ]]; then
  while IFS= read -r f; do files+=("$f"); done < <(find "$build/apps" -maxdepth 2 -type f -perm -u+x | sort)
fi
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_no_fp64: no CUDA objects or programs under '$build' (a build without CUDA?): nothing to check"
  exit 0
fi

demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi; }

# One line per (file, arch, kernel, FP64 opcode family) with a count: "file|arch|kernel|op|count".
scan() {
  local f="$1" out
  if ! out="$("$cuobjdump" -sass "$f" 2>&1)"; then
    if grep -q "does not contain device code" <<< "$out"; then return 0; fi
    echo "check_no_fp64: cuobjdump -sass $f failed: $(head -c 300 <<< "$out")" >&2
    return 1
  fi
  awk -v file="$f" '
    /^[ \t]*arch = / { arch = $3 }
    /Function : / { fn = $NF }
    /^[ \t]*\/\*[0-9a-f]+\*\/[ \t]/ {
      line = $0
      sub(/^[ \t]*\/\*[0-9a-f]+\*\/[ \t]*/, "", line)
      sub(/^@!?U?P[0-9T][ \t]+/, "", line)
      split(line, tok, /[ \t;]+/)
      op = tok[1]
      base = op; sub(/\..*/, "", base)
      fam = ""
      if (base == "DADD" || base == "DMUL" || base == "DFMA" || base == "DMMA" || base == "DSETP" ||
          base == "DMNMX" || base == "DSET") fam = base
      else if ((base == "F2F" || base == "I2F" || base == "F2I" || base == "F2IU" || base == "I2FP") && op ~ /F64/) fam = base ".F64"
      if (fam != "") count[file "|" arch "|" fn "|" fam]++
    }
    END { for (k in count) print k "|" count[k] }
  ' <<< "$out"
}

status=0
records=""
for f in "${files[@]}"; do
  r="$(scan "$f")" || status=1
  [[ -n "$r" ]] && records+="$r"$'\n'
done

# Aggregate over architectures: one line per (file, kernel, instruction family).
declare -A per_arch=()
keys=()
while IFS='|' read -r file arch fn fam count; do
  [[ -z "${file:-}" ]] && continue
  name="$(demangle <<< "$fn")"
  name="${name//pl::cuda::(anonymous namespace)::/}"
  name="${name%%(*}"  # the parameter list says nothing more here
  key="$(basename "$file")|$name|$fam"
  [[ -z "${per_arch[$key]:-}" ]] && keys+=("$key")
  per_arch[$key]+="${per_arch[$key]:+, }$arch x$count"
done < <(sort <<< "$records")

fail_lines=""
note_lines=""
for key in "${keys[@]}"; do
  IFS='|' read -r file name fam <<< "$key"
  allowed=0
  for a in "${allow[@]}"; do
    if [[ "$name" == *"$a"* ]]; then allowed=1; fi
  done
  line="  $file: $name: $fam (${per_arch[$key]})"
  case "$fam" in
    DADD | DMUL | DFMA | DMMA)
      if [[ $allowed -eq 1 ]]; then note_lines+="$line [allowlisted: not on the training path]"$'\n'
      else fail_lines+="$line"$'\n'; fi ;;
    *) note_lines+="$line"$'\n' ;;
  esac
done

echo "check_no_fp64: $(basename "$cuobjdump") -sass over ${#files[@]} file(s) under $build"
if [[ -n "$note_lines" ]]; then
  echo "notes (other FP64 instructions, or allowlisted kernels):"
  printf '%s' "$note_lines"
fi
if [[ -n "$fail_lines" ]]; then
  echo "FAIL: FP64 arithmetic (DADD/DMUL/DFMA/DMMA) in kernels outside the allowlist:"
  printf '%s' "$fail_lines"
  exit 1
fi
if [[ $status -ne 0 ]]; then
  echo "FAIL: cuobjdump could not read every file"
  exit 1
fi
echo "check_no_fp64: OK, no DADD/DMUL/DFMA/DMMA outside the allowlist"
exit 0
