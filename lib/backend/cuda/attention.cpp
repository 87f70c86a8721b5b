// CUDA causal grouped-query attention: cuDNN's fused flash-attention (SDPA) forward and backward,
// built through the cudnn-frontend C++ graph API.
//
// Why the frontend and not the cuDNN backend C API (SPEC-GPU §1.1, §1.7): the frontend is the
// well-trodden path (karpathy/llm.c llmc/cudnn_att.cpp, PyTorch, TransformerEngine). It expands SDPA
// into exactly the composite operation graph the fused engines pattern-match, for whichever cuDNN it
// finds at run time, and it knows the per-version and per-architecture rules (GQA, deterministic
// backward on Blackwell ≥ 9.18, head-dim limits). Writing that graph by hand with the backend API is
// 500–800 lines whose only failure mode is an unexplained NOT_SUPPORTED that cannot be investigated
// without a GPU (its heuristics return no engine at all on a CPU-only machine), so it is the riskier
// choice for code that is written where it cannot run.
//
// Getting the headers: the PyPI wheel nvidia-cudnn-frontend (pinned 1.32.0 in scripts/setup.sh,
// installed with --no-deps: only the headers are used) ships them as <site-packages>/include/
// cudnn_frontend.h. The top-level CMakeLists.txt finds them (or -DCUDNN_FRONTEND_INCLUDE_DIR=...) and
// gives this file, and only this file, the include path and PL_HAVE_CUDNN_FRONTEND. Without the
// headers this file still compiles and both ops fail at run time, saying how to get them.
// CUDNN_FRONTEND_SKIP_JSON_LIB keeps the frontend's bundled nlohmann::json (graph serialization, not
// used here) out of the program, which links the system nlohmann_json. One g++ translation unit
// (frontend TUs are slow to compile, ≈1 min); it links against libcudnn and cudart only (1.32 reaches
// the driver through the runtime).
//
// Tensors given to cuDNN (logical dims are always (batch, heads, seq, head_dim); the layout is in the
// strides, in elements; W = (nq + 2 nkv) d is the qkv row width, B batch, S seq):
//   Q    dims {B, nq,  S, d}  strides {S W, d, W, 1}          at qkv                 (bf16)
//   K    dims {B, nkv, S, d}  strides {S W, d, W, 1}          at qkv + nq d          (bf16)
//   V    dims {B, nkv, S, d}  strides {S W, d, W, 1}          at qkv + (nq + nkv) d  (bf16)
//   O    dims {B, nq,  S, d}  strides {S nq d, d, nq d, 1}    = out[T, nq d]         (bf16)
//   dO   like O, at dout; dQ/dK/dV like Q/K/V, at dqkv (same offsets)               (bf16)
//   Stats dims {B, nq, S, 1}  strides {nq S, S, 1, 1}         = lse[B, nq, S]        (fp32)
// so Q, K and V (and dQ, dK, dV) are strided views into the packed rows: no copies, no pack kernel.
// The qkv pointers are 16-byte aligned when the buffers are (cudaMalloc: 256) and d % 8 == 0, which
// cuDNN requires anyway.
//
// Semantics against the CPU reference (lib/backend/cpu/attention.cpp):
//   * causal: diagonal alignment TOP_LEFT with right bound 0 (what set_causal_mask does): query row i
//     sees keys j <= i, as on the CPU (equal query and key lengths).
//   * scale 1/sqrt(d) as a graph constant (set_attn_scale(float)); the cache key includes d.
//   * GQA: K/V have nkv heads; cuDNN maps query head j to kv head j / (nq / nkv), the same grouping as
//     the CPU; the backward sums dK/dV over the group.
//   * Stats: cuDNN's Stats is max + ln Σ exp(x − max) over the scaled, masked logits x (natural log;
//     set_stats_use_log2 is left off), i.e. exactly the CPU's lse = m + log(sum) of the scaled scores.
//     No conversion is needed, and the backward consumes the CPU's lse unchanged.
//   * precision: BF16 I/O, FP32 intermediates and compute. Inside the flash kernel P is rounded to
//     BF16 before P·V (and dS before its GEMMs), unlike the CPU, which keeps them in FP32; results
//     therefore agree with the CPU to BF16-level tolerances, not bit for bit.
//   * ctx.round_bf16 has no effect here: the outputs are BF16 tensors, rounded by construction.
//   * determinism: by default the backward lets cuDNN pick its fastest algorithm, which may accumulate
//     dQ with atomics (run-to-run differences in the last bits): Transformer Engine's default, where
//     NVTE_ALLOW_NONDETERMINISTIC_ALGO defaults to "1" (transformer_engine/pytorch/attention/
//     dot_product_attention/dot_product_attention.py: self.deterministic = not
//     bool(int(os.getenv("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "1"))) or
//     torch.are_deterministic_algorithms_enabled()). DeviceState::deterministic_attention — pretrain_llama
//     --deterministic-mode, Megatron's flag (megatron/training/arguments.py: "Choose code that has
//     deterministic execution. This usually means slower execution, but is good for debugging and
//     testing."), which Megatron pairs with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 — asks for cuDNN's
//     deterministic algorithm (as llm.c does). On Hopper that is the dP-workspace path, whose
//     workspace is about B·nq·S²·2 bytes (1 GiB at B=1, nq=32, S=4096); the default path needs FP32
//     dQ accumulators instead, about B·nq·S·(4 + 4 d) bytes. If cuDNN refuses a deterministic backward
//     for a configuration, the graph is rebuilt without it and a one-line notice goes to stderr;
//     attention_prepare() reports which algorithm was built and the workspace it asked for.
//
// Graphs are built once per (B, S, nq, nkv, d, direction, deterministic) and cached for the life of the process
// (building is the slow part: tens to hundreds of ms) in the device state (AttentionGraphs, destroyed
// with it). The workspace is one grow-only device Buffer shared by all graphs: it is reallocated only
// when a newly built graph needs more, never per call. All work runs on the state's compute stream.
//
// What runs without a GPU: the argument checks, and the frontend's validation of both graphs for a
// given target architecture (attention_graph.h; tests CudaAttentionArgs, CudaAttentionGraph). With
// set_sm_version given before the SDPA node is added, frontend 1.32's validate() does not call the
// CUDA runtime. (SPEC-GPU §1.1 saw validate() call cudaGetDevice after set_sm_version: that is what
// happens when the version is set after the node is added — the node keeps its own copy of the context.)
// build_operation_graph, the engine heuristics, plan building and execution need a handle, hence a
// GPU: they are checked by the CudaAttention tests on a GPU.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "backend/cuda/attention_graph.h"
#include "backend/cuda/device_state.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_ops.h"
#include "core/error.h"
#include "core/tensor.h"

