# shellcheck shell=bash disable=SC2034
# The PyTorch peer's one pin (sourced by scripts/setup.sh, gpu_bundle.sh and gpu_check.sh; bench_torch.py
# reads the two assignments): the torchao release whose float8 training scripts/bench_torch.py's fp8_torchao
# runs, and the torch release it pairs with.
# The GPU machine's PyTorch (/opt/torch/.venv, docs/GPU_RESULTS.md: CUDA runtime 13.0, cuBLASLt 13.1.0,
# cuDNN 9.19.0, NCCL 2.28.9) is torch 2.11.0: its wheel requires cuda-toolkit 13.0.2 (cuBLAS 13.1.0),
# nvidia-cudnn-cu13 9.19.0.56 and nvidia-nccl-cu13 2.28.9; 2.10 shipped cuDNN 9.15 and NCCL 2.27, 2.12 cuDNN 9.20
# and NCCL 2.29.7. torchao 0.17.0 is the release built against torch 2.11.0 (torchao's compatibility table;
# its Python API also runs on 2.10 and 2.9). Its py3-none-any wheel (1.2 MB) has no compiled extension:
# float8 training is Python over torch._scaled_mm.
TORCHAO_VERSION=0.17.0
TORCHAO_TORCH=2.11
TORCHAO_WHEEL=torchao-$TORCHAO_VERSION-py3-none-any.whl

# torchao_fetch DIR: DIR/$TORCHAO_WHEEL, downloaded with pip when it is not there yet (PyPI, --no-deps, the
# py3-none-any wheel only). Prints the wheel's path; returns 1 (pip's last line on stderr) when it cannot.
torchao_fetch() {
  local dir=$1 py out
  [[ -f $dir/$TORCHAO_WHEEL ]] && { echo "$dir/$TORCHAO_WHEEL"; return 0; }
  py=$(command -v python3 || true)
  if [[ -z $py ]] || ! "$py" -m pip --version >/dev/null 2>&1; then echo "no python3 with pip" >&2; return 1; fi
  mkdir -p "$dir" || return 1
  if ! out=$("$py" -m pip download --quiet --no-deps --only-binary=:all: --platform any --implementation py \
               --abi none --dest "$dir" "torchao==$TORCHAO_VERSION" 2>&1) || [[ ! -f $dir/$TORCHAO_WHEEL ]]; then
    echo "pip download torchao==$TORCHAO_VERSION: $(grep -v '^$' <<<"$out" | tail -n 1)" >&2
    return 1
  fi
  echo "$dir/$TORCHAO_WHEEL"
}
