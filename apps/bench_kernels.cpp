// bench_kernels: the kernel table of a GPU run (issue 39). For each linear layer of the model (qkv, proj,
// fc1, fc2: x [T, in], W [out, in], dy [T, out], T = micro-batch x sequence), times through the public ops
//   - every quantize call the recipes make (lib/model/linear_layer.cpp: x in the forward with the
//     columnwise amax, x's wgrad copy with the amax given, W's two copies, dy's two copies) for FP8 current
//     scaling, FP8 delayed scaling (the scale given), MXFP8 and NVFP4 (1x16 x, 16x16 W, dy with the RHT'd
//     columnwise copy and stochastic rounding);
//   - the expand of every quantized GEMM this device emulates: the emulated quantized_gemm's first phase
//     (codes and block scales expanded into plain values), timed on its own by the op rows (core/timers.h)
//     where the backend marks the phase boundary (op_next_phase);
//   - the three GEMMs of each layer (fprop, dgrad, wgrad) in BF16 (linear_forward / linear_backward_input /
//     linear_backward_weight) and in FP8 per tensor (quantized_gemm of E4M3 / E5M2 copies).
// Bytes and FLOPs come from the ops' cost model (backend/op_costs.h); the bandwidth ceiling is the machine
// probe's (roofline/machine_ceilings.h): its cache when it holds this machine, else the probe's stream_triad
// measured now over the last memory level. Timing: the op rows of a Timers (CUDA events on the GPU,
// steady_clock on the CPU), one warm-up call, then the median of --reps calls.
//
//   bench_kernels --device cuda                      # llama3_8b, seq 4096, MBS 1
//   bench_kernels --device cpu --model llama_tiny --json kernels.json
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "app_main.h"
#include "backend/device_info.h"
#include "backend/device_memory.h"
#include "backend/op_costs.h"
#include "backend/ops.h"
#include "backend/quantize.h"
#include "config/model_config.h"
#include "config/paths.h"
#include "core/error.h"
#include "core/timers.h"
#include "io/atomic_file.h"
#include "numerics/bf16.h"
#include "numerics/fp8.h"
#include "roofline/machine_ceilings.h"

namespace {

using namespace pl;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string device = "auto", model, json, ceilings = roofline::default_ceilings_cache_path();
  std::string quantize_kernels = "fast";  // fast | reference | both (the GPU's kernel sets, issue 40)
  int64_t micro_batch = 1, seq_length = 0, num_layers = 0, reps = 0;
  double budget_s = 150.0;
};

struct Linear {
  const char* name;
  int64_t in, out;
};

// One row of the kernel table.
struct KernelRow {
  std::string kernel, linear, shape, variant, path;
  double ms = 0.0, bytes = 0.0, flops = 0.0;
};
// One row of the GEMM table: the BF16 and the FP8 per-tensor GEMM of one pass.
struct GemmRow {
  std::string linear, pass;
  int64_t m = 0, n = 0, k = 0;
  double bf16_ms = 0.0, fp8_ms = 0.0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Every buffer of one linear layer, allocated before anything is timed.
struct LayerBuffers {
  Linear lin{};
  int64_t T = 0;
  std::vector<Buffer> owner;
  Tensor x, w, dy, y, dx, dw, scratch_a, scratch_b, x_scale, w_scale, dy_scale, amax_record;
  QuantizedTensor x8, w8, dy8, xmx, wmx, dymx, xnv, wnv, dynv;
};

// Deterministic values in [-scale, scale], BF16-rounded, stored as the device stores activations.
void fill(const Tensor& t, uint64_t seed, float scale) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    f = num::round_bf16(scale * (static_cast<float>(s >> 40) / 8388608.0f - 1.0f));
  }
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = num::float_to_bf16_bits(v[i]);
    copy_from_host(t, b.data());
  } else {
    copy_from_host(t, v.data());
  }
}

Tensor scalar(std::vector<Buffer>& owner, Device dev, float value) {
  owner.emplace_back(sizeof(float), dev);
  const Tensor t = owner.back().as({1}, DType::F32);
  copy_from_host(t, &value);
  return t;
}

