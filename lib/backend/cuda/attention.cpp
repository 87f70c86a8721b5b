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
// strides, in elements; W = (nq + 2 nkv) d is the qkv row width, B batch, S seq, T = B S tokens).
// Two layouts for Q, K, V (and dQ, dK, dV), chosen once per shape when the graphs are built
// (attention_graph.h: AttentionLayout):
//   strided (tried first): views into the packed qkv rows, no copies, no pack kernel:
//     Q  dims {B, nq,  S, d}  strides {S W, d, W, 1}           at qkv                 (bf16)
//     K  dims {B, nkv, S, d}  strides {S W, d, W, 1}           at qkv + nq d          (bf16)
//     V  dims {B, nkv, S, d}  strides {S W, d, W, 1}           at qkv + (nq + nkv) d  (bf16)
//     dQ/dK/dV like Q/K/V, at dqkv (same offsets)
//   packed (when cuDNN refuses the strided graph at any build step): contiguous token-major copies
//     made by attention_pack.cu into the pack scratch (grown in attention_prepare, never in the loop):
//     Q  dims {B, nq,  S, d}  strides {S nq d,  d, nq d,  1}    at scratch
//     K  dims {B, nkv, S, d}  strides {S nkv d, d, nkv d, 1}    at scratch + T nq d
//     V  like K                                                 at scratch + T (nq + nkv) d
//     dQ/dK/dV like Q/K/V at scratch + T W, unpacked into the dqkv rows after the backward.
//     This is cuDNN's plain BSHD layout (the one its samples and Transformer Engine's bshd_bshd_bshd
//     use), and the token-major [T, H, d] layout packed-sequence (THD) attention with document masking
//     needs: that can reuse the pack kernels.
//   O    dims {B, nq,  S, d}  strides {S nq d, d, nq d, 1}    = out[T, nq d]         (bf16)
//   dO   like O, at dout                                                           (bf16)
//   Stats dims {B, nq, S, 1}  strides {nq S, S, 1, 1}         = lse[B, nq, S]        (fp32)
// Why both: the frontend checks only the last stride and 16-byte alignment of a view, so whether an
// engine accepts the strided views (for every head dim: 32 for llama_tiny) is decided by cuDNN at
// check_support / build time on the GPU; the packed layout is the plain BSHD layout of cuDNN's support
// matrix (SPEC-GPU §1.5). The qkv pointers are 16-byte aligned when the buffers are (cudaMalloc: 256) and d % 8 == 0, which
// cuDNN requires anyway.
//
// With documents (AttentionShape::docs) the same layouts carry ragged offsets in cuDNN's packed-sequence
// (THD) graphs, bucketed by document count, and Stats is token-major [T, nq]: attention_graph.h.
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
// Graphs are built once per (B, S, nq, nkv, d, direction, deterministic, forced layout) and cached for
// the life of the process (building is the slow part: tens to hundreds of ms) in the device state
// (AttentionGraphs, destroyed with it). The workspace and the pack scratch are grow-only device Buffers
// shared by all graphs: reallocated only when a newly built graph needs more, never per call. All work
// runs on the state's compute stream.
//
// What runs without a GPU: the argument checks, the frontend's validation of the graphs for a given
// target architecture, and cuDNN's deviceless planning for a described target GPU up to check_support()
// (attention_graph.h; tests CudaAttentionArgs, CudaAttentionGraph, CudaAttentionDeviceless). With
// set_sm_version given before the SDPA node is added, frontend 1.32's validate() does not call the
// CUDA runtime. (SPEC-GPU §1.1 saw validate() call cudaGetDevice after set_sm_version: that is what
// happens when the version is set after the node is added — the node keeps its own copy of the context.)
// build_plans and execution need a handle, hence a GPU: they are checked by the CudaAttention tests.
#include <algorithm>
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
#include <vector>

#include <fmt/format.h>

#include "backend/cuda/attention_graph.h"
#include "backend/cuda/attention_pack.h"
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

const char* attention_layout_name(AttentionLayout layout) {
  return layout == AttentionLayout::Strided ? "strided views of the qkv rows" : "packed Q/K/V copies";
}

