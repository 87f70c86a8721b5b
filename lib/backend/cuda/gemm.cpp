// cuBLASLt plumbing of the CUDA GEMMs: one checked matmul with a per-shape cached algorithm, the
// device scalars of device pointer mode, and the description of what runs (gemm.h, gemm_lt.h).
// Facts followed: SPEC-GPU §2 (types, attributes, pointer modes, alignment, the row-major "TN"
// trick), SPEC-NVFP4 §6; the practice of passing each operand's actual pointer alignment as the
// MIN_ALIGNMENT preferences (cuBLASLt's default assumes 256-byte alignment) is the one NVIDIA
// TransformerEngine (common/gemm/cublaslt_gemm.cu) and PyTorch follow.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/device_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/gemm_algorithms.h"
#include "core/error.h"

namespace pl::cuda {

// ---- descriptions --------------------------------------------------------------------------------

namespace {

const char* format_label(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return "NVFP4";
    case QuantFormat::MXFP8: return "MXFP8";
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return "FP8";
  }
  return "?";
}

}  // namespace

GemmExecution quantized_gemm_execution(QuantFormat format, int sm) {
  // The one rule (backend/quantize.h), also behind gemm_native(DeviceState) and the memory plan.
  return quantized_gemm_native(format, sm) ? GemmExecution::Native : GemmExecution::Emulated;
}

std::string gemm_backend_description(QuantFormat format, int sm) {
  if (quantized_gemm_execution(format, sm) == GemmExecution::Emulated)
    return fmt::format("{} GEMMs: emulated on sm_{} (exact dequantize to BF16 + BF16 GEMM)", format_label(format), sm);
  return fmt::format("{} GEMMs: native on sm_{} (cuBLASLt, {})", format_label(format), sm,
                     format == QuantFormat::NVFP4   ? "E2M1 with VEC16_UE4M3 block scales"
                     : format == QuantFormat::MXFP8 ? "E4M3 with VEC32_UE8M0 block scales"
                                                    : "per-tensor FP32 scales");
}

std::string gemm_backend_description(int sm) {
  std::string s = fmt::format("GEMMs on sm_{}: BF16 native (cuBLASLt)", sm);
  for (QuantFormat f : {QuantFormat::FP8_E4M3, QuantFormat::MXFP8, QuantFormat::NVFP4})
    s += fmt::format("; {} {}", format_label(f),
                     quantized_gemm_execution(f, sm) == GemmExecution::Native
                         ? "native (cuBLASLt)"
                         : "emulated (exact dequantize to BF16 + BF16 GEMM)");
  return s;
}

std::vector<std::string> gemm_backend_lines(const std::vector<QuantFormat>& used, int sm) {
  std::vector<std::string> lines{fmt::format("BF16 GEMMs: native on sm_{} (cuBLASLt, FP32 accumulation)", sm)};
  std::vector<std::string> seen;  // FP8_E4M3 and FP8_E5M2 share one line
  for (QuantFormat f : used) {
    const std::string label = format_label(f);
    if (std::find(seen.begin(), seen.end(), label) != seen.end()) continue;
    seen.push_back(label);
    lines.push_back(gemm_backend_description(f, sm));
  }
  return lines;
}

std::vector<std::string> gemm_backend_lines(const DeviceState& state, const std::vector<QuantFormat>& used) {
  std::vector<std::string> lines = gemm_backend_lines(used, state.sm);
  if (state.force_emulated_gemm) lines.push_back("quantized GEMMs forced onto the emulated path (test hook)");
  return lines;
}

std::string gemm_backend_description(const OpContext& ctx) {
  if (ctx.device == Device::CPU)
    return "GEMMs on the CPU: BF16 products with FP32 accumulation (oneDNN BF16 matmul, or FP32 OpenBLAS SGEMM "
           "without it); FP8, MXFP8 and NVFP4 emulated (codes expanded exactly with their block scales, same GEMM)";
  std::string s = gemm_backend_description(ctx.gpu->sm);
  if (ctx.gpu->force_emulated_gemm) s += " [quantized GEMMs forced onto the emulated path]";
  return s;
}

