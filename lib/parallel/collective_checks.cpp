#include "parallel/collective_checks.h"

#include "core/error.h"

namespace pl::parallel {

std::string describe_buffer(const Tensor& buf) {
  return buf.shape_str() + ", " + std::to_string(buf.bytes()) + " bytes";
}

void check_buffer(const char* op, const Tensor& buf, Device device, int rank) {
  PL_CHECK(buf.device == device, "{} on rank {}: buffer {} is on the {}, the communicator on the {}", op, rank,
           describe_buffer(buf), device_name(buf.device), device_name(device));
  PL_CHECK(buf.dtype == DType::F32 || (buf.dtype == DType::BF16 && device == Device::CUDA),
           "{} on rank {}: buffer {} has dtype {}; collectives take F32{} buffers", op, rank, describe_buffer(buf),
           dtype_name(buf.dtype),
           device == Device::CPU ? " on the CPU (its backend stores bf16 values as F32; BF16 is for the GPU)"
                                 : " or BF16");
  PL_CHECK(buf.numel() == 0 || buf.data != nullptr, "{} on rank {}: buffer {} has no data", op, rank,
           describe_buffer(buf));
}

int64_t slice_elements(const char* op, const Tensor& buf, int size, int rank) {
  PL_CHECK(buf.numel() % size == 0, "{} on rank {}: buffer {} has {} elements, not a multiple of the {} ranks", op,
           rank, describe_buffer(buf), buf.numel(), size);
  return buf.numel() / size;
}

void check_root(const char* op, int root, int size, int rank) {
  PL_CHECK(root >= 0 && root < size, "{} on rank {}: root {} is not a rank of {}", op, rank, root, size);
}

}  // namespace pl::parallel
