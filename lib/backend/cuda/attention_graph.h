#pragma once
// A GPU-free check of the cuDNN attention graphs (backend/cuda/attention.cpp), for tests: builds the
// cudnn-frontend SDPA forward or backward graph that attention_forward/attention_backward would use for
// shape `s`, and runs the frontend's validation for a target of compute capability `sm` (90, 100, ...).
// Validation checks the tensors, strides and SDPA options against the frontend's support rules for that
// cuDNN version and architecture; it needs no device. Whether an engine accepts the graph can only be
// learned on a GPU.
#include <cstdint>
#include <string>

#include "backend/ops.h"

namespace pl::cuda {

// False when this build has no cudnn-frontend headers (CUDA attention then fails at run time).
bool attention_has_cudnn_frontend();
// "" when the graph validates, else the frontend's error message (or why there is no frontend).
// `deterministic`: the backward graph asks for cuDNN's deterministic algorithm.
std::string attention_validate_graph(const AttentionShape& s, bool backward, int sm, bool deterministic = false);

// What attention_prepare() built for a shape in the current mode.
struct AttentionPlan {
  bool deterministic_requested = false;
  bool deterministic_backward = false;  // the algorithm cuDNN built (false after a refused request)
  int64_t forward_workspace = 0;        // bytes, cuDNN's get_workspace_size() of each plan
  int64_t backward_workspace = 0;
  int64_t workspace_allocated = 0;      // the shared workspace Buffer now (>= both)
};
// Builds (or finds) the forward and backward graphs for `s` in `state` (in its determinism mode,
// DeviceState::deterministic_attention) and allocates the shared workspace they need, so that neither
// happens inside the training loop. Needs a GPU.
struct DeviceState;  // device_state.h
AttentionPlan attention_prepare(DeviceState& state, const AttentionShape& s);

}  // namespace pl::cuda