uint64_t emulated_gemm_inexact_elements(const DeviceState& state) {
  unsigned long long n = 0;
  check(cudaMemcpy(&n, state.scalars.inexact, sizeof n, cudaMemcpyDeviceToHost), "emulated_gemm_inexact_elements",
        "cudaMemcpy of the counter");
  return static_cast<uint64_t>(n);
}

// ---- one cuBLASLt matmul ---------------------------------------------------------------------------

const char* lt_type_name(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_16BF: return "bf16";
    case CUDA_R_32F: return "f32";
    case CUDA_R_16F: return "f16";
    case CUDA_R_8F_E4M3: return "e4m3";
    case CUDA_R_8F_E5M2: return "e5m2";
    case CUDA_R_4F_E2M1: return "e2m1";
    default: return "?";
  }
}

namespace {

const char* scale_mode_name(cublasLtMatmulMatrixScale_t m) {
  switch (m) {
    case CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: return "SCALAR_32F";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3: return "VEC16_UE4M3";
    case CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: return "VEC32_UE8M0";
    default: return "?";
  }
}

// The op's shapes plus the cuBLASLt view, for every error message of this matmul.
std::string describe(const LtMatmul& g) {
  return fmt::format("{} (cuBLASLt {}{} m={} n={} k={}, A {} ld {}, B {} ld {}, D {} ld {}, {}{}, alpha {}{})", g.what,
                     g.transa == CUBLAS_OP_T ? 'T' : 'N', g.transb == CUBLAS_OP_T ? 'T' : 'N', g.m, g.n, g.k,
                     lt_type_name(g.a_type), g.lda, lt_type_name(g.b_type), g.ldb, lt_type_name(g.d_type), g.ldd,
                     scale_mode_name(g.scale_mode), g.a_scale || g.b_scale ? " scales" : "",
                     g.alpha_device ? "device" : "host", g.accumulate ? ", beta 1" : "");
}

// Largest power of two (<= 256) dividing the address: what the algorithm may assume.
uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

struct PlanKey {
  int32_t transa, transb;
  int64_t m, n, k, lda, ldb, ldd;
  int32_t a_type, b_type, d_type, scale_mode;
  bool device_pointers, a_scale, b_scale, quantized, fast_accum;
  uint32_t align_a, align_b, align_d;
  auto tie() const {
    return std::tie(transa, transb, m, n, k, lda, ldb, ldd, a_type, b_type, d_type, scale_mode, device_pointers,
                    a_scale, b_scale, quantized, fast_accum, align_a, align_b, align_d);
  }
  bool operator<(const PlanKey& o) const { return tie() < o.tie(); }
};

// The key as text (GemmAlgorithmChoice::key): the same on every rank and run of one model and its flags.
std::string key_text(const PlanKey& k) {
  return fmt::format("{}{} m={} n={} k={} ld={}/{}/{} {}x{}->{} {} {}{} align={}/{}/{}", k.transa == CUBLAS_OP_T ? 'T' : 'N',
                     k.transb == CUBLAS_OP_T ? 'T' : 'N', k.m, k.n, k.k, k.lda, k.ldb, k.ldd,
                     lt_type_name(static_cast<cudaDataType_t>(k.a_type)), lt_type_name(static_cast<cudaDataType_t>(k.b_type)),
                     lt_type_name(static_cast<cudaDataType_t>(k.d_type)),
                     scale_mode_name(static_cast<cublasLtMatmulMatrixScale_t>(k.scale_mode)),
                     k.device_pointers ? "device-alpha" : "host-alpha", k.fast_accum ? " fast-accum" : "", k.align_a,
                     k.align_b, k.align_d);
}

// Everything cuBLASLt needs for one key, made once: the matmul descriptor (every attribute but the
// scale pointers, which are written per call), the A, B and C/D layouts and the chosen algorithm
// (backend/gemm_algorithms.h). Kept for the life of the device state (a handful per model shape).
struct LtPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulAlgo_t algo{};
  GemmAlgorithmChoice choice;  // what was chosen and how (its key, the algorithm's bytes, timings)
};

// RAII owner of the preference, used only while a plan is made.
struct Preference {
  cublasLtMatmulPreference_t h = nullptr;
  ~Preference() {
    if (h) cublasLtMatmulPreferenceDestroy(h);
  }
};

