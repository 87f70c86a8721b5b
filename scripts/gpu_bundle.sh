#!/usr/bin/env bash
# Builds pretrain_llama for one GPU architecture and assembles a self-contained folder (default
# .device/, git-ignored) that runs on a machine with only a CUDA 13 driver and NVIDIA's libraries
# (cudart, cuBLASLt, cuDNN, NVRTC, NCCL: as the CUDA toolkit or the nvidia-* Python wheels), no
# package registry and none of this project's Debian packages. Then carry the folder there and run
# `.device/scripts/gpu_check.sh` (or `scripts/gpu_check.sh` in a checkout that holds .device/): a first
# GPU run makes two calls, `--only conformance` then `--only training`; `--only peer` times PyTorch beside it.
#
#   scripts/gpu_bundle.sh [--arch LIST] [--build-dir DIR] [--out DIR] [--no-build] [--max-mib N] [-j N]
#
#   --arch LIST      CMAKE_CUDA_ARCHITECTURES of the build (default 90a, Hopper: H100/H200; also
#                    $PL_BUNDLE_ARCH). One architecture keeps the bundle small; e.g. 100a for B200,
#                    103a for B300, "90a;100a" for both.
#   --build-dir DIR  build directory (default build-device; configured here unless --no-build)
#   --no-build       assemble from DIR as it is (it must hold apps/pretrain_llama and tests/pl_tests)
#   --out DIR        the bundle (default .device); emptied first
#   --max-mib N      fail when the bundle is N MiB or more (default 48: what the device tool carries
#                    beside the working tree)
#
# Layout: bin/ (stripped apps and pl_tests), lib/ (every shared library they load per `ldd` except
# NVIDIA's and glibc's), lib/compat/ (libstdc++ and libgcc_s, used by gpu_check.sh only when the
# machine's are older than the build's), configs/, scripts/gpu_check.sh, gpu_8b_fit.sh, roofline_plot.py (gpu_check.sh
# draws its roofline figure with it) and jsonl_log.py (gpu_check.sh and gpu_8b_fit.sh read their runs'
# --log-jsonl logs with it), bench_torch.py with bench_torch_model.py and torch_peer.sh (the PyTorch peer of
# gpu_check.sh --only peer), wheels/ (torchao's py3-none-any wheel, the release scripts/torch_peer.sh pins, 1.2 MB:
# taken from .cache/wheels/, where scripts/setup.sh downloads it, or downloaded here with pip; without network
# the bundle is made without it, saying so, and --only peer skips its FP8 run), BUILD_INFO. Files over 1 MiB
# in bin/ and lib/ are stored gzip-compressed (NAME.gz: Debian's OpenBLAS alone is 36 MiB, 11 MiB compressed);
# gpu_check.sh unpacks bin/ and lib/ into a temporary folder (`gpu_check.sh --unpack DIR` keeps one,
# with DIR/env.sh). The binaries keep their build RUNPATH (RUNPATH, not RPATH: LD_LIBRARY_PATH comes
# first), so gpu_check.sh resolves the bundle's libraries through LD_LIBRARY_PATH.
# Exit status: 0 done; 1 build or assembly failed; 2 bad arguments; 3 bundle too large.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="/usr/local/cuda/bin:${PATH}"

arch=${PL_BUNDLE_ARCH:-90a}
build="build-device"
out=.device
do_build=1
max_mib=48
jobs=$(nproc)
die() { echo "gpu_bundle: $*" >&2; exit 1; }
while (($#)); do
  case $1 in
    --arch) arch=${2:?}; shift 2 ;;
    --build-dir) build=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --max-mib) max_mib=${2:?}; shift 2 ;;
    -j) jobs=${2:?}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "gpu_bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# The programs a GPU run uses (gpu_check.sh, gpu_8b_fit.sh) and the two small data tools. Each program that runs
