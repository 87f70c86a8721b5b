#pragma once
// Shared helpers of the op tests (tests/ops/): host tensors that own their storage, seeded random
// inputs, comparisons against double-precision references, BF16 checks, central finite
// differences, and the error-message check; the GPU cases of each op file (Cuda*) use the device
// helpers of cuda/cuda_test_util.h. Everything here is test-only.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/onednn_gemm.h"
#include "backend/ops.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "cuda/cuda_test_util.h"
#include "numerics/bf16.h"

namespace pl {
// How gtest (and ctest's test names) show the backend a parameterized case runs on.
inline void PrintTo(Device d, std::ostream* os) { *os << (d == Device::CUDA ? "cuda" : "cpu"); }
}  // namespace pl

namespace pl::optest {

using namespace ::pl::test;  // the device side of the Cuda* cases

inline Tensor make_view(void* data, const std::vector<int64_t>& dims, DType dtype) {
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.device = Device::CPU;
  t.ndim = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) t.shape[i] = dims[i];
  return t;
}

// An f32 CPU tensor owning its storage.
struct HostF32 {
  std::vector<int64_t> dims;
  std::vector<float> v;
  HostF32() = default;
  explicit HostF32(std::vector<int64_t> d, float fill = 0.0f) : dims(std::move(d)) {
    int64_t n = 1;
    for (int64_t s : dims) n *= s;
    v.assign(static_cast<size_t>(n), fill);
  }
  Tensor t() { return make_view(v.data(), dims, DType::F32); }
  size_t size() const { return v.size(); }
  float& operator[](size_t i) { return v[i]; }
  float operator[](size_t i) const { return v[i]; }
  std::vector<double> d() const { return std::vector<double>(v.begin(), v.end()); }
};

// An i32 CPU tensor owning its storage.
struct HostI32 {
  std::vector<int64_t> dims;
  std::vector<int32_t> v;
  explicit HostI32(std::vector<int64_t> d, int32_t fill = 0) : dims(std::move(d)) {
    int64_t n = 1;
    for (int64_t s : dims) n *= s;
    v.assign(static_cast<size_t>(n), fill);
  }
  Tensor t() { return make_view(v.data(), dims, DType::I32); }
};

inline OpContext cpu_ctx(bool round_bf16) {
  OpContext ctx;
  ctx.device = Device::CPU;
  ctx.round_bf16 = round_bf16;
  return ctx;
}

// Uniform values in [lo, hi); bf16 = true rounds each to a BF16-representable value (what a BF16
// tensor would hold), as the model's inputs are when ctx.round_bf16.
inline HostF32 random_f32(std::vector<int64_t> dims, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f,
                          bool bf16 = false) {
  HostF32 h(std::move(dims));
  std::uniform_real_distribution<float> dist(lo, hi);
  for (float& x : h.v) x = bf16 ? num::round_bf16(dist(rng)) : dist(rng);
  return h;
}

inline HostI32 random_i32(std::vector<int64_t> dims, std::mt19937& rng, int32_t lo, int32_t hi_exclusive) {
  HostI32 h(std::move(dims));
  std::uniform_int_distribution<int32_t> dist(lo, hi_exclusive - 1);
  for (int32_t& x : h.v) x = dist(rng);
  return h;
}

// The amax the quantizer's own pass computes from x (CPU, FP8 E4M3 current scaling, rowwise copy): what an
// op's out_amax (op_list.h) must equal.
inline float quantizer_amax(HostF32& x) {
  std::vector<Buffer> owner;
  const int64_t rows = x.dims[0], cols = static_cast<int64_t>(x.size()) / rows;
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::FP8_E4M3, rows, cols, true, false);
  quantize(cpu_ctx(true), q, make_view(x.v.data(), {rows, cols}, DType::F32),
           {.format = QuantFormat::FP8_E4M3, .rowwise = true, .columnwise = false});
  return q.rowwise.amax.f32()[0];
}

inline double max_abs(const std::vector<double>& r) {
  double m = 0.0;
  for (double x : r) m = std::max(m, std::abs(x));
  return m;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Norm-wise closeness: max_i |a_i - ref_i| <= rtol * max_i |ref_i| (plus a tiny floor for an
// all-zero reference). Reports the worst element.
template <class A>
void expect_close(const A& actual, const std::vector<double>& ref, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), ref.size()) << what;
  const double scale = std::max(max_abs(ref), 1e-30);
  double worst = -1.0;
  size_t wi = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::abs(static_cast<double>(actual[i]) - ref[i]);
    if (!(e <= worst)) {  // also catches NaN
      worst = e;
      wi = i;
      if (std::isnan(e)) break;
    }
  }
  EXPECT_LE(worst, rtol * scale) << what << ": worst element " << wi << " is " << actual[wi] << ", reference "
                                 << ref[wi] << " (max |ref| " << scale << ", rel err " << worst / scale
                                 << ")";
}

// Every element is exactly a BF16 value (round_bf16 leaves it unchanged).
inline void expect_bf16_representable(const std::vector<float>& a, const std::string& what) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (num::float_bits(num::round_bf16(a[i])) != num::float_bits(a[i])) {
      ADD_FAILURE() << what << ": element " << i << " = " << a[i] << " is not BF16-representable";
      return;
    }
  }
}