PlanKey key_of(const LtMatmul& g) {
  return PlanKey{static_cast<int32_t>(g.transa), static_cast<int32_t>(g.transb), g.m, g.n, g.k, g.lda, g.ldb, g.ldd,
                 static_cast<int32_t>(g.a_type), static_cast<int32_t>(g.b_type), static_cast<int32_t>(g.d_type),
                 static_cast<int32_t>(g.scale_mode), g.alpha_device != nullptr, g.a_scale != nullptr,
                 g.b_scale != nullptr, g.quantized_inputs, g.quantized_inputs && g.fast_accum, alignment_of(g.A),
                 alignment_of(g.B), alignment_of(g.D)};
}

// The heuristic's first `wanted` algorithms for plan p (descriptor and layouts made), within the device state's
// workspace and for the operands' pointer alignments; at least one.
template <class Check>
std::vector<cublasLtMatmulHeuristicResult_t> heuristic_algorithms(const DeviceState& state, const PlanKey& k,
                                                                  const LtPlan& p, int wanted, Check chk) {
  Preference pref;
  chk(cublasLtMatmulPreferenceCreate(&pref.h), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = state.workspace_bytes;
  chk(cublasLtMatmulPreferenceSetAttribute(pref.h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws),
      "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)");
  // The operands' pointer alignments (C and D are the same buffer).
  const struct {
    cublasLtMatmulPreferenceAttributes_t attr;
    uint32_t bytes;
    const char* name;
  } aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, k.align_a,
       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)"},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, k.align_b,
       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)"},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, k.align_d,
       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)"},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, k.align_d,
       "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)"}};
  for (const auto& a : aligns)
    chk(cublasLtMatmulPreferenceSetAttribute(pref.h, a.attr, &a.bytes, sizeof a.bytes), a.name);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(std::max(1, wanted)));
  int returned = 0;
  chk(cublasLtMatmulAlgoGetHeuristic(state.lt, p.desc, p.la, p.lb, p.ld, p.ld, pref.h, static_cast<int>(results.size()),
                                     results.data(), &returned),
      "cublasLtMatmulAlgoGetHeuristic");
  if (returned == 0) chk(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic returned no algorithm");
  results.resize(static_cast<size_t>(returned));
  chk(results[0].state, "cublasLtMatmulAlgoGetHeuristic (result state)");
  // (A later result that is not SUCCESS is dropped: only usable candidates are timed.)
  std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) { return r.state != CUBLAS_STATUS_SUCCESS; });
  return results;
}

// "id 31 tile 7 stages 18 split-k 1 reduction 0": the algorithm's configuration, for the banner and the list.
std::string algorithm_description(const cublasLtMatmulAlgo_t& a) {
  const auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto value) {
    size_t written = 0;
    return cublasLtMatmulAlgoConfigGetAttribute(&a, attr, &value, sizeof value, &written) == CUBLAS_STATUS_SUCCESS
               ? static_cast<int64_t>(value)
               : int64_t{-1};
  };
  return fmt::format("id {} tile {} stages {} split-k {} reduction {}", get(CUBLASLT_ALGO_CONFIG_ID, int32_t{0}),
                     get(CUBLASLT_ALGO_CONFIG_TILE_ID, uint32_t{0}), get(CUBLASLT_ALGO_CONFIG_STAGES_ID, uint32_t{0}),
                     get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, int32_t{0}),
                     get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, uint32_t{0}));
}

std::array<uint64_t, 8> algorithm_bytes(const cublasLtMatmulAlgo_t& a) {
  static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(std::array<uint64_t, 8>));
  std::array<uint64_t, 8> words{};
  std::memcpy(words.data(), &a, sizeof a);
  return words;
}

cublasLtMatmulAlgo_t algorithm_of(const std::array<uint64_t, 8>& words) {
  cublasLtMatmulAlgo_t a{};
  std::memcpy(&a, words.data(), sizeof a);
  return a;
}

