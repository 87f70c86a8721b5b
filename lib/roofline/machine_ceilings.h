#pragma once
// The measured limits of this machine (the hierarchical roofline's roofs, measured ERT-style rather
// than read from a datasheet): the best GEMM rate of each format the program runs here, over a sweep of
// shapes that includes the model's own GEMMs, and the bandwidth of each memory level. Cached in a file
// keyed by the machine's identity, the GEMM path, the library versions and the probe's own version.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "backend/ops.h"

namespace pl::roofline {

// Bump when what the probe measures, or how, changes: every cache is then re-measured.
inline constexpr int kProbeVersion = 1;

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;  // y[m,n] = a[m,k] · b[n,k]ᵀ
  bool operator==(const GemmShape&) const = default;
};

struct GemmCeiling {
  std::string format;             // "bf16", "fp8", "mxfp8", "nvfp4": the format of a report row's GEMM
  std::string path;               // how it runs here, e.g. "cuBLASLt native", "OpenBLAS sgemm on dequantized FP32 (emulated)"
  double tflops = 0.0;            // measured: the best over the sweep
  GemmShape best_shape;
  double datasheet_tflops = 0.0;  // this GPU's dense (not sparse) datasheet peak for the format; 0: unknown / CPU
  // An emulated format: the whole op's rate at best_shape (the expansion of the codes included), for
  // information; `tflops` is the GEMM row's alone (what the report judges a GEMM row by). 0 when native.
  double path_tflops = 0.0;
};

struct MemoryCeiling {
  std::string level;             // CPU: "L2", "L3", "DRAM"; GPU: "L2", "HBM"
  double capacity_bytes = 0.0;   // what the level holds (all threads' share together); 0: unbounded (the last)
  double gbps = 0.0;             // measured (triad / copy), 1e9 bytes per second
};

struct MachineCeilings {
  // The identity (the cache key, with probe_version).
  std::string device;            // "cpu" or "cuda"
  std::string name;              // CPU model name / GPU name
  std::string driver;            // GPU driver version; "" on the CPU
  int threads = 0;               // OpenMP threads on the CPU; SMs on the GPU
  std::string gemm_impl;         // the GEMM path: BLAS library and build / cuBLASLt version and sm
  std::string library_versions;  // backend/device_info.h library_versions()
  int probe_version = kProbeVersion;
  // The roofs.
  std::vector<GemmCeiling> gemm;      // one per format this machine runs (one no shape could run: left out, a line says why)
  std::vector<MemoryCeiling> memory;  // ascending capacity; the last is unbounded

  // The ceiling of a GEMM row of `format` (nullptr when the probe has none); a non-GEMM row's compute
  // roof is the "bf16" one (the highest rate the program reaches on dense math here).
  const GemmCeiling* gemm_for(std::string_view format) const;
  // The smallest level whose capacity holds `working_set` bytes (the last level otherwise).
  const MemoryCeiling& level_for(double working_set) const;
  bool same_identity(const MachineCeilings& other) const;  // every identity field and probe_version
};

using ProbeLineFn = std::function<void(const std::string&)>;

// Measures this machine on ctx's device (ctx.gpu set for CUDA). `progress` gets one line per roof.
// model_shapes: the model's own GEMMs (fprop, dgrad, wgrad of each linear layer and the LM head); the sweep
// adds a few squares (CPU 256..1024, GPU 1024..8192), drops duplicates and keeps the kProbeMaxShapes with
// the most FLOPs; on the CPU each side of a model shape is capped at kCpuProbeMaxSide. Every GEMM and triad
// runs through the ops and is timed by the op rows of a Timers of the probe's own (core/timers.h: steady_clock
// on the CPU, CUDA events on the GPU), the same clock the roofline report's rows are timed with.
inline constexpr size_t kProbeMaxShapes = 8;
inline constexpr int64_t kCpuProbeMaxSide = 2048;  // 3 x 2048^2 FP32 operands: 48 MiB, a second or two a GEMM
MachineCeilings probe_machine(const OpContext& ctx, const std::vector<GemmShape>& model_shapes,
                              const ProbeLineFn& progress);
// The bandwidth of the last memory level alone (HBM on a GPU, DRAM on the CPU), measured exactly as
// probe_machine measures it (the stream_triad op over arrays sized for the level, the best of several
// timings), without the GEMM sweep or the caches' levels: for a tool that needs only the memory roof
// (bench_kernels). `progress` gets the probe's one line.
MemoryCeiling probe_memory_bandwidth(const OpContext& ctx, const ProbeLineFn& progress);
// The ceilings cached at `cache_path` when that file holds this machine's identity, this probe version and
// every GEMM format (what load_or_probe would reuse); otherwise false, with the reason in *why (one line;
// "" when there is no such file). Reads only; never measures or writes.
bool read_cached_ceilings(const OpContext& ctx, const std::string& cache_path, MachineCeilings& out,
                          std::string* why);
// How many times probe_machine measured in this process (tests: a reused cache measures nothing).
int64_t probes_measured();
// The ceilings from `cache_path` when that file holds this machine's identity and this probe version;
// otherwise measured and written there (atomically). A cache of another machine or version, or one with
// a bad field, is re-measured with one line to `out` saying why. A file that is not this program's cache
// (check_ceilings_cache_replaceable) is never replaced: pl::Error. An empty cache_path: always measured,
// nothing written.
MachineCeilings load_or_probe(const OpContext& ctx, const std::string& cache_path,
                              const std::vector<GemmShape>& model_shapes, const ProbeLineFn& out);
// Throws pl::Error (naming `flag` and the file) when `path` exists and is not this program's own ceilings
// cache — a JSON object with the field "pretrain_llama_machine_ceilings", of any version — so that no run
// replaces a user's file or an input of the same command with a cache. A missing file is fine.
void check_ceilings_cache_replaceable(const std::string& path, const std::string& flag);
// The identity alone (cheap: no measurement), for comparing with a cache.
MachineCeilings machine_identity(const OpContext& ctx);
// Printable lines: identity, then each GEMM roof (with the datasheet peak where known), then each memory level.
std::vector<std::string> ceilings_lines(const MachineCeilings& c);
nlohmann::json to_json(const MachineCeilings& c);
MachineCeilings ceilings_from_json(const nlohmann::json& j);  // throws pl::Error naming the bad field
// The dense datasheet peak (TFLOP/s) of a GPU the program knows (H100, H200, B200, GB300, RTX 5090) for a
// format ("bf16", "fp8", "mxfp8", "nvfp4"); 0 when unknown.
double datasheet_dense_tflops(std::string_view gpu_name, std::string_view format);
// Default cache file: $XDG_CACHE_HOME/pretrain_llama/machine_ceilings.json, else ~/.cache/...; "" when neither is set.
std::string default_ceilings_cache_path();

}  // namespace pl::roofline