// Transformer Engine's rule for the batch of its packed-sequence graphs (transformer_engine/common/
// fused_attn/utils.cu get_max_batch_size: "b = 1, ..., 32 -> 32; 33, ..., 512 -> next power of 2; 513, ...
// -> increment by 512"), capped at the micro-batch's T tokens, the most documents it can hold. The token
// side needs no bucket here (TE's get_max_tokens): every micro-batch has exactly T tokens.
int64_t attention_document_bucket(int64_t count, int64_t tokens) {
  int64_t b = 32;
  if (count > 512)
    b = (count + 511) / 512 * 512;
  else
    while (b < count) b *= 2;
  return std::min(b, tokens);
}

int64_t attention_document_scratch_bytes(int64_t bucket) {
  return bucket > 0 ? 4 * document_offsets_bytes(bucket) + (bucket * 4 + 15) / 16 * 16 : 0;
}

#if defined(PL_HAVE_CUDNN_FRONTEND)

namespace {

namespace fe = cudnn_frontend;

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV, kOffQ, kOffKV, kOffO, kOffStats, kSeqQ, kSeqKV };

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
// B, S, nq, nkv, d, direction, deterministic requested (always false for the forward), packed layout
// forced (DeviceState::force_packed_attention, a test switch), document bucket (0: no documents)
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, bool, bool, int64_t>;

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  bool deterministic = false;  // the algorithm built (a refused deterministic request falls back)
  AttentionLayout layout = AttentionLayout::Strided;
  std::string strided_refusal;  // why the strided graph was not used ("" when it is)
  int64_t workspace = 0;        // get_workspace_size() of the plan
};

int64_t tokens(const AttentionShape& s) { return s.batch * s.seq; }
int64_t row_width(const AttentionShape& s) { return (s.q_heads + 2 * s.kv_heads) * s.head_dim; }
// The graph class of the shape's documents (attention_document_bucket), 0 without documents.
int64_t document_bucket(const AttentionShape& s) {
  return s.docs.count > 0 ? attention_document_bucket(s.docs.count, tokens(s)) : 0;
}
// Bytes of the packed layout's copies: Q, K, V (T·W bf16), and for the backward dQ, dK, dV too.
int64_t pack_bytes(const AttentionShape& s, Direction dir) {
  return tokens(s) * row_width(s) * 2 * (dir == Direction::Backward ? 2 : 1);
}

}  // namespace

// The graphs of one device state, their shared grow-only workspace and the packed layout's shared
// grow-only scratch (all run on its compute stream, in order).
struct AttentionGraphs {
  std::mutex mu;
  std::map<Key, Built> graphs;
  Buffer workspace;
  Buffer pack;
  Buffer docs;  // the document graphs' ragged offsets and lengths (attention_document_scratch_bytes)
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

// Runs the frontend's build steps one by one, so an error names the step that failed. Without a handle
// (deviceless planning: the graph carries a DeviceProperties) it stops after check_support().
fe::error_object build_steps(fe::graph::Graph& g, cudnnHandle_t handle, std::string* step) {
  *step = "validate";
  if (auto e = g.validate(); e.is_bad()) return e;
  *step = "build_operation_graph";
  if (auto e = handle ? g.build_operation_graph(handle) : g.build_operation_graph(); e.is_bad()) return e;
  *step = "create_execution_plans";
  if (auto e = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad()) return e;
  *step = "check_support";
  if (auto e = g.check_support(); e.is_bad() || handle == nullptr) return e;
  *step = "build_plans";
  return g.build_plans(handle);
}

// The target of a graph: its compute capability ×10 (the device state's) and, for deviceless planning,
// its SM count (0: the device's). Both are given before the SDPA node is added, so that node's checks
// use them instead of asking the CUDA runtime.
struct GraphTarget {
  int sm = 0;
  int sm_count = 0;
};

// The document-aware (THD) tensors of a graph with `bucket` > 0 (attention_document_bucket): the ragged
// offsets, in elements of the tensor they belong to ([bucket + 1] INT64, Transformer Engine's offset type
// for cuDNN >= 9.5: fused_attn_f16_arbitrary_seqlen.cu ragged_offset_type), and the per-document lengths
// ([bucket] INT32, as TE's seq_q / seq_kv). Queries and keys of a document are the same tokens, so one
// length array serves both (two uids, one device pointer). attention_pack.cu fills them.
struct DocTensors {
  std::shared_ptr<fe::graph::Tensor_attributes> off_q, off_kv, off_o, off_stats, seq_q, seq_kv;
};

DocTensors doc_tensors(fe::graph::Graph& g, int64_t bucket) {
  auto index = [&](const char* name, int64_t uid, int64_t n, fe::DataType_t type) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(type));
  };
  const auto i64 = fe::DataType_t::INT64, i32 = fe::DataType_t::INT32;
  return DocTensors{index("offset_q", kOffQ, bucket + 1, i64),  index("offset_kv", kOffKV, bucket + 1, i64),
                    index("offset_o", kOffO, bucket + 1, i64),  index("offset_stats", kOffStats, bucket + 1, i64),
                    index("seq_len_q", kSeqQ, bucket, i32),     index("seq_len_kv", kSeqKV, bucket, i32)};
}

