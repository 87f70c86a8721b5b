// The library smoke test (smoke.h): each check runs through the public op API on tiny shapes, against a
// host reference, and reports one line; a failure carries the library's own status string (every call
// below is checked: cuda_check.h, the ops' checks).
#include "backend/cuda/smoke.h"

#include <cudnn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "backend/cuda/attention_graph.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_state.h"
#include "backend/ops.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "core/tensor.h"
#include "numerics/bf16.h"

namespace pl::cuda {
namespace {

using Result = SmokeCheck::Result;

// Deterministic values in [-scale, scale), rounded to BF16 (a fixed LCG: the same numbers everywhere).
std::vector<float> bf16_values(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 12345u;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = num::round_bf16(scale * (static_cast<float>(s >> 8) / 8388608.0f - 1.0f));
  }
  return v;
}

struct DeviceArray {
  Buffer buf;
  Tensor t;
};

DeviceArray device_array(std::initializer_list<int64_t> dims, DType dtype) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  DeviceArray a;
  a.buf = Buffer(static_cast<size_t>(n) * dtype_size(dtype), Device::CUDA);
  a.t = a.buf.as(dims, dtype);
  return a;
}

DeviceArray upload_bf16(const std::vector<float>& v, std::initializer_list<int64_t> dims) {
  DeviceArray a = device_array(dims, DType::BF16);
  std::vector<uint16_t> bits(v.size());
  std::transform(v.begin(), v.end(), bits.begin(), [](float x) { return num::float_to_bf16_bits(x); });
  copy_from_host(a.t, bits.data());
  return a;
}

std::vector<float> download(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::F32) {
    copy_to_host(v.data(), t);
    return v;
  }
  std::vector<uint16_t> bits(v.size());
  copy_to_host(bits.data(), t);
  std::transform(bits.begin(), bits.end(), v.begin(), [](uint16_t b) { return num::bf16_bits_to_float(b); });
  return v;
}

// max |got - want| / max |want|: near 0 when right, near 1 or NaN for garbage or a wrong layout.
double relative_max_error(const std::vector<float>& got, const std::vector<float>& want) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale > 0.0 ? err / scale : err;
}

// y[M,N] = a[M,K]·b[N,K]ᵀ on the GPU against the host's double sum, per element within 2^-7·Σ|a·b|
// (BF16 output rounding is 2^-9 of |y| <= Σ|a·b|; FP32 accumulation over K = 128 far less). Returns the
// largest error as a fraction of that bound; throws past it.
double check_gemm_against_host(const std::vector<float>& y, const std::vector<float>& a, const std::vector<float>& b,
                               int64_t M, int64_t N, int64_t K, const std::string& what) {
  double worst = 0.0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a[i * K + k]) * b[j * K + k];
        ref += p;
        mag += std::fabs(p);
      }
      const double bound = std::ldexp(mag, -7) + 1e-6, e = std::fabs(y[i * N + j] - ref);
      PL_CHECK(e <= bound, "{}: y[{}, {}] = {} but the host computes {} (error {:.3g} > bound {:.3g})", what, i, j,
               y[i * N + j], ref, e, bound);
      worst = std::max(worst, e / bound);
    }
  return worst;
}

constexpr int64_t kM = 64, kN = 96, kK = 128;  // the quantized GEMMs' 16/32-element rules hold

std::string bf16_matmul(const OpContext& ctx) {
  const std::vector<float> x = bf16_values(kM * kK, 1.0f, 1), w = bf16_values(kN * kK, 0.5f, 2);
  DeviceArray dx = upload_bf16(x, {kM, kK}), dw = upload_bf16(w, {kN, kK}), y = device_array({kM, kN}, DType::BF16);
  linear_forward(ctx, y.t, dx.t, dw.t);
  const double worst = check_gemm_against_host(download(y.t), x, w, kM, kN, kK, "BF16 matmul");
  return fmt::format("cuBLASLt BF16 matmul {}x{}x{} matches the host (largest error {:.2f} of the bound)", kM, kN, kK,
                     worst);
}

