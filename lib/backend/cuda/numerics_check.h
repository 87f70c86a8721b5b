#pragma once
// Device launches of the shared numerics, for the GPU conformance tests. All pointers are device
// pointers; each call synchronizes and throws with the kernel name and the CUDA error string.
#include <cstdint>

#include "numerics/adamw.h"

namespace pl::cuda {

void bf16_round_on_device(const float* in, uint16_t* bits, float* rounded, int64_t n);
void adamw_on_device(float* master, float* m, float* v, const float* grad, int64_t n,
                     const num::AdamWHyper& h);

}  // namespace pl::cuda