// The SDPA options both directions share: scale, causal (top-left, right bound 0) and, with documents,
// the padding mask over each document's length and the total token count T (every token is in one
// document), which sizes cuDNN's ragged backward workspaces (softmax sums, dQ accumulators) by T instead
// of bucket x S (frontend node/scaled_dot_product_flash_attention.h: ragged_workspace_size).
template <class Attrs>
void set_common(Attrs& a, float scale, const DocTensors* docs, int64_t T) {
  a.set_attn_scale(scale).set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  if (docs != nullptr)
    a.set_padding_mask(true).set_seq_len_q(docs->seq_q).set_seq_len_kv(docs->seq_kv).set_max_total_seq_len_q(T)
        .set_max_total_seq_len_kv(T);
}

// Stats, [B, nq, S] per sample without documents; with documents token-major [T, nq] with ragged
// offsets (Transformer Engine's ragged stats, stride {h s, 1, h, 1}): T·nq floats, the lse buffer's size.
void set_stats_layout(fe::graph::Tensor_attributes& st, int64_t B, int64_t nq, int64_t S, const DocTensors* docs) {
  st.set_uid(kStats).set_data_type(fe::DataType_t::FLOAT).set_dim({B, nq, S, 1});
  if (docs == nullptr)
    st.set_stride({nq * S, S, 1, 1});
  else
    st.set_stride({nq * S, 1, nq, 1}).set_ragged_offset(docs->off_stats);
}

