// The GEMM roofs of the machine probe: for each format this program runs (BF16, and FP8, MXFP8, NVFP4
// natively or emulated), the best rate over a sweep of shapes, each the best of 5 timings after one
// warm-up, rate = 2·m·n·k / time (the FLOP count of a GEMM row of the roofline report). Measured through
// the ops (linear_forward; quantize once, then quantized_gemm) and timed by op rows: an emulated quantized
// GEMM's roof is its GEMM row's rate, the expansion of the codes being a row of its own.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "backend/device_info.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "numerics/bf16.h"
#include "roofline/probe_internal.h"

namespace pl::roofline::detail {

namespace {

constexpr int kTrials = 5;  // a shared machine's noise: the best of five

struct ProbeFormat {
  const char* name;
  bool quantized;
  QuantFormat format;  // when quantized
};
// FP8 is measured as E4M3 x E4M3 (the forward GEMM's; E5M2 gradients run at the same rate on every GPU).
constexpr ProbeFormat kFormats[] = {{"bf16", false, QuantFormat::FP8_E4M3},
                                    {"fp8", true, QuantFormat::FP8_E4M3},
                                    {"mxfp8", true, QuantFormat::MXFP8},
                                    {"nvfp4", true, QuantFormat::NVFP4}};

double gemm_flops(const GemmShape& s) { return 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * s.k; }

std::string path_of(const OpContext& ctx, const ProbeFormat& f, bool native) {
  if (ctx.device == Device::CPU)
    return f.quantized ? "emulated: expand to BF16 + " + cpu_gemm_engine_description() : cpu_gemm_engine_description();
  if (!f.quantized) return "cuBLASLt BF16";
  return native ? fmt::format("cuBLASLt native {}", quant_format_name(f.format))
                : "emulated: expand to BF16 + cuBLASLt BF16";
}

// Pseudo-random BF16-representable values in [-1, 1) (an LCG: the probe times arithmetic, not values).
std::vector<float> probe_values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1u;
  for (float& e : v) {
    x = x * 1664525u + 1013904223u;
    e = num::round_bf16(static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
  return v;
}

// One shape's operands on ctx's device: x[m,k], w[n,k] (BF16 values), y[m,n], and the emulated quantized
// GEMM's scratch (CPU: FP32 m·k and n·k; GPU: room for as many BF16 values).
struct ShapeOperands {
  std::vector<Buffer> owner;
  Tensor x, w, y, scratch_a, scratch_b;

  ShapeOperands(Device device, const GemmShape& s) {
    const DType act = device == Device::CUDA ? DType::BF16 : DType::F32;
    x = make(device, {s.m, s.k}, act);
    w = make(device, {s.n, s.k}, act);
    y = make(device, {s.m, s.n}, act);
    scratch_a = make(device, {s.m * s.k}, device == Device::CUDA ? DType::BF16 : DType::F32);
    scratch_b = make(device, {s.n * s.k}, device == Device::CUDA ? DType::BF16 : DType::F32);
    fill(x, 1);
    fill(w, 2);
  }

 private:
  Tensor make(Device device, std::initializer_list<int64_t> dims, DType dt) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    owner.emplace_back(static_cast<size_t>(n) * dtype_size(dt), device);
    return owner.back().as(dims, dt);
  }
  static void fill(const Tensor& t, uint32_t seed) {
    const std::vector<float> v = probe_values(t.numel(), seed);
    if (t.dtype == DType::F32) {
      copy_from_host(t, v.data());
      return;
    }
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = num::float_to_bf16_bits(v[i]);
    copy_from_host(t, bits.data());
  }
};

// The best of kTrials timings of `reps` calls after one warm-up call; rates in TFLOP/s.
struct Timed {
  double gemm_tflops = 0.0, total_tflops = 0.0;
};
template <class Run>
Timed time_best(OpRowClock& clock, double flops, int reps, Run&& run) {
  run(clock.ctx());  // warm-up: caches, cuBLASLt's plan for the shape, page faults
  double best_gemm = std::numeric_limits<double>::infinity(), best_total = best_gemm;
  for (int t = 0; t < kTrials; ++t) {
    const RowTimes rt = clock.time([&](const OpContext& c) {
      for (int r = 0; r < reps; ++r) run(c);
    });
    // Without a GEMM row (an op row table that has not split the phases) the whole op is the GEMM.
    best_gemm = std::min(best_gemm, rt.gemm_ms > 0.0 ? rt.gemm_ms : rt.total_ms);
    best_total = std::min(best_total, rt.total_ms);
  }
  const auto rate = [&](double ms) { return ms > 0.0 && std::isfinite(ms) ? flops * reps / (ms * 1e-3) / 1e12 : 0.0; };
  return {rate(best_gemm), rate(best_total)};
}

// Measures format f at shape s into `roof` when faster than what it holds; "" when measured, else the op's
// one-line error (a shape the format cannot run here: a block or alignment rule; or a library failure).
std::string measure(OpRowClock& clock, ShapeOperands& ops, const GemmShape& s, const ProbeFormat& f,
                    GemmCeiling& roof) {
  const OpContext& ctx = clock.ctx();
  const double flops = gemm_flops(s);
  const int reps = reps_for(flops, ctx.device == Device::CUDA ? 50e9 : 0.5e9, 64);
  Timed t;
  try {
    if (!f.quantized) {
      t = time_best(clock, flops, reps, [&](const OpContext& c) { linear_forward(c, ops.y, ops.x, ops.w); });
    } else {
      std::vector<Buffer> owner;
      QuantizedTensor qa = allocate_quantized(owner, ctx.device, f.format, s.m, s.k, true, false);
      QuantizedTensor qb = allocate_quantized(owner, ctx.device, f.format, s.n, s.k, true, false);
      QuantizeOptions opt;
      opt.format = f.format;
      quantize(ctx, qa, ops.x, opt);
      quantize(ctx, qb, ops.w, opt);
      t = time_best(clock, flops, reps, [&](const OpContext& c) {
        quantized_gemm(c, ops.y, qa.rowwise, qb.rowwise, f.format, false, ops.scratch_a, ops.scratch_b);
      });
    }
  } catch (const Error& e) {
    return e.what();
  }
  if (t.gemm_tflops > roof.tflops) {
    roof.tflops = t.gemm_tflops;
    roof.best_shape = s;
    roof.path_tflops = t.total_tflops;
  }
  return "";
}

}  // namespace

std::vector<GemmShape> sweep_shapes(Device device, const std::vector<GemmShape>& model_shapes) {
  std::vector<GemmShape> all;
  for (int64_t side : device == Device::CUDA ? std::vector<int64_t>{1024, 2048, 4096, 8192}
                                              : std::vector<int64_t>{256, 512, 1024})
    all.push_back({side, side, side});
  for (GemmShape s : model_shapes) {
    if (device == Device::CPU) {
      // The CPU measures at most kCpuProbeMaxSide per side: at the 8B defaults an LM head of 16384 x 128256 x 4096
      // would take minutes and gigabytes before any memory check, and a CPU's rate has settled long before.
      s = {std::min(s.m, kCpuProbeMaxSide), std::min(s.n, kCpuProbeMaxSide), std::min(s.k, kCpuProbeMaxSide)};
    }
    if (s.m > 0 && s.n > 0 && s.k > 0 && std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
  }
  std::stable_sort(all.begin(), all.end(),
                   [](const GemmShape& a, const GemmShape& b) { return gemm_flops(a) > gemm_flops(b); });
  if (all.size() > kProbeMaxShapes) all.resize(kProbeMaxShapes);
  return all;
}

std::vector<GemmCeiling> probe_gemm_roofs(const OpContext& ctx, const std::vector<GemmShape>& shapes,
                                          const ProbeLineFn& progress) {
  OpRowClock clock(ctx);
  std::vector<GemmCeiling> roofs;
  std::vector<int> measured(std::size(kFormats), 0);
  std::vector<std::string> last_error(std::size(kFormats));
  for (const ProbeFormat& f : kFormats) {
    GemmCeiling r;
    r.format = f.name;
    const bool native = f.quantized && ctx.device == Device::CUDA && quantized_gemm_native(f.format, device_sm(ctx));
    r.path = path_of(ctx, f, native);
    roofs.push_back(r);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (const GemmShape& s : shapes) {  // one allocation per shape, shared by every format
    ShapeOperands ops(ctx.device, s);
    for (size_t i = 0; i < std::size(kFormats); ++i) {
      std::string error = measure(clock, ops, s, kFormats[i], roofs[i]);
      if (error.empty()) ++measured[i];
      else last_error[i] = std::move(error);
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<GemmCeiling> measured_roofs;
  for (size_t i = 0; i < roofs.size(); ++i) {
    GemmCeiling& r = roofs[i];
    if (r.path.rfind("emulated", 0) != 0) r.path_tflops = 0.0;  // the whole op is the GEMM
    // A format no shape could run has no roof (its rows are then judged by the BF16 one), and says why.
    if (measured[i] == 0 || !(r.tflops > 0.0)) {
      if (progress) progress(fmt::format("probe: gemm {} not measured ({})", r.format, last_error[i]));
      continue;
    }
    if (progress)
      progress(fmt::format("probe: gemm {} {:.4g} TFLOP/s at {}x{}x{} ({} of {} shapes; the GEMM sweep took {:.1f} s)",
                           r.format, r.tflops, r.best_shape.m, r.best_shape.n, r.best_shape.k, measured[i],
                           shapes.size(), seconds));
    measured_roofs.push_back(r);
  }
  return measured_roofs;
}

}  // namespace pl::roofline::detail
