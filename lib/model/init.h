#pragma once
// Deterministic parameter initialisation. Each element's value depends only on (seed, tensor id,
// element index) through a counter-based hash, so the result is independent of thread count and
// of the order tensors are initialised in. (Megatron draws from torch's generator; its exact
// values are not reproduced, only the distributions.)
#include <cstdint>

namespace pl {

struct ParamEntry;

void fill_normal(float* out, int64_t n, double std, uint64_t seed, uint64_t tensor_id);
// U(-bound, bound] (LoRA's kaiming_uniform A: bound 1/sqrt(in)).
void fill_uniform(float* out, int64_t n, double bound, uint64_t seed, uint64_t tensor_id);
void fill_ones(float* out, int64_t n);
// The initial values LlamaModel::init_parameters gives parameter `index` (e) of param_layout: N(0, init_std), or
// ones for a norm weight (init_std 0); out[0, e.numel()).
void initial_parameter_values(const ParamEntry& e, uint64_t index, uint64_t seed, float* out);
// The standard normal sample for one counter (exposed for tests).
double normal_at(uint64_t seed, uint64_t tensor_id, uint64_t index);

}  // namespace pl
