#pragma once
// The library smoke test behind `pretrain_llama --print-library-versions` (pl::library_smoke_test,
// backend/device_info.h), which scripts/gpu_check.sh runs before anything else: on the current GPU it
// opens a cuDNN handle and the device state, builds and runs a tiny cuDNN SDPA forward+backward graph on
// the packed QKV layout training uses, and runs a tiny cuBLASLt BF16 matmul and, where the GPU has them
// natively, an FP8 and an NVFP4 one, each against a host reference. A first GPU run learns in seconds
// whether the libraries it loaded work together, before the conformance suite and the training table.
// It catches a library that does not load, a refused graph, a wrong layout or garbage; precision is the
// conformance suite's job. Plain C++ (CUDA builds only).
#include <string>
#include <vector>

namespace pl::cuda {

struct SmokeCheck {
  enum class Result { Passed, Failed, Skipped };
  Result result = Result::Failed;
  std::string text;  // what was checked and what came of it (failures: the library's status string)
};

// The checks in order. Without a usable device: one Failed check saying why, and nothing else.
std::vector<SmokeCheck> library_smoke_checks();

// The NVIDIA libraries this process has mapped (/proc/self/maps: the files the loader actually chose,
// including what cuDNN and the runtime dlopen, which `ldd` cannot see), one "name: path" per library.
std::vector<std::string> loaded_nvidia_libraries();

}  // namespace pl::cuda
