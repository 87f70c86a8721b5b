#pragma once
// Model FLOPs (the TFLOP/s of the log) and Megatron's theoretical parameter counts.
#include <cstdint>

#include "config/lora_config.h"
#include "config/model_config.h"

namespace pl {

// Megatron-Bridge num_floating_point_operations (SPEC-MEGATRON §2b): fwd+wgrad+dgrad of every GEMM,
// causal attention halved, recomputation not counted, LM head over the padded vocab.
double flops_per_iteration(const ModelConfig& m, int64_t global_batch, int64_t seq_length);
inline double flops_per_token(const ModelConfig& m, int64_t seq_length) {
  return flops_per_iteration(m, 1, seq_length) / static_cast<double>(seq_length);
}
// --peft lora: the base's weight GEMMs (linear layers, LM head) forward and dgrad only (2/3 of their fwd + wgrad +
// dgrad: no base wgrad), the attention core whole (its backward has no weight to skip: dQ, dK, dV all run), plus
// 6 FLOPs per adapter parameter per token (fwd, dgrad, wgrad of A and B). Megatron-Bridge counts LoRA as "forward
// + dgrad of the base plus the adapters" (../shared/SPEC-LORA.md); its exact code was not at hand, so this is
// our reading of it, named in README. (Its 70B anchor, 278.8 GFLOP/token at seq 4096, is about 2/3 of the weight
// GEMMs, 278.0, plus the adapters; this count also has the attention core's 16.1.)
double lora_flops_per_iteration(const ModelConfig& m, const LoraConfig& lora, int64_t global_batch, int64_t seq_length);

// Megatron's theoretical_memory_utils counts (used for the start-up lines).
struct MegatronParamCounts {
  double transformer_layers;  // attention + MLP + the layer norms + final norm
  double embedding_layers;    // embedding + untied output layer, padded vocab
  double total() const { return transformer_layers + embedding_layers; }
};
MegatronParamCounts megatron_param_counts(const ModelConfig& m);

// Bytes per parameter of weights + optimizer state for this trainer's bf16_mixed layout:
// bf16 weight 2 + fp32 grad 4 + fp32 master 4 + Adam m,v 8 = 18 (Megatron's 6 + 12/DP with DP=1).
inline constexpr double kWeightAndOptimizerBytesPerParam = 18.0;

}  // namespace pl