std::shared_ptr<fe::graph::Graph> make_graph(const AttentionShape& s, Direction dir, bool deterministic,
                                             AttentionLayout layout, GraphTarget target) {
  const int64_t bucket = document_bucket(s);
  // With documents the graph's batch is the bucket: one "sequence" per document (THD).
  const int64_t B = bucket > 0 ? bucket : s.batch, S = s.seq, nq = s.q_heads, nkv = s.kv_heads, d = s.head_dim;
  // Distance between consecutive tokens of Q (dQ) and of K, V (dK, dV), in elements.
  const bool packed = layout == AttentionLayout::Packed;
  const int64_t q_row = packed ? nq * d : row_width(s), kv_row = packed ? nkv * d : row_width(s);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT)
      .set_sm_version(target.sm);
  if (target.sm_count > 0) g->set_sm_count(target.sm_count);
  DocTensors dt;
  const DocTensors* docs = nullptr;
  if (bucket > 0) {
    dt = doc_tensors(*g, bucket);
    docs = &dt;
  }
  // Ragged offsets on a Q-, K/V- or O-shaped tensor when there are documents.
  auto ragged = [&](const std::shared_ptr<fe::graph::Tensor_attributes>& t,
                    const std::shared_ptr<fe::graph::Tensor_attributes>& off) {
    if (docs != nullptr) t->set_ragged_offset(off);
  };
  auto Q = bhsd(*g, "Q", kQ, B, nq, S, d, q_row);
  auto K = bhsd(*g, "K", kK, B, nkv, S, d, kv_row);
  auto V = bhsd(*g, "V", kV, B, nkv, S, d, kv_row);
  ragged(Q, dt.off_q);
  ragged(K, dt.off_kv);
  ragged(V, dt.off_kv);
  if (dir == Direction::Forward) {
    auto attrs = fe::graph::SDPA_attributes().set_name("attention_forward").set_generate_stats(true);
    set_common(attrs, scale, docs, tokens(s));
    auto [O, Stats] = g->sdpa(Q, K, V, attrs);
    O->set_output(true).set_uid(kO).set_dim({B, nq, S, d}).set_stride({S * nq * d, d, nq * d, 1});
    ragged(O, dt.off_o);
    Stats->set_output(true);
    set_stats_layout(*Stats, B, nq, S, docs);
  } else {
    auto O = bhsd(*g, "O", kO, B, nq, S, d, nq * d);
    auto dO = bhsd(*g, "dO", kdO, B, nq, S, d, nq * d);
    ragged(O, dt.off_o);
    ragged(dO, dt.off_o);
    auto Stats = g->tensor(fe::graph::Tensor_attributes().set_name("Stats"));
    set_stats_layout(*Stats, B, nq, S, docs);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_deterministic_algorithm(deterministic);
    set_common(attrs, scale, docs, tokens(s));
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, attrs);
    dQ->set_output(true).set_uid(kdQ).set_dim({B, nq, S, d}).set_stride({S * q_row, d, q_row, 1});
    dK->set_output(true).set_uid(kdK).set_dim({B, nkv, S, d}).set_stride({S * kv_row, d, kv_row, 1});
    dV->set_output(true).set_uid(kdV).set_dim({B, nkv, S, d}).set_stride({S * kv_row, d, kv_row, 1});
    ragged(dQ, dt.off_q);
    ragged(dK, dt.off_kv);
    ragged(dV, dt.off_kv);
  }
  return g;
}

// A document graph's deterministic backward on Hopper keeps dP for the padded [bucket, nq, S, S]
// (cudnn-frontend's dP-workspace path; its linear-workspace alternative needs cuDNN >= 9.25 and
// CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT): 32 GiB at 8B for the smallest bucket of 32 documents. One
// whose workspace is over what the dense deterministic backward of the same micro-batch takes (B nq S² 2
// bytes, what lib/model/memory_plan.cpp reserves) is refused like a cuDNN refusal, so the build falls back
// to the non-deterministic backward with the usual notice. "" when the graph is within it.
std::string over_document_limit(fe::graph::Graph& g, const AttentionShape& s) {
  if (s.docs.count == 0) return "";
  int64_t ws = 0;
  if (g.get_workspace_size(ws).is_bad()) return "get_workspace_size failed";
  const int64_t limit = s.batch * s.q_heads * s.seq * s.seq * 2;
  if (ws <= limit) return "";
  return fmt::format("workspace {:.1f} MiB over the dense deterministic backward's {:.1f} MiB (document bucket {})",
                     static_cast<double>(ws) / 1048576.0, static_cast<double>(limit) / 1048576.0,
                     document_bucket(s));
}

struct Attempt {
  AttentionLayout layout;
  bool deterministic;
};

// What graph_for tries, in order: the strided layout before the packed one (unless the test switch
// forces the packed one), and a requested deterministic backward before giving it up.
std::vector<Attempt> attempts_for(bool want_det, bool force_packed) {
  std::vector<Attempt> v;
  for (bool det : {want_det, false}) {
    if (!force_packed) v.push_back({AttentionLayout::Strided, det});
    v.push_back({AttentionLayout::Packed, det});
    if (!want_det) break;
  }
  return v;
}

