// Device allocations behind Buffer. Without the CUDA build a CUDA buffer is a clear error.

#include "core/error.h"

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
void cuda_free(void* p) { cudaFree(p); }
#else
void* cuda_alloc(size_t bytes) {
  fail("cannot allocate {} bytes on the GPU: this build has no CUDA support (reconfigure with nvcc present)", bytes);
}
void cuda_free(void*) {}
#endif

}  // namespace pl