// Whether cuBLASLt accepts `algo` for plan p here (a checkpoint's algorithm on another GPU or library may not).
bool algorithm_valid(const DeviceState& state, const LtPlan& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t r{};
  return cublasLtMatmulAlgoCheck(state.lt, p.desc, p.la, p.lb, p.ld, p.ld, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= state.workspace_bytes;
}

// Makes the plan of key k (the first call with it) but its algorithm (choose_algorithm); chk checks every
// cuBLASLt status. On an error the partly made plan is destroyed.
template <class Check>
LtPlan make_plan(const PlanKey& k, const LtMatmul& g, Check chk) {
  struct Owner {  // destroys a partly made plan if a call below throws
    LtPlan p;
    bool keep = false;
    ~Owner() {
      if (keep) return;
      if (p.desc) cublasLtMatmulDescDestroy(p.desc);
      if (p.la) cublasLtMatrixLayoutDestroy(p.la);
      if (p.lb) cublasLtMatrixLayoutDestroy(p.lb);
      if (p.ld) cublasLtMatrixLayoutDestroy(p.ld);
    }
  } o;
  LtPlan& p = o.p;
  chk(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes, const char* name) {
    chk(cublasLtMatmulDescSetAttribute(p.desc, attr, v, bytes), name);
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &k.transa, sizeof k.transa, "cublasLtMatmulDescSetAttribute(TRANSA)");
  set(CUBLASLT_MATMUL_DESC_TRANSB, &k.transb, sizeof k.transb, "cublasLtMatmulDescSetAttribute(TRANSB)");
  const int32_t pointer_mode = k.device_pointers ? CUBLASLT_POINTER_MODE_DEVICE : CUBLASLT_POINTER_MODE_HOST;
  set(CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode, sizeof pointer_mode,
      "cublasLtMatmulDescSetAttribute(POINTER_MODE)");
  if (k.quantized) {
    // 0: split accumulation (FP32 promotion as the hardware allows); 1 only where the caller asks
    // (FP8 fprop, as TE: see linear.cu).
    const int8_t fast_accum = k.fast_accum ? 1 : 0;
    set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum, sizeof fast_accum, "cublasLtMatmulDescSetAttribute(FAST_ACCUM)");
  }
  if (k.scale_mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F) {
    set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &k.scale_mode, sizeof k.scale_mode,
        "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
    set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &k.scale_mode, sizeof k.scale_mode,
        "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
  }
  // The scale pointers take part in the heuristic query; the call's own ones are written again
  // before every launch.
  if (g.a_scale) set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof g.a_scale,
                     "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  if (g.b_scale) set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof g.b_scale,
                     "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");

  // Layouts (column-major): op(A) is m x k, op(B) is k x n, C = D is m x n.
  const bool an = g.transa == CUBLAS_OP_N, bn = g.transb == CUBLAS_OP_N;
  chk(cublasLtMatrixLayoutCreate(&p.la, g.a_type, static_cast<uint64_t>(an ? g.m : g.k),
                                 static_cast<uint64_t>(an ? g.k : g.m), g.lda),
      "cublasLtMatrixLayoutCreate(A)");
  chk(cublasLtMatrixLayoutCreate(&p.lb, g.b_type, static_cast<uint64_t>(bn ? g.k : g.n),
                                 static_cast<uint64_t>(bn ? g.n : g.k), g.ldb),
      "cublasLtMatrixLayoutCreate(B)");
  chk(cublasLtMatrixLayoutCreate(&p.ld, g.d_type, static_cast<uint64_t>(g.m), static_cast<uint64_t>(g.n), g.ldd),
      "cublasLtMatrixLayoutCreate(C/D)");

  o.keep = true;
  return p;
}

}  // namespace

// The plans of one device state (node-based map: a plan's address is stable), and how their algorithms are
// chosen (backend/gemm_algorithms.h).
struct LtPlanCache {
  std::mutex mu;
  std::map<PlanKey, LtPlan> plans;
  GemmAlgorithmPolicy policy = GemmAlgorithmPolicy::Heuristic;
  int candidates = 1;
  std::map<std::string, GemmAlgorithmChoice> installed;  // by key: a plan of that key takes it (if valid here)
  static void destroy(LtPlan& p) {
    cublasLtMatmulDescDestroy(p.desc);
    cublasLtMatrixLayoutDestroy(p.la);
    cublasLtMatrixLayoutDestroy(p.lb);
    cublasLtMatrixLayoutDestroy(p.ld);
  }
  ~LtPlanCache() {
    for (auto& [key, p] : plans) destroy(p);
  }
};

