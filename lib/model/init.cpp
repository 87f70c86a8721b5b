#include "model/init.h"

#include "model/llama.h"

#include <cmath>
#include <numbers>

namespace pl {

namespace {
// splitmix64 finaliser: a bijective 64-bit mix with good avalanche.
uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// Uniform in (0, 1], 53 bits.
double unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }
}  // namespace

double normal_at(uint64_t seed, uint64_t tensor_id, uint64_t index) {
  const uint64_t key = mix64(mix64(seed) ^ (tensor_id * 0xD1B54A32D192ED03ull));
  const double u1 = unit(mix64(key ^ (2 * index)));
  const double u2 = unit(mix64(key ^ (2 * index + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);  // Box-Muller
}

void fill_normal(float* out, int64_t n, double std, uint64_t seed, uint64_t tensor_id) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = static_cast<float>(std * normal_at(seed, tensor_id, static_cast<uint64_t>(i)));
}

void fill_uniform(float* out, int64_t n, double bound, uint64_t seed, uint64_t tensor_id) {
  const uint64_t key = mix64(mix64(seed) ^ (tensor_id * 0xD1B54A32D192ED03ull) ^ 0x55AA55AA55AA55AAull);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const double u = unit(mix64(key ^ static_cast<uint64_t>(i)));  // (0, 1]
    out[i] = static_cast<float>(bound * (2.0 * u - 1.0));
  }
}

void initial_parameter_values(const ParamEntry& e, uint64_t index, uint64_t seed, float* out) {
  if (e.init_std == 0.0)
    fill_ones(out, e.numel());
  else
    fill_normal(out, e.numel(), e.init_std, seed, index);
}

void fill_ones(float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = 1.0f;
}

}  // namespace pl
