# Shell helpers shared by scripts/sweep.sh, scripts/nvfp4_study.sh, scripts/check_no_fp64.sh,
# scripts/check_kernel_resources.sh, scripts/sft_example.sh and scripts/lora_example.sh (sourced; `prog` names the
# caller).

die() { echo "$prog: error: $*" >&2; exit 2; }

# The words as a shell command line: plain words as they are, the others quoted (printf %q).
quote_words() {
  local w out=""
  for w in "$@"; do
    if [[ "$w" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=" $w"; else out+=" $(printf '%q' "$w")"; fi
  done
  printf '%s' "${out# }"
}

# The header comment of script $1 (from its second line up to `set -uo`), without the leading '# '.
print_usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$1"; }

# Sets `python`: $PYTHON, else Debian's /usr/bin/python3 when it has numpy (scripts/setup.sh installs
# python3-numpy and python3-matplotlib there; a python3 earlier on PATH may lack them), else python3.
find_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    python=$PYTHON
  elif [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    python=/usr/bin/python3
  else
    python=python3
  fi
}

# The build directory argument of the check scripts ($1, default build) into $build: -h/--help prints the
# calling script's usage (exit 0), a directory that does not exist is a usage error (exit 2).
build_dir_arg() {
  build="${1:-build}"
  [[ "$build" == "-h" || "$build" == "--help" ]] && { print_usage "$0"; exit 0; }
  [[ -d "$build" ]] || { echo "$prog: no build directory '$build'" >&2; exit 2; }
}

# The path of CUDA binary utility $1 (cuobjdump, nvdisasm): on PATH, in /usr/local/cuda/bin, or in the
# `nvidia-cuda-*` Python wheels' bin folders (scripts/setup.sh installs them when nvcc is present);
# status 1 when none is found.
find_cuda_binutil() {
  local name="$1" d
  local -a dirs=()
  IFS=: read -r -a dirs <<< "${PATH:-}"
  dirs+=(/usr/local/cuda/bin)
  if command -v python3 >/dev/null 2>&1; then
    while IFS= read -r d; do dirs+=("$d"); done < <(python3 -c '
import glob, os, site, sys
roots = []
try: roots += site.getsitepackages()
except Exception: pass
try: roots.append(site.getusersitepackages())
except Exception: pass
roots += [p for p in sys.path if p.endswith("site-packages")]
for r in dict.fromkeys(roots):
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "bin"))): print(d)
' 2>/dev/null)
  fi
  for d in "${dirs[@]}"; do
    if [[ -n "$d" && -x "$d/$name" ]]; then
      echo "$d/$name"
      return 0
    fi
  done
  return 1
}

# The examples' start: each program $2.. in APPS_DIR $1 must be there (else one line and exit 1).
require_apps() {
  local apps="$1" a
  shift
  for a in "$@"; do
    [[ -x $apps/$a ]] || { echo "$prog: $apps/$a not found: build first (cmake --build build)" >&2; exit 1; }
  done
}

# The fine-tuning examples' starting model in Hugging Face format (a real run starts from a downloaded HF Llama):
# llama_tiny_bytes pretrained $3 iterations on the sample license corpus (made first if missing) into $2/base, then
# exported by our own writer to $2/hf_base. $1: the apps directory. Prints the run's iteration and summary lines.
make_tiny_hf_base() {
  local apps="$1" out="$2" iters="$3"
  [[ -f data/sample/license_byte_text_document.bin ]] || scripts/make_sample_corpus.sh "$apps/preprocess_data"
  "$apps/pretrain_llama" --model llama_tiny_bytes --device cpu --disable-fp4 --global-batch-size 8 \
    --micro-batch-size 4 --seq-length 256 --lr 1e-3 --min-lr 1e-4 --warmup-iters 20 \
    --data-path data/sample/license_byte_text_document --train-iters "$iters" --log-interval 100 \
    --save "$out/base" | grep -E ' iteration .*/|summary:'
  "$apps/convert_checkpoint" --load "$out/base" --to-hf "$out/hf_base"
}