# ops links the whole static library with its device code (a full build: ~20 MB each, 5+ MB gzipped), so
# quantize_tensor, convert_checkpoint and generate stay out: with them a bundle of every CUDA architecture
# (CI's) would pass the 48 MiB the device tool carries.
apps=(pretrain_llama bench_kernels inspect_data preprocess_data)
if ((do_build)); then
  command -v nvcc >/dev/null || die "nvcc not found (PATH or /usr/local/cuda/bin): the bundle needs the CUDA backend"
  echo "gpu_bundle: configuring $build (Release, CUDA architectures $arch)"
  mkdir -p "$build"
  # -DPL_ONEDNN=OFF: libdnnl (39 MB, 11 MB gzipped) would take a quarter of the 48 MiB the device tool carries;
  # the bundle's CPU backend (the conformance tests' reference) runs its BF16 GEMMs on FP32 OpenBLAS instead,
  # the same products summed in another order.
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPL_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DPL_ONEDNN=OFF \
    >"$build/gpu_bundle.configure.log" 2>&1 || die "configure failed, see $build/gpu_bundle.configure.log"
  grep -q '✓ cudnn-frontend' "$build/gpu_bundle.configure.log" ||
    die "the build has no cudnn-frontend headers, so it could not train on a GPU (run scripts/setup.sh first)"
  echo "gpu_bundle: building (log: $build/gpu_bundle.build.log)"
  cmake --build "$build" -j "$jobs" --target pl_tests "${apps[@]}" >"$build/gpu_bundle.build.log" 2>&1 ||
    die "build failed, see $build/gpu_bundle.build.log"
fi
[[ -x $build/apps/pretrain_llama && -x $build/tests/pl_tests ]] ||
  die "$build has no apps/pretrain_llama or tests/pl_tests"
grep -q 'PL_WITH_CUDA' "$build/build.ninja" 2>/dev/null || grep -q '^PL_HAVE_CUDA:INTERNAL=ON' "$build/CMakeCache.txt" ||
  die "$build was built without the CUDA backend"

# The bundle is rebuilt from scratch; refuse to empty anything that is not a bundle (or empty).
if [[ -e $out ]]; then
  [[ -d $out ]] || die "--out $out exists and is not a directory"
  if [[ -n $(ls -A "$out") && ! -f $out/BUILD_INFO ]]; then die "--out $out is neither empty nor a bundle"; fi
  rm -rf "$out"
fi
mkdir -p "$out/bin" "$out/lib/compat" "$out/scripts"

for a in "${apps[@]}"; do
  if [[ -x $build/apps/$a ]]; then strip --strip-unneeded -o "$out/bin/$a" "$build/apps/$a"; fi
done
strip --strip-unneeded -o "$out/bin/pl_tests" "$build/tests/pl_tests"
cp -r configs "$out/configs"
cp scripts/gpu_check.sh scripts/gpu_8b_fit.sh scripts/roofline_plot.py scripts/atomic_output.py scripts/jsonl_log.py \
  scripts/script_errors.py scripts/bench_torch.py scripts/bench_torch_model.py scripts/torch_peer.sh "$out/scripts/"
# torchao for the PyTorch peer (gpu_check.sh --only peer): the GPU machine has PyTorch but no registry.
# shellcheck source=scripts/torch_peer.sh
source scripts/torch_peer.sh
mkdir -p "$out/wheels"
if wheel=$(torchao_fetch .cache/wheels 2>&1); then
  cp "$wheel" "$out/wheels/"
  torchao_info="wheels/$TORCHAO_WHEEL (torchao $TORCHAO_VERSION, paired with torch $TORCHAO_TORCH)"
else
  echo "gpu_bundle: warning: the bundle has no torchao ($wheel); gpu_check.sh --only peer will skip its fp8_torchao run" >&2
  torchao_info="none ($wheel)"
fi