// Builds the first graph of attempts_for() that cuDNN accepts at every build step. `refusals` collects,
// per refused attempt, the layout, algorithm, step and cuDNN's message.
Built build_first_accepted(const DeviceState& dev, const AttentionShape& s, Direction dir, bool want_det,
                           std::vector<std::string>& refusals) {
  Built b;
  for (const Attempt& a : attempts_for(want_det, dev.force_packed_attention)) {
    std::string step = "make_graph", text;
    try {
      auto g = make_graph(s, dir, a.deterministic, a.layout, GraphTarget{dev.sm, 0});
      const fe::error_object e = build_steps(*g, dev.cudnn, &step);
      // A refusal of ours, not cuDNN's: a document graph's deterministic workspace.
      const std::string over = e.is_good() && a.deterministic ? over_document_limit(*g, s) : "";
      if (e.is_good() && over.empty()) {
        b.graph = std::move(g);
        b.deterministic = a.deterministic;
        b.layout = a.layout;
        return b;
      }
      text = over.empty() ? step + ": " + fe_error_text(e) : "the workspace check: " + over;
    } catch (const fe::cudnnException& e) {  // the frontend throws from a few helpers: a refusal too
      text = step + ": cuDNN frontend exception: " + e.what();
    }
    refusals.push_back(std::string(attention_layout_name(a.layout)) +
                       (a.deterministic ? ", deterministic backward" : "") + " refused at " + text);
    if (a.layout == AttentionLayout::Strided && b.strided_refusal.empty()) b.strided_refusal = text;
  }
  return b;  // no graph: every attempt was refused
}

// Grows a shared grow-only device buffer to `bytes`. Safe while graphs are queued: inside the device
// arena the old space is reused only by work queued after this point on the same (default) stream;
// without an arena, cudaFree of the old buffer synchronizes the device first.
void grow(Buffer& buf, int64_t bytes) {
  if (bytes <= 0 || static_cast<size_t>(bytes) <= buf.bytes()) return;
  buf = Buffer();
  buf = Buffer(static_cast<size_t>(bytes), Device::CUDA);
}

// The cached graph for this shape and direction (built on first use) in the current determinism mode
// and layout switch, with the shared workspace (and, for the packed layout, the pack scratch) grown to
// cover it. Called with the state's mutex held.
const Built& graph_for(const DeviceState& dev, AttentionGraphs& st, const char* op, const AttentionShape& s,
                       Direction dir) {
  const bool want_det = dir == Direction::Backward && dev.deterministic_attention;
  const int64_t bucket = document_bucket(s);
  const Key key{s.batch, s.seq, s.q_heads, s.kv_heads, s.head_dim, static_cast<int>(dir), want_det,
                dev.force_packed_attention, bucket};
  if (auto it = st.graphs.find(key); it != st.graphs.end()) return it->second;

  const std::string what = shape_text(s) + (bucket > 0 ? fmt::format(" document bucket {}", bucket) : "");
  std::vector<std::string> refusals;
  Built b = build_first_accepted(dev, s, dir, want_det, refusals);
  if (!b.graph) {
    std::string all;
    for (const std::string& r : refusals) all += (all.empty() ? "" : "; ") + r;
    throw_error(fmt::format("{} {}: cuDNN accepts no attention graph for this shape (sm {}, cuDNN {}): {}", op,
                            what, dev.sm, cudnnGetVersion(), all));
  }
  if (want_det && !b.deterministic)
    std::fprintf(stderr, "%s %s: cuDNN has no deterministic backward here (%s); using the non-deterministic one\n",
                 op, what.c_str(), refusals.front().c_str());
  if (dev.force_packed_attention) b.strided_refusal = "not tried: DeviceState::force_packed_attention (test switch)";

  fe_check(b.graph->get_workspace_size(b.workspace), op, what + " (get_workspace_size)");
  grow(st.workspace, b.workspace);
  if (b.layout == AttentionLayout::Packed) grow(st.pack, pack_bytes(s, dir));
  grow(st.docs, attention_document_scratch_bytes(bucket));
  return st.graphs.emplace(key, std::move(b)).first->second;
}

// The ops' device pointers; dqkv is null for the forward, dout/out for the forward are O's.
struct Io {
  const void* qkv = nullptr;
  void* dqkv = nullptr;
  void* out = nullptr;
  void* lse = nullptr;
  const void* dout = nullptr;
};