LayerBuffers allocate_layer(const OpContext& ctx, const Linear& lin, int64_t T) {
  LayerBuffers b;
  b.lin = lin;
  b.T = T;
  const Device dev = ctx.device;
  const DType act = dev == Device::CUDA ? DType::BF16 : DType::F32;
  const auto make = [&](int64_t r, int64_t c, DType t) {
    b.owner.emplace_back(static_cast<size_t>(r * c) * dtype_size(t), dev);
    return b.owner.back().as({r, c}, t);
  };
  b.x = make(T, lin.in, act), b.w = make(lin.out, lin.in, act), b.dy = make(T, lin.out, act);
  b.y = make(T, lin.out, act), b.dx = make(T, lin.in, act), b.dw = make(lin.out, lin.in, DType::F32);
  // The emulated GEMM's scratch, as a linear layer sizes it on the CPU (the GPU needs half of it).
  const int64_t scratch = std::max({T * lin.in, T * lin.out, lin.in * lin.out});
  b.scratch_a = make(scratch, 1, DType::F32).view({scratch});
  b.scratch_b = make(scratch, 1, DType::F32).view({scratch});
  fill(b.x, 1, 3.0f), fill(b.w, 2, 0.05f), fill(b.dy, 3, 1e-3f);
  // Delayed scaling's scales: E4M3 / E5M2 max over the values' bound (3, 0.05, 1e-3), as an amax history gives.
  b.x_scale = scalar(b.owner, dev, num::kE4M3Max / 3.0f), b.w_scale = scalar(b.owner, dev, num::kE4M3Max / 0.05f);
  b.dy_scale = scalar(b.owner, dev, num::kE5M2Max / 1e-3f), b.amax_record = scalar(b.owner, dev, 0.0f);
  const auto q = [&](QuantFormat f, int64_t r, int64_t c) { return allocate_quantized(b.owner, dev, f, r, c, true, true); };
  b.x8 = q(QuantFormat::FP8_E4M3, T, lin.in), b.w8 = q(QuantFormat::FP8_E4M3, lin.out, lin.in);
  b.dy8 = q(QuantFormat::FP8_E5M2, T, lin.out);
  b.xmx = q(QuantFormat::MXFP8, T, lin.in), b.wmx = q(QuantFormat::MXFP8, lin.out, lin.in);
  b.dymx = q(QuantFormat::MXFP8, T, lin.out);
  b.xnv = q(QuantFormat::NVFP4, T, lin.in), b.wnv = q(QuantFormat::NVFP4, lin.out, lin.in);
  b.dynv = q(QuantFormat::NVFP4, T, lin.out);
  return b;
}

// One quantize call as the model makes it (lib/model/linear_layer.cpp).
struct QuantCall {
  const char* variant;
  QuantizedTensor* q;
  Tensor x;
  QuantizeOptions opt;
};

