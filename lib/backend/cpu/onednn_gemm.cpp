// The CPU BF16 GEMM engine over oneDNN's matmul (see onednn_gemm.h for the contract and the decisions).
#include "backend/cpu/onednn_gemm.h"

#include <omp.h>

#include <map>
#include <mutex>
#include <tuple>

#include "core/error.h"
#include "numerics/bf16.h"

#if PL_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace pl::cpu {
namespace {

GemmEngineOverride g_override = GemmEngineOverride::Auto;

constexpr const char* kFp32Description = "FP32 BLAS, BF16 operands emulated";

#if PL_WITH_ONEDNN
using dnnl::memory;
using DataType = memory::data_type;

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

bool isa_has_bf16_dot(dnnl::cpu_isa isa) {
  return isa == dnnl::cpu_isa::avx512_core_bf16 || isa == dnnl::cpu_isa::avx512_core_amx;
}

// A native BF16 matmul by its implementation name: oneDNN's brgemm kernels for the BF16 ISAs. The
// reference ("ref:any"), the FP32-emulating gemm ("gemm:jit" on bf16 data converts to FP32) and brgemm on
// an ISA without BF16 instructions are not.
bool native_bf16_impl(const std::string& impl) {
  return impl.rfind("brg:", 0) == 0 &&
         (impl.find("bf16") != std::string::npos || impl.find("amx") != std::string::npos);
}

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& thread_stream() {
  static thread_local dnnl::stream s(cpu_engine());
  return s;
}

memory::desc md_of(const MatLayout& l, DataType t) { return memory::desc({l.rows, l.cols}, t, {l.row_stride, l.col_stride}); }

// A primitive is created for one (shapes, layouts, output stride, accumulate, thread count, nested or not).
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int,
                       bool>;
struct Entry {
  dnnl::matmul prim;
  memory::desc a, b, c, scratch;
  bool native = false;
};

Key key_of(const MatLayout& la, const MatLayout& lb, int64_t ldc, bool accumulate) {
  return {la.rows, la.cols, la.row_stride, la.col_stride, lb.rows, lb.cols, lb.row_stride, lb.col_stride, ldc,
          accumulate, omp_get_max_threads(), omp_in_parallel() != 0};
}

// The matmul for these operands: a sum post-op when accumulating, a user scratchpad. No output scales: in
// oneDNN 2.6 a runtime output scale (alpha changes every step for the quantized GEMMs, so it cannot be a
// constant of the primitive) turns the BF16 brgemm into "gemm:jit", which converts to FP32; alpha is applied
// by scale_into below instead.
Entry make_entry(const char* op, const MatLayout& la, const MatLayout& lb, int64_t ldc, bool accumulate) {
  Entry e;
  e.a = md_of(la, DataType::bf16);
  e.b = md_of(lb, DataType::bf16);
  e.c = memory::desc({la.rows, lb.cols}, DataType::f32, {ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(e.a, e.b, e.c), attr, cpu_engine());
    e.native = native_bf16_impl(pd.impl_info_str());
    e.scratch = pd.scratchpad_desc();
    e.prim = dnnl::matmul(pd);
  } catch (const dnnl::error& err) {
    fail("{}: oneDNN matmul [{},{}]x[{},{}] (strides a {},{} b {},{}, ldc {}{}): {} (status {})", op, la.rows,
         la.cols, lb.rows, lb.cols, la.row_stride, la.col_stride, lb.row_stride, lb.col_stride, ldc,
         accumulate ? ", accumulate" : "", err.what(), static_cast<int>(err.status));
  }
  return e;
}

// The cached primitive for these operands (created at the first call; the map is shared by the threads of
// the attention's parallel loops, hence the lock; entries are never erased, so references stay valid).
const Entry& entry_for(const char* op, const MatLayout& la, const MatLayout& lb, int64_t ldc, bool accumulate) {
  static std::mutex mu;
  static std::map<Key, Entry> cache;
  const Key k = key_of(la, lb, ldc, accumulate);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(k);
  if (it == cache.end()) it = cache.emplace(k, make_entry(op, la, lb, ldc, accumulate)).first;
  return it->second;
}

void execute(const char* op, const Entry& e, const uint16_t* a, const uint16_t* b, float* c) {
  static thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < e.scratch.get_size()) scratch.resize(e.scratch.get_size());
  dnnl::engine& eng = cpu_engine();
  try {
    e.prim.execute(thread_stream(), {{DNNL_ARG_SRC, memory(e.a, eng, const_cast<uint16_t*>(a))},
                                     {DNNL_ARG_WEIGHTS, memory(e.b, eng, const_cast<uint16_t*>(b))},
                                     {DNNL_ARG_DST, memory(e.c, eng, c)},
                                     {DNNL_ARG_SCRATCHPAD, memory(e.scratch, eng, scratch.data())}});
    thread_stream().wait();
  } catch (const dnnl::error& err) {
    fail("{}: oneDNN matmul execution failed: {} (status {})", op, err.what(), static_cast<int>(err.status));
  }
}