std::unordered_map<int64_t, void*> variant_pack(const AttentionShape& s, Direction dir, AttentionLayout layout,
                                                 void* x, void* dx, const Io& io) {
  const int64_t T = tokens(s), nq = s.q_heads, nkv = s.kv_heads, d = s.head_dim;
  const bool packed = layout == AttentionLayout::Packed;
  // Where K and V start after Q (in elements): within each row, or after the whole packed Q (then K).
  const int64_t k_at = packed ? T * nq * d : nq * d, v_at = packed ? T * (nq + nkv) * d : (nq + nkv) * d;
  auto* q = static_cast<uint16_t*>(x);  // bf16 elements
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q}, {kK, q + k_at}, {kV, q + v_at}, {kO, io.out}, {kStats, io.lse}};
  if (dir == Direction::Backward) {
    auto* dq = static_cast<uint16_t*>(dx);
    pack.insert({{kdO, const_cast<void*>(io.dout)}, {kdQ, dq}, {kdK, dq + k_at}, {kdV, dq + v_at}});
  }
  return pack;
}

// The ragged offsets of a document graph in `layout`, in elements per token of each tensor: the qkv
// rows' width W for the strided views (Q, K and V are views of the same rows), nq d and nkv d for the
// packed copies; O and dO are [T, nq d]; Stats [T, nq].
RaggedUnits ragged_units(const AttentionShape& s, AttentionLayout layout) {
  const int64_t qd = s.q_heads * s.head_dim, kvd = s.kv_heads * s.head_dim;
  if (layout == AttentionLayout::Strided) return RaggedUnits{row_width(s), row_width(s), qd, s.q_heads};
  return RaggedUnits{qd, kvd, qd, s.q_heads};
}

// With documents: the ragged offsets and lengths of this micro-batch into the document scratch, and
// their places in the variant pack.
void add_documents(DeviceState& dev, AttentionGraphs& st, const AttentionShape& s, AttentionLayout layout,
                   std::unordered_map<int64_t, void*>& pack) {
  const int64_t bucket = document_bucket(s);
  const DocumentScratch ds = document_scratch_at(st.docs.data(), bucket);
  attention_document_offsets(dev, s.docs.device, s.docs.count, bucket, ragged_units(s, layout), ds);
  pack.insert({{kOffQ, ds.off_q}, {kOffKV, ds.off_kv}, {kOffO, ds.off_o}, {kOffStats, ds.off_stats},
               {kSeqQ, ds.seq_len}, {kSeqKV, ds.seq_len}});
}

void execute(DeviceState& dev, const char* op, const AttentionShape& s, Direction dir, const Io& io) {
  AttentionGraphs& st = graphs_of(dev);
  std::lock_guard<std::mutex> lock(st.mu);
  const Built& b = graph_for(dev, st, op, s, dir);
  const int64_t T = tokens(s);
  void* x = const_cast<void*>(io.qkv);  // cuDNN's variant pack takes void*; Q, K, V are only read
  void* dx = io.dqkv;
  if (b.layout == AttentionLayout::Packed) {
    x = st.pack.data();
    dx = static_cast<uint16_t*>(x) + T * row_width(s);
    attention_pack_qkv(dev, io.qkv, x, T, s.q_heads, s.kv_heads, s.head_dim);
  }
  std::unordered_map<int64_t, void*> pack = variant_pack(s, dir, b.layout, x, dx, io);
  if (s.docs.count > 0) add_documents(dev, st, s, b.layout, pack);
  check(cudnnSetStream(dev.cudnn, dev.stream), "cudnnSetStream", std::string(op) + " compute stream");
  try {
    fe_check(b.graph->execute(dev.cudnn, pack, st.workspace.data()), op, shape_text(s) + " (graph execute)");
  } catch (const fe::cudnnException& e) {
    throw_error(std::string(op) + " " + shape_text(s) + ": cuDNN frontend exception in execute: " + e.what());
  }
  check_launch(dev, op, shape_text(s));
  if (dir == Direction::Backward && b.layout == AttentionLayout::Packed)
    attention_unpack_dqkv(dev, dx, io.dqkv, T, s.q_heads, s.kv_heads, s.head_dim);
}

}  // namespace

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  execute(*ctx.gpu, "attention_forward", s, Direction::Forward,
          Io{.qkv = qkv.data, .out = out.data, .lse = lse.data});
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  execute(*ctx.gpu, "attention_backward", s, Direction::Backward,
          Io{.qkv = qkv.data, .dqkv = dqkv.data, .out = out.data, .lse = lse.data, .dout = dout.data});
}

