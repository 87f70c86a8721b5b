#pragma once
// What one op costs, in arithmetic and in memory traffic, and which row of the roofline report
// (--roofline) it belongs to. The formulas live in backend/op_costs.cpp, one per op of
// backend/op_list.h, computed from the op's shapes at the dispatch layer; core/timers.h sums them
// per row together with the op's measured time.
#include <array>
#include <cstdint>
#include <cstring>

namespace pl {

// The report's "kind" column.
enum class OpKind : uint8_t { Gemm, Attention, Quantize, Norm, Elementwise, Embedding, CrossEntropy, Optimizer, Comm, Other };
// Which linear layer a GEMM (or the quantization feeding it) belongs to; None for every other op.
enum class LinearKind : uint8_t { None, Qkv, Proj, Fc1, Fc2, LmHead };
// Which of a linear layer's three GEMMs (linear_layer.h): fprop y = x·Wᵀ, dgrad dx = dy·W, wgrad dW = dyᵀ·x.
enum class GemmPass : uint8_t { None, Fprop, Dgrad, Wgrad };

const char* op_kind_name(OpKind k);          // "gemm", "attention", "quantize", "norm", "elementwise", ...
const char* linear_kind_name(LinearKind k);  // "qkv", "proj", "fc1", "fc2", "lm_head"; nullptr for None
const char* gemm_pass_name(GemmPass p);      // "fprop", "dgrad", "wgrad"; nullptr for None

// Set by the model on the OpContext of a linear layer's ops (backend/ops.h OpContext::tag), so the
// dispatch layer can name the row; the ops themselves never read it.
struct OpTag {
  LinearKind linear = LinearKind::None;
  GemmPass pass = GemmPass::None;
  // Spelled out: nvcc compiles this header as C++17 (lib/CMakeLists.txt), which has no defaulted operator==.
  bool operator==(const OpTag& o) const { return linear == o.linear && pass == o.pass; }
};

// One phase of an op. An op is one phase, except an emulated quantized GEMM: its operands' codes are
// expanded to plain values first (a row of its own, kind Quantize), then multiplied (the GEMM row,
// 2·M·N·K only). The backend marks the boundary with op_next_phase (backend/ops.h).
struct OpCost {
  const char* op = nullptr;      // the row's op name; nullptr: the op's own name (the dispatcher fills it in)
  OpKind kind = OpKind::Other;
  const char* format = "";       // "bf16", "fp32", "fp8", "mxfp8", "nvfp4", "int32"... (a static string)
  double flops = 0.0;            // the op's arithmetic (a multiply-add is 2)
  double bytes = 0.0;            // minimal traffic: every input read once, every output written once
  double working_set = 0.0;      // bytes the op touches: picks the memory level that judges it
};
struct OpCosts {
  std::array<OpCost, 2> phase{};
  int phases = 1;
};

// What identifies a row: ops with equal keys add up.
struct OpRowKey {
  const char* op = "";
  OpTag tag;
  OpKind kind = OpKind::Other;
  const char* format = "";
  bool operator==(const OpRowKey& o) const {
    return tag == o.tag && kind == o.kind && std::strcmp(op, o.op) == 0 && std::strcmp(format, o.format) == 0;
  }
};

}  // namespace pl
