#pragma once
// One element of Megatron's optimizer step: TE FusedAdam with adam_w_mode (decoupled weight decay)
// and bias correction, on an FP32 master weight. Operation order is fixed here so CPU and GPU agree
// bit for bit (compiled with FMA contraction off on both sides).
#include <cmath>
#include <cstdint>

#include "numerics/bf16.h"
#include "numerics/hd.h"

namespace pl::num {

struct AdamWHyper {
  float lr;            // learning rate of this step
  float beta1;         // 0.9
  float beta2;         // 0.95
  float eps;           // 1e-8
  float weight_decay;  // effective decay of this tensor (0 for 1-D tensors)
  float bias_correction1;  // 1 - beta1^step
  float bias_correction2;  // 1 - beta2^step
  float grad_scale;    // clip coefficient applied to the gradient (1 when not clipping)
};

// Host only. The hyper-parameters of one step, built on the host the same way for every backend (so their
// bits agree): bias corrections 1 - beta^step in double, rounded to float once (precise for large
// steps).
inline AdamWHyper adamw_hyper(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                              float grad_scale) {
  const auto correction = [step](float beta) {
    return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
  };
  return {lr, beta1, beta2, eps, weight_decay, correction(beta1), correction(beta2), grad_scale};
}

// Updates master, m, v in place. TE's multi_tensor_adam (ADAM_MODE_1 = AdamW) order:
//   g = grad*scale; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g
//   denom = sqrt(v / bc2) + eps; update = (m / bc1) / denom + wd * p; p -= lr * update
PL_HD void adamw_element(float& master, float& m, float& v, float grad, const AdamWHyper& h) {
  const float g = grad * h.grad_scale;
  m = h.beta1 * m + (1.0f - h.beta1) * g;
  v = h.beta2 * v + (1.0f - h.beta2) * (g * g);
  const float m_hat = m / h.bias_correction1;
  const float v_hat = v / h.bias_correction2;
  const float denom = sqrtf(v_hat) + h.eps;
  const float update = m_hat / denom + h.weight_decay * master;
  master = master - h.lr * update;
}

// ---- the precision-aware optimizer's stored states (Megatron's --use-precision-aware-optimizer) ----
// A state element is stored as float (FP32) or as bf16 bits (uint16_t, BF16). As Transformer Engine's
// FusedAdam (transformer_engine/pytorch/optimizers/fused_adam.py with the multi_tensor_adam kernels of
// transformer_engine/common/multi_tensor/adam.cu): every state is loaded and widened to FP32, the whole
// step is computed in FP32 (the update of this step uses the unrounded FP32 moments), and the new state
// is stored rounded to nearest, ties to even. A BF16 state carries no scale in TE (its _apply_scale
// copies `unscaled.bfloat16()`), so none here; TE's FP16 states use a per-tensor scale
// (absmax / (65504/2)), which this project does not implement yet (--exp-avg-dtype fp16 and
// --main-params-dtype fp16 are refused at start-up). Overflow: a BF16 state past its range becomes
// +-Inf by RNE as TE's cast does; a moment stays far inside it (|m| <= max|g|, v <= max g^2).
PL_HD float state_load(float x) { return x; }
PL_HD float state_load(uint16_t bf16_bits) { return bf16_bits_to_float(bf16_bits); }
PL_HD void state_store(float& dst, float x) { dst = x; }
PL_HD void state_store(uint16_t& dst, float x) { dst = float_to_bf16_bits(x); }

// adamw_element on stored states: M and V are float (FP32) or uint16_t (BF16 bits). With float states it
// is adamw_element exactly (loads and stores are plain copies), so FP32 storage through this path is
// bit-identical to the path without the precision-aware optimizer.
template <class M, class V>
PL_HD void adamw_element_stored(float& master, M& m_stored, V& v_stored, float grad, const AdamWHyper& h) {
  float m = state_load(m_stored), v = state_load(v_stored);
  adamw_element(master, m, v, grad, h);
  state_store(m_stored, m);
  state_store(v_stored, v);
}

}  // namespace pl::num
