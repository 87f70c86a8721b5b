#pragma once
// The three GEMMs of one Transformer linear layer, y = x·Wᵀ, in the format its precision plan gives:
//   fprop  y[T,out]   = x[T,in] · W[out,in]ᵀ
//   dgrad  dx[T,in]   = dy[T,out] · W[out,in]
//   wgrad  dW[out,in] += dy[T,out]ᵀ · x[T,in]
// BF16 runs the plain ops. NVFP4 (SPEC-NVFP4 §2): W in 16x16 blocks (one copy serves W and Wᵀ), x
// and dy in 1x16 blocks along each GEMM's reduction dim, dy with stochastic rounding, the wgrad
// operands through the RHT; W is quantized once per optimizer step (prepare_weight) and reused by
// every micro-batch. FP8 current scaling: E4M3 x and W, dy E5M2 ("hybrid") or E4M3 ("e4m3"). MXFP8: E4M3, 1x32.
// On the CPU the quantized GEMMs are emulated (exact dequantization + FP32 BLAS); on a GPU they run
// natively where backend/quantize.h quantized_gemm_native says so, emulated (exact dequantization
// to BF16 + BF16 cuBLASLt) elsewhere.
//
// x's amaxes (plain, and of RHT(xᵀ) for the NVFP4 wgrad copy) are computed once, by the forward's
// quantization pass, into two floats the layer owns, and reused by the backward's re-quantization of
// x (QuantizeOptions::amax_given): the same bits as recomputing them. Where the recipe scales per tensor
// without an RHT'd copy (FP8 current scaling; NVFP4 without RHT), the producer of x (RMSNorm, SwiGLU) writes
// x's amax into those two floats as it makes x (producer_x_amax, op_list.h out_amax), and SwiGLU's backward
// dy's into two more (producer_dy_amax): the quantization then skips its amax pass (Transformer Engine's fused
// norm/activation amax), the same value as that pass, so the same bits (issue 40). The GPU quantizer skips the
// compact block scales (QuantizeOptions::compact_scales = false): every GPU consumer reads the
// swizzled ones; the CPU writes both.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/quantize.h"
#include "model/precision_plan.h"

