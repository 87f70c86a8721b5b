#include "backend/device_info.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <string_view>

#include "backend/cpu/onednn_gemm.h"
#include "backend/op_costs.h"
#include "core/error.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/attention_graph.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/smoke.h"
#endif

// OpenBLAS's description of itself (the program links OpenBLAS: CMakeLists.txt), as the app's banner uses it.
extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace pl {

std::string cpu_gemm_engine_description() { return cpu::cpu_gemm_engine().description; }

namespace {

std::string trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return std::string(s);
}

// The first line of `path` (empty when it cannot be read).
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return trimmed(line);
}

// /proc/cpuinfo's "model name" (x86), else its "Hardware" / "Processor" line (some ARM kernels), else
// "unknown CPU".
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, fallback;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trimmed(std::string_view(line).substr(0, colon));
    if (key == "model name") return trimmed(std::string_view(line).substr(colon + 1));
    if ((key == "Hardware" || key == "Processor") && fallback.empty())
      fallback = trimmed(std::string_view(line).substr(colon + 1));
  }
  return fallback.empty() ? "unknown CPU" : fallback;
}

// "1024K", "32M", "1G" (sysfs cache sizes) in bytes; 0 when unreadable.
double size_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return 0.0;
  }
  const char unit = used < text.size() ? static_cast<char>(std::toupper(static_cast<unsigned char>(text[used]))) : ' ';
  return v * (unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0);
}

// How many CPUs a sysfs cpu list ("0-1", "0,4", "0-3,8-11") names; at least 1.
int cpu_list_count(const std::string& list) {
  int count = 0;
  size_t pos = 0;
  while (pos < list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string part = list.substr(pos, comma - pos);
    const size_t dash = part.find('-');
    try {
      count += dash == std::string::npos ? 1 : std::stoi(part.substr(dash + 1)) - std::stoi(part.substr(0, dash)) + 1;
    } catch (const std::exception&) {
      count += 1;
    }
    pos = comma + 1;
  }
  return count > 0 ? count : 1;
}

// cpu 0's L2 (one CPU's share) and L3 from sysfs; sysconf's figures where sysfs has none (sysconf may give
// the whole package's L3 on a VM: sysfs describes the cache as this system sees it, so it comes first).
void cpu_caches(DeviceIdentity& id) {
  for (int i = 0; i < 16; ++i) {
    const std::string dir = fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/", i);
    const std::string level = first_line(dir + "level"), type = first_line(dir + "type");
    if (level.empty()) break;
    if (type != "Unified" && type != "Data") continue;
    const double bytes = size_bytes(first_line(dir + "size"));
    if (level == "2") id.l2_bytes = bytes / cpu_list_count(first_line(dir + "shared_cpu_list"));
    if (level == "3") id.l3_bytes = bytes;
  }
#if defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
  if (id.l2_bytes <= 0.0) id.l2_bytes = static_cast<double>(std::max(0L, sysconf(_SC_LEVEL2_CACHE_SIZE)));
  if (id.l3_bytes <= 0.0) id.l3_bytes = static_cast<double>(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
#endif
}

std::vector<std::string> cpu_gemm_banner_lines() { return {"cpu GEMMs: " + cpu_gemm_engine_description()}; }

// Each format of `used` once, by the roofline's row names ("fp8" for both FP8 encodings), with how it runs.
template <class Describe>
void add_quantized_paths(std::vector<GemmPath>& out, const std::vector<QuantFormat>& used, Describe&& describe) {
  for (QuantFormat f : used) {
    const std::string name = cost::format_row_name(f);
    if (std::none_of(out.begin(), out.end(), [&](const GemmPath& p) { return p.format == name; }))
      out.push_back(describe(f, name));
  }
}

std::vector<GemmPath> cpu_gemm_paths(const std::vector<QuantFormat>& used) {
  std::vector<GemmPath> out{{"bf16", cpu::cpu_gemm_engine().onednn_bf16, cpu_gemm_banner_lines()[0]}};
  add_quantized_paths(out, used, [](QuantFormat, const std::string& name) {
    return GemmPath{name, false, fmt::format("{} GEMMs: emulated on the cpu (each code expanded exactly with its block "
                                             "scale, BF16 GEMM with FP32 accumulation)", name)};
  });
  return out;
}

DeviceIdentity cpu_identity() {
  DeviceIdentity id;
  id.name = cpu_model_name();
  id.threads = omp_get_max_threads();
  cpu_caches(id);
  id.gemm_impl = fmt::format("{} | {} | core {}", cpu::cpu_gemm_engine().description, trimmed(openblas_get_config()),
                             trimmed(openblas_get_corename()));
#if defined(__clang__)
  const std::string compiler = "clang " __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = "GCC " __VERSION__;
#else
  const std::string compiler = "unknown compiler";
#endif
  id.library_versions = fmt::format("{} | OpenMP {}", trimmed(compiler), _OPENMP);
  if (!cpu::onednn_version().empty()) id.library_versions += " | oneDNN " + cpu::onednn_version();
  return id;
}

}  // namespace

