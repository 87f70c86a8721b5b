#!/usr/bin/env bash
# The first thing to run on a GPU machine, offline: from the bundle that scripts/gpu_bundle.sh made
# (.device/) or from a CUDA build directory. Installs nothing and builds nothing. It
#   1. finds NVIDIA's libraries (cudart, cuBLASLt, cuDNN, NVRTC, NCCL) as ONE set: $PL_CUDA_LIBS when
#      given, else the first of the CUDA toolkit and each Python environment's nvidia-* wheels that holds
#      both cuDNN and cuBLASLt (a wheel's cuDNN goes with that wheel set's cuBLASLt); the machine's other
#      folders (ldconfig) only supply what the set lacks, each such library named in the log;
#   2. prints the GPU, the driver, the bundle's commit and architectures, its time estimate per step, and
#      runs the library smoke test (pretrain_llama --print-library-versions: the versions, then a cuDNN
#      handle, a tiny SDPA forward+backward graph, a BF16 and, where native, an FP8 / NVFP4 cuBLASLt
#      matmul, one ✓/✗ line each, and the library files the process mapped, cuDNN's dlopened engines
#      included); when a check fails it stops there, with the ✗ lines;
#   3. runs the conformance suite (pl_tests --gtest_filter='Cuda*'), one line per test;
#   4. trains llama_tiny, llama_small and 4 layers of llama3_8b (seq 4096, MBS 1) in BF16, FP8 current
#      scaling, MXFP8 and NVFP4, one table row each, each run with --log-jsonl and its row read from that
#      JSON-lines log by scripts/jsonl_log.py (python3, standard library only): the GEMMs column from the
#      "start" event's gemms list (native or emulated), step time, TFLOP/s, tokens/s, final loss and nan
#      iterations from the "end" event, the peak memory from its memory.max_allocated_bytes (in GB, 1e9);
#   5. the roofline (issue 24): 2 layers of llama3_8b (seq 4096, MBS 1) in NVFP4 and in BF16 with
#      --roofline, the machine's measured ceilings probed once and cached, the two per-op tables and
#      JSON reports (the summary's "% of speed of light" is the report's pct_of_sol), and
#      scripts/roofline_plot.py's figure of both (when python3 has matplotlib);
#   6. with --sync (or SYNC=1): the conformance suite again with CUDA_LAUNCH_BLOCKING=1;
#   7. with --sanitize (or SANITIZE=1): compute-sanitizer over a subset of the conformance suite;
#   8. only with --only peer (not part of the default run): the PyTorch peer on the same GPU, 4 layers of
#      llama3_8b (seq 4096, MBS 1, GBS 8, 10 iterations) trained by pretrain_llama in bf16_mixed and
#      bf16_with_fp8_current_scaling_mixed (tokens/s and peak memory from the --log-jsonl "end" event) and by
#      scripts/bench_torch.py --device cuda in bf16_compile (autocast BF16, torch.compile, SDPA, fused AdamW)
#      and fp8_torchao (the same plus torchao's float8 training, tensorwise, the same BF16 edge layers as our
#      recipe); a table: recipe | ours tok/s | PyTorch tok/s | ours/PyTorch | peak memory, and each side's
#      FP8/BF16 ratio. The python with a CUDA torch: $PEER_PYTHON, else python3, /opt/*/.venv/bin/python3,
#      /usr/bin/python3 (named, with its torch version; a warning when it is not the torch the pinned torchao
#      pairs with, scripts/torch_peer.sh); torchao from the bundle's wheels/ (scripts/gpu_bundle.sh), unpacked
#      into a temporary folder on PYTHONPATH (nothing installed). Estimate ~180 s, limit 270 s (PEER_LIMIT).
#   9. only with --only kernels (not part of the default run): the kernel table of the bundle's bench_kernels
#      --device cuda on llama3_8b's linear layers (seq 4096, MBS 1): every quantize call of the FP8 (current and
#      delayed scaling), MXFP8 and NVFP4 recipes in GB/s and % of the HBM ceiling, the expand of each emulated
#      GEMM format, and each layer's fprop / dgrad / wgrad GEMMs in BF16 and FP8 (TFLOP/s, FP8/BF16); the
#      table into the report, its JSON to $OUT/kernels.json (else the logs folder). Estimate ~60 s (fast and reference kernels), limit
#      170 s (KERNELS_LIMIT).
# --quantize-kernels fast|reference (or QUANTIZE_KERNELS=...): passed to every pretrain_llama run of the training
# table, the roofline and the peer (default: the program's, fast). When CudaQuantizeKernels.* fails on the fast
# kernels, `--only training --quantize-kernels reference` still gives the training table (issue 40).
# GPU_CHECK_PAST_SMOKE=1: go on after a failed smoke test (only to try the later steps' parsing without
# a GPU; the failure still counts).
# The whole run keeps to a time budget (default 530 s, --budget S): every step runs under `timeout`,
# and a step that no longer fits is reported as not run (a failure); --sync and --sanitize take their
# time from the training table (`--only conformance --sync --sanitize` runs them without it). On an
# H200 (2026-11-28) every step together took ~215 s, well inside the budget; the two calls below keep
# each inside the device tool's 10 minutes on a slower machine too. With $OUT set (the device tool),
# the report goes to $OUT/gpu_check.txt and every log into $OUT/gpu_check_logs.tar.gz; the roofline's
# logs, JSON reports, ceilings cache and figure go to $OUT as roofline_{nvfp4,bf16}.{log,json},
# machine_ceilings.json and roofline.png (else into the logs folder).
#
#   scripts/gpu_check.sh [--bundle DIR | --build-dir DIR] [--sync] [--sanitize] [--budget S]
#                        [--only conformance|training|roofline|peer|kernels] [--iters N]
#                        [--quantize-kernels fast|reference]
#   scripts/gpu_check.sh [--bundle DIR] --unpack DIR2   (no GPU needed: unpack the bundle's programs
#                        into DIR2 and write DIR2/env.sh, which sets LD_LIBRARY_PATH for running them)
#   scripts/gpu_check.sh --gemm-mode FORMAT JSONL  (no GPU needed; for tests: what the GEMMs column reads for
#                        FORMAT (BF16, FP8, MXFP8 or NVFP4, any case) from a pretrain_llama --log-jsonl file:
#                        one line, native, emulated or ?, exit 0; ? when the file's last start event has no
#                        gemms entry for it or the file is not a JSON-lines log, with one line on stderr
#                        saying why; exit 2 for bad arguments, or JSONL not a regular file)
#
# A first GPU run is two calls, each under the device tool's 10 minutes (the estimate printed first):
#   scripts/gpu_check.sh --only conformance      then      scripts/gpu_check.sh --only training
# and PyTorch beside ours on the same GPU (< 5 min): scripts/gpu_check.sh --only peer
# and the kernel table (< 3 min): scripts/gpu_check.sh --only kernels
#
# Exit status: 0 every check passed; 1 a check failed or did not run; 2 bad arguments, or no bundle
# or build to run; 3 no GPU is present (one line on stderr, nothing else is done).
set -uo pipefail
self_dir=$(cd "$(dirname "$0")" && pwd)
start=$(date +%s)
peer_ld=${LD_LIBRARY_PATH:-}  # (--only peer runs PyTorch with the library path it came with, not the bundle's)

# The JSON-lines logs' reader (beside this script, in a checkout and in the bundle); python3's standard
# library is all it needs.
reader=$self_dir/jsonl_log.py
# gemm_mode FORMAT JSONL: how FORMAT's GEMMs run, "native" or "emulated", as pretrain_llama's JSON-lines log
# says it: the last "start" event's gemms entry of that format (lower case there: bf16, fp8, mxfp8, nvfp4;
# both FP8 scalings are "fp8"), or "?" (no such entry, not a JSON-lines log, no python3: the reason on stderr).
gemm_mode() {
  local m; m=$(python3 "$reader" --gemm "$(tr '[:upper:]' '[:lower:]' <<<"$1")" "$2") || m=""
  echo "${m:-?}"
}
if [[ ${1:-} == --gemm-mode ]]; then
  [[ $# -eq 3 && ${2^^} =~ ^(BF16|FP8|MXFP8|NVFP4)$ && -f $3 ]] ||
    { echo "gpu_check: --gemm-mode FORMAT JSONL (FORMAT: BF16, FP8, MXFP8 or NVFP4; JSONL: a pretrain_llama --log-jsonl file)" >&2; exit 2; }
  gemm_mode "$2" "$3"; exit 0
fi

bundle="" build="" unpack_to="" sync=${SYNC:-0} sanitize=${SANITIZE:-0} budget=${GPU_CHECK_BUDGET:-530} only="" iters=""
quantize_kernels=${QUANTIZE_KERNELS:-}
usage() { awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; }
while (($#)); do
  case $1 in
    --bundle) bundle=${2:?}; shift 2 ;;
    --build-dir) build=${2:?}; shift 2 ;;
    --unpack) unpack_to=${2:?}; shift 2 ;;
    --sync) sync=1; shift ;;
    --sanitize) sanitize=1; shift ;;
    --budget) budget=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --quantize-kernels) quantize_kernels=${2:?}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $budget =~ ^[0-9]+$ ]] && [[ -z $iters || $iters =~ ^[1-9][0-9]*$ ]] ||
  { echo "gpu_check: --budget and --iters take a number" >&2; exit 2; }
