#pragma once
// A GPU-free check of the cuDNN attention graphs (backend/cuda/attention.cpp), for tests: builds the
// cudnn-frontend SDPA forward or backward graph that attention_forward/attention_backward would use for
// shape `s`, and runs the frontend's validation for a target of compute capability `sm` (90, 100, ...).
// Validation checks the tensors, strides and SDPA options against the frontend's support rules for that
// cuDNN version and architecture; it needs no device. Whether an engine accepts the graph can only be
// learned on a GPU.
#include <string>

#include "backend/ops.h"

namespace pl::cuda {

// False when this build has no cudnn-frontend headers (CUDA attention then fails at run time).
bool attention_has_cudnn_frontend();
// "" when the graph validates, else the frontend's error message (or why there is no frontend).
std::string attention_validate_graph(const AttentionShape& s, bool backward, int sm);

}  // namespace pl::cuda