#if defined(PL_HAVE_CUDNN_FRONTEND)
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>
#endif

namespace pl::cuda {

namespace {

std::string shape_text(const AttentionShape& s) {
  return fmt::format("batch={} seq={} q_heads={} kv_heads={} head_dim={}", s.batch, s.seq, s.q_heads,
                     s.kv_heads, s.head_dim);
}

// attention_prepare's shape (the ops' arguments are checked in backend/op_checks.cpp, with the same rules).
void check_shape(const char* op, const AttentionShape& s) {
  PL_CHECK(s.batch > 0 && s.seq > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
               s.q_heads % s.kv_heads == 0,
           "{}: invalid shape {} (q_heads must be a multiple of kv_heads)", op, shape_text(s));
  // cuDNN SDPA: head dim a multiple of 8 (16-byte aligned rows of bf16), at most 256 on Hopper and
  // 128 for the Blackwell backward; the finer limits are cuDNN's to report.
  PL_CHECK(s.head_dim % 8 == 0 && s.head_dim <= 256,
           "{}: cuDNN attention needs head_dim a multiple of 8 and at most 256, got {}", op, shape_text(s));
}

}  // namespace

#if defined(PL_HAVE_CUDNN_FRONTEND)

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

const char* fe_code_name(fe::error_code_t c) {
  switch (c) {
    case fe::error_code_t::OK: return "OK";
    case fe::error_code_t::ATTRIBUTE_NOT_SET: return "ATTRIBUTE_NOT_SET";
    case fe::error_code_t::SHAPE_DEDUCTION_FAILED: return "SHAPE_DEDUCTION_FAILED";
    case fe::error_code_t::INVALID_TENSOR_NAME: return "INVALID_TENSOR_NAME";
    case fe::error_code_t::INVALID_VARIANT_PACK: return "INVALID_VARIANT_PACK";
    case fe::error_code_t::GRAPH_NOT_SUPPORTED: return "GRAPH_NOT_SUPPORTED";
    case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED: return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
    case fe::error_code_t::GRAPH_EXECUTION_FAILED: return "GRAPH_EXECUTION_FAILED";
    case fe::error_code_t::HEURISTIC_QUERY_FAILED: return "HEURISTIC_QUERY_FAILED";
    case fe::error_code_t::CUDNN_BACKEND_API_FAILED: return "CUDNN_BACKEND_API_FAILED";
    case fe::error_code_t::CUDA_API_FAILED: return "CUDA_API_FAILED";
    case fe::error_code_t::INVALID_CUDA_DEVICE: return "INVALID_CUDA_DEVICE";
    case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT: return "UNSUPPORTED_GRAPH_FORMAT";
    case fe::error_code_t::HANDLE_ERROR: return "HANDLE_ERROR";
    case fe::error_code_t::INVALID_VALUE: return "INVALID_VALUE";
    case fe::error_code_t::NVRTC_COMPILATION_FAILED: return "NVRTC_COMPILATION_FAILED";
    default: return "error";
  }
}

// The frontend reports through error objects, not cudnnStatus_t: same one-line shape as check().
std::string fe_error_text(const fe::error_object& e) {
  return fmt::format("cuDNN frontend error {}: {}", fe_code_name(e.code), e.err_msg);
}

void fe_check(const fe::error_object& e, const char* op, const std::string& what) {
  if (e.is_good()) return;
  throw_error(std::string(op) + " " + what + ": " + fe_error_text(e));
}

enum class Direction : int { Forward = 0, Backward = 1 };
// B, S, nq, nkv, d, direction, deterministic requested (always false for the forward)
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool>;

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  bool deterministic = false;  // the algorithm built (a refused deterministic request falls back)
  int64_t workspace = 0;       // get_workspace_size() of the plan
};

}  // namespace