// A quantized matmul of the format on the GPU: both operands quantized there (one copy each), the GEMM,
// then the product checked against the host's sum over the dequantized operands (dequantize op).
std::string quantized_matmul(const OpContext& ctx, QuantFormat f) {
  const std::vector<float> x = bf16_values(kM * kK, 1.0f, 3), w = bf16_values(kN * kK, 0.5f, 4);
  DeviceArray dx = upload_bf16(x, {kM, kK}), dw = upload_bf16(w, {kN, kK}), y = device_array({kM, kN}, DType::BF16);
  std::vector<Buffer> owner;
  QuantizedTensor qx = allocate_quantized(owner, Device::CUDA, f, kM, kK, true, false);
  QuantizedTensor qw = allocate_quantized(owner, Device::CUDA, f, kN, kK, true, false);
  QuantizeOptions o;
  o.format = f;
  quantize(ctx, qx, dx.t, o);
  quantize(ctx, qw, dw.t, o);
  DeviceArray sa = device_array({kM * kK}, DType::BF16), sb = device_array({kN * kK}, DType::BF16);
  quantized_gemm(ctx, y.t, qx.rowwise, qw.rowwise, f, false, sa.t, sb.t);
  DeviceArray xd = device_array({kM, kK}, DType::F32), wd = device_array({kN, kK}, DType::F32);
  dequantize(ctx, xd.t, qx.rowwise, f);
  dequantize(ctx, wd.t, qw.rowwise, f);
  const double worst =
      check_gemm_against_host(download(y.t), download(xd.t), download(wd.t), kM, kN, kK, quant_format_name(f));
  return fmt::format("cuBLASLt {} matmul {}x{}x{} (native) matches the host on the dequantized operands (largest "
                     "error {:.2f} of the bound)",
                     quant_format_name(f), kM, kN, kK, worst);
}

// Attention on the packed QKV rows, forward and backward, on the GPU (graphs built by attention_prepare
// first, as the app does: strided views of the rows, or packed copies where cuDNN refuses those; the line
// names which) and on the CPU backend.
std::string sdpa(DeviceState& state, const OpContext& ctx) {
  const AttentionShape s{1, 64, 2, 1, 64};
  const int64_t T = s.batch * s.seq, W = (s.q_heads + 2 * s.kv_heads) * s.head_dim, O = s.q_heads * s.head_dim;
  const AttentionPlan plan = attention_prepare(state, s);
  std::vector<float> qkv = bf16_values(static_cast<size_t>(T * W), 1.0f, 5);
  std::vector<float> gout = bf16_values(static_cast<size_t>(T * O), 1.0f, 6);
  std::vector<float> out(static_cast<size_t>(T * O)), lse(static_cast<size_t>(s.batch * s.q_heads * s.seq));
  std::vector<float> dqkv(qkv.size());
  const OpContext cpu{};
  attention_forward(cpu, Tensor(out.data(), {T, O}, DType::F32), Tensor(lse.data(), {s.batch, s.q_heads, s.seq}, DType::F32),
                    Tensor(qkv.data(), {T, W}, DType::F32), s);
  attention_backward(cpu, Tensor(dqkv.data(), {T, W}, DType::F32), Tensor(gout.data(), {T, O}, DType::F32),
                     Tensor(out.data(), {T, O}, DType::F32),
                     Tensor(lse.data(), {s.batch, s.q_heads, s.seq}, DType::F32), Tensor(qkv.data(), {T, W}, DType::F32),
                     s);
  DeviceArray d_qkv = upload_bf16(qkv, {T, W}), d_gout = upload_bf16(gout, {T, O});
  DeviceArray d_out = device_array({T, O}, DType::BF16), d_lse = device_array({s.batch, s.q_heads, s.seq}, DType::F32);
  DeviceArray d_dqkv = device_array({T, W}, DType::BF16);
  attention_forward(ctx, d_out.t, d_lse.t, d_qkv.t, s);
  attention_backward(ctx, d_dqkv.t, d_gout.t, d_out.t, d_lse.t, d_qkv.t, s);
  // BF16 operands and BF16 probabilities in cuDNN's P·V: errors of a few 2^-8 of the largest value.
  const double e_out = relative_max_error(download(d_out.t), out), e_dqkv = relative_max_error(download(d_dqkv.t), dqkv);
  const std::string shape = fmt::format("B={} S={} nq={} nkv={} d={}, causal", s.batch, s.seq, s.q_heads, s.kv_heads,
                                        s.head_dim);
  PL_CHECK(e_out <= 0.05 && e_dqkv <= 0.05,
           "cuDNN SDPA ({}): the GPU differs from the CPU backend by {:.3g} (forward out) and {:.3g} (backward dqkv) "
           "of the largest value; a working graph stays under 0.05",
           shape, e_out, e_dqkv);
  return fmt::format("cuDNN SDPA forward+backward graphs built and run ({}; on {} / {}): forward {:.4f}, backward "
                     "{:.4f} of the largest value from the CPU backend; backward algorithm {}, workspaces {:.2f} / "
                     "{:.2f} MiB",
                     shape, attention_layout_name(plan.forward_layout), attention_layout_name(plan.backward_layout),
                     e_out, e_dqkv, plan.deterministic_backward ? "deterministic" : "non-deterministic",
                     static_cast<double>(plan.forward_workspace) / 1048576.0,
                     static_cast<double>(plan.backward_workspace) / 1048576.0);
}

