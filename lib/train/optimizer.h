#pragma once
// AdamW on the fp32 master weights with global-norm clipping, as Megatron's optimizer with
// bf16_mixed: grad norm over all fp32 grads before clipping, clip_coeff = max_norm/(norm+1e-6)
// applied when < 1, decoupled weight decay on 2-D tensors only, new bf16 weights from the masters.
#include <cstdint>
#include <vector>

#include "config/train_config.h"
#include "core/tensor.h"
#include "model/llama.h"

namespace pl {

struct OptimizerConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.033;  // Bridge's effective decay (the scheduler's constant 0.033)
  double clip_grad = 1.0;
  // The precision-aware optimizer's moment dtypes (--exp-avg-dtype / --exp-avg-sq-dtype): F32 or BF16
  // (stored as 2-byte bf16 on every backend; num::adamw_element_stored loads, computes in FP32, stores RNE).
  DType exp_avg_dtype = DType::F32;
  DType exp_avg_sq_dtype = DType::F32;
};

// The optimizer settings of a run: the defaults with the run's state dtypes (validated flags).
OptimizerConfig optimizer_config(const TrainConfig& t);
// "fp32" -> F32, "bf16" -> BF16 (the moment dtypes this optimizer stores).
DType optimizer_state_dtype(const std::string& flag_value);

class AdamW {
 public:
  AdamW(LlamaModel& model, const OptimizerConfig& cfg);

  struct Result {
    double grad_norm = 0.0;  // before clipping
    bool skipped = false;    // grad norm not finite: no update
  };
  // One step at learning rate lr. A non-finite gradient norm skips the update (nothing changes).
  Result step(double lr);
  int64_t steps_taken() const { return step_; }
  // Checkpoint access: the moments (flat, the layout of the master weights, in their dtypes) and the step count.
  const Buffer& moment1() const { return m_; }
  const Buffer& moment2() const { return v_; }
  Tensor moment1_tensor() const { return m_.as({model_.num_params()}, cfg_.exp_avg_dtype); }
  Tensor moment2_tensor() const { return v_.as({model_.num_params()}, cfg_.exp_avg_sq_dtype); }
  const OptimizerConfig& config() const { return cfg_; }
  void restore_steps_taken(int64_t steps) { step_ = steps; }
  size_t state_bytes() const { return m_.bytes() + v_.bytes(); }

 private:
  LlamaModel& model_;
  OptimizerConfig cfg_;
  Buffer m_, v_;
  // The elements without weight decay (the 1-D norm weights) as sorted [begin, end) ranges of the flat
  // buffers: on the host, and on the device once (built at construction, read by every step).
  std::vector<int64_t> no_decay_host_;
  Buffer no_decay_device_;
  ElementRanges no_decay_;
  int64_t step_ = 0;
};

}  // namespace pl
