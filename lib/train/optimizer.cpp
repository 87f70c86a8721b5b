#include "train/optimizer.h"

#include <cmath>

namespace pl {

AdamW::AdamW(LlamaModel& model, const OptimizerConfig& cfg) : model_(model), cfg_(cfg) {
  const size_t n = static_cast<size_t>(model.num_params());
  const Device dev = model.grads().flat.device;
  m_ = Buffer(n * 4, dev);
  v_ = Buffer(n * 4, dev);
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
  const Tensor m = m_.as({n}, DType::F32), v = v_.as({n}, DType::F32);
  for (const ParamEntry& e : model_.param_entries()) {
    AdamWStep s;
    s.lr = static_cast<float>(lr);
    s.beta1 = static_cast<float>(cfg_.beta1);
    s.beta2 = static_cast<float>(cfg_.beta2);
    s.eps = static_cast<float>(cfg_.eps);
    s.weight_decay = e.is_matrix ? static_cast<float>(cfg_.weight_decay) : 0.0f;
    s.step = step_;
    s.grad_scale = grad_scale;
    adamw_update(ctx, model_.weights().flat.rows(e.offset, e.numel()), model_.master().flat.rows(e.offset, e.numel()),
                 model_.grads().flat.rows(e.offset, e.numel()), m.rows(e.offset, e.numel()),
                 v.rows(e.offset, e.numel()), s);
  }
  return r;
}

}  // namespace pl
