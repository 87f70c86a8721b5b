#!/usr/bin/env bash
# Installs the build dependencies from Debian packages (idempotent; needs root or sudo).
# The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is not installed here: the CUDA backend is built
# when nvcc is found on PATH or under /usr/local/cuda.
set -euo pipefail
packages=(cmake ninja-build g++ libcli11-dev nlohmann-json3-dev libspdlog-dev libfmt-dev libgtest-dev
          libopenblas-openmp-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all packages present (${packages[*]})"
  exit 0
fi
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
