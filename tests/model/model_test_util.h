#pragma once
// Comparisons of the model tests' gradient vectors, LoRA's B set to random values, and the byte-vocabulary tiny
// model with its initial masters (the generate and evaluate tests).
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "config/model_config.h"
#include "model/llama.h"

namespace pl {

// llama_tiny_bytes with init std 0.05: predictions sharper than at 0.02, so near-ties between logits are rare.
inline ModelConfig tiny_bytes_model() {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json");
  m.init_method_std = 0.05;
  return m;
}

inline OpContext cpu_bf16_ctx() {
  OpContext c;
  c.round_bf16 = true;
  return c;
}

// Megatron-initialised FP32 masters of `m` (as a checkpoint would hold them).
inline std::vector<float> initial_masters(const ModelConfig& m, uint64_t seed) {
  LlamaModel model(m, 1, 8, cpu_bf16_ctx(), bf16_plan(m));
  model.init_parameters(seed);
  std::vector<float> w(static_cast<size_t>(model.num_params()));
  copy_to_host(w.data(), model.master().flat);
  return w;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

// Every adapter's B (lora_layout's linear_out entries) drawn from N(0, stddev) with `rng`, written into the model's
// master and BF16 weights: B starts at zero, which would make A's gradients zero whatever the backward does.
inline void set_random_lora_b(LlamaModel& model, std::mt19937& rng, float stddev) {
  std::vector<float> master(static_cast<size_t>(model.num_params()));
  copy_to_host(master.data(), model.master().flat);
  std::normal_distribution<float> nd(0.0f, stddev);
  for (const ParamEntry& e : model.param_entries())
    if (e.name.ends_with("linear_out.weight"))
      for (int64_t i = 0; i < e.numel(); ++i) master[static_cast<size_t>(e.offset + i)] = nd(rng);
  model.write_master(0, master.data(), model.num_params());
  model.sync_weights_from_master();
}

}  // namespace pl