// The recipes' quantize calls, in the order that gives each amax_given call its amax (the call before it).
std::vector<QuantCall> quantize_calls(LayerBuffers& b) {
  using F = QuantFormat;
  constexpr F e4 = F::FP8_E4M3, e5 = F::FP8_E5M2, mx = F::MXFP8, nv = F::NVFP4;
  return {
      {"fp8cs x e4m3 row (+col amax)", &b.x8, b.x, {.format = e4, .columnwise_amax = true, .compact_scales = false}},
      // What the layers of FP8 current scaling run for x of qkv, fc1 and fc2 (and dy of fc1, below): the amax
      // written by its producer (RMSNorm, SwiGLU: LinearLayer::producer_x_amax), no amax pass.
      {"fp8cs x e4m3 row (producer amax)", &b.x8, b.x, {.format = e4, .amax_given = true, .compact_scales = false}},
      {"fp8cs x e4m3 col (wgrad)", &b.x8, b.x,
       {.format = e4, .rowwise = false, .columnwise = true, .amax_given = true, .compact_scales = false}},
      {"fp8cs W e4m3 row+col", &b.w8, b.w, {.format = e4, .columnwise = true, .compact_scales = false}},
      {"fp8cs dy e5m2 row+col", &b.dy8, b.dy, {.format = e5, .columnwise = true, .compact_scales = false}},
      {"fp8cs dy e5m2 row+col (producer amax)", &b.dy8, b.dy,
       {.format = e5, .columnwise = true, .amax_given = true, .compact_scales = false}},
      {"fp8ds x e4m3 row (scale given)", &b.x8, b.x,
       {.format = e4, .scale = b.x_scale, .amax_record = b.amax_record, .columnwise_amax = true, .compact_scales = false}},
      {"fp8ds W e4m3 row+col (scale given)", &b.w8, b.w,
       {.format = e4, .columnwise = true, .scale = b.w_scale, .amax_record = b.amax_record, .compact_scales = false}},
      {"fp8ds dy e5m2 row+col (scale given)", &b.dy8, b.dy,
       {.format = e5, .columnwise = true, .scale = b.dy_scale, .amax_record = b.amax_record, .compact_scales = false}},
      {"mxfp8 x row", &b.xmx, b.x, {.format = mx, .columnwise_amax = true, .compact_scales = false}},
      {"mxfp8 x col (wgrad)", &b.xmx, b.x, {.format = mx, .rowwise = false, .columnwise = true, .compact_scales = false}},
      {"mxfp8 W row+col", &b.wmx, b.w, {.format = mx, .columnwise = true, .compact_scales = false}},
      {"mxfp8 dy row+col", &b.dymx, b.dy, {.format = mx, .columnwise = true, .compact_scales = false}},
      {"nvfp4 x 1x16 row (+RHT col amax)", &b.xnv, b.x,
       {.format = nv, .rht_columnwise = true, .columnwise_amax = true, .compact_scales = false}},
      {"nvfp4 x 1x16 col RHT (wgrad)", &b.xnv, b.x,
       {.format = nv, .rowwise = false, .columnwise = true, .rht_columnwise = true, .amax_given = true,
        .compact_scales = false}},
      {"nvfp4 W 16x16 row+col", &b.wnv, b.w, {.format = nv, .columnwise = true, .block_2d = true, .compact_scales = false}},
      {"nvfp4 dy row + col RHT, SR", &b.dynv, b.dy,
       {.format = nv, .columnwise = true, .rht_columnwise = true, .stochastic = true, .seed = 1234, .stream_id = 2,
        .counter = 1, .compact_scales = false}},
  };
}

// The op rows of a Timers of its own (CUDA events per op on the GPU, steady_clock on the CPU): the whole
// ops' time, and an emulated quantized GEMM's expand phase apart.
class OpClock {
 public:
  explicit OpClock(const OpContext& ctx) : timers_(ctx.device, 0, /*op_rows=*/true), ctx_(ctx) {
    ctx_.timers = &timers_;
    ctx_.tag = OpTag{};
  }
  struct Times {
    double total_ms = 0.0, expand_ms = 0.0;
  };
  // One warm-up call, then the median of `reps` calls.
  Times median(const std::function<void(const OpContext&)>& call, int64_t reps) {
    once(call);
    std::vector<double> total, expand;
    for (int64_t r = 0; r < reps; ++r) {
      const Times t = once(call);
      total.push_back(t.total_ms), expand.push_back(t.expand_ms);
    }
    return {median_of(total), median_of(expand)};
  }

 private:
  Times once(const std::function<void(const OpContext&)>& call) {
    timers_.clear_op_rows();
    timers_.set_op_rows_active(true);
    call(ctx_);
    timers_.set_op_rows_active(false);
    Times t;
    for (const OpRow& r : timers_.op_rows()) {
      t.total_ms += r.ms;
      if (r.key.kind == OpKind::Quantize && std::string_view(r.key.op) == "quantized_gemm:expand") t.expand_ms += r.ms;
    }
    return t;
  }
  static double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  Timers timers_;
  OpContext ctx_;
};