// BF16-level agreement: each element within rel * |ref| + abs_frac * max|ref| of the reference. The
// default rel (2^-7) covers the output rounding (<= 2^-9 relative) and fp32 math on bf16 inputs.
inline void expect_bf16_close(const std::vector<float>& a, const std::vector<double>& ref,
                              const std::string& what, double rel = 1.0 / 128, double abs_frac = 1e-4) {
  ASSERT_EQ(a.size(), ref.size()) << what;
  const double scale = max_abs(ref);
  for (size_t i = 0; i < a.size(); ++i) {
    const double tol = rel * std::abs(ref[i]) + abs_frac * scale;
    if (!(std::abs(a[i] - ref[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " = " << a[i] << ", reference " << ref[i] << " (tol "
                    << tol << ")";
      return;
    }
  }
}

// Central finite differences of a double function: grad_i = (f(x + h e_i) - f(x - h e_i)) / 2h.
inline std::vector<double> finite_diff(const std::function<double(const std::vector<double>&)>& f,
                                       std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2.0 * h);
  }
  return g;
}

// Runs fn; expects a pl::Error whose message contains `op`.
template <class Fn>
void expect_error_naming(const std::string& op, Fn&& fn) {
  try {
    fn();
    ADD_FAILURE() << "expected a pl::Error naming " << op;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(op), std::string::npos) << "message does not name " << op << ": " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
  }
}

using cpu::GemmEngineOverride;

// Forces one CPU GEMM engine (backend/cpu/onednn_gemm.h) for a scope, restoring the automatic choice after.
class EngineScope {
 public:
  explicit EngineScope(GemmEngineOverride o) { cpu::set_gemm_engine_override_for_testing(o); }
  ~EngineScope() { cpu::set_gemm_engine_override_for_testing(GemmEngineOverride::Auto); }
  EngineScope(const EngineScope&) = delete;
  EngineScope& operator=(const EngineScope&) = delete;
};

// Sets the OpenMP thread count for a scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_;
};

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (num::float_bits(a[i]) != num::float_bits(b[i])) return false;
  return true;
}

// ---- one case on every backend --------------------------------------------------------------------
// A suite derived from OnBackend runs each TEST_P once per backend (PL_INSTANTIATE_BACKENDS):
// Cpu/<Suite>.<Case>/0 always, Cuda/<Suite>.<Case>/0 on a GPU (skipped with the reason without one).
// A case makes its inputs once as host vectors, runs the op on a Backend and checks what it checks
// on every backend; on the GPU it also runs the same function on the CPU backend and compares (the
// conformance claim: bit-exact, or within the bound the case states).
class Backend {
 public:
  explicit Backend(Device d) : device_(d) {}
  bool cuda() const { return device_ == Device::CUDA; }
  OpContext ctx(bool round_bf16 = true) const {
    OpContext c = cuda() ? cuda_ctx() : cpu_ctx(round_bf16);
    c.round_bf16 = round_bf16;
    return c;
  }
  // A tensor of this backend holding v: the CPU views v itself (outputs land in it), the GPU gets a
  // device copy of dtype `dt` (BF16 rounds RNE, as the model's BF16 tensors), owned by the Backend
  // (until v is put again).
  Tensor put(std::vector<float>& v, std::initializer_list<int64_t> shape, DType dt) {
    if (!cuda()) return host_view(v, shape);
    return dev_.insert_or_assign(v.data(), to_device(v, shape, dt)).first->second.t;
  }
  Tensor put(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
    if (!cuda()) return Tensor(v.data(), shape, DType::I32, Device::CPU);
    return dev_.insert_or_assign(v.data(), to_device_i32(v, shape)).first->second.t;
  }
  // The values of the tensor put(v) made, now.
  std::vector<float> get(const std::vector<float>& v) const {
    return cuda() ? to_host_floats(dev_.at(v.data()).t) : v;
  }
  std::vector<int32_t> get(const std::vector<int32_t>& v) const {
    if (!cuda()) return v;
    std::vector<int32_t> out(v.size());
    copy_to_host(out.data(), dev_.at(v.data()).t);
    return out;
  }

 private:
  Device device_;
  std::map<const void*, DeviceTensor> dev_;
};

class OnBackend : public ::testing::TestWithParam<Device> {
 protected:
  void SetUp() override {
    if (GetParam() == Device::CUDA) PL_REQUIRE_CUDA_DEVICE();
  }
  bool on_cuda() const { return GetParam() == Device::CUDA; }
};
#define PL_INSTANTIATE_BACKENDS(Suite)                                                   \
  INSTANTIATE_TEST_SUITE_P(Cpu, Suite, ::testing::Values(::pl::Device::CPU));           \
  INSTANTIATE_TEST_SUITE_P(Cuda, Suite, ::testing::Values(::pl::Device::CUDA))

// The concatenation of result vectors (a case that checks several outputs returns them as one).
inline std::vector<float> joined(std::initializer_list<std::vector<float>> parts) {
  std::vector<float> r;
  for (const std::vector<float>& p : parts) r.insert(r.end(), p.begin(), p.end());
  return r;
}

// f(backend) -> result vector, on this test's backend; on the GPU, check(gpu result, the CPU backend's
// result for the same inputs) too.
template <class F, class Check>
std::vector<float> run_checked(Device d, F&& f, Check&& check) {
  Backend b(d);
  std::vector<float> got = f(b);
  if (b.cuda()) {
    Backend cpu(Device::CPU);
    check(got, f(cpu));
  }
  return got;
}
// The exact ops: bit-identical to the CPU backend.
template <class F>
std::vector<float> run_exact(Device d, F&& f, const std::string& what) {
  return run_checked(d, f, [&](const auto& gpu, const auto& cpu) { expect_bits_equal(gpu, cpu, what + " (gpu vs cpu)"); });
}
// Within expect_close_to_cpu's bound of the CPU backend (rel, abs, max_frac as there).
template <class F>
std::vector<float> run_close(Device d, F&& f, double rel, double abs, double max_frac, const std::string& what) {
  return run_checked(d, f, [&](const auto& gpu, const auto& cpu) {
    expect_close_to_cpu(gpu, cpu, rel, abs, max_frac, what + " (gpu vs cpu)");
  });
}

}  // namespace pl::optest
