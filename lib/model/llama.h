#pragma once
// The Llama decoder, written once against backend/ops.h.
//
// State lives in flat buffers (DESIGN "State in flat buffers"): weights (bf16 values), fp32 grads,
// fp32 master weights and the two Adam moments each occupy one Buffer with the same layout, so the
// optimizer and the gradient norm are single passes. Activations for one micro-batch live in one
// arena sized at construction: nothing is allocated by forward/backward.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "core/tensor.h"
#include "model/linear_layer.h"
#include "model/precision_plan.h"

namespace pl {

// One parameter tensor inside the flat buffers.
struct ParamEntry {
  std::string name;              // Megatron-style, e.g. "decoder.layers.3.self_attention.linear_qkv.weight"
  int64_t rows = 0, cols = 0;    // 2-D [rows, cols]; 1-D tensors have rows = 1
  int64_t offset = 0;            // in elements
  bool is_matrix = false;        // 2-D: weight decay applies
  double init_std = 0.0;         // 0 means "ones" (norm weights)
  int64_t numel() const { return rows * cols; }
};

struct LayerParams {
  Tensor ln1, qkv, proj, ln2, fc1, fc2;  // ln: [h]; qkv: [qkv_dim, h]; proj: [h, q_dim]; fc1: [2f, h]; fc2: [h, f]
};

// Views of one flat buffer (weights, grads, master or a moment) by parameter.
struct ParamViews {
  Tensor embedding;        // [V, h]
  std::vector<LayerParams> layers;
  Tensor final_norm;       // [h]
  Tensor lm_head;          // [V, h]
  Tensor flat;             // [n]
};

// Telemetry of one linear layer's quantized operands.
struct LinearStats {
  int64_t layer;
  const char* linear;  // kLinearNames
  std::vector<OperandStats> operands;
};

// Options that change what is kept for the backward pass, or whether memory is allocated at all.
struct ModelOptions {
  bool recompute = false;  // --recompute full: keep each layer's input only, recompute its forward in backward
  bool plan_only = false;  // size everything (memory_plan()) but allocate nothing: --dry-run
  // The GPU the quantized GEMMs' scratch is sized for (device CUDA; LinearLayer::scratch_need):
  // compute capability, or 0 for the GPU this process has opened, else (--dry-run, nothing opened)
  // backend/quantize.h kPlanDefaultSm. See MemoryPlan::gemm_note.
  int gpu_sm = 0;
  // Quantization statistics may be collected (--log-quant-stats-interval > 0): on a GPU their FP32
  // reference scratch is planned only then. The CPU always has it.
  bool quant_telemetry = true;
  // Micro-batches whose per-token losses stay on the device until read together (add_loss_sums):
  // the trainer sets its micro-batches per iteration, so the loss is read once per iteration.
  int64_t loss_micro_batches = 1;
  // --deterministic-mode: the plan counts the workspace of cuDNN's deterministic attention backward
  // (the algorithm itself is chosen by the device state's deterministic_attention, which the app sets too).
  bool deterministic_attention = false;
};

// Bytes the model needs on its device, by category, known before anything is allocated.
struct MemoryPlan {
  double weights = 0, grads = 0, master = 0, optimizer = 0, activations = 0, quantized = 0, workspace = 0;
  // For a GPU plan with quantized layers: the execution the quantized GEMMs' buffers were sized for,
  // e.g. "quantized GEMMs planned for sm_90: NVFP4 emulated (BF16 operand scratch 470.0 MB in
  // activations and scratch)"; empty otherwise. describe() appends it as a line.
  std::string gemm_note;
  double total() const { return weights + grads + master + optimizer + activations + quantized + workspace; }
  double weights_and_optimizer() const { return weights + grads + master + optimizer; }
  std::vector<std::string> describe() const;  // one line per category, GB (1e9) and MB (2^20)
};

class LlamaModel {
 public:
  // micro_batch x seq_length tokens per forward; device and rounding from ctx; the linear layers run
  // in the formats of `plan` (all BF16 when no plan is given).
  LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx);
  LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx,
             const PrecisionPlan& plan, const ModelOptions& options = {});
  // The memory this model (with the AdamW state) takes; for plan_only models nothing was allocated.
  const MemoryPlan& memory_plan() const { return mem_; }

  const ModelConfig& config() const { return cfg_; }
  const OpContext& context() const { return ctx_; }
  const std::vector<ParamEntry>& param_entries() const { return entries_; }
  int64_t num_params() const { return num_params_; }
  int64_t tokens_per_micro_batch() const { return B_ * S_; }
  size_t activation_bytes() const { return arena_.bytes(); }

  ParamViews& weights() { return weights_; }
  ParamViews& grads() { return grads_; }
  ParamViews& master() { return master_; }

  // Megatron initialisation into the fp32 master weights (deterministic in seed), copied to the
  // bf16 weights. N(0, std) for matrices; linear_proj and linear_fc2 use std/sqrt(2L); norms 1.
  void init_parameters(uint64_t seed);
  // Copies master -> weights (rounded to bf16), e.g. after a test edits the master copy, and
  // re-quantizes the weights of quantized layers.
  void sync_weights_from_master();
  // Quantizes the weights of every non-BF16 linear layer from the current bf16 weights: once per
  // optimizer step, reused by all micro-batches of the next step.
  void prepare_weights();
  void zero_grads();
  // Distinct per (iteration, micro-batch): seeds the stochastic rounding of gradient quantization.
  void set_micro_batch_counter(uint64_t counter) { micro_counter_ = counter; }
  // Telemetry: when on, the next backward records statistics of every quantized operand.
  void set_collect_quant_stats(bool on);
  std::vector<LinearStats> quant_stats() const;
  const PrecisionPlan& plan() const { return plan_; }

  // Forward of one micro-batch: tokens/labels are host arrays of B*S ids. Returns the sum of the
  // per-token losses (fp32 per token, summed in double).
  double forward(const int32_t* tokens, const int32_t* labels);
  // forward() then backward, accumulating grads += d(loss_sum * grad_scale)/dθ.
  double forward_backward(const int32_t* tokens, const int32_t* labels, float grad_scale);

  // The same without reading the loss back: the per-token losses of the micro-batch stay on the
  // device in slot `slot` (0 <= slot < loss_micro_batches) until add_loss_sums reads them, so nothing
  // waits for the device between micro-batches.
  void queue_forward(int64_t slot, const int32_t* tokens, const int32_t* labels);
  void queue_forward_backward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale);
  // One copy of the losses of slots [0, slots) to the host (waits for the device), then
  // acc += (Σ losses of slot s, in double from 0) for s = 0, 1, ... in order; returns acc. This is
  // exactly the sequence of additions `acc += forward_backward(...)` makes, micro-batch by micro-batch.
  double add_loss_sums(int64_t slots, double acc);
  int64_t loss_slots() const { return opt_.loss_micro_batches; }

 private:
  void build_param_layout();
  ParamViews views_of(const Buffer& buf, DType t) const;
  void allocate_activations();
  void layer_forward(int64_t l, const Tensor& out);
  void run_forward(float grad_scale, bool want_grad);
  void run_backward();
  void upload_batch(const int32_t* tokens, const int32_t* labels);
  void use_loss_slot(int64_t slot);

  LinearLayer& linear(int64_t layer, int kind) { return linears_[static_cast<size_t>(layer * 4 + kind)]; }

  ModelConfig cfg_;
  int64_t B_, S_;
  OpContext ctx_;
  PrecisionPlan plan_;
  ModelOptions opt_;
  MemoryPlan mem_;
  std::vector<Buffer> quant_buffers_;
  std::vector<LinearLayer> linears_;  // [layer*4 + {qkv, proj, fc1, fc2}]
  std::vector<std::unique_ptr<LinearWorkspace>> linear_workspaces_;  // one per distinct (format, shape)
  Tensor quant_scratch_a_, quant_scratch_b_;
  uint64_t micro_counter_ = 0;
  std::vector<ParamEntry> entries_;
  int64_t num_params_ = 0;
  Buffer weight_buf_, grad_buf_, master_buf_;
  ParamViews weights_, grads_, master_;

  // Activations of one micro-batch (saved for backward) and backward scratch, all in arena_.
  struct LayerActs {
    Tensor resid_in, ln1, rstd1, qkv, attn, lse, resid_mid, ln2, rstd2, fc1, swi;
  };
  Buffer arena_;
  std::vector<LayerActs> acts_;
  Tensor tokens_, labels_, embed_out_, resid_out_, lnf_, rstdf_, logits_;
  Tensor losses_all_;  // [loss_micro_batches, T] fp32 per-token losses of the micro-batches not yet read
  Tensor losses_;      // the slot the next cross-entropy writes (a row of losses_all_)
  Tensor rope_cos_, rope_sin_;
  Tensor d_resid_, d_ln_, d_h_, d_qkv_, d_attn_, d_fc1_, d_swi_;
  std::vector<float> host_losses_;  // [loss_micro_batches * T]
  UploadStaging staging_;            // pinned host staging of tokens+labels (CUDA), 2 slots
};

// cos/sin tables [S, d/2] of Megatron's rotary embedding (Llama 3.1 frequency scaling if enabled).
void rope_tables(const ModelConfig& cfg, int64_t seq_length, float* cos_out, float* sin_out);

}  // namespace pl
