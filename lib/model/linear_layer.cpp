#include "model/linear_layer.h"

#include <algorithm>

#include "backend/ops.h"
#include "core/error.h"

namespace pl {

QuantFormat linear_quant_format(LinearFormat f) {
  switch (f) {
    case LinearFormat::NVFP4: return QuantFormat::NVFP4;
    case LinearFormat::MXFP8: return QuantFormat::MXFP8;
    default: return QuantFormat::FP8_E4M3;
  }
}

namespace {
QuantFormat quant_format_of(LinearFormat f) { return linear_quant_format(f); }
}  // namespace

bool LinearExecution::native(LinearFormat f) const {
  if (device != Device::CUDA || f == LinearFormat::BF16) return false;
  // FP8 current scaling also multiplies E5M2 gradients: the same rule as E4M3.
  return quantized_gemm_native(quant_format_of(f), gpu_sm);
}

int64_t LinearLayer::scratch_elements(int64_t tokens, int64_t in, int64_t out) {
  return std::max({tokens * in, tokens * out, in * out});
}

LinearLayer::ScratchNeed LinearLayer::scratch_need(LinearFormat f, const LinearExecution& e, int64_t tokens,
                                                   int64_t in, int64_t out) {
  if (f == LinearFormat::BF16) return {};
  const int64_t full = scratch_elements(tokens, in, out);
  if (e.device == Device::CPU) return {full, full};
  const int64_t bf16 = (full + 1) / 2;  // BF16 operand values in f32-typed scratch
  ScratchNeed n;
  if (!e.native(f)) n.a = n.b = bf16;
  if (e.telemetry) n.a = full;  // record_columnwise's FP32 reference
  return n;
}

namespace {
// Megatron's fp8 "hybrid": E5M2 for gradients. MXFP8 (fp8 "e4m3") and NVFP4 keep their format.
QuantFormat grad_format_of(LinearFormat f) {
  return f == LinearFormat::FP8_CURRENT_SCALING ? QuantFormat::FP8_E5M2 : quant_format_of(f);
}
}  // namespace

QuantFormat LinearLayer::x_format() const { return quant_format_of(format_); }
QuantFormat LinearLayer::dy_format() const { return grad_format_of(format_); }

size_t LinearLayer::weight_bytes(LinearFormat f, int64_t in, int64_t out) {
  return f == LinearFormat::BF16 ? 0 : quantized_tensor_bytes(quant_format_of(f), out, in, true, true);
}

size_t LinearWorkspace::bytes(LinearFormat f, int64_t tokens, int64_t in, int64_t out) {
  if (f == LinearFormat::BF16) return 0;
  return quantized_tensor_bytes(quant_format_of(f), tokens, in, true, true) +  // x
         quantized_tensor_bytes(grad_format_of(f), tokens, out, true, true);   // dy
}

LinearWorkspace LinearWorkspace::allocate(std::vector<Buffer>& owner, Device device, LinearFormat f, int64_t tokens,
                                          int64_t in, int64_t out) {
  LinearWorkspace ws;
  ws.xq = allocate_quantized(owner, device, quant_format_of(f), tokens, in, true, true);
  ws.dyq = allocate_quantized(owner, device, grad_format_of(f), tokens, out, true, true);
  return ws;
}

LinearLayer::LinearLayer(LinearFormat format, const Nvfp4Options& nvfp4, int64_t tokens, int64_t in, int64_t out,
                         uint32_t stream_base, Device device, std::vector<Buffer>& owner, LinearWorkspace* ws,
                         Tensor scratch_a, Tensor scratch_b)
    : format_(format),
      nv_(nvfp4),
      T_(tokens),
      in_(in),
      out_(out),
      stream_base_(stream_base),
      ws_(ws),
      scratch_a_(scratch_a),
      scratch_b_(scratch_b) {
  if (format_ == LinearFormat::BF16) return;
  // On the CPU the emulation needs the full FP32 scratch; on a GPU what it needs depends on the path
  // (scratch_need), checked by quantized_gemm itself when it emulates and by set_collect_stats.
  PL_CHECK(device != Device::CPU || (scratch_a.numel() >= scratch_elements(T_, in_, out_) &&
                                     scratch_b.numel() >= scratch_elements(T_, in_, out_)),
           "internal: linear layer scratch too small");
  PL_CHECK(ws_ && ws_->xq.has_rowwise && ws_->xq.rowwise.rows == T_ && ws_->xq.rowwise.cols == in_ &&
               ws_->dyq.rowwise.cols == out_ && ws_->xq.format == x_format() && ws_->dyq.format == dy_format(),
           "internal: linear layer [{}x{}] needs a matching {} workspace", out_, in_, format_name(format_));
  wq_ = allocate_quantized(owner, device, x_format(), out_, in_, true, true);
  x_amax_ = wq_.rowwise.spare;  // no allocation of its own
}

void LinearLayer::set_collect_stats(bool on) {
  if (on && format_ != LinearFormat::BF16)
    PL_CHECK(scratch_a_.numel() >= scratch_elements(T_, in_, out_),
             "quantization statistics of a {} linear layer [{}x{}] need {} f32 elements of scratch, the model "
             "planned {} (plan it with telemetry on)",
             format_name(format_), out_, in_, scratch_elements(T_, in_, out_), scratch_a_.numel());
  collect_ = on;
}

QuantizedTensor LinearLayer::x_copies() const {
  QuantizedTensor q = ws_->xq;
  q.rowwise.amax = x_amax_.rows(0, 1);
  q.columnwise.amax = x_amax_.rows(1, 1);
  return q;
}

void LinearLayer::prepare_weight(const OpContext& ctx, const Tensor& w) {
  if (format_ == LinearFormat::BF16) return;
  QuantizeOptions o;
  o.format = x_format();
  o.rowwise = o.columnwise = true;
  o.block_2d = format_ == LinearFormat::NVFP4 && nv_.weight_2d_quantization;
  o.compact_scales = false;
  quantize(ctx, wq_, w, o);
}

void LinearLayer::forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  if (format_ == LinearFormat::BF16) return linear_forward(ctx, y, x, w);
  QuantizeOptions o;
  o.format = x_format();
  o.rowwise = true;
  o.columnwise = false;  // the wgrad copy is made in backward from the saved bf16 x (same bits)
  // ... with the amax this pass computes now (of RHT(xᵀ) under the RHT), kept in x_amax_[1].
  o.columnwise_amax = true;
  o.rht_columnwise = format_ == LinearFormat::NVFP4 && nv_.random_hadamard_transform;
  o.compact_scales = false;
  QuantizedTensor xq = x_copies();
  quantize(ctx, xq, x, o);
  // fprop: FAST_ACCUM where TE uses it (native FP8 forward GEMMs; see backend/cuda/linear.cu).
  quantized_gemm(ctx, y, xq.rowwise, wq_.rowwise, xq.format, false, scratch_a_, scratch_b_,
                 /*fast_accumulation=*/true);
}

