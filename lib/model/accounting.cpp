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
