#include "model/precision_plan.h"

#include <fmt/format.h>

#include "core/error.h"

namespace pl {

const char* format_name(LinearFormat f) {
  switch (f) {
    case LinearFormat::BF16: return "bf16";
    case LinearFormat::FP8_CURRENT_SCALING: return "fp8-current-scaling";
    case LinearFormat::MXFP8: return "mxfp8";
    case LinearFormat::NVFP4: return "nvfp4";
  }
  return "?";
}

int64_t format_block_multiple(LinearFormat f) {
  switch (f) {
    case LinearFormat::BF16: return 1;
    case LinearFormat::FP8_CURRENT_SCALING: return 16;  // cuBLASLt FP8: dims multiple of 16
    case LinearFormat::MXFP8: return 32;                // 1x32 blocks
    case LinearFormat::NVFP4: return 16;                // 1x16 and 16x16 blocks
  }
  return 1;
}

bool PrecisionPlan::all_bf16() const { return quantized_format() == LinearFormat::BF16; }

LinearFormat PrecisionPlan::quantized_format() const {
  for (LinearFormat f : layer_format)
    if (f != LinearFormat::BF16) return f;
  return LinearFormat::BF16;
}

namespace {

LinearFormat recipe_format(const PrecisionRecipe& r) {
  if (r.fp4) return LinearFormat::NVFP4;
  if (r.fp8) return r.fp8_recipe == "mxfp8" ? LinearFormat::MXFP8 : LinearFormat::FP8_CURRENT_SCALING;
  return LinearFormat::BF16;
}

std::string format_detail(LinearFormat f, const Nvfp4Options& o) {
  switch (f) {
    case LinearFormat::NVFP4:
      return fmt::format("nvfp4 (E2M1, E4M3 scales per {} weight / 1x16 activation blocks, RHT on wgrad {}, "
                         "stochastic rounding of gradients {})",
                         o.weight_2d_quantization ? "16x16" : "1x16", o.random_hadamard_transform ? "on" : "off",
                         o.stochastic_rounding ? "on" : "off");
    case LinearFormat::FP8_CURRENT_SCALING: return "fp8 current scaling (E4M3 forward, E5M2 gradients)";
    case LinearFormat::MXFP8: return "mxfp8 (E4M3, UE8M0 scales per 1x32 block)";
    case LinearFormat::BF16: return "bf16";
  }
  return "?";
}

}  // namespace

std::vector<std::string> PrecisionPlan::describe() const {
  std::vector<std::string> lines;
  const int64_t n = static_cast<int64_t>(layer_format.size());
  for (int64_t a = 0; a < n;) {
    int64_t b = a;
    while (b + 1 < n && layer_format[b + 1] == layer_format[a]) ++b;
    const std::string range = a == b ? fmt::format("layer  {}", a) : fmt::format("layers {}-{}", a, b);
    lines.push_back(fmt::format("{:<13}: linear_qkv linear_proj linear_fc1 linear_fc2 in {}", range,
                                format_detail(layer_format[a], nvfp4)));
    a = b + 1;
  }
  lines.push_back("always bf16  : embedding, attention core (QK^T, softmax, PV), RMSNorm, LM head");
  return lines;
}

PrecisionPlan bf16_plan(int64_t num_layers) {
  PrecisionPlan p;
  p.recipe_name = "bf16_mixed";
  p.layer_format.assign(static_cast<size_t>(num_layers), LinearFormat::BF16);
  return p;
}

PrecisionPlan make_precision_plan(const ModelConfig& m, const PrecisionRecipe& r) {
  PrecisionPlan plan;
  plan.recipe_name = r.name;
  plan.nvfp4 = r.nvfp4;
  const LinearFormat q = recipe_format(r);
  const int64_t L = m.num_layers;
  int64_t start = r.first_last_layers_bf16 ? r.num_layers_at_start_in_bf16 : 0;
  int64_t end = r.first_last_layers_bf16 ? r.num_layers_at_end_in_bf16 : 0;
  if (q != LinearFormat::BF16 && start + end >= L) {
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
  plan.layer_format.assign(L, q);
  for (int64_t l = 0; l < L; ++l)
    if (l < start || l >= L - end) plan.layer_format[l] = LinearFormat::BF16;

  const int64_t blk = format_block_multiple(q);
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
  const int64_t blk = format_block_multiple(plan.quantized_format());
  PL_CHECK((micro_batch * seq_length) % blk == 0,
           "micro-batch-size x seq-length = {} x {} = {} tokens must be a multiple of {} for {} (the weight-gradient "
           "GEMM reduces over tokens in blocks)",
           micro_batch, seq_length, micro_batch * seq_length, blk, format_name(plan.quantized_format()));
}

void check_gpu_gemm_rules(const PrecisionPlan& plan, const ModelConfig& m, int64_t micro_batch, int64_t seq_length) {
  if (plan.quantized_format() != LinearFormat::NVFP4) return;
  auto rule = [&](const char* what, int64_t value) {
    PL_CHECK(value % 32 == 0, "{} = {} must be a multiple of 32 for NVFP4 GEMMs on the GPU (cuBLASLt FP4 rows are "
             "16 bytes); {} fits the CPU's 16-element blocks only", what, value, m.file);
  };
  rule("hidden_size", m.hidden_size);
  rule("ffn_hidden_size", m.ffn_hidden_size);
  rule("num_attention_heads*kv_channels", m.q_dim());
  rule("num_query_groups*kv_channels", m.kv_dim());
  rule("micro-batch-size x seq-length", micro_batch * seq_length);
}

}  // namespace pl