// The graphs of one device state and their shared grow-only workspace (all run on its compute
// stream, in order).
struct AttentionGraphs {
  std::mutex mu;
  std::map<Key, Built> graphs;
  Buffer workspace;
};

std::shared_ptr<AttentionGraphs> make_attention_graphs() { return std::make_shared<AttentionGraphs>(); }

namespace {

AttentionGraphs& graphs_of(DeviceState& state) { return *state.attention; }

std::shared_ptr<fe::graph::Tensor_attributes> bhsd(fe::graph::Graph& g, const char* name, int64_t uid, int64_t B,
                                                   int64_t H, int64_t S, int64_t d, int64_t row_stride) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({B, H, S, d})
                      .set_stride({S * row_stride, d, row_stride, 1}));
}

// Runs the frontend's build steps one by one, so an error names the step that failed.
fe::error_object build_steps(fe::graph::Graph& g, cudnnHandle_t handle, std::string* step) {
  *step = "validate";
  if (auto e = g.validate(); e.is_bad()) return e;
  *step = "build_operation_graph";
  if (auto e = g.build_operation_graph(handle); e.is_bad()) return e;
  *step = "create_execution_plans";
  if (auto e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad()) return e;
  *step = "check_support";
  if (auto e = g.check_support(handle); e.is_bad()) return e;
  *step = "build_plans";
  return g.build_plans(handle);
}