# Libraries: NVIDIA's come from the machine (driver, toolkit or wheels), glibc's from the system;
# everything else ldd names is copied. The NVIDIA pattern is shared with gpu_check.sh and the test.
nvidia_re='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z_-]*|libnvJitLink|libnvidia-[a-z-]+|libcufft|libcurand|libcusolver|libcusparse|libcupti|libnvToolsExt)\.so'
glibc_re='^(linux-vdso|linux-gate|ld-linux[a-z0-9_-]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec)\.so'
compat_re='^(libstdc\+\+|libgcc_s)\.so'
missing=()
while read -r name path; do
  if [[ $name =~ $nvidia_re || $name =~ $glibc_re ]]; then continue; fi
  [[ $path == /* && -f $path ]] || { missing+=("$name"); continue; }
  dest="$out/lib"
  if [[ $name =~ $compat_re ]]; then dest="$out/lib/compat"; fi
  if [[ ! -e $dest/$name ]]; then cp -L "$path" "$dest/$name"; fi
done < <(for b in "$out"/bin/*; do ldd "$b" 2>/dev/null; done | awk '$2 == "=>" {print $1, $3}' | sort -u)
((${#missing[@]} == 0)) || die "ldd could not resolve here: ${missing[*]}"
# The copies keep their symbols for nothing: strip them too (Debian's are already stripped).
for f in "$out"/lib/*.so* "$out"/lib/compat/*.so*; do strip --strip-unneeded "$f" 2>/dev/null || true; done
unpacked_bytes=$(du -sb "$out" | cut -f1)
# Large files compressed (gzip: every Linux has it; -n: no name or time stamp, the same bytes each time).
# Several at once. Level 6 (gzip's default), not 9: on CI's six-architecture build -9 took 34 s and -6 10 s for
# a bundle 1.3% larger (53.3 against 54.0 MiB; 2-core Xeon, 2026-12-02), and ctest's GpuBundle tests make three.
find "$out/bin" "$out/lib" -type f -size +1024k -print0 | xargs -0 -r -n 1 -P "$jobs" gzip -6 -n

archs=$(grep '^CMAKE_CUDA_ARCHITECTURES:' "$build/CMakeCache.txt" | cut -d= -f2)
src=$(grep '^CMAKE_HOME_DIRECTORY:' "$build/CMakeCache.txt" | cut -d= -f2)
{
  echo "commit: $(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "bundled: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "cuda_architectures: $archs"
  echo "cuda_toolkit: $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  # pl_tests reads configs from the source tree it was built in (PL_CONFIG_DIR); gpu_check.sh makes
  # that path point at the bundle's configs when the machine lacks it.
  echo "test_config_dir: $src/configs"
  echo "libraries: $(cd "$out/lib" && find . -name '*.so*' | sed 's|^\./||' | sort | tr '\n' ' ')"
  echo "torchao: $torchao_info"
} >"$out/BUILD_INFO"

bytes=$(du -sb "$out" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
echo "gpu_bundle: $out: $mib MiB (CUDA architectures $archs): bin/ $(du -sh "$out/bin" | cut -f1), lib/ $(du -sh "$out/lib" | cut -f1), wheels/ $(du -sh "$out/wheels" | cut -f1); $(awk -v b="$unpacked_bytes" 'BEGIN {printf "%.1f", b / 1048576}') MiB unpacked"
if ((bytes >= max_mib * 1048576)); then
  echo "gpu_bundle: $out is $mib MiB, not under the $max_mib MiB limit" >&2
  exit 3
fi
# A first GPU run is two calls, each inside the device tool's 10 minutes (gpu_check.sh prints its estimate).
carry=""; [[ $out != /* ]] && carry=" (the device tool: carry [\"$out\"])"
echo "gpu_bundle: on the GPU machine run: bash $out/scripts/gpu_check.sh --only conformance, then bash $out/scripts/gpu_check.sh --only training$carry; PyTorch beside it: --only peer"