namespace pl {

// Telemetry of one quantized operand copy (--log-quant-stats-interval).
struct OperandStats {
  std::string operand;  // "x rowwise", "x columnwise", "w rowwise", "dy rowwise", "dy columnwise"
  QuantFormat format;
  QuantStats stats;
};

// What travels with each micro-batch's backward (LlamaModel::queue_backward, LinearLayer::backward).
struct MicroBatchOptions {
  uint64_t counter = 0;              // distinct per (iteration, micro-batch): seeds the stochastic rounding
  bool collect_quant_stats = false;  // the backward records telemetry of every quantized operand it makes
  // The last micro-batch of an iteration with the optimizer offloaded: called during the backward each
  // time the gradients of the flat elements [begin, num_params) are final (the LM head and final norm,
  // then each layer from the last, then the embedding with begin = 0), so their copy to the host can
  // start while the rest of the backward runs. Null: nobody listens.
  const std::function<void(int64_t begin)>* grads_final_from = nullptr;
  // BF16 main grads only: the iteration's first micro-batch writes its (rounded) gradients into the main
  // grads instead of adding them, so the main grads need no zeroing per iteration (round_bf16(g) where
  // zero-then-add gives round_bf16(0 + g): the same but for the sign of a zero).
  bool overwrite_main_grads = false;
};

// The transient quantized copies of x and dy that one GEMM triple needs while it runs. Only the
// weight's copies persist between calls (x is re-quantized in backward from the saved BF16 x, which
// gives the same bits), so layers of the same shape and format share one workspace.
struct LinearWorkspace {
  QuantizedTensor xq, dyq;
  static LinearWorkspace allocate(std::vector<Buffer>& owner, Device device, const LinearPlan& plan, int64_t tokens);
  static size_t bytes(const LinearPlan& plan, int64_t tokens);
};

// How the quantized GEMMs of a model run, for sizing what they need besides the copies: the CPU
// emulates every format (FP32 block values in the scratch); a GPU of compute capability gpu_sm runs
// a format natively (no scratch) or emulated (BF16 block values: half the CPU's scratch bytes).
// Telemetry (--log-quant-stats-interval) needs scratch_a as an FP32 [rows, cols] reference.
struct LinearExecution {
  Device device = Device::CPU;
  int gpu_sm = 0;          // used when device == CUDA
  bool telemetry = true;   // quantization statistics may be collected (MicroBatchOptions::collect_quant_stats)
  bool native(const LinearPlan& p) const;  // the quantized GEMMs of p run natively (never on the CPU)
};

// FP8 delayed scaling (a plan whose quantized linears are delayed()): one amax history column and one
// scale per quantized operand, x, W and dy of each quantized linear q (0, 1, ... in model order), in one
// buffer: history f32 [len, n] (TE's amax_history layout: row 0 this step's amaxes), then scale f32 [n],
// n = 3Q. Columns: x_q at 2q, W_q at 2q + 1 (the forward tensors, as TE's scaling_fwd), dy_q at 2Q + q
// (scaling_bwd). update() runs after each micro-batch's backward (trainer-visible: LlamaModel), as TE
// updates the forward tensors at the autocast's exit and the backward ones after the backward: x's and
// dy's histories roll once per micro-batch, W's once per optimizer step (its amax is recorded when it is
// quantized, after the step; on later micro-batches its entry is 0: no roll, as in TE's kernel_bulk).
struct DelayedScalingState {
  Tensor all;      // f32 [(len + 1) * n]: what a checkpoint saves
  Tensor history;  // f32 [len, n]
  Tensor scale;    // f32 [n]
  DelayedScalingRule rule;
  int64_t quantized_linears = 0;

  bool enabled() const { return all.data != nullptr; }
  static size_t bytes(const PrecisionPlan& plan);  // 0 when the plan is not delayed scaling
  static DelayedScalingState allocate(std::vector<Buffer>& owner, Device device, const PrecisionPlan& plan);
  void reset() const;  // TE's initial state: history 0, scales 1 (upload; outside the loop)
  void update(const OpContext& ctx) const { delayed_scaling_update(ctx, history, scale, rule); }
  // Quantized linear q's history entries (row 0) and scales.
  struct Slots {
    Tensor x_record, w_record, dy_record, x_scale, w_scale, dy_scale;
  };
  Slots slots(int64_t q) const;
};

class LinearLayer {
 public:
  // Buffers for the quantized copies are appended to `owner`. scratch_a/scratch_b: fp32 buffers of
  // at least scratch_elements(...) elements each, shared by all layers (used only inside one call).
  // ws: the shared transient copies for this (plan, tokens); null for BF16.
  // frozen: the weight never trains (LoRA's base): backward runs dgrad only (its dw empty) and the forward makes
  // nothing for a wgrad (no columnwise amax of x). weight_t: a frozen weight's Wᵀ scratch (weight_transposable
  // plans; shared by the layers of its shape): the layer then stores only W's rowwise copy and transposes it into
  // weight_t before each dgrad (null: both stored).
  LinearLayer(const LinearPlan& plan, int64_t tokens, uint32_t stream_base, Device device, std::vector<Buffer>& owner,
              LinearWorkspace* ws, Tensor scratch_a, Tensor scratch_b, bool frozen = false,
              const QuantizedCopy* weight_t = nullptr);
  static int64_t scratch_elements(int64_t tokens, int64_t in, int64_t out);
  // The f32 elements scratch_a / scratch_b need for a layer planned as p under execution e: the CPU's
  // scratch_elements for both on the CPU; on a GPU, half of it per operand where p is emulated
  // (BF16 values), none where native, scratch_a the full FP32 size when telemetry is on; {0, 0} for BF16.
  struct ScratchNeed {
    int64_t a = 0, b = 0;
  };
  static ScratchNeed scratch_need(const LinearPlan& p, const LinearExecution& e, int64_t tokens);
  // Device bytes of the weight's quantized copies such a layer allocates (0 for BF16): its rowwise copy only when
  // its Wᵀ is made in scratch (weight_t).
  static size_t weight_bytes(const LinearPlan& p, bool transposed_in_scratch = false);
  // A weight whose columnwise copy is its rowwise copy transposed (transpose_quantized): NVFP4 with 16x16 blocks,
  // FP8 per tensor. MXFP8's 1x32 blocks run along K in both copies: it stores both.
  static bool weight_transposable(const LinearPlan& p);

