// The machine's measured ceilings (roofline/machine_ceilings.h): its identity, the probe put together
// from its GEMM and memory halves (probe_gemm.cpp, probe_memory.cpp), the dense datasheet peaks of the
// GPUs the program knows, the JSON form and the cache file keyed by the identity.
#include "roofline/machine_ceilings.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/json_text.h"
#include "roofline/probe_internal.h"

namespace pl::roofline {

namespace {

std::atomic<int64_t> g_probes{0};

// The GEMM formats this program runs on every device (natively or emulated): a cache must hold them all.
constexpr const char* kGemmFormats[] = {"bf16", "fp8", "mxfp8", "nvfp4"};

// Dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s per GPU, from NVIDIA's datasheets, which print the
// sparse figure with a footnote "shown with sparsity; specifications 1/2 lower without": the numbers
// here are those halves. Matched by substring of the CUDA device name, first match wins (so the PCIe and
// NVL boards come before the SXM one, GB200/GB300 before B200/B300). 0: the format has no tensor-core
// path on that GPU (Hopper has no MXFP8 or NVFP4 tensor cores: quantize.h emulates them there).
struct DatasheetPeak {
  const char* name_part;
  double bf16, fp8, mxfp8, nvfp4;
};
constexpr DatasheetPeak kDatasheet[] = {
    // H100 datasheet (nvidia.com/en-us/data-center/h100): PCIe BF16 1,513 / FP8 3,026 with sparsity; NVL
    // BF16 1,671 / FP8 3,341; SXM ("NVIDIA H100 80GB HBM3") BF16 1,979 / FP8 3,958 (the Hopper
    // whitepaper's dense SXM5 figures: 989.4 and 1978.9).
    {"H100 PCIe", 756.5, 1513.0, 0.0, 0.0},
    {"H100 NVL", 835.5, 1670.5, 0.0, 0.0},
    {"H100", 989.4, 1978.9, 0.0, 0.0},
    // H200 datasheet (nvidia.com/en-us/data-center/h200): the H100 SXM's tensor cores (GH100) with more
    // HBM: SXM BF16 1,979 / FP8 3,958 with sparsity; NVL BF16 1,671 / FP8 3,341.
    {"H200 NVL", 835.5, 1670.5, 0.0, 0.0},
    {"H200", 989.4, 1978.9, 0.0, 0.0},
    // GB200 NVL72 / HGX B200 datasheets (nvidia.com/en-us/data-center/gb200-nvl72, .../hgx): per GPU
    // FP4 20 / 18 PFLOPS, FP8/FP6 10 / 9, FP16/BF16 5 / 4.5 with sparsity (GB200 / HGX B200). MXFP8 runs
    // at the FP8 rate (the block scales are applied inside the tensor core).
    {"GB200", 2500.0, 5000.0, 5000.0, 10000.0},
    {"B200", 2250.0, 4500.0, 4500.0, 9000.0},
    // GB300 NVL72 datasheet (nvidia.com/en-us/data-center/gb300-nvl72): 72 GPUs, FP4 1,080 PFLOPS dense
    // (1,440 sparse), FP8/FP6 720 and BF16 360 PFLOPS with sparsity: per GPU 15 / 5 / 2.5 PFLOPS dense.
    // HGX B300 (nvidia.com/en-us/data-center/hgx): 8 GPUs, FP4 108 PFLOPS dense, FP8 72 and BF16 36 with
    // sparsity: per GPU 13.5 / 4.5 / 2.25 (third-party summaries round FP4 to 14; uncertain to ±0.5).
    {"GB300", 2500.0, 5000.0, 5000.0, 15000.0},
    {"B300", 2250.0, 4500.0, 4500.0, 13500.0},
    // GeForce RTX 5090 (NVIDIA RTX Blackwell GPU architecture whitepaper, as quoted by spec summaries):
    // FP16/BF16 tensor 838.4, FP8 1,676.8, FP4 3,352 TFLOPS with sparsity. The whitepaper's figure with
    // FP32 accumulation (what the GEMMs here use) may be lower on GeForce; this is the headline rate.
    {"RTX 5090", 419.2, 838.4, 838.4, 1676.0},
};

// The first identity field that differs ("" when none): its name and both values.
struct Difference {
  std::string field, cached, now;
};
Difference identity_difference(const MachineCeilings& cached, const MachineCeilings& now) {
  const auto s = [](int v) { return std::to_string(v); };
  const std::pair<const char*, std::pair<std::string, std::string>> fields[] = {
      {"device", {cached.device, now.device}},
      {"name", {cached.name, now.name}},
      {"driver", {cached.driver, now.driver}},
      {"threads", {s(cached.threads), s(now.threads)}},
      {"gemm_impl", {cached.gemm_impl, now.gemm_impl}},
      {"library_versions", {cached.library_versions, now.library_versions}},
      {"probe_version", {s(cached.probe_version), s(now.probe_version)}},
  };
  for (const auto& [field, values] : fields)
    if (values.first != values.second) return {field, values.first, values.second};
  return {};
}

std::string rate_text(const MachineCeilings& c, double tflops) {
  return c.device == "cpu" ? fmt::format("{:.1f} GFLOP/s", tflops * 1e3) : fmt::format("{:.1f} TFLOP/s", tflops);
}

double finite_positive(double v, const char* what) {
  PL_CHECK(std::isfinite(v) && v > 0.0, "machine ceilings: {} = {} is not a finite positive number", what, v);
  return v;
}

// A measured rate no machine has (a hand-edited or corrupt cache, e.g. 1e-300) is refused like a malformed one,
// so it is measured again rather than printed as a 300-digit percentage. The bounds are far outside any real
// device: from 1 MFLOP/s and 1 MB/s to 100 PFLOP/s and 1 PB/s.
double plausible_rate(double v, double lo, double hi, const char* what) {
  finite_positive(v, what);
  PL_CHECK(v >= lo && v <= hi, "machine ceilings: {} = {:g} is outside [{:g}, {:g}], no machine's", what, v, lo, hi);
  return v;
}

}  // namespace

const GemmCeiling* MachineCeilings::gemm_for(std::string_view format) const {
  for (const GemmCeiling& g : gemm)
    if (g.format == format) return &g;
  return nullptr;
}

const MemoryCeiling& MachineCeilings::level_for(double working_set) const {
  PL_CHECK(!memory.empty(), "machine ceilings: no memory level was measured");
  for (const MemoryCeiling& m : memory)
    if (m.capacity_bytes > 0.0 && working_set <= m.capacity_bytes) return m;
  return memory.back();
}

bool MachineCeilings::same_identity(const MachineCeilings& other) const {
  return identity_difference(*this, other).field.empty();
}

int64_t probes_measured() { return g_probes.load(); }

double datasheet_dense_tflops(std::string_view gpu_name, std::string_view format) {
  for (const DatasheetPeak& d : kDatasheet) {
    if (gpu_name.find(d.name_part) == std::string_view::npos) continue;
    if (format == "bf16") return d.bf16;
    if (format == "fp8") return d.fp8;
    if (format == "mxfp8") return d.mxfp8;
    if (format == "nvfp4") return d.nvfp4;
    return 0.0;
  }
  return 0.0;
}

namespace {
MachineCeilings identity_of(const OpContext& ctx, const DeviceIdentity& id) {
  MachineCeilings c;
  c.device = ctx.device == Device::CUDA ? "cuda" : "cpu";
  c.name = id.name;
  c.driver = id.driver;
  c.threads = id.threads;
  c.gemm_impl = id.gemm_impl;
  c.library_versions = id.library_versions;
  return c;
}
}  // namespace

MachineCeilings machine_identity(const OpContext& ctx) { return identity_of(ctx, device_identity(ctx)); }

MachineCeilings probe_machine(const OpContext& ctx, const std::vector<GemmShape>& model_shapes,
                              const ProbeLineFn& progress) {
  ++g_probes;
  const DeviceIdentity id = device_identity(ctx);
  MachineCeilings c = identity_of(ctx, id);
  c.gemm = detail::probe_gemm_roofs(ctx, detail::sweep_shapes(ctx.device, model_shapes), progress);
  if (ctx.device == Device::CUDA)
    for (GemmCeiling& g : c.gemm) g.datasheet_tflops = datasheet_dense_tflops(c.name, g.format);
  c.memory = detail::probe_memory_roofs(ctx, detail::memory_levels(ctx.device, id), progress);
  return c;
}

nlohmann::json to_json(const MachineCeilings& c) {
  nlohmann::json gemm = nlohmann::json::array(), memory = nlohmann::json::array();
  for (const GemmCeiling& g : c.gemm)
    gemm.push_back({{"format", g.format},
                    {"path", g.path},
                    {"tflops", g.tflops},
                    {"best_shape", {g.best_shape.m, g.best_shape.n, g.best_shape.k}},
                    {"datasheet_tflops", g.datasheet_tflops},
                    {"path_tflops", g.path_tflops}});
  for (const MemoryCeiling& m : c.memory)
    memory.push_back({{"level", m.level}, {"capacity_bytes", m.capacity_bytes}, {"gbps", m.gbps}});
  return {{"pretrain_llama_machine_ceilings", 1},
          {"machine",
           {{"device", c.device},
            {"name", c.name},
            {"driver", c.driver},
            {"threads", c.threads},
            {"gemm_impl", c.gemm_impl},
            {"library_versions", c.library_versions},
            {"probe_version", c.probe_version}}},
          {"gemm", std::move(gemm)},
          {"memory", std::move(memory)}};
}

MachineCeilings ceilings_from_json(const nlohmann::json& j) {
  const std::string what = "machine ceilings";
  PL_CHECK(json_field<int>(j, "pretrain_llama_machine_ceilings", what) == 1,
           "{}: field 'pretrain_llama_machine_ceilings' must be 1 (this program's format)", what);
  const nlohmann::json m = json_field<nlohmann::json>(j, "machine", what);
  MachineCeilings c;
  c.device = json_field<std::string>(m, "device", what + " machine");
  c.name = json_field<std::string>(m, "name", what + " machine");
  c.driver = json_field<std::string>(m, "driver", what + " machine");
  c.threads = json_field<int>(m, "threads", what + " machine");
  c.gemm_impl = json_field<std::string>(m, "gemm_impl", what + " machine");
  c.library_versions = json_field<std::string>(m, "library_versions", what + " machine");
  c.probe_version = json_field<int>(m, "probe_version", what + " machine");
  for (const nlohmann::json& g : json_field<nlohmann::json::array_t>(j, "gemm", what)) {
    GemmCeiling r;
    r.format = json_field<std::string>(g, "format", what + " gemm");
    r.path = json_field<std::string>(g, "path", what + " gemm");
    r.tflops = plausible_rate(json_field<double>(g, "tflops", what + " gemm"), 1e-6, 1e5, "a GEMM's tflops");
    const auto shape = json_field<std::vector<int64_t>>(g, "best_shape", what + " gemm");
    PL_CHECK(shape.size() == 3, "{} gemm: field 'best_shape' must be [m, n, k]", what);
    r.best_shape = {shape[0], shape[1], shape[2]};
    r.datasheet_tflops = json_field<double>(g, "datasheet_tflops", what + " gemm");
    r.path_tflops = json_field<double>(g, "path_tflops", what + " gemm");
    c.gemm.push_back(std::move(r));
  }
  for (const nlohmann::json& l : json_field<nlohmann::json::array_t>(j, "memory", what)) {
    MemoryCeiling r;
    r.level = json_field<std::string>(l, "level", what + " memory");
    r.capacity_bytes = json_field<double>(l, "capacity_bytes", what + " memory");
    r.gbps = plausible_rate(json_field<double>(l, "gbps", what + " memory"), 1e-3, 1e6, "a level's gbps");
    c.memory.push_back(std::move(r));
  }
  PL_CHECK(!c.memory.empty() && c.memory.back().capacity_bytes == 0.0,
           "{}: the memory levels must end with the unbounded one (capacity_bytes 0)", what);
  return c;
}

std::vector<std::string> ceilings_lines(const MachineCeilings& c) {
  std::vector<std::string> lines;
  lines.push_back(fmt::format("machine: {} | {}{} | {} {} | {} | probe v{}", c.device, c.name,
                              c.driver.empty() ? "" : " | driver " + c.driver, c.threads,
                              c.device == "cpu" ? "threads" : "SMs", c.gemm_impl, c.probe_version));
  for (const GemmCeiling& g : c.gemm) {
    std::string line = fmt::format("gemm {:<6}: {} measured (best at {}x{}x{}) | {}", g.format, rate_text(c, g.tflops),
                                   g.best_shape.m, g.best_shape.n, g.best_shape.k, g.path);
    if (g.path_tflops > 0.0) line += fmt::format(" | whole emulated op {}", rate_text(c, g.path_tflops));
    if (g.datasheet_tflops > 0.0) line += fmt::format(" | datasheet dense {:.1f} TFLOP/s", g.datasheet_tflops);
    lines.push_back(std::move(line));
  }
  for (const MemoryCeiling& m : c.memory)
    lines.push_back(fmt::format("memory {:<5}: {:.1f} GB/s ({})", m.level, m.gbps,
                                m.capacity_bytes > 0.0 ? fmt::format("holds {:.1f} MiB", m.capacity_bytes / 1048576.0)
                                                       : std::string("beyond the caches")));
  return lines;
}

namespace {

// Why the cache at `path` cannot be reused for `now` (one line for `out`), or "" when it can; `cached`
// receives what it holds.
std::string cache_refusal(const std::string& path, const MachineCeilings& now, MachineCeilings& cached) {
  try {
    cached = ceilings_from_json(parse_json_text(read_regular_file(path), path));
  } catch (const std::exception& e) {
    return fmt::format("machine ceilings cache {} is unreadable ({}); measuring again", path, e.what());
  }
  const Difference d = identity_difference(cached, now);
  if (!d.field.empty())
    return fmt::format("machine ceilings cache {} was measured for {}: {} (this run: {}); measuring again", path,
                       d.field, d.cached, d.now);
  for (const char* f : kGemmFormats)
    if (cached.gemm_for(f) == nullptr)
      return fmt::format("machine ceilings cache {} has no {} GEMM ceiling, which this machine runs; measuring again",
                         path, f);
  return "";
}

// Writes `c` to `path` atomically (its directory created first); one line to `out` when it cannot.
void write_cache(const std::string& path, const MachineCeilings& c, const ProbeLineFn& out) {
  try {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    PL_CHECK(!ec, "cannot create {}: {}", parent.string(), ec.message());
    write_file_atomically(path, to_json(c).dump(2) + "\n");
  } catch (const std::exception& e) {
    if (out) out(fmt::format("machine ceilings not cached ({}); they are measured again next run", e.what()));
  }
}

}  // namespace

void check_ceilings_cache_replaceable(const std::string& path, const std::string& flag) {
  check_replaceable_output(flag, path, "a machine ceilings cache", [](const std::string& p) {
    return json_file_lacks(p, {"pretrain_llama_machine_ceilings"});
  });
}

MachineCeilings load_or_probe(const OpContext& ctx, const std::string& cache_path,
                              const std::vector<GemmShape>& model_shapes, const ProbeLineFn& out) {
  if (cache_path.empty()) return probe_machine(ctx, model_shapes, out);
  check_ceilings_cache_replaceable(cache_path, "machine ceilings cache");
  const MachineCeilings now = machine_identity(ctx);
  std::error_code ec;
  if (std::filesystem::exists(cache_path, ec)) {
    MachineCeilings cached;
    const std::string refusal = cache_refusal(cache_path, now, cached);
    if (refusal.empty()) {
      // The datasheet table is this program's, not the cache's: a corrected figure applies at once.
      for (GemmCeiling& g : cached.gemm)
        g.datasheet_tflops = cached.device == "cuda" ? datasheet_dense_tflops(cached.name, g.format) : 0.0;
      return cached;
    }
    if (out) out(refusal);
  }
  MachineCeilings measured = probe_machine(ctx, model_shapes, out);
  write_cache(cache_path, measured, out);
  return measured;
}

MemoryCeiling probe_memory_bandwidth(const OpContext& ctx, const ProbeLineFn& progress) {
  const std::vector<detail::LevelPlan> levels = detail::memory_levels(ctx.device, device_identity(ctx));
  return detail::probe_memory_roofs(ctx, {levels.back()}, progress).front();
}

bool read_cached_ceilings(const OpContext& ctx, const std::string& cache_path, MachineCeilings& out,
                          std::string* why) {
  if (why) why->clear();
  std::error_code ec;
  if (cache_path.empty() || !std::filesystem::exists(cache_path, ec)) return false;
  MachineCeilings cached;
  const std::string refusal = cache_refusal(cache_path, machine_identity(ctx), cached);
  if (!refusal.empty()) {
    if (why) *why = refusal;
    return false;
  }
  out = std::move(cached);
  return true;
}

std::string default_ceilings_cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/pretrain_llama/machine_ceilings.json";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home != '\0') return std::string(home) + "/.cache/pretrain_llama/machine_ceilings.json";
  return "";
}

}  // namespace pl::roofline