// What the run knows about the device and the paths its GEMMs take.
struct Setup {
  Options o;
  OpContext ctx;
  std::string device_name, model_name, ceiling_level, ceiling_source;
  double ceiling_gbps = 0.0;
  std::vector<Linear> linears;
  int64_t tokens = 0;
  std::vector<QuantFormat> emulated;  // the quantized formats whose GEMM this device emulates
  std::string bf16_path, fp8_path;
  bool fp8_native = false;
};

std::string shape_text(int64_t r, int64_t c) { return fmt::format("{}x{}", r, c); }

// The quantize/expand kernel sets to time, as DeviceState::reference_quantize_kernels values: on the CPU
// there is one set (the flag has no effect there).
std::vector<bool> kernel_sets(const Setup& s) {
  if (s.ctx.device != Device::CUDA || s.o.quantize_kernels == "fast") return {false};
  if (s.o.quantize_kernels == "reference") return {true};
  return {true, false};
}

// The run's progress against --budget-seconds.
struct Budget {
  Clock::time_point start = Clock::now();
  double seconds = 0.0;
  bool stopped = false;
  bool left() {
    if (!stopped) stopped = std::chrono::duration<double>(Clock::now() - start).count() > seconds;
    return !stopped;
  }
};

struct Results {
  std::vector<KernelRow> kernels;
  std::vector<GemmRow> gemms;
  int64_t planned = 0;  // kernels the full run times
};

void bench_quantize(const Setup& s, LayerBuffers& b, OpClock& clock, Budget& budget, Results& res) {
  for (QuantCall& c : quantize_calls(b)) {
    if (!budget.left()) return;
    const OpCosts cost = cost::quantize(s.ctx, *c.q, c.x, c.opt);
    const OpClock::Times t = clock.median([&](const OpContext& ctx) { quantize(ctx, *c.q, c.x, c.opt); }, s.o.reps);
    res.kernels.push_back({"quantize", b.lin.name, shape_text(c.x.dim(0), c.x.dim(1)), c.variant, "native kernel",
                           t.total_ms, cost.phase[0].bytes, cost.phase[0].flops});
  }
}

// The expand phase of each emulated format's fprop GEMM (y = x·Wᵀ from the recipe's x rowwise and W rowwise copies).
void bench_expand(const Setup& s, LayerBuffers& b, OpClock& clock, Budget& budget, Results& res) {
  for (QuantFormat f : s.emulated) {
    if (!budget.left()) return;
    const QuantizedTensor& xq = f == QuantFormat::NVFP4 ? b.xnv : f == QuantFormat::MXFP8 ? b.xmx : b.x8;
    const QuantizedTensor& wq = f == QuantFormat::NVFP4 ? b.wnv : f == QuantFormat::MXFP8 ? b.wmx : b.w8;
    const auto call = [&](const OpContext& ctx) {
      quantized_gemm(ctx, b.y, xq.rowwise, wq.rowwise, f, false, b.scratch_a, b.scratch_b, true);
    };
    const OpCosts cost = cost::quantized_gemm(s.ctx, b.y, xq.rowwise, wq.rowwise, f, false, b.scratch_a, b.scratch_b, true);
    const OpClock::Times t = clock.median(call, s.o.reps);
    res.kernels.push_back({"expand", b.lin.name, fmt::format("{}+{}", shape_text(b.T, b.lin.in), shape_text(b.lin.out, b.lin.in)),
                           fmt::format("{} fprop x,W -> {} (emulated)", cost::format_row_name(f),
                                       s.ctx.device == Device::CUDA ? "bf16" : "fp32"),
                           "emulated GEMM, phase 1", t.expand_ms, cost.phase[0].bytes, cost.phase[0].flops});
  }
}

