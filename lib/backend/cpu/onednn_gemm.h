#pragma once
// The CPU backend's BF16 GEMM engine: oneDNN's matmul (Debian libdnnl-dev, 2.6) with BF16 operands, FP32
// accumulation and FP32 output — the contract of the GPU's cuBLASLt BF16 GEMM — where this CPU has BF16
// dot-product instructions; FP32 OpenBLAS SGEMM on the same BF16 values elsewhere (and in builds without
// oneDNN: -DPL_ONEDNN=OFF).
//
// Decided once per process: oneDNN's effective ISA must be avx512_core_bf16 or better, and every shape's
// primitive must be a native BF16 implementation by its name ("brg:avx512_core_bf16", "brg:avx512_core_amx",
// ...): oneDNN also creates reference and emulated BF16 matmuls, slower than SGEMM, so that creation succeeds
// proves nothing. A shape whose primitive is not native runs on SGEMM (onednn_bf16_matmul returns false).
//
// Primitives are created once per (shape, layouts, accumulate, threads) and cached; they use a user-managed
// scratchpad in a per-thread buffer that only grows, so steady-state calls neither create primitives nor
// allocate. Thread count: oneDNN 2.6's brgemm matmul splits M and N over threads, never K, for every shape
// the tests try (tests/ops/test_linear.cpp checks 1, 2 and 3 threads bit for bit); oneDNN does not promise
// it, so README says "bit-reproducible for a given thread count". Called inside an OpenMP parallel region
// (the attention's tiles), a primitive runs on the calling thread alone.
#include <cstdint>
#include <string>
#include <vector>

namespace pl::cpu {

// Element (i, j) of a logical [rows, cols] matrix lives at data[i * row_stride + j * col_stride].
struct MatLayout {
  int64_t rows, cols, row_stride, col_stride;
};
inline MatLayout row_major(int64_t rows, int64_t cols, int64_t ld) { return {rows, cols, ld, 1}; }
// The transpose of a row-major [rows, cols] storage (ld its row stride): a logical [cols, rows] matrix.
inline MatLayout transposed(int64_t rows, int64_t cols, int64_t ld) { return {cols, rows, 1, ld}; }

struct CpuGemmEngine {
  bool onednn_bf16 = false;  // BF16 GEMMs through oneDNN (else FP32 BLAS on BF16 values)
  std::string isa;           // oneDNN's effective ISA ("avx512_core_bf16"); "" without oneDNN
  std::string description;   // the banner's words: "oneDNN bf16 (avx512_core_bf16)" or "FP32 BLAS, BF16 operands emulated"
};
// The engine of this process (decided at the first call; the test override below re-decides).
const CpuGemmEngine& cpu_gemm_engine();
// "2.6.3 (<git hash>)" as the loaded oneDNN reports itself; "" in a build without oneDNN.
std::string onednn_version();
// Whether oneDNN creates a BF16 matmul on this CPU at all, with any implementation: oneDNN 2.6 has none, not
// even its reference kernels, below avx512_core (an AVX2-only CPU answers "could not create a primitive
// descriptor iterator", status unimplemented). False in a build without oneDNN. Probed once.
bool onednn_bf16_matmul_exists();

// A test-only switch (never read from the environment): Auto decides as above; Fp32Blas forces the fallback;
// OneDnnAnyImpl runs oneDNN whatever implementation it picks (its reference kernels on an AVX-512 CPU without
// BF16 instructions: slow, exact contract), so such CI machines still test the oneDNN path; where
// onednn_bf16_matmul_exists() is false (AVX2 only) there is no oneDNN path to test.
enum class GemmEngineOverride { Auto, Fp32Blas, OneDnnAnyImpl };
void set_gemm_engine_override_for_testing(GemmEngineOverride o);

// c[M,N] (row stride ldc) = alpha · A[M,K] · B[K,N] (+ c when accumulate), A and B BF16 bits laid out by
// la and lb, products exact, FP32 accumulation. Returns false, touching nothing, when the engine is not
// oneDNN or no native BF16 matmul serves this shape (the caller then runs its FP32 path); with
// require_native = false a non-native shape runs on whatever implementation oneDNN picked (correct, slower:
// for callers whose operands exist only in BF16, the attention's tiles). Errors name the op, the shapes and
// oneDNN's status.
bool onednn_bf16_matmul(const char* op, const uint16_t* a, const MatLayout& la, const uint16_t* b,
                        const MatLayout& lb, float* c, int64_t ldc, float alpha, bool accumulate,
                        bool require_native = true);

// dst[r * cols + k] = BF16 bits of src[r * ld + k] (round to nearest even: exact for BF16 values), rows
// threaded unless called inside a parallel region.
void to_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld);

// A per-thread buffer of at least n BF16 elements that only grows (Tag: 0 and 1 the operands of one GEMM,
// 2 and up the attention's tiles).
template <int Tag>
uint16_t* thread_bf16_scratch(size_t n) {
  static thread_local std::vector<uint16_t> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

}  // namespace pl::cpu
