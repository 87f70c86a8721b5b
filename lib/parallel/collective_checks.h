#pragma once
// What every Communicator checks before a collective (parallel/communicator.h's contract), in one place so
// the one-rank, MPI and NCCL implementations reject the same calls with the same words.
#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace pl::parallel {

// buf is F32 or BF16 on `device` (BF16 only on the GPU: the CPU backend stores bf16 values as F32).
void check_buffer(const char* op, const Tensor& buf, Device device, int rank);
// The slice length k of a [size * k] buffer (reduce_scatter_sum, all_gather); an error when buf's
// element count is not a multiple of size.
int64_t slice_elements(const char* op, const Tensor& buf, int size, int rank);
void check_root(const char* op, int root, int size, int rank);
// "[1024] f32, 4096 bytes" for error messages.
std::string describe_buffer(const Tensor& buf);

}  // namespace pl::parallel
