#pragma once
// What the CUDA attention (backend/cuda/attention.cpp) exposes besides the ops: its plan for a shape
// (attention_prepare, needs a GPU), and GPU-free checks of the cudnn-frontend SDPA graphs it builds,
// for tests:
//   * attention_validate_graph: the frontend's validate() for a target compute capability (tensors,
//     strides, SDPA options against the frontend's rules). Needs neither a GPU nor libcuda.
//   * attention_plan_deviceless: cuDNN's deviceless planning (cuDNN >= 9.11, "ahead-of-time" for a GPU
//     that is absent): the graph with a DeviceProperties description of the target (attention_targets)
//     goes through validate(), build_operation_graph() without a handle, the engine heuristics
//     (create_execution_plans({A, FALLBACK}), the modes of the real build) and check_support() — every
//     step of the real build but build_plans(), which needs a driver. The runtime-compiled engines need
//     a libcuda.so.1 to be loadable: the toolkit's stub is enough (tests/CMakeLists.txt gives the
//     deviceless tests, and only them, one). A necessary check, not a proof that an engine runs
//     (SPEC-GPU §1.7: FP32 IO and d = 512 pass check_support() too).
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"

namespace pl::cuda {

// How Q, K, V (and dQ, dK, dV) are given to cuDNN:
//   Strided: views into the qkv rows [T, (nq + 2 nkv) d] (no copies), tried first;
//   Packed:  contiguous token-major copies Q [T, nq, d], K [T, nkv, d], V [T, nkv, d] made by
//            attention_pack.cu (and dQ/dK/dV unpacked back into the dqkv rows), used when cuDNN
//            refuses the strided graph at any build step; also the layout document masking needs.
enum class AttentionLayout { Strided, Packed };
const char* attention_layout_name(AttentionLayout layout);  // "strided views of the qkv rows" / ...

// Document-aware attention (AttentionShape::docs, issue 27): cuDNN's packed-sequence (THD) SDPA, as
// Transformer Engine runs it for packed sequences (fused_attn_f16_arbitrary_seqlen.cu), not a dense mask:
//   * the graph's batch is a bucket of documents, each a sequence of at most S tokens: Q, K, V, O (and
//     dQ, dK, dV, dO) keep the layout above (strided views first, packed copies as the fallback, the
//     same attempts) with ragged offsets (INT64, elements: the document's first token times the
//     elements per token of the tensor) and a padding mask over the documents' lengths (INT32), causal
//     top-left inside each; documents past the count have length 0 (TE's padding);
//   * Stats: TE's ragged stats, token-major [T, nq] (stride {nq S, 1, nq, 1}, offsets first token · nq):
//     the lse buffer keeps its T·nq floats but, with documents, holds them [T, nq] where it is [B, nq, S]
//     without (only attention_backward reads it). A per-sample [B, nq, S] layout cannot be written with
//     ragged offsets: cuDNN sizes its backward softmax-sum workspace from the Stats strides and the
//     total token count (frontend ragged_workspace_size), which for it would be short of T·nq;
//   * max_total_seq_len_q/kv = T, so the backward's FP32 accumulators are sized by T, not bucket · S;
//   * bucket: attention_document_bucket; a graph pair per bucket, built once and cached; the offsets
//     and lengths are computed on the device from DocumentBoundaries::device by one small kernel
//     (attention_pack.h) into scratch reserved by attention_prepare for the largest bucket.
// cuDNN refuses THD backward graphs with ragged Stats, and deterministic ones, on SM 8x and 12x
// (frontend >= 9.18.1 rules): on an RTX 50xx document attention fails at attention_prepare, naming the
// rule. A deterministic document backward whose workspace exceeds the dense one's (Hopper's dP path:
// bucket · nq · S² · 2 bytes) is refused in favour of the non-deterministic one, with the usual notice.
// The bucket of `count` documents in a micro-batch of `tokens` tokens: Transformer Engine's
// get_max_batch_size (32; then powers of two to 512; then multiples of 512), capped at `tokens`.
int64_t attention_document_bucket(int64_t count, int64_t tokens);
// Bytes of the ragged offsets and lengths of a bucket's graphs (attention_pack.h DocumentScratch).
int64_t attention_document_scratch_bytes(int64_t bucket);

// False when this build has no cudnn-frontend headers (CUDA attention then fails at run time).
bool attention_has_cudnn_frontend();
// "" when the graph validates, else the frontend's error message (or why there is no frontend).
// `deterministic`: the backward graph asks for cuDNN's deterministic algorithm.
std::string attention_validate_graph(const AttentionShape& s, bool backward, int sm, bool deterministic = false,
                                     AttentionLayout layout = AttentionLayout::Strided);

// A GPU this program may be run on, described for deviceless planning (attention_targets.cpp has the
// table and the sources of its values).
struct AttentionTarget {
  std::string gpu;  // e.g. "H100 SXM5 80GB"
  int sm = 0;       // compute capability × 10: 90, 100, 103, 120
  int sm_count = 0;
  std::string device_properties_json;  // what cudnn_frontend::DeviceProperties::deserialize() reads
};
const std::vector<AttentionTarget>& attention_targets();

struct DevicelessPlan {
  std::string error;                 // "" when check_support() passed, else "<step>: <cuDNN's message>"
  std::vector<std::string> engines;  // the heuristics' engine configs (cuDNN's tags, e.g. "eng6_k24=26")
};
DevicelessPlan attention_plan_deviceless(const AttentionShape& s, bool backward, bool deterministic,
                                         AttentionLayout layout, const AttentionTarget& target);

// What attention_prepare() built for a shape in the current mode.
struct AttentionPlan {
  bool deterministic_requested = false;
  bool deterministic_backward = false;  // the algorithm cuDNN built (false after a refused request)
  AttentionLayout forward_layout = AttentionLayout::Strided;
  AttentionLayout backward_layout = AttentionLayout::Strided;
  std::string strided_refusal;          // why cuDNN refused the strided graph ("" when it did not)
  int64_t forward_workspace = 0;        // bytes, cuDNN's get_workspace_size() of each plan
  int64_t backward_workspace = 0;
  int64_t workspace_allocated = 0;      // the shared workspace Buffer now (>= both)
  int64_t pack_scratch_allocated = 0;   // the packed layout's Q/K/V (+ dQ/dK/dV) copies, 0 when strided
  int64_t document_bucket = 0;          // with documents: the bucket prepared (the largest), else 0
  int64_t document_scratch_allocated = 0;  // the document graphs' ragged offsets and lengths
};
// Builds (or finds) the forward and backward graphs for `s` in `state` (in its determinism mode,
// DeviceState::deterministic_attention, and layout switch, DeviceState::force_packed_attention) and
// allocates the shared workspace and pack scratch they need, so that neither happens inside the
// training loop. Needs a GPU. With documents (s.docs.count > 0; only the count is read, not the
// offsets) it prepares the document graphs of the largest bucket instead (T documents), whose
// workspace and offsets scratch cover every smaller bucket's; the graphs of the other buckets are
// built, once each, when a micro-batch first needs them.
struct DeviceState;  // device_state.h
AttentionPlan attention_prepare(DeviceState& state, const AttentionShape& s);

}  // namespace pl::cuda