void bench_gemms(const Setup& s, LayerBuffers& b, OpClock& clock, Budget& budget, Results& res) {
  const Linear& l = b.lin;
  using F = QuantFormat;
  const auto row = [&](const char* pass, int64_t m, int64_t n, int64_t k, const std::function<void(const OpContext&)>& bf16,
                       const std::function<void(const OpContext&)>& fp8) {
    if (!budget.left()) return;
    GemmRow r{l.name, pass, m, n, k};
    r.bf16_ms = clock.median(bf16, s.o.reps).total_ms;
    if (!budget.left()) return;
    r.fp8_ms = clock.median(fp8, s.o.reps).total_ms;
    res.gemms.push_back(r);
  };
  row("fprop", b.T, l.out, l.in, [&](const OpContext& c) { linear_forward(c, b.y, b.x, b.w); },
      [&](const OpContext& c) {
        quantized_gemm(c, b.y, b.x8.rowwise, b.w8.rowwise, F::FP8_E4M3, false, b.scratch_a, b.scratch_b, true);
      });
  row("dgrad", b.T, l.in, l.out, [&](const OpContext& c) { linear_backward_input(c, b.dx, b.dy, b.w); },
      [&](const OpContext& c) {
        quantized_gemm(c, b.dx, b.dy8.rowwise, b.w8.columnwise, F::FP8_E5M2, false, b.scratch_a, b.scratch_b);
      });
  row("wgrad", l.out, l.in, b.T, [&](const OpContext& c) { linear_backward_weight(c, b.dw, b.dy, b.x); },
      [&](const OpContext& c) {
        quantized_gemm(c, b.dw, b.dy8.columnwise, b.x8.columnwise, F::FP8_E5M2, true, b.scratch_a, b.scratch_b);
      });
}

double gbps(const KernelRow& r) { return r.ms > 0.0 ? r.bytes / (r.ms * 1e-3) / 1e9 : 0.0; }
double tflops(double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e-3) / 1e12 : 0.0; }

// A rough time of the whole run, before anything is measured: each call at the bandwidth and rate assumed
// here (not measured), plus a launch's overhead, times (1 warm-up + reps) calls.
double estimate_seconds(const Setup& s, const std::vector<LayerBuffers>& layers, int64_t kernels) {
  const bool gpu = s.ctx.device == Device::CUDA;
  const double bw = gpu ? 3.0e12 : 5.0e9, rate = gpu ? 4.0e14 : 2.0e10, overhead = gpu ? 3e-5 : 2e-4;
  double per_rep = 0.0;
  for (const LayerBuffers& b : layers) {
    const double x = static_cast<double>(b.x.numel()), w = static_cast<double>(b.w.numel());
    const double dy = static_cast<double>(b.dy.numel()), elem = gpu ? 2.0 : 4.0;
    const double sets = static_cast<double>(kernel_sets(s).size());
    per_rep += sets * 15 * (std::max({x, w, dy}) * elem * 2.0 / bw);  // the quantize calls
    const double gemm = 2.0 * static_cast<double>(b.T) * static_cast<double>(b.lin.in * b.lin.out) / rate;
    per_rep += 3 * 2 * gemm + sets * static_cast<double>(s.emulated.size()) * (gemm + (x + w) * 8.0 / bw);
  }
  return static_cast<double>(1 + s.o.reps) * (per_rep + static_cast<double>(kernels) * overhead);
}

// ---- output -----------------------------------------------------------------------------------------------
void print_tables(const Setup& s, const Results& r) {
  const std::string pct = fmt::format("% {} ceil", s.ceiling_level);
  fmt::print("{:<9} {:<5} {:<20} {:<38} {:>10} {:>9} {:>11}\n", "kernel", "layer", "shape", "format/variant", "ms",
             "GB/s", pct);
  for (const KernelRow& k : r.kernels)
    fmt::print("{:<9} {:<5} {:<20} {:<38} {:>10.4g} {:>9.4g} {:>11.4g}\n", k.kernel, k.linear, k.shape, k.variant, k.ms,
               gbps(k), 100.0 * gbps(k) / s.ceiling_gbps);
  fmt::print("\n{:<5} {:<20} {:<6} {:>13} {:>13} {:>9}  {}\n", "layer", "shape (MxNxK)", "pass", "BF16 TFLOP/s",
             "FP8 TFLOP/s", "FP8/BF16", "FP8 GEMM");
  for (const GemmRow& g : r.gemms) {
    const double b = tflops(g.flops(), g.bf16_ms), f = tflops(g.flops(), g.fp8_ms);
    fmt::print("{:<5} {:<20} {:<6} {:>13.4g} {:>13.4g} {:>9.3f}  {}\n", g.linear, fmt::format("{}x{}x{}", g.m, g.n, g.k),
               g.pass, b, f, b > 0.0 ? f / b : 0.0, s.fp8_native ? "native" : "emulated");
  }
}