// Runs one check: its line, or the exception's one line (the op, its shapes, the library's status string).
// The device is synchronized inside, so an asynchronous fault is reported by the check that caused it.
SmokeCheck run_check(const std::string& name, const std::function<std::string()>& body) {
  try {
    std::string text = body();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", "after the smoke check '" + name + "'");
    return {Result::Passed, std::move(text)};
  } catch (const std::exception& e) {
    return {Result::Failed, name + ": " + e.what()};
  }
}

std::string open_cudnn_handle() {
  cudnnHandle_t h = nullptr;
  check(cudnnCreate(&h), "cudnnCreate", "the smoke test's handle");
  check(cudnnDestroy(h), "cudnnDestroy", "the smoke test's handle");
  const size_t v = cudnnGetVersion();
  return fmt::format("cuDNN handle opened (cuDNN {}.{}.{})", v / 10000, v / 100 % 100, v % 100);
}

// The quantized format's check, or why it is skipped on this GPU.
SmokeCheck quantized_check(const OpContext& ctx, QuantFormat f, const char* label, int native_from) {
  if (!gemm_native(*ctx.gpu, f))
    return {Result::Skipped, fmt::format("{} matmul: skipped: not native on sm_{} (native from sm_{}; the emulated "
                                         "path runs the BF16 matmul above)",
                                         label, ctx.gpu->sm, native_from)};
  return run_check(std::string(label) + " matmul", [&] { return quantized_matmul(ctx, f); });
}

}  // namespace

std::vector<SmokeCheck> library_smoke_checks() {
  std::string why;
  if (cuda_device_count(&why) == 0) return {{Result::Failed, "no CUDA device (" + why + "): the smoke test did not run"}};
  std::vector<SmokeCheck> checks{run_check("cuDNN handle", open_cudnn_handle)};
  DeviceStateHandle state;
  checks.push_back(run_check("device state", [&] {
    state = open_device_state(Device::CUDA);
    return fmt::format("device state opened on GPU {} ({}, sm_{}, {} SMs): this build has code for it; cuBLASLt "
                       "handle, {} MiB workspace",
                       state->device, state->name, state->sm, state->num_sms, state->workspace_bytes >> 20);
  }));
  if (!state) return checks;
  OpContext ctx;
  ctx.device = Device::CUDA;
  ctx.gpu = state.get();
  checks.push_back(run_check("cuDNN SDPA", [&] { return sdpa(*state, ctx); }));
  checks.push_back(run_check("BF16 matmul", [&] { return bf16_matmul(ctx); }));
  // Native from (backend/quantize.h quantized_gemm_native): FP8 on sm_89+, NVFP4 on sm_100/103.
  checks.push_back(quantized_check(ctx, QuantFormat::FP8_E4M3, "FP8 (E4M3)", 89));
  checks.push_back(quantized_check(ctx, QuantFormat::NVFP4, "NVFP4", 100));
  return checks;
}

std::vector<std::string> loaded_nvidia_libraries() {
  static const std::regex kName(
      R"(^lib(cuda|cudart|cublas|cublasLt|cudnn[a-z_]*|nccl|nvrtc[a-z_-]*|nvrtc-builtins|nvJitLink)\.so[.0-9]*$)");
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> paths, lines;
  for (std::string line; std::getline(maps, line);) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    const std::string name = path.substr(path.rfind('/') + 1);
    if (std::regex_match(name, kName) && std::find(paths.begin(), paths.end(), path) == paths.end())
      paths.push_back(path);
  }
  std::sort(paths.begin(), paths.end(), [](const std::string& a, const std::string& b) {
    return a.substr(a.rfind('/') + 1) < b.substr(b.rfind('/') + 1);
  });
  for (const std::string& p : paths) lines.push_back(p.substr(p.rfind('/') + 1) + ": " + p);
  return lines;
}

}  // namespace pl::cuda
