#include "model/accounting.h"

namespace pl {

double flops_per_iteration(const ModelConfig& m, int64_t global_batch, int64_t seq_length) {
  const double B = static_cast<double>(global_batch);
  const double s = static_cast<double>(seq_length);
  const double L = static_cast<double>(m.num_layers);
  const double h = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double n = static_cast<double>(m.num_attention_heads);
  const double g = static_cast<double>(m.num_query_groups);
  const double q_over_h = static_cast<double>(m.q_dim()) / h;  // kv_channels*heads/hidden
  const double V = static_cast<double>(m.padded_vocab_size());
  const double expansion = 3.0 * 2.0 * 2.0;  // fwd+wgrad+dgrad, 2 FLOPs per MAC, 2 GEMMs per pair
  const double gated = 1.5;                  // SwiGLU: three h<->f GEMMs instead of two
  // Megatron's formula (training.py num_floating_point_operations): with --reset-attention-mask the attention
  // is block-diagonal, but Megatron does not discount the masked pairs, and neither does this count.
  const double self_attn = expansion * L * h * h * ((1.0 + g / n + s / h / 2.0) * q_over_h);
  return B * s * (expansion * L * h * (f * gated) + self_attn + 6.0 * h * V);
}

// The full formula's terms, split: the weight GEMMs (linear layers and LM head, fwd + wgrad + dgrad) and the
// attention core (QKᵀ and PV, forward and backward), whose sum is flops_per_iteration.
double lora_flops_per_iteration(const ModelConfig& m, const LoraConfig& lora, int64_t global_batch, int64_t seq_length) {
  const double B = static_cast<double>(global_batch), s = static_cast<double>(seq_length);
  const double L = static_cast<double>(m.num_layers), h = static_cast<double>(m.hidden_size);
  const double q_over_h = static_cast<double>(m.q_dim()) / h;
  // Megatron's attention-core term (the s/h/2 part of self_attn in flops_per_iteration).
  const double core = 12.0 * L * h * h * (s / h / 2.0) * q_over_h;
  const double full = flops_per_iteration(m, 1, seq_length) / s;  // per token
  const double weight_gemms = full - core;
  double adapters = 0.0;  // per token: fwd, dgrad and wgrad of A and B, 2 FLOPs per MAC
  for (int k = 0; k < kLoraTargets; ++k)
    if (lora.targets[static_cast<size_t>(k)])
      adapters += 6.0 * L * static_cast<double>(lora_adapter_shape(m, k).parameters(lora.dim));
  return B * s * (weight_gemms * 2.0 / 3.0 + core + adapters);
}

MegatronParamCounts megatron_param_counts(const ModelConfig& m) {
  const double L = static_cast<double>(m.num_layers);
  const double h = static_cast<double>(m.hidden_size);
  const double f = static_cast<double>(m.ffn_hidden_size);
  const double n = static_cast<double>(m.num_attention_heads);
  const double g = static_cast<double>(m.num_query_groups);
  const double q_over_h = static_cast<double>(m.q_dim()) / h;
  const double gated = 1.5;
  MegatronParamCounts c;
  c.transformer_layers = 2.0 * L * h * h *
                         ((1.0 + g / n) * q_over_h  // attention
                          + (f / h) * gated         // MLP
                          + 2.0 / h                 // the two layer norms
                          + 1.0 / (L * h));         // final norm
  c.embedding_layers = 2.0 * h * static_cast<double>(m.padded_vocab_size());  // untied
  return c;
}

}  // namespace pl