nlohmann::json to_json(const Setup& s, const Results& r) {
  nlohmann::json kernels = nlohmann::json::array(), gemms = nlohmann::json::array();
  for (const KernelRow& k : r.kernels)
    kernels.push_back({{"kernel", k.kernel}, {"linear", k.linear}, {"shape", k.shape}, {"variant", k.variant},
                       {"path", k.path}, {"ms", k.ms}, {"bytes", k.bytes}, {"flops", k.flops}, {"gbps", gbps(k)},
                       {"pct_of_ceiling", 100.0 * gbps(k) / s.ceiling_gbps}});
  for (const GemmRow& g : r.gemms) {
    const double b = tflops(g.flops(), g.bf16_ms), f = tflops(g.flops(), g.fp8_ms);
    gemms.push_back({{"linear", g.linear}, {"pass", g.pass}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"bf16_ms", g.bf16_ms},
                     {"fp8_ms", g.fp8_ms}, {"bf16_tflops", b}, {"fp8_tflops", f}, {"fp8_over_bf16", b > 0.0 ? f / b : 0.0}});
  }
  return {{"bench_kernels", 1},
          {"device", s.ctx.device == Device::CUDA ? "cuda" : "cpu"},
          {"device_name", s.device_name},
          {"model", s.model_name},
          {"micro_batch_size", s.o.micro_batch},
          {"seq_length", s.o.seq_length},
          {"tokens", s.tokens},
          {"reps", s.o.reps},
          {"warmup", 1},
          {"complete", static_cast<int64_t>(r.kernels.size()) + 2 * static_cast<int64_t>(r.gemms.size()) == r.planned},
          {"ceiling", {{"level", s.ceiling_level}, {"gbps", s.ceiling_gbps}, {"source", s.ceiling_source}}},
          {"expand_method", "the emulated quantized_gemm's expand phase, timed apart by the op rows (op_next_phase)"},
          {"bf16_gemm_path", s.bf16_path},
          {"fp8_gemm_path", s.fp8_path},
          {"kernels", std::move(kernels)},
          {"gemms", std::move(gemms)}};
}

// ---- setup ------------------------------------------------------------------------------------------------
Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  std::string why;
  const int n = cuda_device_count(&why);
  if (name == "cuda") PL_CHECK(n > 0, "--device cuda: no usable CUDA device ({})", why);
  return n > 0 ? Device::CUDA : Device::CPU;
}

void find_ceiling(Setup& s) {
  roofline::MachineCeilings cached;
  std::string why;
  if (roofline::read_cached_ceilings(s.ctx, s.o.ceilings, cached, &why)) {
    s.ceiling_level = cached.memory.back().level, s.ceiling_gbps = cached.memory.back().gbps;
    s.ceiling_source = fmt::format("read from the machine probe's cache {} (pretrain_llama --probe-machine)", s.o.ceilings);
    return;
  }
  if (!why.empty()) fmt::print("bench_kernels: {}\n", why);
  const roofline::MemoryCeiling m = roofline::probe_memory_bandwidth(s.ctx, nullptr);
  s.ceiling_level = m.level, s.ceiling_gbps = m.gbps;
  s.ceiling_source = "measured now with the machine probe's stream_triad over the last memory level (no cache of this machine)";
  PL_CHECK(std::isfinite(s.ceiling_gbps) && s.ceiling_gbps > 0.0, "the bandwidth probe measured {} GB/s", s.ceiling_gbps);
}

void describe_paths(Setup& s) {
  using F = QuantFormat;
  for (const GemmPath& p : gemm_paths(s.ctx, {F::FP8_E4M3, F::MXFP8, F::NVFP4})) {
    if (p.format == "bf16") s.bf16_path = p.description;
    if (p.format == "fp8") s.fp8_path = p.description, s.fp8_native = p.native;
    if (!p.native && p.format != "bf16")
      s.emulated.push_back(p.format == "fp8" ? F::FP8_E4M3 : p.format == "mxfp8" ? F::MXFP8 : F::NVFP4);
  }
}

