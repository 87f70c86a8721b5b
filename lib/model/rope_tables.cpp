// Megatron's rotary embedding tables (declared in model/llama.h: the model and the generator read them).
#include <cmath>
#include <numbers>
#include <vector>

#include "model/llama.h"

namespace pl {

void rope_tables(const ModelConfig& cfg, int64_t seq_length, float* cos_out, float* sin_out) {
  // MCore RotaryEmbedding: inv_freq_i = 1 / base^(2i/d) in fp32, optional Llama 3.1 _apply_scaling,
  // angle = float(pos) * inv_freq (fp32 outer product), cos/sin of that fp32 angle. We evaluate
  // each step in double and round to float at the points where MCore holds an fp32 tensor.
  const int64_t half = cfg.kv_channels / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(cfg.rotary_base, static_cast<double>(2 * i) / static_cast<double>(cfg.kv_channels));
    if (cfg.rope_scaling) {
      const double old_ctx = static_cast<double>(cfg.rope_original_max_position);
      const double low_wavelen = old_ctx / cfg.rope_low_freq_factor;
      const double high_wavelen = old_ctx / cfg.rope_high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_wavelen) {
        // high frequency: unchanged
      } else if (wavelen > low_wavelen) {
        f = f / cfg.rope_scaling_factor;
      } else {
        const double smooth = (old_ctx / wavelen - cfg.rope_low_freq_factor) /
                              (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
        f = (1.0 - smooth) * f / cfg.rope_scaling_factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  for (int64_t p = 0; p < seq_length; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos_out[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_out[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
}

}  // namespace pl