#if defined(PL_WITH_CUDA)

LibraryVersions library_versions() { return {true, cuda::library_version_lines()}; }

LibrarySmokeTest library_smoke_test() {
  LibrarySmokeTest t{true, {}};
  bool device = false;
  for (const cuda::SmokeCheck& c : cuda::library_smoke_checks()) {
    using R = cuda::SmokeCheck::Result;
    t.lines.push_back((c.result == R::Passed ? "✓ " : c.result == R::Skipped ? "- " : "✗ ") + c.text);
    t.passed = t.passed && c.result != R::Failed;
    device = device || c.result != R::Failed;
  }
  // Only when something ran: without a device the one line says so, and nothing else is of interest.
  if (device)
    for (const std::string& l : cuda::loaded_nvidia_libraries()) t.lines.push_back("loaded " + l);
  return t;
}

DeviceStateHandle open_gpu_for_training(OpContext& ctx, bool deterministic_attention, bool sync_every_launch) {
  PL_CHECK(cuda::attention_has_cudnn_frontend(),
           "this build's CUDA attention has no cudnn-frontend headers (run scripts/setup.sh, which installs "
           "nvidia-cudnn-frontend, then reconfigure), so it cannot train on the GPU; use --device cpu");
  DeviceStateHandle state = open_device_state(Device::CUDA);
  ctx.gpu = state.get();
  ctx.gpu->deterministic_attention = deterministic_attention;
  ctx.gpu->sync_every_launch = sync_every_launch;
  return state;
}

void use_reference_quantize_kernels(const OpContext& ctx, bool on) {
  if (ctx.device == Device::CUDA) ctx.gpu->reference_quantize_kernels = on;
}

void set_gemm_algorithm_policy(const OpContext& ctx, GemmAlgorithmPolicy policy, int candidates) {
  if (ctx.device == Device::CUDA) cuda::set_gemm_algorithm_policy(*ctx.gpu, policy, candidates);
}

GemmAlgorithms gemm_algorithm_choices(const OpContext& ctx) {
  return ctx.device == Device::CUDA ? cuda::gemm_algorithm_choices(*ctx.gpu) : GemmAlgorithms{};
}

std::vector<std::string> install_gemm_algorithms(const OpContext& ctx, const GemmAlgorithms& g) {
  return ctx.device == Device::CUDA ? cuda::install_gemm_algorithms(*ctx.gpu, g) : std::vector<std::string>{};
}

std::vector<std::string> gemm_banner_lines(const OpContext& ctx, const std::vector<QuantFormat>& used) {
  if (ctx.device != Device::CUDA) return cpu_gemm_banner_lines();
  return cuda::gemm_backend_lines(*ctx.gpu, used);
}

std::vector<GemmPath> gpu_gemm_paths(const std::vector<QuantFormat>& used, int sm, bool forced_emulated) {
  std::vector<GemmPath> out{{"bf16", true, cuda::gemm_backend_lines({}, sm)[0]}};
  add_quantized_paths(out, used, [&](QuantFormat f, const std::string& name) {
    const bool native = cuda::quantized_gemm_execution(f, sm) == cuda::GemmExecution::Native;
    return GemmPath{name, native && !forced_emulated, cuda::gemm_backend_description(f, sm)};
  });
  return out;
}

std::vector<GemmPath> gemm_paths(const OpContext& ctx, const std::vector<QuantFormat>& used) {
  if (ctx.device != Device::CUDA) return cpu_gemm_paths(used);
  return gpu_gemm_paths(used, ctx.gpu->sm, ctx.gpu->force_emulated_gemm);
}

std::string prepare_attention(const OpContext& ctx, const AttentionShape& shape, double planned_workspace) {
  const cuda::AttentionPlan ap = cuda::attention_prepare(*ctx.gpu, shape);
  // Which layout cuDNN's graphs run on (backend/cuda/attention.cpp): the strided views, or the packed
  // copies with why the views were refused and what the copies take.
  std::string layout = std::string("on ") + cuda::attention_layout_name(ap.forward_layout);
  if (ap.backward_layout != ap.forward_layout)
    layout += std::string(" (backward on ") + cuda::attention_layout_name(ap.backward_layout) + ")";
  if (ap.pack_scratch_allocated > 0)
    layout += fmt::format(" ({:.1f} MiB; strided views refused: {})",
                          static_cast<double>(ap.pack_scratch_allocated) / 1048576.0, ap.strided_refusal);
  // --reset-attention-mask: the packed-sequence (THD) graphs, prepared for the largest document bucket.
  if (ap.document_bucket > 0)
    layout += fmt::format(", documents as packed sequences (largest bucket {} documents, offsets {:.1f} KiB)",
                          ap.document_bucket, static_cast<double>(ap.document_scratch_allocated) / 1024.0);
  return fmt::format("attention: cuDNN SDPA {}, backward algorithm {}{}; workspace forward {:.1f} MiB, backward "
                     "{:.1f} MiB (planned {:.1f} MiB with cuBLASLt's 32 MiB)",
                     layout, ap.deterministic_backward ? "deterministic" : "non-deterministic",
                     ap.deterministic_requested
                         ? (ap.deterministic_backward ? " (--deterministic-mode)"
                                                      : " (--deterministic-mode asked for the deterministic one; "
                                                        "cuDNN has none for this shape on this GPU)")
                         : " (the default, as Transformer Engine's; --deterministic-mode for the deterministic one)",
                     static_cast<double>(ap.forward_workspace) / 1048576.0,
                     static_cast<double>(ap.backward_workspace) / 1048576.0, planned_workspace / 1048576.0);
}

