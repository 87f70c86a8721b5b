#pragma once
// Comparisons of the model tests' gradient vectors, and LoRA's B set to random values.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/llama.h"

namespace pl {

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