void print_header(const Setup& s, const Results& r, double estimate_s) {
  const Options& o = s.o;
  fmt::print("bench_kernels: {} {} | {} | {} linear layers, T = {} x {} = {} tokens | 1 warm-up, median of {} calls\n",
             s.ctx.device == Device::CUDA ? "cuda" : "cpu", s.device_name, s.model_name, s.linears.size(),
             o.micro_batch, o.seq_length, s.tokens, o.reps);
  if (o.num_layers != 0) fmt::print("bench_kernels: --num-layers {}: ignored (the layers' shapes do not depend on it)\n", o.num_layers);
  fmt::print("bench_kernels: estimate ~{:.0f} s (the operands are allocated and filled): the bandwidth ceiling, then {} kernels x {} calls at a rough per-call time (bytes at {} GB/s, GEMMs "
             "at {} TFLOP/s, assumed, not measured); stops at --budget-seconds {:g}\n",
             std::ceil(estimate_s + 2.0), r.planned, 1 + o.reps, s.ctx.device == Device::CUDA ? 3000 : 5,
             s.ctx.device == Device::CUDA ? "400" : "0.02", o.budget_s);
  std::fflush(stdout);
}

void print_context(const Setup& s) {
  fmt::print("bench_kernels: bandwidth ceiling {} {:.1f} GB/s, {}\n", s.ceiling_level, s.ceiling_gbps, s.ceiling_source);
  fmt::print("bench_kernels: bytes and FLOPs: the ops' cost model (backend/op_costs.h); quantize: one kernel per call, "
             "native on every device\n");
  fmt::print("bench_kernels: expand: the emulated quantized_gemm's expand phase alone (codes x block scales -> {}), "
             "timed by the op rows where the backend ends that phase; formats emulated here: {}\n",
             s.ctx.device == Device::CUDA ? "bf16" : "fp32", s.emulated.empty() ? std::string("none (every GEMM native)") : [&] {
               std::string t;
               for (QuantFormat f : s.emulated) t += (t.empty() ? "" : ", ") + std::string(cost::format_row_name(f));
               return t;
             }());
  fmt::print("bench_kernels: BF16 GEMMs: {}\n", s.bf16_path);
  fmt::print("bench_kernels: FP8 GEMMs ({}): {}\n", s.fp8_native ? "native" : "emulated: expand + BF16 GEMM, the whole op timed", s.fp8_path);
}

int bench(Setup& s, const Options& o) {
  Budget budget{.seconds = o.budget_s};
  const DeviceStateHandle state = open_device_state(s.ctx.device);
  s.ctx.gpu = state.get();
  const DeviceIdentity id = device_identity(s.ctx);
  s.device_name = s.ctx.device == Device::CUDA ? fmt::format("{} (sm_{})", id.name, id.sm) : id.name;
  describe_paths(s);
  std::vector<LayerBuffers> layers;
  for (const Linear& l : s.linears) layers.push_back(allocate_layer(s.ctx, l, s.tokens));
  Results res;
  const int64_t sets = static_cast<int64_t>(kernel_sets(s).size());
  const int64_t per_layer = sets * static_cast<int64_t>(quantize_calls(layers.front()).size() + s.emulated.size()) + 6;
  res.planned = per_layer * static_cast<int64_t>(layers.size());
  print_header(s, res, estimate_seconds(s, layers, res.planned));
  find_ceiling(s);
  print_context(s);
  OpClock clock(s.ctx);
  for (LayerBuffers& b : layers) {
    for (bool reference : kernel_sets(s)) {  // --quantize-kernels: reference rows say so in their variant
      use_reference_quantize_kernels(s.ctx, reference);
      const size_t first = res.kernels.size();
      bench_quantize(s, b, clock, budget, res);
      bench_expand(s, b, clock, budget, res);
      if (reference)
        for (size_t i = first; i < res.kernels.size(); ++i) res.kernels[i].variant += " [reference kernels]";
    }
    use_reference_quantize_kernels(s.ctx, false);
    bench_gemms(s, b, clock, budget, res);
  }
  print_tables(s, res);
  const int64_t done = static_cast<int64_t>(res.kernels.size() + 2 * res.gemms.size());
  if (budget.stopped)
    fmt::print("bench_kernels: stopped at --budget-seconds {:g}: {} of {} kernels timed\n", o.budget_s, done, res.planned);
  fmt::print("bench_kernels: done in {:.1f} s\n", std::chrono::duration<double>(Clock::now() - budget.start).count());
  if (!o.json.empty()) {
    write_file_atomically(o.json, to_json(s, res).dump(2) + "\n");
    fmt::print("bench_kernels: wrote {}\n", o.json);
  }
  return 0;
}