namespace {

// The NVIDIA kernel module's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64
// Kernel Module  550.54.15  ..."; the open module says "Open Kernel Module for x86_64  ..."): the first
// dotted number after "Module". Else the CUDA driver API version the runtime reports.
std::string nvidia_driver_version() {
  const std::string line = first_line("/proc/driver/nvidia/version");
  const size_t module = line.find("Module");
  if (module != std::string::npos) {
    size_t pos = module;
    while (pos < line.size()) {
      while (pos < line.size() && line[pos] == ' ') ++pos;
      const size_t end = std::min(line.find(' ', pos), line.size());
      const std::string token = line.substr(pos, end - pos);
      if (!token.empty() && std::isdigit(static_cast<unsigned char>(token[0])) && token.find('.') != std::string::npos)
        return token;
      pos = end;
    }
  }
  int drv = 0;
  if (cudaDriverGetVersion(&drv) == cudaSuccess && drv > 0)
    return fmt::format("CUDA driver API {}.{}", drv / 1000, drv / 10 % 100);
  return "unknown";
}

DeviceIdentity gpu_identity(const cuda::DeviceState& gpu) {
  DeviceIdentity id;
  id.name = gpu.name;
  id.driver = nvidia_driver_version();
  id.threads = gpu.num_sms;
  id.sm = gpu.sm;
  int l2 = 0;
  if (cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, gpu.device) == cudaSuccess) id.l2_bytes = l2;
  const size_t lt = cublasLtGetVersion();  // major*10000 + minor*100 + patch
  id.gemm_impl = fmt::format("cuBLASLt {}.{}.{} on sm_{}{}", lt / 10000, lt / 100 % 100, lt % 100, gpu.sm,
                             gpu.force_emulated_gemm ? " (quantized GEMMs forced onto the emulated path)" : "");
  for (const std::string& line : cuda::library_version_lines()) {
    if (line.rfind("device ", 0) == 0) continue;  // every visible GPU: not this one's identity
    id.library_versions += (id.library_versions.empty() ? "" : " | ") + line;
  }
  return id;
}

}  // namespace

DeviceIdentity device_identity(const OpContext& ctx) {
  if (ctx.device == Device::CPU) return cpu_identity();
  PL_CHECK(ctx.gpu != nullptr, "device_identity: the OpContext of the cuda device has no device state");
  return gpu_identity(*ctx.gpu);
}

#else

DeviceIdentity device_identity(const OpContext& ctx) {
  PL_CHECK(ctx.device == Device::CPU, "device_identity: this build has no CUDA backend");
  return cpu_identity();
}

LibraryVersions library_versions() { return {false, {"this build has no CUDA backend: no CUDA libraries to report"}}; }

LibrarySmokeTest library_smoke_test() { return {}; }

DeviceStateHandle open_gpu_for_training(OpContext&, bool, bool) {
  return open_device_state(Device::CUDA);  // a one-line error: no CUDA backend
}

std::vector<std::string> gemm_banner_lines(const OpContext&, const std::vector<QuantFormat>&) {
  return cpu_gemm_banner_lines();
}

void set_gemm_algorithm_policy(const OpContext&, GemmAlgorithmPolicy, int) {}
void use_reference_quantize_kernels(const OpContext&, bool) {}
GemmAlgorithms gemm_algorithm_choices(const OpContext&) { return {}; }
std::vector<std::string> install_gemm_algorithms(const OpContext&, const GemmAlgorithms&) { return {}; }

std::vector<GemmPath> gemm_paths(const OpContext&, const std::vector<QuantFormat>& used) { return cpu_gemm_paths(used); }

std::vector<GemmPath> gpu_gemm_paths(const std::vector<QuantFormat>&, int, bool) {
  fail("gpu_gemm_paths: this build has no CUDA backend");
}

std::string prepare_attention(const OpContext&, const AttentionShape&, double) {
  fail("prepare_attention: this build has no CUDA backend");
}

#endif

}  // namespace pl