void LinearLayer::backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dy,
                           const Tensor& x, const Tensor& w, uint64_t sr_counter) {
  if (format_ == LinearFormat::BF16) {
    linear_backward_weight(ctx, dw, dy, x);
    linear_backward_input(ctx, dx, dy, w);
    return;
  }
  const bool nvfp4 = format_ == LinearFormat::NVFP4;
  QuantizeOptions g;
  g.format = dy_format();
  g.rowwise = g.columnwise = true;
  g.rht_columnwise = nvfp4 && nv_.random_hadamard_transform;
  g.stochastic = nvfp4 && nv_.stochastic_rounding;
  g.seed = kStochasticRoundingSeed;
  g.stream_id = stream_base_;
  g.counter = sr_counter;
  g.compact_scales = false;
  quantize(ctx, ws_->dyq, dy, g);
  QuantizeOptions xo;
  xo.format = x_format();
  xo.rowwise = false;
  xo.columnwise = true;
  xo.rht_columnwise = nvfp4 && nv_.random_hadamard_transform;
  xo.amax_given = true;  // x_amax_[1], from this x's forward
  xo.compact_scales = false;
  QuantizedTensor xq = x_copies();
  quantize(ctx, xq, x, xo);
  // wgrad: dW[out,in] += RHT(dyᵀ)[out,T] · RHT(xᵀ)[in,T]ᵀ
  quantized_gemm(ctx, dw, ws_->dyq.columnwise, xq.columnwise, ws_->dyq.format, true, scratch_a_, scratch_b_);
  // dgrad: dx[T,in] = dy[T,out] · (Wᵀ)[in,out]ᵀ
  quantized_gemm(ctx, dx, ws_->dyq.rowwise, wq_.columnwise, ws_->dyq.format, false, scratch_a_, scratch_b_);
  if (collect_) {
    stats_.clear();
    record(ctx, "w rowwise", wq_.rowwise, w);
    QuantizeOptions ro;  // rowwise x as fprop saw it
    ro.format = xo.format;
    ro.amax_given = true;
    ro.compact_scales = false;
    quantize(ctx, xq, x, ro);
    record(ctx, "x rowwise", xq.rowwise, x);
    record_columnwise(ctx, "x columnwise", xq.columnwise, x, xo.rht_columnwise);
    record(ctx, "dy rowwise", ws_->dyq.rowwise, dy);
    record_columnwise(ctx, "dy columnwise", ws_->dyq.columnwise, dy, g.rht_columnwise);
  }
}

void LinearLayer::record(const OpContext& ctx, const char* operand, const QuantizedCopy& c, const Tensor& reference) {
  stats_.push_back({operand, c.format, quant_stats(ctx, c, c.format, reference)});
}

void LinearLayer::record_columnwise(const OpContext& ctx, const char* operand, const QuantizedCopy& c,
                                    const Tensor& src, bool rht) {
  // The values this copy was quantized from: (RHT'd) transpose of src, materialised in scratch.
  const Tensor ref = scratch_a_.view({scratch_a_.numel()}).rows(0, c.rows * c.cols).view({c.rows, c.cols});
  columnwise_source(ctx, ref, src, rht);
  stats_.push_back({operand, c.format, quant_stats(ctx, c, c.format, ref)});
}

}  // namespace pl