[[ -z $quantize_kernels || $quantize_kernels == fast || $quantize_kernels == reference ]] ||
  { echo "gpu_check: --quantize-kernels fast|reference (got '$quantize_kernels')" >&2; exit 2; }
# What every training, roofline and peer run of pretrain_llama gets (nothing: the program's default).
qk_flags=()
[[ -n $quantize_kernels ]] && qk_flags=(--quantize-kernels "$quantize_kernels")
# --only's values (a new step adds its name here, and its own `[[ $only == NAME ]]` block below).
only_steps=(conformance training roofline peer kernels)
[[ -z $only || " ${only_steps[*]} " == *" $only "* ]] ||
  { echo "gpu_check: --only $(IFS='|'; echo "${only_steps[*]}")" >&2; exit 2; }

# ---- is there a GPU at all? One line and exit 3 when not. -------------------------------------
if [[ -n $unpack_to ]]; then :
elif command -v nvidia-smi >/dev/null 2>&1; then
  if ! smi_list=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU [0-9]' <<<"$smi_list"; then
    echo "gpu_check: no GPU is present (nvidia-smi lists none: $(head -n 1 <<<"$smi_list" | cut -c1-120)): nothing to check" >&2
    exit 3
  fi
elif ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  echo "gpu_check: no GPU is present (nvidia-smi not found, no /dev/nvidia*): nothing to check" >&2
  exit 3
fi

# ---- what to run: a bundle (bin/, lib/, BUILD_INFO) or a build directory ----------------------
if [[ -z $bundle && -z $build ]]; then
  if [[ -f $self_dir/../BUILD_INFO ]]; then bundle=$self_dir/..                 # .device/scripts/gpu_check.sh
  elif [[ -f $self_dir/../.device/BUILD_INFO ]]; then bundle=$self_dir/../.device  # scripts/gpu_check.sh in a checkout
  else
    for d in "$self_dir"/../build-device "$self_dir"/../build-gpu "$self_dir"/../build; do
      [[ -x $d/apps/pretrain_llama && -x $d/tests/pl_tests ]] && { build=$d; break; }
    done
  fi
fi
if [[ -n $bundle ]]; then
  bundle=$(cd "$bundle" && pwd) || exit 2
  app=$bundle/bin/pretrain_llama tests=$bundle/bin/pl_tests kbench=$bundle/bin/bench_kernels
  archs=$(sed -n 's/^cuda_architectures: //p' "$bundle/BUILD_INFO")
  export PRETRAIN_LLAMA_CONFIGS=$bundle/configs