// sm: the target's compute capability ×10 (the device state's); given before the SDPA node is
// added, so that node's checks use it instead of asking the CUDA runtime.
std::shared_ptr<fe::graph::Graph> make_graph(const AttentionShape& s, Direction dir, bool deterministic, int sm) {
  const int64_t B = s.batch, S = s.seq, nq = s.q_heads, nkv = s.kv_heads, d = s.head_dim;
  const int64_t W = (nq + 2 * nkv) * d;  // qkv / dqkv row width
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(sm);
  auto Q = bhsd(*g, "Q", kQ, B, nq, S, d, W);
  auto K = bhsd(*g, "K", kK, B, nkv, S, d, W);
  auto V = bhsd(*g, "V", kV, B, nkv, S, d, W);
  if (dir == Direction::Forward) {
    auto attrs = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(scale)
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0);
    auto [O, Stats] = g->sdpa(Q, K, V, attrs);
    O->set_output(true).set_uid(kO).set_dim({B, nq, S, d}).set_stride({S * nq * d, d, nq * d, 1});
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, nq, S, 1})
        .set_stride({nq * S, S, 1, 1});
  } else {
    auto O = bhsd(*g, "O", kO, B, nq, S, d, nq * d);
    auto dO = bhsd(*g, "dO", kdO, B, nq, S, d, nq * d);
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_data_type(fe::DataType_t::FLOAT)
                               .set_dim({B, nq, S, 1})
                               .set_stride({nq * S, S, 1, 1}));
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(scale)
                     .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                     .set_diagonal_band_right_bound(0)
                     .set_deterministic_algorithm(deterministic);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, attrs);
    dQ->set_output(true).set_uid(kdQ).set_dim({B, nq, S, d}).set_stride({S * W, d, W, 1});
    dK->set_output(true).set_uid(kdK).set_dim({B, nkv, S, d}).set_stride({S * W, d, W, 1});
    dV->set_output(true).set_uid(kdV).set_dim({B, nkv, S, d}).set_stride({S * W, d, W, 1});
  }
  return g;
}

// The cached graph for this shape and direction (built on first use) in the current determinism mode,
// with the shared workspace grown to cover it. Called with the state's mutex held.
const Built& graph_for(const DeviceState& dev, AttentionGraphs& st, const char* op, const AttentionShape& s,
                       Direction dir) {
  const bool want_det = dir == Direction::Backward && dev.deterministic_attention;
  const Key key{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim, static_cast<int>(dir), want_det};
  if (auto it = st.graphs.find(key); it != st.graphs.end()) return it->second;

  const std::string what = shape_text(s);
  std::shared_ptr<fe::graph::Graph> g;
  bool built_det = want_det;
  std::string step, first;  // first: the deterministic backward's error, when it had one
  try {
    g = make_graph(s, dir, want_det, dev.sm);
    fe::error_object e = build_steps(*g, dev.cudnn, &step);
    if (e.is_bad() && want_det) {
      built_det = false;
      first = step + ": " + fe_error_text(e);
      g = make_graph(s, dir, /*deterministic=*/false, dev.sm);
      e = build_steps(*g, dev.cudnn, &step);
      if (e.is_good())
        std::fprintf(stderr, "%s %s: cuDNN has no deterministic backward here (%s); using the non-deterministic one\n",
                     op, what.c_str(), first.c_str());
      else
        first = "; deterministic graph: " + first;
    }
    fe_check(e, op, what + " (graph " + step + ", sm " + std::to_string(dev.sm) + ", cuDNN " +
                        std::to_string(cudnnGetVersion()) + ")" + (e.is_bad() ? first : std::string()));
  } catch (const fe::cudnnException& e) {  // the frontend throws from a few helpers
    throw_error(std::string(op) + " " + what + ": cuDNN frontend exception while building the graph: " + e.what());
  }

  int64_t bytes = 0;
  fe_check(g->get_workspace_size(bytes), op, what + " (get_workspace_size)");
  if (bytes > 0 && static_cast<size_t>(bytes) > st.workspace.bytes()) {
    // Safe while graphs are queued: inside the device arena the old space is reused only by work
    // queued after this point on the same (default) stream; without an arena, cudaFree of the old
    // buffer synchronizes the device first.
    st.workspace = Buffer();
    st.workspace = Buffer(static_cast<size_t>(bytes), Device::CUDA);
  }
  return st.graphs.emplace(key, Built{std::move(g), built_det, bytes}).first->second;
}

