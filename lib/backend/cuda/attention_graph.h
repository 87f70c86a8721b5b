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
};
// Builds (or finds) the forward and backward graphs for `s` in `state` (in its determinism mode,
// DeviceState::deterministic_attention, and layout switch, DeviceState::force_packed_attention) and
// allocates the shared workspace and pack scratch they need, so that neither happens inside the
// training loop. Needs a GPU.
struct DeviceState;  // device_state.h
AttentionPlan attention_prepare(DeviceState& state, const AttentionShape& s);

}  // namespace pl::cuda