elif [[ -n $build ]]; then
  build=$(cd "$build" && pwd) || exit 2
  app=$build/apps/pretrain_llama tests=$build/tests/pl_tests kbench=$build/apps/bench_kernels
  archs=$(grep '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" 2>/dev/null | cut -d= -f2)
else
  echo "gpu_check: nothing to run: no .device/ bundle (scripts/gpu_bundle.sh makes it) and no build directory" >&2
  exit 2
fi
[[ -n $unpack_to && -z $bundle ]] && { echo "gpu_check: --unpack needs a bundle (--bundle DIR or .device/)" >&2; exit 2; }

# A bundle stores its large files gzip-compressed: bin/ and lib/ are unpacked into a folder of their
# own (removed at exit, except with --unpack); configs/ stays in the bundle.
rt="" libdir=""
if [[ -n $bundle ]]; then
  if [[ -n $unpack_to ]]; then
    mkdir -p "$unpack_to" && [[ -z $(ls -A "$unpack_to") ]] || { echo "gpu_check: --unpack $unpack_to: not an empty folder" >&2; exit 2; }
    rt=$(cd "$unpack_to" && pwd)
  else
    rt=$(mktemp -d "${TMPDIR:-/tmp}/pl_device.XXXXXX")
  fi
  # (chmod: a copy that lost the modes on its way still runs.)
  if ! cp -R "$bundle/bin" "$bundle/lib" "$rt/" || ! find "$rt" -name '*.gz' -exec gunzip -f {} + || ! chmod +x "$rt"/bin/*; then
    echo "gpu_check: cannot unpack $bundle into $rt" >&2; exit 2
  fi
  ln -s "$bundle/configs" "$rt/configs"  # pretrain_llama looks in <exe>/../configs
  app=$rt/bin/pretrain_llama tests=$rt/bin/pl_tests kbench=$rt/bin/bench_kernels libdir=$rt/lib
fi
[[ -x $app && -x $tests ]] || { echo "gpu_check: $app or $tests is missing" >&2; exit 2; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
report=$logs/gpu_check.txt
status=0
say() { printf '%s\n' "$*" | tee -a "$report"; }
failures=() summary=()
fail() { say "FAILED: $*"; failures+=("$*"); status=1; }
left() { echo $((budget - ($(date +%s) - start))); }
# step_limit WANTED [RESERVE]: seconds a step may take, given what is left and what later steps need.
step_limit() { local l=$(( $(left) - ${2:-0} - 5 )); ((l > $1)) && l=$1; echo $((l < 0 ? 0 : l)); }
made_links=()
finish() {
  for l in "${made_links[@]}"; do rm -f "$l"; done
  [[ -n $rt && -z $unpack_to ]] && rm -rf "$rt"
  [[ -n ${peer_tmp:-} ]] && rm -rf "$peer_tmp"
  # The end of the output is what a remote call shows first: the summary again, in a few lines.
  say "== summary"
  for l in "${summary[@]}"; do say "$l"; done
  for t in "${table:-}" "${peer_table:-}"; do [[ -n $t && -f $t ]] && while IFS= read -r l; do say "$l"; done <"$t"; done
  for l in "${failures[@]}"; do say "FAILED: $l"; done
  local where=$logs
  [[ -n ${OUT:-} && -d ${OUT:-} ]] && where="$OUT/gpu_check.txt, $OUT/gpu_check_logs.tar.gz"
  say "gpu_check: $( ((status == 0)) && echo "all checks passed" || echo "FAILED (see above)") in $(( $(date +%s) - start )) s; logs in $where"
  if [[ -n ${OUT:-} && -d ${OUT:-} ]]; then
    cp "$report" "$OUT/gpu_check.txt" &&
      tar -C "$(dirname "$logs")" -czf "$OUT/gpu_check_logs.tar.gz" "$(basename "$logs")" 2>/dev/null && rm -rf "$logs"
  fi
  exit $status
}

# ---- NVIDIA's libraries -------------------------------------------------------------------------
nvidia_re='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z_-]*|libnvJitLink|libnvidia-[a-z-]+|libcufft|libcurand|libcusolver|libcusparse|libcupti|libnvToolsExt)\.so'
# Library sets. cuDNN is built against one cuBLASLt: a wheel's cuDNN must run with that wheel set's
# cuBLASLt, not the toolkit's or another environment's. Each source is one set of folders: $PL_CUDA_LIBS
# (the user's choice, taken as it is), the CUDA toolkit, each Python environment's nvidia/ wheels
# (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib, ...). The first set holding both cuDNN and
# cuBLASLt is chosen and searched first for every library; the machine's other folders (ldconfig, the
# driver's) only supply what it lacks, and each such library is named as coming from outside the set.
set_names=() set_dirs=()  # one entry per set: its name, its folders joined by ':'
add_set() {  # NAME DIR...: a set of the folders that exist (canonical paths), unless an earlier set has them
  local name=$1 d c ds=(); shift
  for d in "$@"; do
    [[ -n $d && -d $d ]] || continue
    c=$(cd "$d" && pwd -P); [[ " ${ds[*]} " == *" $c "* ]] || ds+=("$c")
  done
  ((${#ds[@]})) || return 0
  local joined; joined=$(IFS=:; echo "${ds[*]}")
  for d in "${set_dirs[@]}"; do [[ $d == "$joined" ]] && return 0; done
  set_names+=("$name"); set_dirs+=("$joined")
}
set_has() { local d; for d in ${1//:/ }; do [[ -e $d/$2 ]] && return 0; done; return 1; }  # DIRS SONAME
[[ -n ${PL_CUDA_LIBS:-} ]] && add_set "PL_CUDA_LIBS" ${PL_CUDA_LIBS//:/ }
nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$nvcc_dir/.." /usr/local/cuda; do
  [[ -n $d && -d $d ]] && add_set "CUDA toolkit $(cd "$d" && pwd -P)" "$d/lib64" "$d/lib" "$d/targets/x86_64-linux/lib"
done
# The nvidia-* wheels: ask python3 where its site-packages are when there is one, and look in the usual
# places too.
sites=()
for py in python3 /opt/*/.venv/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  while IFS= read -r s; do sites+=("$s"); done < <("$py" -c 'import site, sys
print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null)
done
for s in "${sites[@]}" /opt/*/.venv/lib/python3*/site-packages /usr/local/lib/python3*/dist-packages \
         /usr/lib/python3/dist-packages "$HOME"/.local/lib/python3*/site-packages; do
  [[ -d $s/nvidia ]] || continue
  wheel_dirs=()
  while IFS= read -r f; do wheel_dirs+=("$(dirname "$f")"); done < <(find "$s/nvidia" -maxdepth 3 -name 'lib*.so*' 2>/dev/null | sort)
  add_set "nvidia wheels $(cd "$s/nvidia" && pwd -P)" "${wheel_dirs[@]}"
done
chosen="" chosen_name=""
for i in "${!set_names[@]}"; do
  if [[ ${set_names[i]} == PL_CUDA_LIBS ]] || { set_has "${set_dirs[i]}" libcudnn.so.9 && set_has "${set_dirs[i]}" libcublasLt.so.13; }; then
    chosen=${set_dirs[i]} chosen_name=${set_names[i]}; break
  fi
done
candidates=()
[[ -n $chosen ]] && IFS=: read -r -a candidates <<<"$chosen"
for d in "${set_dirs[@]}"; do IFS=: read -r -a more <<<"$d"; candidates+=("${more[@]}"); done
while IFS= read -r f; do candidates+=("$(dirname "$f")"); done < <(ldconfig -p 2>/dev/null | awk '$NF ~ /^\// {print $NF}' | grep -E '/lib(cuda|cudart|cublas|cudnn|nccl|nvrtc)')
candidates+=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64)
others=()
for i in "${!set_names[@]}"; do [[ ${set_dirs[i]} != "$chosen" ]] && others+=("${set_names[i]}"); done
if [[ -n $chosen ]]; then
  lib_set_line="library set: $chosen_name (${chosen//:/, })"
  ((${#others[@]})) && lib_set_line+="; also seen, used only for what it lacks: $(IFS=';'; echo "${others[*]}")"
elif ((${#set_names[@]})); then lib_set_line="library set: none holds both cuDNN (libcudnn.so.9) and cuBLASLt (libcublasLt.so.13): each library from the first folder that has it (${set_names[*]}); the smoke test shows whether they work together"
else lib_set_line="library set: no CUDA toolkit, \$PL_CUDA_LIBS or nvidia wheels found: each library from the machine's library folders"; fi
ldpath=()
[[ -n $libdir ]] && ldpath+=("$libdir")
nv_sonames=$( { ldd "$app"; ldd "$tests"; } 2>/dev/null | awk '{print $1}' | grep -E "$nvidia_re" | sort -u)
lib_report=()
# What the binaries need (ldd), what this build always needs (in case ldd is missing), NCCL, the driver.
for so in $(printf '%s\n' $nv_sonames libcudart.so.13 libcublasLt.so.13 libcudnn.so.9 libnvrtc.so.13 libnccl.so.2 \
               libcuda.so.1 | awk '!seen[$0]++'); do
  # The driver's library is normally in the ld.so cache: leave it there.
  if [[ $so == libcuda.so.1 ]] && cached=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" && /x86-64/ {print $NF; exit}') &&
     [[ -n $cached ]]; then
    lib_report+=("$so: $cached (ld.so cache)"); continue
  fi
  found=""
  for d in "${candidates[@]}"; do [[ -e $d/$so ]] && { found=$d; break; }; done
  if [[ -z $found ]]; then
    # NCCL: needed when the binaries link it (builds with NCCL: parallel/nccl_communicator.cpp calls it).
    [[ $so == libnccl.so.2 ]] && ! grep -qx libnccl.so.2 <<<"$nv_sonames" &&
      { lib_report+=("$so: not found (the binaries do not link it)"); continue; }
    lib_report+=("$so: NOT FOUND"); continue
  fi
  found=$(cd "$found" && pwd -P)
  if [[ -n $chosen && ":$chosen:" != *":$found:"* ]]; then lib_report+=("$so: $found (not in the chosen set)")
  else lib_report+=("$so: $found"); fi
  [[ " ${ldpath[*]} " == *" $found "* ]] || ldpath+=("$found")
done
# The chosen set's folders ahead of any other: a folder outside it that supplied one library (cudart,
# say) may hold another (the toolkit's lib64 holds a cuBLASLt too), and the loader takes the first match.
ordered=()
[[ -n $libdir ]] && ordered+=("$libdir")
for d in "${ldpath[@]}"; do [[ $d != "$libdir" && ":$chosen:" == *":$d:"* ]] && ordered+=("$d"); done
for d in "${ldpath[@]}"; do [[ $d != "$libdir" && ":$chosen:" != *":$d:"* ]] && ordered+=("$d"); done
ldpath=("${ordered[@]}")
LD_LIBRARY_PATH=$(IFS=:; echo "${ldpath[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
# libstdc++/libgcc_s: the machine's when it is at least as new as the build's, else the bundle's copy.
if [[ -n $libdir && -d $libdir/compat ]] && { ldd "$app"; ldd "$tests"; } 2>&1 | grep -qE "(GLIBCXX|CXXABI|GCC)_[0-9.]+' not found"; then
  export LD_LIBRARY_PATH=$libdir/compat:$LD_LIBRARY_PATH
  lib_report+=("libstdc++: the machine's is older than the build's; using the bundle's copy")
fi

if [[ -n $unpack_to ]]; then
  printf 'export LD_LIBRARY_PATH=%q\nexport PRETRAIN_LLAMA_CONFIGS=%q\n' "$LD_LIBRARY_PATH" "$bundle/configs" >"$rt/env.sh"
  rm -rf "$logs"
  echo "gpu_check: unpacked $bundle into $rt: source $rt/env.sh, then run $rt/bin/pretrain_llama"
  exit 0
fi

say "== gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ) on ${HOSTNAME:-$(uname -n)}"
if command -v nvidia-smi >/dev/null 2>&1; then
  say "GPU: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
else
  say "GPU: $(ls /dev/nvidia[0-9]* | tr '\n' ' ') (no nvidia-smi)"; cc=""
fi
[[ -n $bundle ]] && say "bundle: $bundle: $(grep -E '^(commit|bundled|cuda_toolkit):' "$bundle/BUILD_INFO" | tr '\n' ' ')"
[[ -n $build ]] && say "build: $build"
say "CUDA architectures of the build: ${archs:-unknown}"
[[ -n $quantize_kernels ]] && say "quantize kernels: $quantize_kernels (--quantize-kernels, every training, roofline and peer run)"
# Code this GPU runs: sm_XYa machine code on XY only; sm_XY (and XYf) on the same major, minor >= Y;
# compute_XY PTX (no suffix or -virtual) JIT-compiled on any newer GPU.
if [[ $cc =~ ^[0-9]+$ && -n $archs ]]; then
  covered=0
  for a in ${archs//;/ }; do
    v=${a%%-*} n=${a%%-*}; n=${n%[af]}
    [[ $n =~ ^[0-9]+$ ]] || continue
    if [[ $a != *-virtual ]]; then
      if [[ $v == *a ]]; then ((n == cc)) && covered=1
      elif ((n / 10 == cc / 10 && n <= cc)); then covered=1; fi
    fi
    [[ $a != *-real && $v =~ ^[0-9]+$ ]] && ((n <= cc)) && covered=1
  done
  ((covered)) || fail "the build has no code for this GPU (sm_$cc; built for $archs): scripts/gpu_bundle.sh --arch $cc$( ((cc >= 90)) && echo a)"
fi
# ---- the time estimate, before anything runs -------------------------------------------------------
# Times as the first GPU run measured them (docs/GPU_RESULTS.md: an H200 with 16 host cores, 2026-11-28,
# with the 90a bundle): smoke test 5 s, conformance 66 s (93 tests; the production-shape cases' CPU
# references dominate it), training table 63 s, roofline 52 s plus the machine probe's 26 s when no
# ceilings are cached. Another GPU or fewer host cores changes them; the estimates below round them up.
# The LoRA rows of the training table have not run yet: ~30 s each (3.8 B parameters initialised on the host).
est_smoke=5 est_conf=70 est_train=185 est_roofline=80
# The peer step has not run on a GPU yet: ours ~15 s a run (as the training table's 8B rows, with 10
# iterations), PyTorch ~60-80 s a run, torch.compile's first iteration most of it.
est_peer=180 peer_limit=${PEER_LIMIT:-270} peer_ours_limit=60 peer_torch_limit=150
# The kernel table has not run on a GPU yet: ~60 calls of each of 80 kernels (well under a millisecond to a few
# each on an H200), the device state and filling ~2 GB of operands on the host most of it.
est_kernels=60 kernels_limit=${KERNELS_LIMIT:-170}
say "== time estimate (as measured on an H200, 2026-11-28; each step runs under its limit, the whole run under --budget $budget s)"
say "$(printf '  %-34s ~%4d s  (limit 120 s)' 'library smoke test' "$est_smoke")"
[[ -z $only || $only == conformance ]] && say "$(printf '  %-34s ~%4d s  (limit 200 s)' 'conformance (pl_tests Cuda*)' "$est_conf")"
[[ -z $only || $only == training ]] &&
  say "$(printf '  %-34s ~%4d s  (row limits 45 / 60 / 110 / 90 s: tiny / small / 8B 4 layers / LoRA 70B 2 layers)' 'training (16 rows)' "$est_train")"
[[ -z $only || $only == roofline ]] && say "$(printf '  %-34s ~%4d s  (limit 170 s)' 'roofline (2 runs of 2 8B layers)' "$est_roofline")"
((sync)) && [[ -z $only || $only == conformance ]] && say "$(printf '  %-34s ~%4d s  (limit 200 s)' 'conformance again (--sync)' "$est_conf")"
((sanitize)) && say "$(printf '  %-34s ~%4d s  (limit 150 s)' 'compute-sanitizer (--sanitize)' 150)"
[[ $only == kernels ]] && say "$(printf '  %-34s ~%4d s  (limit %d s; not measured yet)' 'kernels (bench_kernels, 8B layers)' "$est_kernels" "$kernels_limit")"
[[ $only == peer ]] && say "$(printf '  %-34s ~%4d s  (limit %d s: ours 2 x %d s, PyTorch 2 x %d s; not measured yet)' 'peer (ours and PyTorch, 8B 4 layers)' "$est_peer" "$peer_limit" "$peer_ours_limit" "$peer_torch_limit")"
say "  two calls: --only conformance ~$((est_smoke + est_conf)) s, --only training ~$((est_smoke + est_train)) s (each under the device tool's 10 minutes)"
say "$lib_set_line"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
for l in "${lib_report[@]}"; do say "  $l"; done
unresolved=$( { ldd "$app"; ldd "$tests"; } 2>&1 | grep -E 'not found' | sort -u)
if [[ -n $unresolved ]]; then
  fail "libraries not resolved: $(tr -s ' \t\n' ' ' <<<"$unresolved")"
  finish
fi
# ---- the library smoke test, before anything else -------------------------------------------------
# pretrain_llama --print-library-versions: the versions, then one ✓/✗ line per check (cuDNN handle, device
# state, a tiny SDPA forward+backward graph, BF16 and native FP8/NVFP4 matmuls), then "loaded <file>: <path>"
# for every NVIDIA library the process mapped (what cuDNN dlopens included, which ldd cannot see).
smoke_log=$logs/smoke.log
timeout -k 5 120 "$app" --print-library-versions >"$smoke_log" 2>&1
smoke_rc=$?
say "== library smoke test: pretrain_llama --print-library-versions (exit status $smoke_rc)"
sed 's/^pretrain_llama | /  /' "$smoke_log" | while IFS= read -r l; do say "$l"; done
grep -q 'devices: none' "$smoke_log" && fail "the CUDA runtime sees no GPU ($(sed -n 's/.*devices: none (\(.*\))/\1/p' "$smoke_log"))"
# The cuDNN and cuBLASLt files the process loaded are the chosen set's (else the set was not honoured:
# RUNPATH, a preloaded library, ...).
# (/proc/self/maps names real files: the set's folders are compared through the files their links name.)
set_real=:
for d in ${chosen//:/ }; do
  for f in "$d"/libcudnn*.so* "$d"/libcublasLt.so*; do [[ -e $f ]] && set_real+="$(dirname "$(readlink -f "$f")"):"; done
done
while IFS= read -r l; do
  f=${l#*: }
  [[ -n $chosen && $set_real != *":$(dirname "$f"):"* ]] && say "  note: $(basename "$f") was loaded from $(dirname "$f"), outside the chosen library set"
done < <(grep -E '^pretrain_llama \| loaded lib(cudnn[a-z_]*|cublasLt)\.so' "$smoke_log")
if ((smoke_rc != 0)); then
  why=$(grep '✗' "$smoke_log" | sed 's/^pretrain_llama | //' | paste -sd ' ')
  ((smoke_rc == 124 || smoke_rc == 137)) && why="did not finish in 120 s. $why"
  ((smoke_rc > 128 && smoke_rc != 137)) && why="crashed (signal $((smoke_rc - 128))): $(tail -n 1 "$smoke_log"). $why"
  fail "library smoke test: ${why:-exit status $smoke_rc: $(tail -n 1 "$smoke_log")}"
  [[ ${GPU_CHECK_PAST_SMOKE:-0} == 1 ]] || finish
  say "  (GPU_CHECK_PAST_SMOKE=1: going on)"
fi
summary+=("library smoke test: $( ((smoke_rc == 0)) && echo passed || echo FAILED) ($(grep -c '✓' "$smoke_log") ✓, $(grep -c '✗' "$smoke_log") ✗, $(grep -c ': skipped: ' "$smoke_log") skipped)")

# pl_tests reads configs from the source tree it was built in: make that path the bundle's configs
# when this machine lacks it (removed at exit).
if [[ -n $bundle ]]; then
  cfg=$(sed -n 's/^test_config_dir: //p' "$bundle/BUILD_INFO")
  if [[ -n $cfg && ! -e $cfg ]]; then
    if mkdir -p "$(dirname "$cfg")" 2>/dev/null && ln -s "$bundle/configs" "$cfg" 2>/dev/null; then made_links+=("$cfg")
    else say "  note: cannot create $cfg -> $bundle/configs: the CudaModel tests will not find their configs"; fi
  fi
fi

# ---- conformance ----------------------------------------------------------------------------------
# conformance NAME LIMIT all|problems [env...]: runs pl_tests --gtest_filter='Cuda*', prints one line
# per test (all), or per test that did not pass or skip (problems), and the totals.
conformance() {
  local name=$1 limit=$2 which=$3; shift 3
  local log=$logs/$name.log t0=$(date +%s) rc
  if ((limit < 20)); then fail "$name: not run (time budget: ${limit} s for it)"; return; fi
  say "== $name: pl_tests --gtest_filter='Cuda*' $* (limit ${limit} s)"
  env "$@" timeout -k 10 "$limit" "$tests" --gtest_filter='Cuda*' --gtest_output="xml:$logs/$name.xml" >"$log" 2>&1
  rc=$?
  # gtest's lines: "[       OK ] Suite.Test (12 ms)", "[  FAILED  ] ...", "[  SKIPPED ] ..."; a test
  # that began ("[ RUN      ]") and has no result line crashed or hit the time limit.
  awk -v rc="$rc" -v which="$which" '
    /: Skipped$/ { grab = 1; next }
    grab { reason = $0; grab = 0 }
    $1 == "[" && $2 == "RUN" { run = $4; reason = ""; next }
    $1 == "[" && ($2 == "OK" || $2 == "FAILED" || $2 == "SKIPPED") && $NF ~ /ms\)$/ {
      n = $4; sub(/,$/, "", n); res = ($2 == "OK") ? "ok" : $2
      if (which == "all" || res == "FAILED")
        printf "  %-72s %s%s\n", n, res, (res == "SKIPPED" && reason != "") ? "  (" substr(reason, 1, 80) ")" : ""
      count[res]++; run = ""; next }
    END {
      if (run != "") { printf "  %-72s %s\n", run, (rc == 124 || rc == 137) ? "TIMEOUT" : "CRASHED (rc " rc ")"; count["CRASHED/TIMEOUT"]++ }
      s = ""; for (k in count) s = s (s == "" ? "" : ", ") count[k] " " k
      printf "  total: %s\n", (s == "" ? "no test ran" : s) }' "$log" | tee -a "$report" >"$logs/$name.table"
  cat "$logs/$name.table"
  summary+=("$name${*:+ ($*)}:$(tail -n 1 "$logs/$name.table" | sed 's/^ *total://')")
  # A test that needs a device skips with "no CUDA device: <why>": on a GPU machine that is a failure.
  local nodev; nodev=$(grep -c '^no CUDA device' "$log")
  if ((rc != 0)); then fail "$name: pl_tests exit status $rc ($(( $(date +%s) - t0 )) s; log $log)"
  elif ((nodev > 0)); then fail "$name: $nodev conformance tests did not run on the GPU: $(grep -m1 '^no CUDA device' "$log")"
  else say "  $name: passed in $(( $(date +%s) - t0 )) s"; fi
}

sanitize_limit=${SANITIZE_LIMIT:-150}
# The roofline step: the first run probes the ceilings (a sweep of GEMM shapes per format and the
# bandwidth of L2 and HBM: estimate 30-60 s), then two short runs of 2 layers of llama3_8b.
roofline_limit=${ROOFLINE_LIMIT:-170}
roofline_pending=0; [[ -z $only || $only == roofline ]] && roofline_pending=1
reserve_extras() {  # seconds the roofline step and the requested --sync / --sanitize passes still need
  local r=0
  ((roofline_pending)) && r=$((r + roofline_limit))
  ((sync)) && [[ -z $only || $only == conformance ]] && r=$((r + ${conf_secs:-120} + 20))
  ((sanitize)) && r=$((r + sanitize_limit))
  echo $r
}
conf_secs=""
if [[ -z $only || $only == conformance ]]; then
  t0=$(date +%s)
  # Keep time for the training table and the requested passes, but never more than half of what is left.
  reserve=$((120 + $(reserve_extras))); (( reserve > $(left) / 2 )) && reserve=$(( $(left) / 2 ))
  conformance conformance "$(step_limit 200 "$reserve")" all
  conf_secs=$(( $(date +%s) - t0 ))
fi

# ---- training table -------------------------------------------------------------------------------
table=""
row=0
train_row() {  # model-label precision limit flags...
  local label=$1 prec=$2 limit=$3; shift 3
  row=$((row + 1))
  local log=$logs/train_$(printf '%02d' $row)_${label//[^a-z0-9_]/_}_${prec}.log note="" rc
  local jsonl=${log%.log}.jsonl
  local -a env_extra=()
  ((row == 1)) && env_extra=(LD_DEBUG=libs "LD_DEBUG_OUTPUT=$logs/ld_debug")  # which files were loaded
  if ((limit < 15)); then
    printf '%-28s %-9s %s\n' "$label" "$prec" "not run (time budget)" >>"$table"; failures+=("$label $prec: not run (time budget)"); status=1; return
  fi
  rm -f "$jsonl"
  env "${env_extra[@]}" timeout -k 10 "$limit" "$app" --device "$train_device" --log-interval 1 --log-jsonl "$jsonl" "${qk_flags[@]}" "$@" >"$log" 2>&1
  rc=$?
  local fmt=$prec; [[ $prec == FP8cs ]] && fmt=FP8
  local mode; mode=$(gemm_mode "$fmt" "$jsonl" 2>/dev/null)
  if ((rc != 0)); then
    note=$( ((rc == 124 || rc == 137)) && echo "TIMEOUT after ${limit} s" || echo "FAILED (rc $rc): $(grep -v '^$' "$log" | tail -n 1 | cut -c1-150)")
    printf '%-28s %-9s %-9s %s\n' "$label" "$prec" "$mode" "$note" >>"$table"; status=1; return
  fi
  # LoRA rows: the memory plan's total beside the measured peak (issue 42: the plan against the GPU).
  local plan=""
  [[ $label == lora* ]] && plan=$(python3 "$reader" "$jsonl" start memory_plan.total_bytes 2>/dev/null |
                                  LC_ALL=C awk '$1 ~ /^[0-9.eE+]+$/ { printf "plan %.3f GB", $1 / 1e9 }')
  # The "end" event, as the summary line words it: mean step time in s (.3f), TFLOP/s (.3f), tokens/s
  # (.0f), final loss (.6E; null: nan), nan iterations; the peak memory in GB (max allocated / 1e9, .3f).
  local e step="" tf="" tok="" loss="" nan="" peak=""
  if e=$(python3 "$reader" "$jsonl" end mean_step_ms tflops tokens_per_s final_lm_loss nan_iterations \
           memory.max_allocated_bytes 2>&1); then
    IFS=$'\t' read -r step tf tok loss nan peak < <(LC_ALL=C awk -F'\t' '
      function num(x) { return x ~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }
      { printf "%s\t%s\t%s\t%s\t%s\t%s\n", num($1) ? sprintf("%.3f", $1 / 1000) : "?", num($2) ? sprintf("%.3f", $2) : "?",
               num($3) ? sprintf("%.0f", $3) : "?", num($4) ? sprintf("%.6E", $4) : ($4 == "" ? "?" : $4),
               $5 == "" ? "?" : $5, num($6) ? sprintf("%.3f", $6 / 1e9) : "?" }' <<<"$e")
    if [[ $nan != 0 || ! $loss =~ ^[0-9.]+E[-+][0-9]+$ ]]; then note="FAILED: final loss $loss, $nan nan iterations"; status=1; fi
  else
    note="FAILED: no end event (${e#jsonl_log.py: })"; status=1
  fi
  printf '%-28s %-9s %-9s %9s %9s %10s %9s %11s  %s\n' "$label" "$prec" "$mode" "$step" "$tf" "$tok" "${peak:-?}" "$loss" \
    "${plan:+$plan${note:+; }}$note" >>"$table"
}
precisions=(BF16 FP8cs MXFP8 NVFP4)
train_device=${GPU_CHECK_TRAIN_DEVICE:-cuda}  # cpu: only to try this script's parsing without a GPU
recipe_flags() {
  case $1 in
    BF16) echo --disable-fp4 ;;
    FP8cs) echo --recipe bf16_with_fp8_current_scaling_mixed ;;
    MXFP8) echo --recipe bf16_with_mxfp8_mixed ;;
    NVFP4) echo --recipe bf16_with_nvfp4_mixed ;;
  esac
}
if [[ -z $only || $only == training ]]; then
  table=$logs/training_table.txt
  printf '%-28s %-9s %-9s %9s %9s %10s %9s %11s  %s\n' model precision GEMMs "step (s)" TFLOP/s tokens/s "peak (GB)" "final loss" note >"$table"
  say "== training ($(( $(left) - $(reserve_extras) )) s of budget left for it)"
  # Rows: model label, per-row limit, iterations, shape. 8 iterations: the summary averages the last
  # 60% (iteration 1 builds cuDNN graphs and picks cuBLASLt algorithms). A 4-layer slice of llama3_8b
  # keeps its embedding and LM head (2 x 525 M parameters), so it is about 5x, not 8x, lighter than
  # the 32 layers: at 13k tokens/s for the whole 8B in BF16, ~65k tokens/s, so 16k tokens per
  # iteration take well under a second each when the path is healthy; the limit leaves room for an
  # emulated or slow path and for the start (initialising 1.9 B parameters). --num-layers-at-end-in-bf16 0:
  # all four layers in the row's format (the playbook's 4 BF16 edge layers would leave one quantized).
  for spec in "llama_tiny|llama_tiny|45|${iters:-10}|--global-batch-size 8 --micro-batch-size 2 --seq-length 128" \
              "llama_small|llama_small|60|${iters:-10}|--global-batch-size 8 --micro-batch-size 2 --seq-length 512" \
              "llama3_8b --num-layers 4|llama3_8b_4l|110|${iters:-8}|--num-layers 4 --num-layers-at-end-in-bf16 0 --global-batch-size 4 --micro-batch-size 1 --seq-length 4096"; do
    IFS='|' read -r label model lim n shape <<<"$spec"
    [[ $model == llama3_8b_4l ]] && model=llama3_8b
    [[ $train_device == cpu && $model != llama_tiny ]] && continue  # a CPU try of the parsing: tiny only
    for p in "${precisions[@]}"; do
      # shellcheck disable=SC2046,SC2086
      train_row "$label" "$p" "$(step_limit "$lim" "$(reserve_extras)")" --model "$model" --train-iters "$n" $shape $(recipe_flags "$p")
    done
  done
  # LoRA rows (issue 42): NeMo's 70B LoRA benchmark shape (dim 16, alpha 32 on linear_qkv, seq 4096, MBS 1,
  # --recompute-granularity full) on a 2-layer slice of llama3_70b over a frozen base in each format, random (init
  # seed) since the bundle carries no weights: tokens/s, and the peak memory beside the plan's total. The slice keeps
  # the 70B embedding and LM head (2 x 1.05 B parameters) and 2 x 0.86 B in its layers, initialised on the host.
  if [[ $train_device == cuda ]]; then
    for p in "${precisions[@]}"; do
      # shellcheck disable=SC2046
      train_row "lora llama3_70b 2l" "$p" "$(step_limit 90 "$(reserve_extras)")" --model llama3_70b --num-layers 2 \
        --num-layers-at-end-in-bf16 0 --peft lora --lora-dim 16 --lora-alpha 32 --lora-target-modules linear_qkv \
        --recompute-granularity full --global-batch-size 4 --micro-batch-size 1 --seq-length 4096 --lr 1e-4 \
        --warmup-iters 1 --train-iters "${iters:-6}" $(recipe_flags "$p")
    done
  fi
  while IFS= read -r l; do say "$l"; done <"$table"
  loaded=$(cat "$logs"/ld_debug.* 2>/dev/null | sed -nE 's/.*calling init: (.*)/\1/p' | sort -u)
  if [[ -n $loaded ]]; then
    say "libraries loaded by the first training run (file -> its real name):"
    while IFS= read -r f; do
      b=$(basename "$f")
      [[ $b =~ $nvidia_re || ( -n $rt && $f == "$rt"/* ) ]] && say "  $f -> $(basename "$(readlink -f "$f")")"
    done <<<"$loaded"
  fi
fi

# ---- roofline ---------------------------------------------------------------------------------------
# roofline_run NAME LIMIT flags...: one --roofline run of the 8B-shaped layers (--num-layers-at-end-in-bf16 0:
# both layers in the recipe's format; the playbook's 4 BF16 end layers would leave none quantized); its
# log and JSON report go to $rf_dir as roofline_NAME.log / .json, its "roofline |" table into the report
# file, and the table's summary lines (step, speed of light, MFU) on the screen too.
roofline_run() {
  local name=$1 limit=$2; shift 2
  local log=$rf_dir/roofline_$name.log json=$rf_dir/roofline_$name.json rc
  if ((limit < 30)); then fail "roofline $name: not run (time budget: ${limit} s for it)"; return; fi
  say "== roofline $name (limit ${limit} s): pretrain_llama $* --roofline $json"
  # shellcheck disable=SC2086
  timeout -k 10 "$limit" "$app" --device "$train_device" $rf_shape --num-layers-at-end-in-bf16 0 --train-iters 6 \
    --log-interval 1 --machine-ceilings "$rf_dir/machine_ceilings.json" --roofline "$json" "${qk_flags[@]}" "$@" >"$log" 2>&1
  rc=$?
  [[ $rf_dir != "$logs" ]] && cp "$log" "$logs/"  # the logs archive holds them too
  grep -E 'roofline \| ' "$log" >>"$report"
  grep -E 'roofline \| (step [0-9]|speed of light|MFU)' "$log" | while IFS= read -r l; do say "  $l"; done
  if ((rc == 124 || rc == 137)); then fail "roofline $name: TIMEOUT after ${limit} s (log $log)"
  elif ((rc != 0)); then fail "roofline $name: FAILED (rc $rc): $(grep -v '^$' "$log" | tail -n 1 | cut -c1-150)"
  elif [[ ! -s $json ]]; then fail "roofline $name: no JSON report written to $json"
  else summary+=("roofline $name: $(sol_of "$json" "$log")"); fi
}
# sol_of JSON LOG: "N% of speed of light" from the --roofline JSON report (its pct_of_sol, else 100 x sol_ms /
# step_ms, as roofline_plot.py reads it), else from the log's "roofline | speed of light" line.
sol_of() {
  python3 - "$1" 2>/dev/null <<'EOF' || grep -m1 -oE '[0-9.]+% of speed of light' "$2" || echo 'no % of speed of light line'
import json, math, sys
with open(sys.argv[1], encoding="utf-8") as fh:
    d = json.load(fh)
p = d.get("pct_of_sol")
if isinstance(p, bool) or not isinstance(p, (int, float)):
    p = 100.0 * d["sol_ms"] / d["step_ms"]
if not math.isfinite(p):
    sys.exit(1)
print(f"{p:.1f}% of speed of light")
EOF
}
if ((roofline_pending)); then
  rf_dir=$logs; [[ -n ${OUT:-} && -d ${OUT:-} ]] && rf_dir=$OUT
  rf_shape="--model llama3_8b --num-layers 2 --seq-length 4096 --micro-batch-size 1 --global-batch-size 2"
  [[ $train_device == cpu ]] && rf_shape="--model llama_tiny --seq-length 128 --micro-batch-size 2 --global-batch-size 4"
  rf_t0=$(date +%s)
  roofline_pending=0
  rf_budget=$(step_limit "$roofline_limit" "$(reserve_extras)")
  # The first run also measures the ceilings (cached in machine_ceilings.json, reused by the second): 60%;
  # 20 s are kept for the plot.
  roofline_run nvfp4 $((rf_budget * 6 / 10)) --recipe bf16_with_nvfp4_mixed
  roofline_run bf16 $((rf_budget - ($(date +%s) - rf_t0) - 20)) --disable-fp4
  plot=$self_dir/roofline_plot.py
  # A python3 that has matplotlib and numpy: Debian's first (scripts/setup.sh installs them there).
  plot_py=""
  for py in /usr/bin/python3 python3; do
    command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib, numpy' >/dev/null 2>&1 && { plot_py=$py; break; }
  done
  if [[ ! -s $rf_dir/roofline_nvfp4.json || ! -s $rf_dir/roofline_bf16.json ]]; then
    say "  roofline plot: skipped (a JSON report is missing)"
  elif [[ ! -f $plot ]]; then
    say "  roofline plot: skipped ($plot is not there; scripts/gpu_bundle.sh copies it)"
  elif [[ -z $plot_py ]]; then
    say "  roofline plot: skipped (python3 has no matplotlib/numpy here; draw it elsewhere: scripts/roofline_plot.py roofline_bf16.json roofline_nvfp4.json --png roofline.png)"
  elif plot_out=$(timeout 20 "$plot_py" "$plot" "$rf_dir/roofline_bf16.json" "$rf_dir/roofline_nvfp4.json" \
                     --png "$rf_dir/roofline.png" 2>&1); then
    say "  roofline plot: $rf_dir/roofline.png"
  else
    fail "roofline plot: $(tail -n 1 <<<"$plot_out")"
  fi
fi

# ---- peer: PyTorch on the same GPU (--only peer) -----------------------------------------------------
# The same layers trained by pretrain_llama and by PyTorch (scripts/bench_torch.py --device cuda): 4 layers of
# llama3_8b, seq 4096, MBS 1, GBS 8, 10 iterations each, tokens/s the mean over the last 60% on both sides
# (pretrain_llama's "end" event in its --log-jsonl log; bench_torch.py's result line). Ours in bf16_mixed
# (--disable-fp4) and bf16_with_fp8_current_scaling_mixed (its first and last decoder layer BF16, as the recipe
# says); PyTorch in bf16_compile and fp8_torchao (torchao's float8, tensorwise, the same edge layers BF16). The
# python: $PEER_PYTHON, else the first of python3, /opt/*/.venv/bin/python3 and /usr/bin/python3 whose torch has
# CUDA, run with the LD_LIBRARY_PATH this script started with (its own wheels' libraries); torchao: the bundle's
# wheel (or a checkout's .cache/wheels/), unpacked into a temporary folder on PYTHONPATH without its optional
# compiled extensions, else the environment's own.
peer_iters=10 peer_table="" peer_tmp=""
# shellcheck source=scripts/torch_peer.sh
[[ -f $self_dir/torch_peer.sh ]] && source "$self_dir/torch_peer.sh"
peer_find_python() {  # sets peer_py, peer_torch (version), peer_cuda
  local py v
  for py in ${PEER_PYTHON:-} python3 /opt/*/.venv/bin/python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    v=$(env -u PYTHONPATH LD_LIBRARY_PATH="$peer_ld" timeout 120 "$py" -c \
          'import torch; print(torch.__version__, torch.version.cuda or "none")' 2>/dev/null | tail -n 1) || continue
    [[ -n $v && ${v##* } != none ]] || continue  # a CPU-only torch (Debian's) is no peer on a GPU
    peer_py=$(command -v "$py") peer_torch=${v% *} peer_cuda=${v##* }
    return 0
  done
  return 1
}
# peer_time_for WANTED LATER: seconds a run may take: WANTED, or less so that LATER seconds stay for the runs after.
peer_time_for() {
  local l=$(( peer_end - $(date +%s) - $2 )) g; g=$(step_limit "$1" "$(reserve_extras)")
  ((l > g)) && l=$g; ((l > $1)) && l=$1; echo $((l < 0 ? 0 : l))
}
peer_ours() {  # PRECISION LIMIT: sets p_tok, p_peak, p_note (pretrain_llama, --log-jsonl)
  local prec=$1 limit=$2 log=$logs/peer_ours_$1.log jsonl=$logs/peer_ours_$1.jsonl rc e tok peak loss nan
  p_tok="" p_peak="" p_note=""
  if ((limit < 20)); then p_note="not run (time budget: ${limit} s)"; return 1; fi
  # shellcheck disable=SC2046
  set -- --model llama3_8b --num-layers 4 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 \
         --train-iters "$peer_iters" $(recipe_flags "$prec")
  say "== peer: pretrain_llama $* (limit $limit s)"
  timeout -k 10 "$limit" "$app" --device "$train_device" --log-interval 1 --log-jsonl "$jsonl" "${qk_flags[@]}" "$@" >"$log" 2>&1
  rc=$?
  if ((rc != 0)); then
    p_note=$( ((rc == 124 || rc == 137)) && echo "TIMEOUT after ${limit} s" || echo "FAILED (rc $rc): $(grep -v '^$' "$log" | tail -n 1 | cut -c1-150)")
    return 1
  fi
  if ! e=$(python3 "$reader" "$jsonl" end tokens_per_s memory.max_allocated_bytes final_lm_loss nan_iterations 2>&1); then
    p_note="FAILED: no end event (${e#jsonl_log.py: })"; return 1
  fi
  IFS=$'\t' read -r tok peak loss nan <<<"$e"
  p_tok=$(LC_ALL=C awk -v x="$tok" 'BEGIN { if (x ~ /^[0-9.eE+-]+$/) printf "%.0f", x }')
  p_peak=$(LC_ALL=C awk -v x="$peak" 'BEGIN { if (x ~ /^[0-9.eE+-]+$/) printf "%.2f", x / 1e9 }')
  [[ $nan == 0 ]] || { p_note="FAILED: $nan nan iterations (final loss $loss)"; return 1; }
  say "  tokens/s ${p_tok:-?}, peak memory ${p_peak:-?} GB, final loss $loss"
  [[ -n $p_tok ]] || { p_note="FAILED: no tokens/s in the end event"; return 1; }
}
peer_pytorch() {  # MODE LIMIT: sets p_tok, p_peak, p_note (bench_torch.py's result lines)
  local mode=$1 limit=$2 log=$logs/peer_torch_$1.log rc
  p_tok="" p_peak="" p_note=""
  if ((limit < 30)); then p_note="not run (time budget: ${limit} s)"; return 1; fi
  set -- --device cuda --mode "$mode" --model llama3_8b --num-layers 4 --seq 4096 --mbs 1 --gbs 8 --iters "$peer_iters"
  say "== peer: $peer_py bench_torch.py $* (limit $limit s)"
  env LD_LIBRARY_PATH="$peer_ld" PYTHONPATH="$peer_pythonpath" timeout -k 10 "$limit" "$peer_py" \
    "$self_dir/bench_torch.py" "$@" >"$log" 2>&1
  rc=$?
  grep -E '^bench_torch: ' "$log" | while IFS= read -r l; do say "  $l"; done
  if ((rc != 0)); then
    p_note=$( ((rc == 124 || rc == 137)) && echo "TIMEOUT after ${limit} s" || echo "FAILED (rc $rc): $(grep -v '^$' "$log" | tail -n 1 | cut -c1-150)")
    return 1
  fi
  p_tok=$(sed -nE "s/^bench_torch: $mode \| .*\| ([0-9]+) tokens\/s.*/\1/p" "$log" | tail -n 1)
  p_peak=$(sed -nE "s/^bench_torch: $mode \| .*\| peak memory ([0-9.]+) GB$/\1/p" "$log" | tail -n 1)
  [[ -n $p_tok ]] || { p_note="FAILED: no tokens/s line in $log"; return 1; }
}
if [[ $only == peer ]]; then
  peer_end=$(( $(date +%s) + peer_limit ))
  peer_table=$logs/peer_table.txt
  say "== peer: ours and PyTorch on this GPU, llama3_8b --num-layers 4, seq 4096, MBS 1, GBS 8, $peer_iters iterations (mean of the last 60%)"
  peer_py="" peer_torch="" peer_cuda="" peer_pythonpath="" peer_ao=""
  if peer_find_python; then
    say "  PyTorch: $peer_py, torch $peer_torch (CUDA $peer_cuda)"
    if [[ -n ${TORCHAO_TORCH:-} && ${peer_torch%%+*} != "$TORCHAO_TORCH" && ${peer_torch%%+*} != "$TORCHAO_TORCH".* ]]; then
      say "  warning: torch $peer_torch is not torch $TORCHAO_TORCH, the release torchao ${TORCHAO_VERSION:-?} (scripts/torch_peer.sh) pairs with: fp8_torchao may fail or differ"
    fi
    wheel=""
    for w in "${bundle:+$bundle/wheels/${TORCHAO_WHEEL:-}}" "$self_dir/../.cache/wheels/${TORCHAO_WHEEL:-}"; do
      [[ -n ${TORCHAO_WHEEL:-} && -n $w && -f $w ]] && { wheel=$w; break; }
    done
    if [[ -n $wheel ]]; then
      peer_tmp=$(mktemp -d "${TMPDIR:-/tmp}/pl_torchao.XXXXXX")
      if "$peer_py" - "$wheel" "$peer_tmp" <<'PYEOF' 2>"$logs/peer_torchao.log"; then peer_pythonpath=$peer_tmp; fi
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:  # torchao's Python files and metadata; no tests, no compiled extension
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.split("/")[0] != "test" and not n.endswith(".so")])
PYEOF
    fi
    peer_ao=$(env LD_LIBRARY_PATH="$peer_ld" PYTHONPATH="$peer_pythonpath" timeout 120 "$peer_py" -c \
                'import torchao, torchao.float8; print(torchao.__version__, torchao.__file__)' 2>>"$logs/peer_torchao.log" | tail -n 1)
    if [[ -n $peer_ao ]]; then say "  torchao ${peer_ao% *} ($( [[ -n $peer_pythonpath ]] && echo "from $wheel" || echo "the environment's own: ${peer_ao#* }"))"
    else say "  torchao: not importable ($( [[ -n $wheel ]] && echo "unpacking $wheel failed: $(tail -n 1 "$logs/peer_torchao.log")" || echo "no wheels/${TORCHAO_WHEEL:-torchao-*.whl} in the bundle: scripts/gpu_bundle.sh carries it")): fp8_torchao not run"; fi
  else
    say "  PyTorch: no python3 with a CUDA torch (\$PEER_PYTHON, python3, /opt/*/.venv/bin/python3, /usr/bin/python3): its runs not run"
  fi
  printf '%-36s %11s %14s %13s  %-13s %11s %14s  %s\n' recipe "ours tok/s" "PyTorch tok/s" "ours/PyTorch" "PyTorch mode" \
    "ours GB" "PyTorch GB" note >"$peer_table"
  declare -A peer_ours_tok=() peer_torch_tok=()
  for pair in "BF16 bf16_mixed bf16_compile" "FP8cs bf16_with_fp8_current_scaling_mixed fp8_torchao"; do
    read -r prec recipe mode <<<"$pair"
    notes=()
    # Time kept for the runs after this one: the other recipe's (ours 20 s, PyTorch 60 s at least).
    [[ $prec == BF16 ]] && later=$((20 + 60 + 60)) || later=60
    peer_ours "$prec" "$(peer_time_for "$peer_ours_limit" "$later")" || { notes+=("ours: $p_note"); fail "peer ours $recipe: $p_note"; }
    o_tok=$p_tok o_peak=$p_peak
    [[ $prec == BF16 ]] && later=$((20 + 60)) || later=0
    if [[ -z $peer_py ]]; then p_tok="" p_peak="" p_note="not run (no CUDA PyTorch)"; fail "peer PyTorch $mode: $p_note"; notes+=("PyTorch: $p_note")
    elif [[ $mode == fp8_torchao && -z $peer_ao ]]; then p_tok="" p_peak="" p_note="not run (no torchao)"; fail "peer PyTorch $mode: $p_note"; notes+=("PyTorch: $p_note")
    else peer_pytorch "$mode" "$(peer_time_for "$peer_torch_limit" "$later")" || { notes+=("PyTorch: $p_note"); fail "peer PyTorch $mode: $p_note"; }
    fi
    t_tok=$p_tok t_peak=$p_peak
    peer_ours_tok[$prec]=$o_tok peer_torch_tok[$prec]=$t_tok
    ratio=$(LC_ALL=C awk -v a="$o_tok" -v b="$t_tok" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }')
    printf '%-36s %11s %14s %13s  %-13s %11s %14s  %s\n' "$recipe" "${o_tok:--}" "${t_tok:--}" "$ratio" "$mode" \
      "${o_peak:--}" "${t_peak:--}" "$(IFS=';'; echo "${notes[*]}")" | sed 's/ *$//' >>"$peer_table"
  done
  fp8_ratio() { LC_ALL=C awk -v a="$2" -v b="$1" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "-" }'; }
  printf '%-36s %11s %14s\n' "FP8 / BF16 (tokens/s)" "$(fp8_ratio "${peer_ours_tok[BF16]}" "${peer_ours_tok[FP8cs]}")" \
    "$(fp8_ratio "${peer_torch_tok[BF16]}" "${peer_torch_tok[FP8cs]}")" >>"$peer_table"
  say "== peer table (ours/PyTorch > 1: ours faster; peak memory in GB = 1e9 bytes)"
  while IFS= read -r l; do say "$l"; done <"$peer_table"
  summary+=("peer: ours/PyTorch $(awk 'NR == 2 || NR == 3 {printf "%s%s %s", (NR == 3 ? ", " : ""), $1, $4}' "$peer_table")")
fi

# ---- kernels: bench_kernels' table (--only kernels) ---------------------------------------------------
# The bundle's bench_kernels on llama3_8b's four linear layers (seq 4096, MBS 1; on the CPU try of the parsing,
# llama_tiny): its table into the report, its JSON to $OUT/kernels.json (else the logs folder). It stops by itself
# at --budget-seconds (20 s inside the limit), printing what it measured: a table cut short is a failure.
if [[ $only == kernels ]]; then
  k_dir=$logs; [[ -n ${OUT:-} && -d ${OUT:-} ]] && k_dir=$OUT
  k_log=$logs/kernels.log k_json=$k_dir/kernels.json
  k_shape="--model llama3_8b --seq-length 4096 --micro-batch-size 1"
  [[ $train_device == cpu ]] && k_shape="--model llama_tiny --seq-length 128 --micro-batch-size 2"
  k_limit=$(step_limit "$kernels_limit")
  if [[ ! -x $kbench ]]; then fail "kernels: $kbench is missing (scripts/gpu_bundle.sh bundles bench_kernels)"
  elif ((k_limit < 40)); then fail "kernels: not run (time budget: ${k_limit} s for it)"
  else
    # --quantize-kernels both: each quantize and expand row of the fast kernels beside the reference one
    # (the kernels before issue 40), so one call measures the change.
    say "== kernels (limit ${k_limit} s): bench_kernels --device $train_device $k_shape --quantize-kernels both --json $k_json"
    # shellcheck disable=SC2086
    timeout -k 10 "$k_limit" "$kbench" --device "$train_device" $k_shape --budget-seconds $((k_limit - 20)) \
      --quantize-kernels both --json "$k_json" >"$k_log" 2>&1
    rc=$?
    while IFS= read -r l; do say "$l"; done <"$k_log"
    if ((rc == 124 || rc == 137)); then fail "kernels: TIMEOUT after ${k_limit} s (log $k_log)"
    elif ((rc != 0)); then fail "kernels: FAILED (rc $rc): $(grep -v '^$' "$k_log" | tail -n 1 | cut -c1-150)"
    elif grep -q 'stopped at --budget-seconds' "$k_log"; then fail "kernels: $(grep -m1 'stopped at --budget-seconds' "$k_log")"
    elif [[ ! -s $k_json ]]; then fail "kernels: no JSON written to $k_json"
    else summary+=("kernels: $(grep -cE '^(quantize|expand) ' "$k_log") kernel rows, $(grep -cE '^(qkv|proj|fc1|fc2) +[0-9]+x[0-9]+x[0-9]+ +(fprop|dgrad|wgrad) ' "$k_log") GEMM rows; JSON $k_json")
    fi
  fi
fi

# ---- optional passes ------------------------------------------------------------------------------
if ((sync)) && [[ -z $only || $only == conformance ]]; then
  conformance conformance_sync "$(step_limit 200 "$( ((sanitize)) && echo "$sanitize_limit" || echo 0)")" problems CUDA_LAUNCH_BLOCKING=1
fi
if ((sanitize)); then
  cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -n 1)
  if [[ -z $cs ]]; then
    say "== sanitize: compute-sanitizer not installed: skipped"
  else
    # The small-shape suites only: compute-sanitizer slows every launch by 10-100x. (Cuda/* are the op
    # cases run on every backend, the quantize/dequantize/quant_stats cases among them; CudaQuantize*
    # covers the quantizers' GPU-only cases and CudaQuantizedGemm; the production shapes are left out;
    # CudaNcclOneRank: the NCCL communicator's streams and events over one rank.)
    filter=${SANITIZE_FILTER:-'Cuda/*:CudaCrossEntropy.*:CudaOptimizer.*:CudaOffload.*:CudaBf16MainGrads.*:CudaLinear.*:CudaQuantize*:CudaConformance.*:CudaNcclOneRank.*-CudaQuantizeProduction.*:CudaQuantizedGemmProduction.*:CudaQuantizedGemmDescription.*'}
    lim=$(step_limit "$sanitize_limit")
    if ((lim < 20)); then fail "sanitize: not run (time budget)"
    else
      say "== sanitize: $cs --tool memcheck, filter $filter (limit $lim s)"
      timeout -k 10 "$lim" "$cs" --tool memcheck --error-exitcode 99 --print-limit 20 "$tests" --gtest_filter="$filter" \
        >"$logs/sanitize.log" 2>&1
      rc=$?
      errs=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$logs/sanitize.log" | tail -n 1)
      summary+=("compute-sanitizer memcheck ($filter): rc $rc, ${errs:-no summary}")
      if ((rc == 0)); then say "  sanitize: clean (${errs:-no summary})"
      elif ((rc == 124 || rc == 137)); then fail "sanitize: did not finish in $lim s (${errs:-no summary yet}; log sanitize.log)"
      else fail "sanitize: exit status $rc, ${errs:-no summary}; first report: $(grep -m1 -E '^========= (Invalid|Program hit|Error)' "$logs/sanitize.log")"; fi
    fi
  fi
fi
finish