int run(int argc, char** argv) {
  Setup s;
  Options& o = s.o;
  CLI::App app{"bench_kernels: the quantize, expand and GEMM kernels of the model's linear layers, timed through "
               "the ops (GB/s against the machine's bandwidth ceiling, TFLOP/s of BF16 and FP8 GEMMs)"};
  app.add_option("--device", o.device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--model", o.model, "Model config: a name in configs/models/ or a .json (default: llama3_8b on cuda, llama_tiny on cpu)");
  app.add_option("--micro-batch-size", o.micro_batch, "Samples per micro-batch")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--seq-length", o.seq_length, "Tokens per sample (default: 4096 on cuda, 128 on cpu)")->check(CLI::PositiveNumber);
  app.add_option("--num-layers", o.num_layers, "Ignored: the layers' shapes do not depend on it (pretrain_llama's flag)");
  app.add_option("--reps", o.reps, "Timed calls per kernel after one warm-up; the median is reported (default: 10 on cuda, 2 on cpu)")
      ->check(CLI::PositiveNumber);
  app.add_option("--budget-seconds", o.budget_s, "Stop early, printing what was measured, past this time")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--json", o.json, "Also write the tables as JSON to FILE (atomically)");
  app.add_option("--quantize-kernels", o.quantize_kernels,
                 "The GPU's quantize and expand kernels to time: fast | reference (before issue 40) | both (each "
                 "reference row beside its fast one). No effect on the CPU")
      ->check(CLI::IsMember({"fast", "reference", "both"}))
      ->capture_default_str();
  app.add_option("--machine-ceilings", o.ceilings, "The machine probe's ceilings cache to read the bandwidth ceiling from; "
                 "when it does not hold this machine (or is \"\"), the probe's stream_triad is measured now")
      ->capture_default_str();
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "bench_kernels")) return *rc;
  if (!o.json.empty()) {
    app::check_output_directory("--json", o.json);
    PL_CHECK(!std::filesystem::is_directory(o.json), "--json {}: is a directory (give a FILE)", o.json);
  }
  s.ctx.device = resolve_device(o.device);
  const bool gpu = s.ctx.device == Device::CUDA;
  if (o.model.empty()) o.model = gpu ? "llama3_8b" : "llama_tiny";
  if (o.seq_length == 0) o.seq_length = gpu ? 4096 : 128;
  if (o.reps == 0) o.reps = gpu ? 10 : 2;
  const ModelConfig mc = load_model_config(resolve_config("models", o.model, argv[0]));
  s.model_name = mc.name;
  s.tokens = o.micro_batch * o.seq_length;
  PL_CHECK(s.tokens % 32 == 0, "--micro-batch-size {} x --seq-length {} = {} tokens: must be a multiple of 32 (MXFP8's "
           "columnwise blocks run along the tokens)", o.micro_batch, o.seq_length, s.tokens);
  const int64_t h = mc.hidden_size;
  s.linears = {{"qkv", h, mc.qkv_dim()}, {"proj", mc.q_dim(), h}, {"fc1", h, 2 * mc.ffn_hidden_size}, {"fc2", mc.ffn_hidden_size, h}};
  return bench(s, o);
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("bench_kernels", run, argc, argv); }
