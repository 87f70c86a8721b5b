// The GPUs the deviceless attention check plans for (attention_graph.h: attention_targets), one row per
// architecture this program ships device code for and trains on with cuDNN SDPA. cuDNN's deviceless
// planning reads a cudnn_frontend::DeviceProperties deserialized from JSON; the backend's parser
// (libcudnn_graph, cuDNN 9.19) requires every key written below — found key by key with
// CUDNN_LOGERR_DBG=1, which names a missing one ("convert_child_from_json(json_object, "KEY", ...)"); the
// same strings name the cudaDeviceGetAttribute each key mirrors (deviceVer is major·100 + minor·10,
// driverVer is cudaDriverGetVersion's 1000·major + 10·minor).
//
// Sources of the values (none read from a device here: there is none):
//   * per-architecture limits (shared memory per block opt-in, threads and blocks per SM, registers):
//     the CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": 227 KB opt-in
//     (232448 B) for 9.0 and 10.x, 99 KB (101376 B) and 1536 threads per SM for 12.0; 64 K registers,
//     1 KB reserved shared memory per block and 48 KB without opt-in everywhere;
//   * SM counts: H100 SXM5 132 (NVIDIA H100 Tensor Core GPU Architecture whitepaper), B200 148 and
//     GB300 (Blackwell Ultra) 160 (NVIDIA's Blackwell / Blackwell Ultra technical blogs), RTX 5090 170
//     (NVIDIA RTX Blackwell GPU Architecture whitepaper);
//   * L2, memory size and clocks: the same documents' nominal figures (H100 50 MB L2, RTX 5090 96 MB);
//     the Blackwell datacenter parts' L2 and all clocks are approximate [uncertain], and the planning
//     of these graphs was seen not to depend on them (the engines are chosen by SM version, shared
//     memory and SM count).
// The driver version is CUDA 13.0's (13000): the least this toolkit's programs run on.
#include <nlohmann/json.hpp>

#include "backend/cuda/attention_graph.h"

namespace pl::cuda {

namespace {

struct TargetRow {
  const char* gpu;
  const char* device_name;  // as cudaGetDeviceProperties would report it
  int sm, sms;
  int64_t smem_optin;   // maxSharedMemoryPerBlockOptin, bytes
  int threads_per_sm;   // maxThreadsPerSM
  int64_t l2_bytes, global_mem_bytes;
  int sm_clock_khz, mem_clock_khz;
};

constexpr TargetRow kTargets[] = {
    {"H100 SXM5 80GB", "NVIDIA H100 80GB HBM3", 90, 132, 232448, 2048, 50LL << 20, 85520809984LL, 1980000, 2619000},
    {"B200", "NVIDIA B200", 100, 148, 232448, 2048, 126LL << 20, 191514624000LL, 1965000, 3996000},
    {"GB300 / B300", "NVIDIA GB300", 103, 160, 232448, 2048, 126LL << 20, 287762808832LL, 1965000, 3996000},
    {"RTX 5090", "NVIDIA GeForce RTX 5090", 120, 170, 101376, 1536, 96LL << 20, 34190917632LL, 2407000, 14001000},
};

std::string properties_json(const TargetRow& r) {
  const nlohmann::json j = {
      {"deviceName", r.device_name},
      {"deviceVer", r.sm * 10},
      {"driverVer", 13000},
      {"cudaDeviceId", 0},
      {"pciDeviceId", 0},
      {"isTccDriver", 0},
      {"supportCoopLaunch", 1},
      {"multiProcessorCount", r.sms},
      {"maxGridSize", {2147483647, 65535, 65535}},
      {"maxBlockSize", {1024, 1024, 64}},
      {"maxThreadsPerBlock", 1024},
      {"maxThreadsPerSM", r.threads_per_sm},
      {"maxCtasPerSM", 32},
      {"warpSize", 32},
      {"regsPerBlock", 65536},
      {"maxRegistersPerSM", 65536},
      {"maxSharedMemoryPerBlock", 49152},
      {"maxSharedMemoryPerBlockOptin", r.smem_optin},
      {"reservedSharedMemoryPerBlock", 1024},
      {"l2CacheSize", r.l2_bytes},
      {"totalGlobalMem", r.global_mem_bytes},
      {"smClockRateKHz", r.sm_clock_khz},
      {"memClockRateKHz", r.mem_clock_khz},
  };
  return j.dump();
}

}  // namespace

const std::vector<AttentionTarget>& attention_targets() {
  static const std::vector<AttentionTarget> targets = [] {
    std::vector<AttentionTarget> v;
    for (const TargetRow& r : kTargets) v.push_back({r.gpu, r.sm, r.sms, properties_json(r)});
    return v;
  }();
  return targets;
}

}  // namespace pl::cuda
