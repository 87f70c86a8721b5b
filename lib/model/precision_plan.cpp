#include "model/precision_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace pl {

const char* format_name(const LinearPlan& p) {
  if (!p.quantized()) return "bf16";
  switch (*p.x) {
    case QuantFormat::NVFP4: return "nvfp4";
    case QuantFormat::MXFP8: return "mxfp8";
    default: return p.delayed() ? "fp8-delayed-scaling" : "fp8-current-scaling";
  }
}

std::vector<QuantFormat> PrecisionPlan::quantized_formats() const {
  std::vector<QuantFormat> used;
  for (const LinearPlan& p : linears)
    if (p.quantized() && std::find(used.begin(), used.end(), *p.x) == used.end()) used.push_back(*p.x);
  return used;
}

const LinearPlan& PrecisionPlan::quantized() const {
  static const LinearPlan bf16;
  for (const LinearPlan& p : linears)
    if (p.quantized()) return p;
  return bf16;
}

namespace {

// The formats and rules of the recipe's quantized linears.
LinearPlan recipe_linear(const PrecisionRecipe& r) {
  LinearPlan p;
  if (r.fp4) {
    p.x = p.w = p.dy = QuantFormat::NVFP4;  // 1x16 and 16x16 blocks
    p.rht = r.nvfp4.random_hadamard_transform;
    p.stochastic_rounding = r.nvfp4.stochastic_rounding;
    p.weight_2d = r.nvfp4.weight_2d_quantization;
    p.block_multiple = 16;
    p.gpu_multiple = 32;
  } else if (r.fp8 && r.fp8_recipe == "mxfp8") {
    p.x = p.w = p.dy = QuantFormat::MXFP8;  // fp8 "e4m3" only (the loader checks): E4M3 everywhere, 1x32 blocks
    p.block_multiple = p.gpu_multiple = 32;
  } else if (r.fp8) {
    // Megatron-LM's get_fp8_context (megatron/core/fp8_utils.py) maps fp8 "e4m3" to Transformer
    // Engine's recipe.Format.E4M3 (every FP8 tensor E4M3, gradients included) and "hybrid" to
    // Format.HYBRID (E4M3 forward, E5M2 backward), passed to Float8CurrentScaling for "tensorwise".
    p.x = p.w = QuantFormat::FP8_E4M3;
    p.dy = *r.fp8 == "hybrid" ? QuantFormat::FP8_E5M2 : QuantFormat::FP8_E4M3;
    p.block_multiple = p.gpu_multiple = 16;  // cuBLASLt FP8: dims multiple of 16
    // fp8_recipe "delayed": Megatron passes the same format to TE's DelayedScaling with margin,
    // amax_history_len and amax_compute_algo (megatron/core/extensions/transformer_engine.py, TEDelayedScaling).
    if (r.fp8_recipe == "delayed") {
      p.amax_history_len = r.fp8_amax_history_len;
      p.amax_most_recent = r.fp8_amax_compute_algo == "most_recent";
      p.margin = r.fp8_margin;
    }
  }
  return p;
}

std::string format_detail(const LinearPlan& p) {
  if (!p.quantized()) return "bf16";
  switch (*p.x) {
    case QuantFormat::NVFP4:
      return fmt::format("nvfp4 (E2M1, E4M3 scales per {} weight / 1x16 activation blocks, RHT on wgrad {}, "
                         "stochastic rounding of gradients {})",
                         p.weight_2d ? "16x16" : "1x16", p.rht ? "on" : "off", p.stochastic_rounding ? "on" : "off");
    case QuantFormat::MXFP8: return "mxfp8 (E4M3, UE8M0 scales per 1x32 block)";
    default:
      if (p.delayed())
        return fmt::format("fp8 delayed scaling (E4M3 forward, {} gradients; amax history {}, {}, margin {})",
                           *p.dy == QuantFormat::FP8_E5M2 ? "E5M2" : "E4M3", p.amax_history_len,
                           p.amax_most_recent ? "most_recent" : "max", p.margin);
      return fmt::format("fp8 current scaling (E4M3 forward, {} gradients)",
                         *p.dy == QuantFormat::FP8_E5M2 ? "E5M2" : "E4M3");
  }
}

}  // namespace