  const LinearPlan& plan() const { return p_; }
  // Delayed scaling: quantize x, W and dy with these scales and record their amaxes there.
  void attach_delayed_scaling(const DelayedScalingState::Slots& slots) { ds_ = slots; }
  // Quantizes W (both copies) from the bf16 weights; call after every optimizer step.
  void prepare_weight(const OpContext& ctx, const Tensor& w);
  // x_amax_given: x's producer wrote producer_x_amax() while making this x.
  void forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w, bool x_amax_given = false);
  // Where the producer of x (or of dy, in backward) writes its amax (op_list.h out_amax: f32 [2], both slots)
  // so that forward (backward) skips the quantizer's amax pass; empty when this layer's recipe does not
  // take it (BF16, MXFP8, delayed scaling, or an RHT'd columnwise copy, whose amax needs its own pass).
  Tensor producer_x_amax() const { return takes_producer_amax() ? x_amax_ : Tensor{}; }
  Tensor producer_dy_amax() const { return takes_producer_amax() ? dy_amax_ : Tensor{}; }
  // Philox seed of the gradients' stochastic rounding (a checkpoint records it with the counter).
  static constexpr uint64_t kStochasticRoundingSeed = 0x5EED;
  // step.counter: distinct per (iteration, micro-batch), so stochastic rounding draws fresh bits;
  // step.collect_quant_stats: record every quantized operand's telemetry into stats() (needs scratch_a
  // of scratch_elements(...), checked). Follows this layer's forward() of the same x (reusing its amaxes).
  // dy_amax_given: dy's producer wrote producer_dy_amax() while making this dy. A frozen layer takes an empty dw
  // (no data): dgrad only, no wgrad GEMM and no wgrad copies of x and dy.
  void backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                const Tensor& w, const MicroBatchOptions& step, bool dy_amax_given = false);
  const std::vector<OperandStats>& stats() const { return stats_; }

 private:
  // The workspace's x (dy) copies with this layer's own amax slots (x_amax_[0] rowwise, [1] columnwise; dy_amax_).
  QuantizedTensor x_copies() const;
  QuantizedTensor dy_copies() const;
  // Per-tensor scaling without an RHT'd copy and without delayed scaling (producer_x_amax).
  bool takes_producer_amax() const;
  void record(const OpContext& ctx, const char* operand, const QuantizedCopy& c, const Tensor& reference);
  void record_columnwise(const OpContext& ctx, const char* operand, const QuantizedCopy& c, const Tensor& src,
                         bool rht);

  LinearPlan p_;
  int64_t T_;
  uint32_t stream_base_;
  QuantizedTensor wq_;
  Tensor x_amax_;   // f32 [2] (wq_.rowwise.spare): amax of x and of its columnwise copy's source, from forward
  Tensor dy_amax_;  // f32 [2] (wq_.columnwise.spare): amax of dy's rowwise and columnwise copies' sources
  LinearWorkspace* ws_ = nullptr;
  Tensor scratch_a_, scratch_b_;
  std::vector<OperandStats> stats_;
  DelayedScalingState::Slots ds_;  // empty tensors unless delayed scaling
  bool frozen_ = false;
  const QuantizedCopy* weight_t_ = nullptr;  // Wᵀ made per dgrad (a frozen base); null: wq_.columnwise stored
};

}  // namespace pl