std::shared_ptr<LtPlanCache> make_lt_plan_cache() { return std::make_shared<LtPlanCache>(); }

size_t lt_plan_count(const DeviceState& state) {
  std::lock_guard<std::mutex> lock(state.plans->mu);
  return state.plans->plans.size();
}

namespace {

constexpr int kTimedCalls = 5;  // per candidate, after one warm-up call

// The mean time per call of `algo` on the call's own operands (one warm-up, then kTimedCalls between two
// events on the compute stream), in ms; negative when cuBLASLt refuses to run it. It writes g.D each time.
double time_algorithm(DeviceState& state, const LtPlan& p, const cublasLtMatmulAlgo_t& algo, const LtMatmul& g,
                      const void* alpha, const void* beta) {
  const auto run = [&] {
    return cublasLtMatmul(state.lt, p.desc, alpha, g.A, p.la, g.B, p.lb, beta, g.D, p.ld, g.D, p.ld, &algo,
                          state.workspace, state.workspace_bytes, state.stream);
  };
  if (run() != CUBLAS_STATUS_SUCCESS) return -1.0;
  cudaEvent_t ev[2] = {nullptr, nullptr};
  const std::string what = "timing a cuBLASLt algorithm for " + describe(g);
  for (cudaEvent_t& e : ev) check(cudaEventCreate(&e), g.op, what + " (cudaEventCreate)");
  check(cudaEventRecord(ev[0], state.stream), g.op, what + " (cudaEventRecord)");
  bool ok = true;
  for (int i = 0; i < kTimedCalls && ok; ++i) ok = run() == CUBLAS_STATUS_SUCCESS;
  check(cudaEventRecord(ev[1], state.stream), g.op, what + " (cudaEventRecord)");
  check(cudaEventSynchronize(ev[1]), g.op, what + " (cudaEventSynchronize)");
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, ev[0], ev[1]), g.op, what + " (cudaEventElapsedTime)");
  for (cudaEvent_t e : ev) check(cudaEventDestroy(e), g.op, what + " (cudaEventDestroy)");
  return ok ? static_cast<double>(ms) / kTimedCalls : -1.0;
}

// The algorithm of a new plan: the installed one for its key where cuBLASLt accepts it here; else, timed, the
// fastest of the heuristic's first `candidates` (ties: the earlier); else the heuristic's first.
template <class Check>
void choose_algorithm(DeviceState& state, const LtPlanCache& cache, const PlanKey& k, LtPlan& p, const LtMatmul& g,
                      const void* alpha, const void* beta, Check chk) {
  const std::string key = key_text(k);
  if (const auto it = cache.installed.find(key); it != cache.installed.end()) {
    const cublasLtMatmulAlgo_t a = algorithm_of(it->second.algo);
    if (algorithm_valid(state, p, a)) {
      p.algo = a;
      p.choice = it->second;
      return;
    }
  }
  const bool timed = cache.policy == GemmAlgorithmPolicy::Timed;
  const std::vector<cublasLtMatmulHeuristicResult_t> r = heuristic_algorithms(state, k, p, timed ? cache.candidates : 1, chk);
  int best = 0;
  double first = 0.0, best_ms = 0.0;
  if (timed && r.size() > 1) {
    for (size_t i = 0; i < r.size(); ++i) {
      const double ms = time_algorithm(state, p, r[i].algo, g, alpha, beta);
      if (i == 0) first = best_ms = ms;
      if (ms >= 0.0 && (best_ms < 0.0 || ms < best_ms)) {
        best = static_cast<int>(i);
        best_ms = ms;
      }
    }
  }
  p.algo = r[static_cast<size_t>(best)].algo;
  p.choice = {.key = key,
              .algo = algorithm_bytes(p.algo),
              .description = algorithm_description(p.algo),
              .source = timed && r.size() > 1 ? "timed" : "heuristic",
              .candidates = timed ? static_cast<int>(r.size()) : 1,
              .chosen = best,
              .heuristic_ms = std::max(0.0, first),
              .chosen_ms = std::max(0.0, best_ms)};
}

}  // namespace