// dst[i,j] = alpha · src[i,j] (+ dst[i,j] when add): cuBLASLt's alpha on the FP32 product, FP32 arithmetic.
void scale_into(float* dst, int64_t ldd, const float* src, int64_t lds, int64_t rows, int64_t cols, float alpha,
                bool add) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ldd;
    const float* s = src + r * lds;
    if (add)
      for (int64_t k = 0; k < cols; ++k) d[k] += alpha * s[k];
    else
      for (int64_t k = 0; k < cols; ++k) d[k] = alpha * s[k];
  }
}

CpuGemmEngine decide_engine() {
  CpuGemmEngine e;
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  e.isa = isa_name(isa);
  if (g_override == GemmEngineOverride::Fp32Blas) {
    e.description = std::string(kFp32Description) + " (forced by a test)";
    return e;
  }
  if (g_override == GemmEngineOverride::OneDnnAnyImpl) {
    e.onednn_bf16 = true;
    e.description = "oneDNN bf16, any implementation (" + e.isa + "; forced by a test)";
    return e;
  }
  // The probe shape: an LM-head-like GEMM; a CPU whose brgemm serves it serves every shape the model has
  // (each shape is still checked by name when its primitive is created).
  const MatLayout a = row_major(64, 256, 256), b = transposed(512, 256, 256);
  e.onednn_bf16 = isa_has_bf16_dot(isa) && make_entry("cpu GEMM engine probe", a, b, 512, false).native;
  e.description = e.onednn_bf16 ? "oneDNN bf16 (" + e.isa + ")"
                                : std::string(kFp32Description) + " (oneDNN ISA " + e.isa + " has no BF16 dot product)";
  return e;
}
#else
CpuGemmEngine decide_engine() {
  CpuGemmEngine e;
  e.description = std::string(kFp32Description) + " (built without oneDNN)";
  return e;
}
#endif

CpuGemmEngine& engine_state() {
  static CpuGemmEngine e = decide_engine();
  return e;
}

}  // namespace

const CpuGemmEngine& cpu_gemm_engine() { return engine_state(); }

std::string onednn_version() {
#if PL_WITH_ONEDNN
  const dnnl_version_t* v = dnnl_version();
  return std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) + " (" + v->hash +
         ")";
#else
  return "";
#endif
}

bool onednn_bf16_matmul_exists() {
#if PL_WITH_ONEDNN
  static const bool exists = [] {
    try {
      make_entry("oneDNN BF16 matmul probe", row_major(16, 32, 32), transposed(8, 32, 32), 8, false);
      return true;
    } catch (const Error&) {  // make_entry's one line for oneDNN's "unimplemented"
      return false;
    }
  }();
  return exists;
#else
  return false;
#endif
}

void set_gemm_engine_override_for_testing(GemmEngineOverride o) {
  g_override = o;
  engine_state() = decide_engine();
}

bool onednn_bf16_matmul(const char* op, const uint16_t* a, const MatLayout& la, const uint16_t* b,
                        const MatLayout& lb, float* c, int64_t ldc, float alpha, bool accumulate,
                        bool require_native) {
#if PL_WITH_ONEDNN
  if (!engine_state().onednn_bf16) return false;
  PL_CHECK(la.cols == lb.rows, "{}: oneDNN matmul inner dimensions differ: A [{},{}] x B [{},{}]", op, la.rows,
           la.cols, lb.rows, lb.cols);
  const bool scaled_sum = accumulate && alpha != 1.0f;  // c += alpha · (A·B): through a temporary
  const Entry& e = entry_for(op, la, lb, scaled_sum ? lb.cols : ldc, accumulate && !scaled_sum);
  if (!e.native && require_native && g_override != GemmEngineOverride::OneDnnAnyImpl) return false;
  if (!scaled_sum) {
    execute(op, e, a, b, c);
    if (alpha != 1.0f) scale_into(c, ldc, c, lb.cols, la.rows, lb.cols, alpha, false);
    return true;
  }
  static thread_local std::vector<float> product;
  product.resize(static_cast<size_t>(la.rows * lb.cols));
  execute(op, e, a, b, product.data());
  scale_into(c, ldc, product.data(), lb.cols, la.rows, lb.cols, alpha, true);
  return true;
#else
  (void)op, (void)a, (void)la, (void)b, (void)lb, (void)c, (void)ldc, (void)alpha, (void)accumulate,
      (void)require_native;
  return false;
#endif
}

// The row loop vectorizes (num::float_to_bf16_bits is branch-free; with its former early return for NaN this
// ran at 16 GB/s against 42 on the development machine).
void to_bf16_rows(uint16_t* dst, const float* src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel())
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict s = src + r * ld;
    uint16_t* __restrict d = dst + r * cols;
    for (int64_t k = 0; k < cols; ++k) d[k] = num::float_to_bf16_bits(s[k]);
  }
}

}  // namespace pl::cpu
