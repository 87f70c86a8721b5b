#!/usr/bin/env bash
# Installs the build dependencies from Debian packages (idempotent; needs root or sudo).
# The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is not installed here: the CUDA backend is built
# when nvcc is found on PATH or under /usr/local/cuda.
# When nvcc is present, also the cudnn-frontend C++ headers (CUDA attention) from the PyPI wheel
# nvidia-cudnn-frontend; without network this step only warns, and the CUDA attention ops then fail
# at run time saying so. And cuobjdump + nvdisasm (the wheels nvidia-cuda-cuobjdump and
# nvidia-cuda-nvdisasm; CUDA toolkits installed without them are common) for scripts/check_no_fp64.sh,
# which CI runs after the build; without them that check says so and is skipped.
# And torchao's wheel, downloaded into .cache/wheels/ for the GPU bundle (scripts/torch_peer.sh pins it).
set -euo pipefail

have_nvcc() { command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; }

# pip_install LABEL WHY_IF_MISSING PKG==VER...: installs the pinned wheels that are not installed at that
# version. --no-deps: only the files are used, not the Python packages' dependencies; --only-binary:
# never build an sdist. A Debian system python refuses plain pip installs (PEP 668): then the user's
# site-packages. Without python3/pip or network it only warns with WHY_IF_MISSING.
pip_install() {
  local label=$1 why=$2 spec need=() have
  shift 2
  local py
  py=${PIP_PYTHON:-$(command -v python3 || true)}  # PIP_PYTHON: another python3 than PATH's (see the tensorboard line)
  if [[ -z "$py" ]] || ! "$py" -m pip --version >/dev/null 2>&1; then
    echo "setup: WARNING: no python3 with pip; $label not installed ($why)"
    return 0
  fi
  for spec in "$@"; do
    have=$("$py" -m pip show "${spec%%==*}" 2>/dev/null | sed -n 's/^Version: //p' || true)
    [[ "$have" == "${spec##*==}" ]] || need+=("$spec")
  done
  if ((${#need[@]} == 0)); then
    echo "setup: $label present (pip: $*)"
    return 0
  fi
  local args=(install --quiet --no-deps --only-binary=:all: "${need[@]}")
  echo "setup: installing ${need[*]} (pip)"
  if "$py" -m pip "${args[@]}" 2>/dev/null ||
     PIP_BREAK_SYSTEM_PACKAGES=1 "$py" -m pip "${args[@]}" --user; then
    echo "setup: $label installed"
  else
    echo "setup: WARNING: could not install $label (no network?); $why"
  fi
}

# ---- cudnn-frontend headers (header-only; CMake finds <site-packages>/include/cudnn_frontend.h) ----
# Pinned: backend/cuda/attention.cpp was compiled against this version.
CUDNN_FRONTEND_VERSION=1.32.0
install_cudnn_frontend() {
  if ! have_nvcc; then
    echo "setup: no nvcc, skipping cudnn-frontend (only the CUDA backend uses it)"
    return 0
  fi
  pip_install cudnn-frontend "CUDA attention fails at run time until it is installed and cmake is re-run, or pass \
-DCUDNN_FRONTEND_INCLUDE_DIR=<dir with cudnn_frontend.h> to cmake" "nvidia-cudnn-frontend==$CUDNN_FRONTEND_VERSION"
}

# ---- cuobjdump / nvdisasm (scripts/check_no_fp64.sh disassembles the device code) ----
# Pinned to the version checked here (13.5 reads CUDA 13.0 binaries); the tools land in
# <site-packages>/nvidia/cu13/bin, where the check script looks for them.
CUDA_BINUTILS_VERSION=13.5.37
install_cuda_binutils() {
  if ! have_nvcc; then
    echo "setup: no nvcc, skipping cuobjdump/nvdisasm (only the FP64 check of the device code uses them)"
    return 0
  fi
  if command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1; then
    echo "setup: cuobjdump and nvdisasm present"
    return 0
  fi
  pip_install cuobjdump/nvdisasm "scripts/check_no_fp64.sh will be skipped" \
    "nvidia-cuda-cuobjdump==$CUDA_BINUTILS_VERSION" "nvidia-cuda-nvdisasm==$CUDA_BINUTILS_VERSION"
}

# libdnnl-dev: oneDNN, the CPU backend's BF16 GEMMs (the build falls back to FP32 OpenBLAS without it).
# openmpi-bin + libopenmpi-dev: multi-rank runs (mpirun; lib/parallel/) and their tests (ctest Dist.*);
# the build works without them, single-rank. iproute2: `ip netns` for the two-hosts test (ctest
# Dist.two_hosts; it skips saying why where namespaces cannot be made).
packages=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libgtest-dev
          libopenblas-openmp-dev libdnnl-dev libpcre2-dev pkg-config python3 python3-numpy python3-matplotlib
          openmpi-bin libopenmpi-dev iproute2
          clang libclang-rt-14-dev  # scripts/fuzz.sh: clang++ -fsanitize=fuzzer (libFuzzer is in libclang-rt-14-dev)
          fortunes)  # fortunes: the text of scripts/nvfp4_study.sh's corpus (/usr/share/games/fortunes)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all packages present (${packages[*]})"
else
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
install_cudnn_frontend
install_cuda_binutils
# lizard (with its two dependencies, pinned): the function lengths scripts/check_code_limits.sh measures.
pip_install lizard "scripts/check_code_limits.sh (run by CI) cannot run" \
  "lizard==1.24.3" "pathspec==1.1.1" "pygments==2.20.0"
# tensorboard with the two modules its event-file reader imports (numpy is Debian's python3-numpy), pinned:
# ctest TensorBoard.events reads pretrain_llama's --tensorboard-dir files with TensorBoard's own reader.
# (--no-deps: enough for the reader; the `tensorboard --logdir` web server wants a plain `pip install tensorboard`.)
# For the python3 the tests run (tests/CMakeLists.txt: Debian's /usr/bin/python3 first, else PATH's).
PIP_PYTHON=$([[ -x /usr/bin/python3 ]] && echo /usr/bin/python3 || command -v python3 || true) \
  pip_install tensorboard "ctest TensorBoard.events fails until it is installed" \
  "tensorboard==2.20.0" "protobuf==6.33.6" "absl-py==2.3.1"
# torchao's wheel (pinned in scripts/torch_peer.sh) into .cache/wheels/ (git-ignored): scripts/gpu_bundle.sh carries
# it to the GPU machine, which has PyTorch but no registry, for bench_torch.py's fp8_torchao peer. Only a download
# (no install here: the CPU has no use for it); without network it only warns.
# shellcheck source=scripts/torch_peer.sh
source "$(dirname "$0")/torch_peer.sh"
if wheel=$(torchao_fetch "$(cd "$(dirname "$0")/.." && pwd)/.cache/wheels" 2>&1); then
  echo "setup: torchao wheel present ($wheel)"
else
  echo "setup: WARNING: could not download $TORCHAO_WHEEL ($wheel); scripts/gpu_bundle.sh tries again, else the \
bundle has no torchao and gpu_check.sh --only peer skips its fp8_torchao run"
fi
echo "setup: done"