void set_gemm_algorithm_policy(DeviceState& state, GemmAlgorithmPolicy policy, int candidates) {
  std::lock_guard<std::mutex> lock(state.plans->mu);
  state.plans->policy = policy;
  state.plans->candidates = std::max(1, candidates);
}

GemmAlgorithms gemm_algorithm_choices(const DeviceState& state) {
  std::lock_guard<std::mutex> lock(state.plans->mu);
  GemmAlgorithms g;
  g.device = fmt::format("{} (sm_{}), cuBLASLt {}", state.name, state.sm, cublasLtGetVersion());
  for (const auto& [key, p] : state.plans->plans) g.choices.push_back(p.choice);
  return g;
}

std::vector<std::string> install_gemm_algorithms(DeviceState& state, const GemmAlgorithms& g) {
  std::lock_guard<std::mutex> lock(state.plans->mu);
  std::vector<std::string> refused;
  for (const GemmAlgorithmChoice& c : g.choices) {
    state.plans->installed[c.key] = c;
    for (auto& [key, p] : state.plans->plans) {
      if (p.choice.key != c.key) continue;
      const cublasLtMatmulAlgo_t a = algorithm_of(c.algo);
      if (!algorithm_valid(state, p, a)) {
        refused.push_back(c.key + " (" + c.description + ")");
        continue;
      }
      p.algo = a;
      p.choice = c;
    }
  }
  return refused;
}

void lt_matmul(DeviceState& state, const LtMatmul& g) {
  // The message (shapes, cuBLASLt view) is formatted only when a call fails.
  auto chk = [&](cublasStatus_t st, const char* call) {
    if (st != CUBLAS_STATUS_SUCCESS) check(st, g.op, std::string(call) + ": " + describe(g));
  };
  // cuBLASLt 13.1's FP8 kernels on sm_90 answer a scale pointer that is only 4-byte aligned with a bare
  // CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul, after the heuristic chose an algorithm for it (first
  // H200 run, 2026-11-28): the quantized copies keep scale_inv 256-byte aligned; anything else is named here.
  for (const void* s : {g.a_scale, g.b_scale})
    PL_CHECK(s == nullptr || reinterpret_cast<uintptr_t>(s) % 16 == 0,
             "{}: {}: a scale pointer ({}) is not 16-byte aligned, which cuBLASLt refuses", g.op, describe(g), s);
  const PlanKey key = key_of(g);
  LtPlanCache& cache = *state.plans;
  // Held through the launch: the cached descriptor is written (scale pointers) and read by it.
  std::lock_guard<std::mutex> lock(cache.mu);
  auto it = cache.plans.find(key);
  const bool made = it == cache.plans.end();
  if (made) it = cache.plans.emplace(key, make_plan(key, g, chk)).first;
  LtPlan& p = it->second;
  if (g.a_scale)
    chk(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &g.a_scale, sizeof g.a_scale),
        "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  if (g.b_scale)
    chk(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &g.b_scale, sizeof g.b_scale),
        "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");

  const float beta_host = g.accumulate ? 1.0f : 0.0f;
  const void* alpha = g.alpha_device ? static_cast<const void*>(g.alpha_device) : &g.alpha_host;
  const void* beta = g.alpha_device ? static_cast<const void*>(g.accumulate ? state.scalars.one : state.scalars.zero)
                                    : static_cast<const void*>(&beta_host);
  if (made) {  // (a plan whose choice throws is removed: the next call makes it again)
    try {
      choose_algorithm(state, cache, key, p, g, alpha, beta, chk);
    } catch (...) {
      LtPlanCache::destroy(p);
      cache.plans.erase(it);
      throw;
    }
  }
  chk(cublasLtMatmul(state.lt, p.desc, alpha, g.A, p.la, g.B, p.lb, beta, g.D, p.ld, g.D, p.ld, &p.algo,
                     state.workspace, state.workspace_bytes, state.stream),
      "cublasLtMatmul");
  // --cuda-sync-every-launch: a fault inside the GEMM is reported here, naming it, not by the next op.
  if (state.sync_every_launch) sync_after_launch(g.op, "cublasLtMatmul: " + describe(g));
}

}  // namespace pl::cuda
