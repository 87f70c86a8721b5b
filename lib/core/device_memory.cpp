// Device allocations behind Buffer. Without the CUDA build a CUDA buffer is a clear error.

#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace pl {

#if defined(PL_WITH_CUDA)
void* cuda_alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t st = cudaMalloc(&p, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMalloc of {} bytes ({:.3f} GB) failed: {}", bytes, bytes / 1e9,
           cudaGetErrorString(st));
  return p;
}
// Runs from destructors, which must not throw: a failure is reported on stderr, one line.
void cuda_free(void* p) {
  const cudaError_t st = cudaFree(p);
  if (st != cudaSuccess) std::fprintf(stderr, "pretrain_llama: warning: cudaFree failed: %s\n", cudaGetErrorString(st));
}
void cuda_zero(void* p, size_t bytes) {
  const cudaError_t st = cudaMemset(p, 0, bytes);
  PL_CHECK(st == cudaSuccess, "cudaMemset of {} bytes failed: {}", bytes, cudaGetErrorString(st));
}
static void cuda_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, const char* what) {
  const cudaError_t st = cudaMemcpy(dst, src, bytes, kind);
  PL_CHECK(st == cudaSuccess, "{} of {} bytes failed: {}", what, bytes, cudaGetErrorString(st));
}
#else
void* cuda_alloc(size_t bytes) {
  fail("cannot allocate {} bytes on the GPU: this build has no CUDA support (reconfigure with nvcc present)", bytes);
}
void cuda_free(void*) {}
void cuda_zero(void*, size_t) {}
#endif

int cuda_device_count(std::string* why) {
#if defined(PL_WITH_CUDA)
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorString(st);
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount returned 0 devices";
  return n;
#else
  if (why) *why = "this build has no CUDA support";
  return 0;
#endif
}

void copy_from_host(const Tensor& dst, const void* src) {
  if (dst.device == Device::CPU) {
    std::memcpy(dst.data, src, dst.bytes());
    return;
  }
#if defined(PL_WITH_CUDA)
  cuda_copy(dst.data, src, dst.bytes(), cudaMemcpyHostToDevice, "copy to device");
#else
  fail("copy to a CUDA tensor {} in a build without CUDA", dst.shape_str());
#endif
}

void copy_to_host(void* dst, const Tensor& src) {
  if (src.device == Device::CPU) {
    std::memcpy(dst, src.data, src.bytes());
    return;
  }
#if defined(PL_WITH_CUDA)
  cuda_copy(dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, "copy to host");
#else
  fail("copy from a CUDA tensor {} in a build without CUDA", src.shape_str());
#endif
}

}  // namespace pl
