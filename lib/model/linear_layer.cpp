#include "model/linear_layer.h"

#include <algorithm>

#include "backend/ops.h"
#include "backend/device_memory.h"
#include "core/error.h"
#include "numerics/delayed_scaling.h"
#include "numerics/fp8.h"

namespace pl {

bool LinearExecution::native(const LinearPlan& p) const {
  // FP8 current scaling with E5M2 gradients follows the same rule as E4M3.
  return device == Device::CUDA && p.quantized() && quantized_gemm_native(*p.x, gpu_sm);
}

int64_t LinearLayer::scratch_elements(int64_t tokens, int64_t in, int64_t out) {
  return std::max({tokens * in, tokens * out, in * out});
}

LinearLayer::ScratchNeed LinearLayer::scratch_need(const LinearPlan& p, const LinearExecution& e, int64_t tokens) {
  if (!p.quantized()) return {};
  const int64_t full = scratch_elements(tokens, p.in, p.out);
  if (e.device == Device::CPU) return {full, full};
  const int64_t bf16 = (full + 1) / 2;  // BF16 operand values in f32-typed scratch
  ScratchNeed n;
  if (!e.native(p)) n.a = n.b = bf16;
  if (e.telemetry) n.a = full;  // record_columnwise's FP32 reference
  return n;
}

size_t LinearLayer::weight_bytes(const LinearPlan& p, bool transposed_in_scratch) {
  return p.quantized() ? quantized_tensor_bytes(*p.w, p.out, p.in, true, !transposed_in_scratch) : 0;
}

bool LinearLayer::weight_transposable(const LinearPlan& p) {
  if (!p.quantized()) return false;
  const QuantFormat w = *p.w;
  return (w == QuantFormat::NVFP4 && p.weight_2d) || w == QuantFormat::FP8_E4M3 || w == QuantFormat::FP8_E5M2;
}

size_t LinearWorkspace::bytes(const LinearPlan& p, int64_t tokens) {
  if (!p.quantized()) return 0;
  return quantized_tensor_bytes(*p.x, tokens, p.in, true, true) +   // x
         quantized_tensor_bytes(*p.dy, tokens, p.out, true, true);  // dy
}

LinearWorkspace LinearWorkspace::allocate(std::vector<Buffer>& owner, Device device, const LinearPlan& p,
                                          int64_t tokens) {
  return {.xq = allocate_quantized(owner, device, *p.x, tokens, p.in, true, true),
          .dyq = allocate_quantized(owner, device, *p.dy, tokens, p.out, true, true)};
}

size_t DelayedScalingState::bytes(const PrecisionPlan& plan) {
  const LinearPlan& q = plan.quantized();
  if (!q.delayed()) return 0;
  int64_t quantized = 0;
  for (const LinearPlan& p : plan.linears) quantized += p.quantized() ? 1 : 0;
  return static_cast<size_t>((q.amax_history_len + 1) * 3 * quantized) * sizeof(float);
}

DelayedScalingState DelayedScalingState::allocate(std::vector<Buffer>& owner, Device device, const PrecisionPlan& plan) {
  DelayedScalingState s;
  const size_t bytes = DelayedScalingState::bytes(plan);
  if (bytes == 0) return s;
  const LinearPlan& q = plan.quantized();
  for (const LinearPlan& p : plan.linears) s.quantized_linears += p.quantized() ? 1 : 0;
  const int64_t len = q.amax_history_len, n = 3 * s.quantized_linears;
  owner.emplace_back(bytes, device);
  s.all = owner.back().as({(len + 1) * n}, DType::F32, 0);
  s.history = s.all.rows(0, len * n).view({len, n});
  s.scale = s.all.rows(len * n, n);
  const float e4m3 = num::kE4M3Max, dy_max = *q.dy == QuantFormat::FP8_E5M2 ? num::kE5M2Max : num::kE4M3Max;
  s.rule = {.num_forward = 2 * s.quantized_linears,
            .forward_scaled_max = num::delayed_scaled_max(e4m3, static_cast<int>(q.margin)),
            .backward_scaled_max = num::delayed_scaled_max(dy_max, static_cast<int>(q.margin)),
            .most_recent = q.amax_most_recent};
  return s;
}

void DelayedScalingState::reset() const {
  if (!enabled()) return;
  std::vector<float> init(static_cast<size_t>(all.numel()), 0.0f);
  std::fill(init.end() - scale.numel(), init.end(), 1.0f);
  copy_from_host(all, init.data());
}

DelayedScalingState::Slots DelayedScalingState::slots(int64_t q) const {
  const int64_t Q = quantized_linears;
  const Tensor row0 = history.rows(0, 1).view({history.dim(1)});
  return {.x_record = row0.rows(2 * q, 1), .w_record = row0.rows(2 * q + 1, 1), .dy_record = row0.rows(2 * Q + q, 1),
          .x_scale = scale.rows(2 * q, 1), .w_scale = scale.rows(2 * q + 1, 1), .dy_scale = scale.rows(2 * Q + q, 1)};
}

LinearLayer::LinearLayer(const LinearPlan& plan, int64_t tokens, uint32_t stream_base, Device device,
                         std::vector<Buffer>& owner, LinearWorkspace* ws, Tensor scratch_a, Tensor scratch_b,
                         bool frozen, const QuantizedCopy* weight_t)
    : p_(plan),
      T_(tokens),
      stream_base_(stream_base),
      ws_(ws),
      scratch_a_(scratch_a),
      scratch_b_(scratch_b),
      frozen_(frozen),
      weight_t_(weight_t) {
  PL_CHECK(frozen_ || weight_t_ == nullptr, "internal: a Wᵀ scratch for a linear layer that trains");
  if (!p_.quantized()) return;
  // On the CPU the emulation needs the full FP32 scratch; on a GPU what it needs depends on the path
  // (scratch_need), checked by quantized_gemm itself when it emulates and by backward's telemetry.
  const int64_t full = scratch_elements(T_, p_.in, p_.out);
  PL_CHECK(device != Device::CPU || (scratch_a.numel() >= full && scratch_b.numel() >= full),
           "internal: linear layer scratch too small");
  PL_CHECK(ws_ && ws_->xq.has_rowwise && ws_->xq.rowwise.rows == T_ && ws_->xq.rowwise.cols == p_.in &&
               ws_->dyq.rowwise.cols == p_.out && ws_->xq.format == *p_.x && ws_->dyq.format == *p_.dy,
           "internal: linear layer [{}x{}] needs a matching {} workspace", p_.out, p_.in, format_name(p_));
  PL_CHECK(weight_t_ == nullptr || (weight_transposable(p_) && weight_t_->rows == p_.in && weight_t_->cols == p_.out &&
                                     weight_t_->format == *p_.w),
           "internal: a {} linear layer [{}x{}] given a Wᵀ scratch it cannot use", format_name(p_), p_.out, p_.in);
  wq_ = allocate_quantized(owner, device, *p_.w, p_.out, p_.in, true, weight_t_ == nullptr);
  x_amax_ = wq_.rowwise.spare;  // no allocation of its own
  if (weight_t_ == nullptr) {
    dy_amax_ = wq_.columnwise.spare;
  } else {  // (no columnwise copy to lend its spare floats)
    owner.emplace_back(256, device);
    dy_amax_ = owner.back().as({2}, DType::F32);
  }
}

namespace {
// q with its two copies' amax slots at slots[0] (rowwise) and slots[1] (columnwise).
QuantizedTensor with_amax_slots(QuantizedTensor q, const Tensor& slots) {
  q.rowwise.amax = slots.rows(0, 1);
  q.columnwise.amax = slots.rows(1, 1);
  return q;
}
}  // namespace

QuantizedTensor LinearLayer::x_copies() const { return with_amax_slots(ws_->xq, x_amax_); }
QuantizedTensor LinearLayer::dy_copies() const { return with_amax_slots(ws_->dyq, dy_amax_); }

bool LinearLayer::takes_producer_amax() const {
  if (!p_.quantized() || p_.delayed() || p_.rht) return false;
  const QuantFormat f = *p_.x;  // x, W and dy share the family: per-tensor amax for FP8 and NVFP4 (S_enc)
  return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2 || f == QuantFormat::NVFP4;
}

void LinearLayer::prepare_weight(const OpContext& ctx, const Tensor& w) {
  if (!p_.quantized()) return;
  quantize(ctx, wq_, w,
           {.format = *p_.w, .rowwise = true, .columnwise = weight_t_ == nullptr, .block_2d = p_.weight_2d,
            .scale = ds_.w_scale,
            .amax_record = ds_.w_record, .compact_scales = false});
}

void LinearLayer::forward(const OpContext& layer_ctx, const Tensor& y, const Tensor& x, const Tensor& w,
                          bool x_amax_given) {
  PL_CHECK(!x_amax_given || takes_producer_amax(), "internal: x's amax given to a {} linear layer that takes none",
           format_name(p_));
  const OpContext ctx = with_pass(layer_ctx, GemmPass::Fprop);
  if (!p_.quantized()) return linear_forward(ctx, y, x, w);
  // Rowwise only: the wgrad copy is made in backward from the saved bf16 x (same bits), with the
  // columnwise amax this pass computes now (of RHT(xᵀ) under the RHT), kept in x_amax_[1]; or both amaxes
  // as x's producer wrote them (x_amax_given). A frozen layer has no wgrad: no columnwise amax.
  QuantizedTensor xq = x_copies();
  quantize(ctx, xq, x,
           {.format = *p_.x, .rowwise = true, .columnwise = false, .rht_columnwise = p_.rht, .scale = ds_.x_scale,
            .amax_record = ds_.x_record, .amax_given = x_amax_given, .columnwise_amax = !x_amax_given && !frozen_,
            .compact_scales = false});
  // fprop: FAST_ACCUM where TE uses it (native FP8 forward GEMMs; see backend/cuda/linear.cu).
  quantized_gemm(ctx, y, xq.rowwise, wq_.rowwise, xq.format, false, scratch_a_, scratch_b_,
                 /*fast_accumulation=*/true);
}

void LinearLayer::backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dy,
                           const Tensor& x, const Tensor& w, const MicroBatchOptions& step, bool dy_amax_given) {
  PL_CHECK(!dy_amax_given || takes_producer_amax(), "internal: dy's amax given to a {} linear layer that takes none",
           format_name(p_));
  const OpContext wgrad = with_pass(ctx, GemmPass::Wgrad), dgrad = with_pass(ctx, GemmPass::Dgrad);
  const bool frozen = frozen_;
  PL_CHECK(frozen == (dw.data == nullptr), "internal: a {} linear layer's backward given {} weight gradient",
           frozen ? "frozen" : "trained", frozen ? "a" : "no");
  if (!p_.quantized()) {
    if (!frozen) linear_backward_weight(wgrad, dw, dy, x);
    linear_backward_input(dgrad, dx, dy, w);
    return;
  }
  if (step.collect_quant_stats)
    PL_CHECK(scratch_a_.numel() >= scratch_elements(T_, p_.in, p_.out),
             "quantization statistics of a {} linear layer [{}x{}] need {} f32 elements of scratch, the model "
             "planned {} (plan it with telemetry on)",
             format_name(p_), p_.out, p_.in, scratch_elements(T_, p_.in, p_.out), scratch_a_.numel());
  // dy's two copies serve dgrad (rowwise) and wgrad (columnwise): one row, under dgrad. A frozen weight takes
  // the rowwise copy only, and no copy of x.
  QuantizedTensor dyq = dy_copies();
  quantize(dgrad, dyq, dy,
           {.format = *p_.dy, .rowwise = true, .columnwise = !frozen, .rht_columnwise = p_.rht,
            .stochastic = p_.stochastic_rounding, .seed = kStochasticRoundingSeed, .stream_id = stream_base_,
            .counter = step.counter, .scale = ds_.dy_scale, .amax_record = ds_.dy_record, .amax_given = dy_amax_given,
            .compact_scales = false});
  QuantizedTensor xq = x_copies();
  if (!frozen) {
    // The wgrad copy of x, with the amax given: x_amax_[1], from this x's forward.
    quantize(wgrad, xq, x,
             {.format = *p_.x, .rowwise = false, .columnwise = true, .rht_columnwise = p_.rht, .scale = ds_.x_scale,
              .amax_given = true, .compact_scales = false});
    // wgrad: dW[out,in] += RHT(dyᵀ)[out,T] · RHT(xᵀ)[in,T]ᵀ
    quantized_gemm(wgrad, dw, dyq.columnwise, xq.columnwise, dyq.format, true, scratch_a_, scratch_b_);
  }
  // dgrad: dx[T,in] = dy[T,out] · (Wᵀ)[in,out]ᵀ, Wᵀ stored or made now from W's codes (the same bits)
  if (weight_t_ != nullptr) transpose_quantized(dgrad, *weight_t_, wq_.rowwise);
  quantized_gemm(dgrad, dx, dyq.rowwise, weight_t_ != nullptr ? *weight_t_ : wq_.columnwise, dyq.format, false,
                 scratch_a_, scratch_b_);
  if (step.collect_quant_stats) {
    stats_.clear();
    if (w.data != nullptr) record(ctx, "w rowwise", wq_.rowwise, w);  // (none: a frozen base's, never kept in BF16)
    // rowwise x as fprop saw it
    quantize(ctx, xq, x,
             {.format = *p_.x, .scale = ds_.x_scale, .amax_given = true, .compact_scales = false});
    record(ctx, "x rowwise", xq.rowwise, x);
    if (!frozen) record_columnwise(ctx, "x columnwise", xq.columnwise, x, p_.rht);
    record(ctx, "dy rowwise", dyq.rowwise, dy);
    if (!frozen) record_columnwise(ctx, "dy columnwise", dyq.columnwise, dy, p_.rht);
  }
}

void LinearLayer::record(const OpContext& ctx, const char* operand, const QuantizedCopy& c, const Tensor& reference) {
  stats_.push_back({operand, c.format, quant_stats(ctx, c, c.format, reference)});
}

void LinearLayer::record_columnwise(const OpContext& ctx, const char* operand, const QuantizedCopy& c,
                                    const Tensor& src, bool rht) {
  // The values this copy was quantized from: (RHT'd) transpose of src, materialised in scratch.
  const Tensor ref = scratch_a_.leading(c.rows, c.cols);
  columnwise_source(ctx, ref, src, rht);
  stats_.push_back({operand, c.format, quant_stats(ctx, c, c.format, ref)});
}

}  // namespace pl