std::vector<std::string> PrecisionPlan::describe() const {
  std::vector<std::string> lines;
  const int64_t n = num_layers();
  for (int64_t a = 0; a < n;) {
    const std::string detail = format_detail(linear(a, 0));
    int64_t b = a;
    while (b + 1 < n && format_detail(linear(b + 1, 0)) == detail) ++b;
    const std::string range = a == b ? fmt::format("layer  {}", a) : fmt::format("layers {}-{}", a, b);
    lines.push_back(fmt::format("{:<13}: linear_qkv linear_proj linear_fc1 linear_fc2 in {}", range, detail));
    a = b + 1;
  }
  lines.push_back("always bf16  : embedding, attention core (QK^T, softmax, PV), RMSNorm, LM head");
  return lines;
}

PrecisionPlan bf16_plan(const ModelConfig& model) {
  PrecisionRecipe r;
  r.name = "bf16_mixed";
  return make_precision_plan(model, r);
}

PrecisionPlan make_precision_plan(const ModelConfig& m, const PrecisionRecipe& r) {
  PrecisionPlan plan;
  plan.recipe_name = r.name;
  const LinearPlan q = recipe_linear(r);
  const int64_t L = m.num_layers;
  int64_t start = r.first_last_layers_bf16 ? r.num_layers_at_start_in_bf16 : 0;
  int64_t end = r.first_last_layers_bf16 ? r.num_layers_at_end_in_bf16 : 0;
  if (q.quantized() && start + end >= L) {
    // Megatron would run every layer in BF16 here, which would make the recipe a no-op. Keep at
    // least one quantized layer (the first after the start block) and say so.
    const int64_t new_start = std::min(start, L - 1);
    const int64_t new_end = L - 1 - new_start;
    plan.notes.push_back(fmt::format(
        "recipe keeps {} first and {} last layers in bf16 but the model has only {} layers; using {} first and "
        "{} last so that one layer runs in {}",
        start, end, L, new_start, new_end, format_name(q)));
    start = new_start;
    end = new_end;
  }
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size;
  const int64_t in[4] = {h, m.q_dim(), h, f}, out[4] = {m.qkv_dim(), h, 2 * f, h};  // qkv, proj, fc1 (gate|up), fc2
  for (int64_t l = 0; l < L; ++l)
    for (int k = 0; k < 4; ++k) {
      LinearPlan p = l < start || l >= L - end ? LinearPlan{} : q;
      p.in = in[k];
      p.out = out[k];
      plan.linears.push_back(p);
    }

  const int64_t blk = q.block_multiple;
  if (blk > 1) {
    auto rule = [&](const char* field, int64_t value, const char* what) {
      PL_CHECK(value % blk == 0,
               "{}: field '{}' = {} violates the {} block rule of recipe '{}' ({} = {} must be a multiple of {})",
               m.file, field, value, format_name(q), r.name, what, value, blk);
    };
    rule("hidden_size", m.hidden_size, "hidden_size");
    rule("ffn_hidden_size", m.ffn_hidden_size, "ffn_hidden_size");
    rule("kv_channels", m.q_dim(), "num_attention_heads*kv_channels");
    rule("kv_channels", m.kv_dim(), "num_query_groups*kv_channels");
  }
  return plan;
}

void check_tokens_block_rule(const PrecisionPlan& plan, int64_t micro_batch, int64_t seq_length) {
  const LinearPlan& q = plan.quantized();
  PL_CHECK((micro_batch * seq_length) % q.block_multiple == 0,
           "micro-batch-size x seq-length = {} x {} = {} tokens must be a multiple of {} for {} (the weight-gradient "
           "GEMM reduces over tokens in blocks)",
           micro_batch, seq_length, micro_batch * seq_length, q.block_multiple, format_name(q));
}

void check_gpu_gemm_rules(const PrecisionPlan& plan, const ModelConfig& m, int64_t micro_batch, int64_t seq_length) {
  const LinearPlan& q = plan.quantized();
  if (q.gpu_multiple <= q.block_multiple) return;
  auto rule = [&](const char* what, int64_t value) {
    PL_CHECK(value % q.gpu_multiple == 0,
             "{} = {} must be a multiple of {} for NVFP4 GEMMs on the GPU (cuBLASLt FP4 rows are 16 bytes); {} fits "
             "the CPU's {}-element blocks only",
             what, value, q.gpu_multiple, m.file, q.block_multiple);
  };
  rule("hidden_size", m.hidden_size);
  rule("ffn_hidden_size", m.ffn_hidden_size);
  rule("num_attention_heads*kv_channels", m.q_dim());
  rule("num_query_groups*kv_channels", m.kv_dim());
  rule("micro-batch-size x seq-length", micro_batch * seq_length);
}

}  // namespace pl
