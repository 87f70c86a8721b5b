#include "core/op_cost.h"

namespace pl {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Gemm: return "gemm";
    case OpKind::Attention: return "attention";
    case OpKind::Quantize: return "quantize";
    case OpKind::Norm: return "norm";
    case OpKind::Elementwise: return "elementwise";
    case OpKind::Embedding: return "embedding";
    case OpKind::CrossEntropy: return "cross_entropy";
    case OpKind::Optimizer: return "optimizer";
    case OpKind::Comm: return "comm";
    case OpKind::Other: return "other";
  }
  return "other";
}

const char* linear_kind_name(LinearKind k) {
  switch (k) {
    case LinearKind::None: return nullptr;
    case LinearKind::Qkv: return "qkv";
    case LinearKind::Proj: return "proj";
    case LinearKind::Fc1: return "fc1";
    case LinearKind::Fc2: return "fc2";
    case LinearKind::LmHead: return "lm_head";
  }
  return nullptr;
}

const char* gemm_pass_name(GemmPass p) {
  switch (p) {
    case GemmPass::None: return nullptr;
    case GemmPass::Fprop: return "fprop";
    case GemmPass::Dgrad: return "dgrad";
    case GemmPass::Wgrad: return "wgrad";
  }
  return nullptr;
}

}  // namespace pl