bool attention_has_cudnn_frontend() { return true; }

AttentionPlan attention_prepare(DeviceState& state, const AttentionShape& s) {
  constexpr const char* op = "attention_prepare";
  check_shape(op, s);
  AttentionShape largest = s;  // with documents, their largest bucket: T documents of one token
  if (s.docs.count > 0) largest.docs = DocumentBoundaries{nullptr, nullptr, tokens(s)};
  AttentionGraphs& st = graphs_of(state);
  std::lock_guard<std::mutex> lock(st.mu);
  const Built& f = graph_for(state, st, "attention_forward", largest, Direction::Forward);
  const Built& b = graph_for(state, st, "attention_backward", largest, Direction::Backward);
  AttentionPlan p;
  p.document_bucket = document_bucket(largest);
  p.document_scratch_allocated = static_cast<int64_t>(st.docs.bytes());
  p.deterministic_requested = state.deterministic_attention;
  p.deterministic_backward = b.deterministic;
  p.forward_layout = f.layout;
  p.backward_layout = b.layout;
  p.strided_refusal = !f.strided_refusal.empty() ? f.strided_refusal : b.strided_refusal;
  p.forward_workspace = f.workspace;
  p.backward_workspace = b.workspace;
  p.workspace_allocated = static_cast<int64_t>(st.workspace.bytes());
  p.pack_scratch_allocated = static_cast<int64_t>(st.pack.bytes());
  return p;
}

std::string attention_validate_graph(const AttentionShape& s, bool backward, int sm, bool deterministic,
                                     AttentionLayout layout) {
  auto g = make_graph(s, backward ? Direction::Backward : Direction::Forward, deterministic, layout,
                      GraphTarget{sm, 0});
  const fe::error_object e = g->validate();
  return e.is_good() ? std::string() : fe_error_text(e);
}

DevicelessPlan attention_plan_deviceless(const AttentionShape& s, bool backward, bool deterministic,
                                         AttentionLayout layout, const AttentionTarget& target) {
  DevicelessPlan r;
  try {
    auto props = std::make_shared<fe::DeviceProperties>();
    const std::string& js = target.device_properties_json;
    if (auto e = props->deserialize(std::vector<uint8_t>(js.begin(), js.end())); e.is_bad()) {
      r.error = "DeviceProperties::deserialize: " + fe_error_text(e);
      return r;
    }
    auto g = make_graph(s, backward ? Direction::Backward : Direction::Forward, deterministic, layout,
                        GraphTarget{target.sm, target.sm_count});
    g->set_device_properties(props);
    std::string step;
    if (auto e = build_steps(*g, nullptr, &step); e.is_bad()) r.error = step + ": " + fe_error_text(e);
    std::string name;
    for (int64_t i = 0; g->get_plan_name_at_index(i, name).is_good(); ++i) r.engines.push_back(name);
  } catch (const fe::cudnnException& e) {
    r.error = std::string("cuDNN frontend exception: ") + e.what();
  }
  return r;
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

std::string attention_validate_graph(const AttentionShape&, bool, int, bool, AttentionLayout) {
  return "this build has no cudnn-frontend headers";
}

DevicelessPlan attention_plan_deviceless(const AttentionShape&, bool, bool, AttentionLayout, const AttentionTarget&) {
  return DevicelessPlan{"this build has no cudnn-frontend headers", {}};
}

#endif  // PL_HAVE_CUDNN_FRONTEND

}  // namespace pl::cuda
