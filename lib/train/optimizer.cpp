#include "train/optimizer.h"

#include <cmath>

#include "core/error.h"

namespace pl {

DType optimizer_state_dtype(const std::string& flag_value) {
  PL_CHECK(flag_value == "fp32" || flag_value == "bf16", "internal: optimizer state dtype '{}' not stored here",
           flag_value);
  return flag_value == "bf16" ? DType::BF16 : DType::F32;
}

OptimizerConfig optimizer_config(const TrainConfig& t) {
  validate_optimizer_dtypes(t);
  OptimizerConfig c;
  c.exp_avg_dtype = optimizer_state_dtype(t.exp_avg_dtype);
  c.exp_avg_sq_dtype = optimizer_state_dtype(t.exp_avg_sq_dtype);
  return c;
}

AdamW::AdamW(LlamaModel& model, const OptimizerConfig& cfg) : model_(model), cfg_(cfg) {
  const size_t n = static_cast<size_t>(model.num_params());
  const Device dev = model.grads().flat.device;
  m_ = Buffer(n * dtype_size(cfg.exp_avg_dtype), dev);  // zeroed (a zero bf16 is 0x0000)
  v_ = Buffer(n * dtype_size(cfg.exp_avg_sq_dtype), dev);
  // Decay applies to 2-D tensors only: the others become no-decay ranges (adjacent ones merged).
  for (const ParamEntry& e : model.param_entries()) {
    if (e.is_matrix) continue;
    if (!no_decay_host_.empty() && no_decay_host_.back() == e.offset)
      no_decay_host_.back() = e.offset + e.numel();
    else
      no_decay_host_.insert(no_decay_host_.end(), {e.offset, e.offset + e.numel()});
  }
  no_decay_.host = no_decay_host_.data();
  no_decay_.count = static_cast<int64_t>(no_decay_host_.size() / 2);
  if (dev == Device::CUDA && no_decay_.count > 0) {
    no_decay_device_ = Buffer(no_decay_host_.size() * sizeof(int64_t), dev);
    copy_from_host(no_decay_device_.as({static_cast<int64_t>(no_decay_host_.size()) * 2}, DType::I32),
                   no_decay_host_.data());
    no_decay_.device = static_cast<const int64_t*>(no_decay_device_.data());
  }
}

AdamW::Result AdamW::step(double lr) {
  const OpContext& ctx = model_.context();
  Result r;
  r.grad_norm = std::sqrt(sum_of_squares(ctx, model_.grads().flat));
  if (!std::isfinite(r.grad_norm)) {
    r.skipped = true;
    return r;
  }
  const double clip = cfg_.clip_grad / (r.grad_norm + 1e-6);
  const float grad_scale = clip < 1.0 ? static_cast<float>(clip) : 1.0f;
  ++step_;
  const int64_t n = model_.num_params();
  const Tensor m = m_.as({n}, cfg_.exp_avg_dtype), v = v_.as({n}, cfg_.exp_avg_sq_dtype);
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(cfg_.beta1);
  s.beta2 = static_cast<float>(cfg_.beta2);
  s.eps = static_cast<float>(cfg_.eps);
  s.weight_decay = static_cast<float>(cfg_.weight_decay);  // 0 inside no_decay_ (the norm weights)
  s.step = step_;
  s.grad_scale = grad_scale;
  // One pass over the flat buffers (one launch on the GPU), bit-identical to one adamw_update per tensor.
  adamw_update_multi(ctx, model_.weights().flat, model_.master().flat, model_.grads().flat, m, v, no_decay_, s);
  return r;
}

}  // namespace pl