void execute(DeviceState& dev, const char* op, const AttentionShape& s, Direction dir,
             std::unordered_map<int64_t, void*>& pack) {
  AttentionGraphs& st = graphs_of(dev);
  std::lock_guard<std::mutex> lock(st.mu);
  fe::graph::Graph& g = *graph_for(dev, st, op, s, dir).graph;
  check(cudnnSetStream(dev.cudnn, dev.stream), "cudnnSetStream", std::string(op) + " compute stream");
  try {
    fe_check(g.execute(dev.cudnn, pack, st.workspace.data()), op, shape_text(s) + " (graph execute)");
  } catch (const fe::cudnnException& e) {
    throw_error(std::string(op) + " " + shape_text(s) + ": cuDNN frontend exception in execute: " + e.what());
  }
  check_launch(dev, op, shape_text(s));
}

}  // namespace

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  const int64_t d = s.head_dim, nq = s.q_heads, nkv = s.kv_heads;
  auto* x = static_cast<uint16_t*>(qkv.data);  // bf16 elements
  std::unordered_map<int64_t, void*> pack = {
      {kQ, x}, {kK, x + nq * d}, {kV, x + (nq + nkv) * d}, {kO, out.data}, {kStats, lse.data}};
  execute(*ctx.gpu, op, s, Direction::Forward, pack);
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  const int64_t d = s.head_dim, nq = s.q_heads, nkv = s.kv_heads;
  auto* x = static_cast<uint16_t*>(qkv.data);
  auto* dx = static_cast<uint16_t*>(dqkv.data);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, x},        {kK, x + nq * d},   {kV, x + (nq + nkv) * d},   {kO, out.data},
      {kdO, dout.data}, {kStats, lse.data}, {kdQ, dx}, {kdK, dx + nq * d}, {kdV, dx + (nq + nkv) * d}};
  execute(*ctx.gpu, op, s, Direction::Backward, pack);
}

bool attention_has_cudnn_frontend() { return true; }

AttentionPlan attention_prepare(DeviceState& state, const AttentionShape& s) {
  constexpr const char* op = "attention_prepare";
  check_shape(op, s);
  AttentionGraphs& st = graphs_of(state);
  std::lock_guard<std::mutex> lock(st.mu);
  const Built& f = graph_for(state, st, "attention_forward", s, Direction::Forward);
  const Built& b = graph_for(state, st, "attention_backward", s, Direction::Backward);
  AttentionPlan p;
  p.deterministic_requested = state.deterministic_attention;
  p.deterministic_backward = b.deterministic;
  p.forward_workspace = f.workspace;
  p.backward_workspace = b.workspace;
  p.workspace_allocated = static_cast<int64_t>(st.workspace.bytes());
  return p;
}

std::string attention_validate_graph(const AttentionShape& s, bool backward, int sm, bool deterministic) {
  auto g = make_graph(s, backward ? Direction::Backward : Direction::Forward, deterministic, sm);
  const fe::error_object e = g->validate();
  return e.is_good() ? std::string() : fe_error_text(e);
}

#else  // !PL_HAVE_CUDNN_FRONTEND

struct AttentionGraphs {};
std::shared_ptr<AttentionGraphs> make_attention_graphs() { return std::make_shared<AttentionGraphs>(); }

namespace {
[[noreturn]] void no_frontend(const char* op, const AttentionShape& s) {
  fail("{} {}: this build has no cudnn-frontend headers, which CUDA attention needs: run scripts/setup.sh "
       "(pip package nvidia-cudnn-frontend) or pass -DCUDNN_FRONTEND_INCLUDE_DIR=<dir with cudnn_frontend.h>, "
       "then reconfigure and rebuild",
       op, shape_text(s));
}
}  // namespace

void attention_forward(const OpContext&, const Tensor&, const Tensor&, const Tensor&, const AttentionShape& s) {
  no_frontend("attention_forward", s);
}

void attention_backward(const OpContext&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const AttentionShape& s) {
  no_frontend("attention_backward", s);
}

bool attention_has_cudnn_frontend() { return false; }

AttentionPlan attention_prepare(DeviceState&, const AttentionShape& s) { no_frontend("attention_prepare", s); }

std::string attention_validate_graph(const AttentionShape&, bool, int, bool) {
  return "this build has no cudnn-frontend headers";
}

#endif  // PL_HAVE_CUDNN_FRONTEND

}  // namespace pl::cuda
