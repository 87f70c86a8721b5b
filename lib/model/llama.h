#pragma once
// The Llama decoder, written once against backend/ops.h.
//
// State lives in flat buffers (DESIGN "State in flat buffers"): weights (bf16 values), grads (fp32, or
// bf16 with --main-grads-dtype bf16), fp32 master weights (in host memory with the optimizer offload) and
// the two Adam moments each occupy one Buffer with the same layout, so the optimizer and the gradient
// norm are single passes. Those buffers hold the trainable parameters: every parameter (param_layout), or under
// --peft lora (RunLayout::lora) only the adapters (lora_layout), the base then frozen in a buffer of its own
// (BF16 weights and its recipe's quantized copies; no gradients, master weights or moments), its linear layers'
// weight gradients never computed. Activations for one micro-batch live in one
// arena sized at construction: nothing is allocated by forward/backward.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "core/tensor.h"
#include "model/linear_layer.h"
#include "model/lora.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"

namespace pl {
namespace parallel {
class Communicator;
}

// Parameter entries of one decoder layer in param_layout (ln1, qkv, proj, ln2, fc1, fc2).
inline constexpr size_t kEntriesPerLayer = 6;

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

class LlamaModel {
 public:
  // micro_batch x seq_length tokens per forward; device and rounding from ctx; the linear layers run
  // in the formats of `plan` (all BF16 when no plan is given).
  LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx);
  LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx,
             const PrecisionPlan& plan, const RunLayout& options = {});
  // The memory this model (with the AdamW state) takes: plan_memory's, allocated as it says.
  const MemoryPlan& memory_plan() const { return mem_; }

  const ModelConfig& config() const { return cfg_; }
  const OpContext& context() const { return ctx_; }
  // The Timers its ops report to (OpContext::timers; null: untimed): the trainer's while it trains.
  void set_timers(Timers* timers) { ctx_.timers = timers; }
  // The trainable parameters, in the order of the flat buffers: param_layout(config()), or the adapters under LoRA.
  const std::vector<ParamEntry>& param_entries() const { return entries_; }
  int64_t num_params() const { return trainable_; }
  // --peft lora: the adapters train, the base is frozen (RunLayout::lora).
  bool lora() const { return layout_.lora.has_value(); }
  const LoraConfig& lora_config() const { return *layout_.lora; }
  // Host values of the base's flat elements [offset, offset + count) (param_layout's offsets): into the master
  // weights when every parameter trains (write_master), into the frozen base's BF16 weights (rounded) under LoRA.
  // Initialisation and imports (the HF import), not the loop.
  void write_base(int64_t offset, const float* values, int64_t count);
  // LoRA: the checksum of the frozen base's BF16 weights (LoraBaseRecord::checksum); reads them all to the host.
  uint64_t base_checksum() const;
  int64_t tokens_per_micro_batch() const { return B_ * S_; }
  int64_t micro_batch() const { return B_; }
  int64_t seq_length() const { return S_; }
  size_t activation_bytes() const { return arena_.bytes(); }

  // The BF16 weights the forward and backward read. Under LoRA the per-parameter views are the frozen base's and
  // flat is the adapters' (the trainable flat buffer the optimizer writes). With FP8 primary weights (fp8_primary_weights()) the
  // matrices of the FP8 layers have no BF16 storage (their views have no data; weights().flat is [0]):
  // those layers read their FP8 copies, made from the master (prepare_weights); weights_to_host gives the
  // BF16 values of any range all the same.
  ParamViews& weights() { return weights_; }
  bool fp8_primary_weights() const { return primary_; }
  // FP8 primary weights, after each optimizer step (whose AdamW writes no BF16 weights then): the BF16 weights
  // the model keeps, rounded from the master (copy_master_to_param over bf16_weight_ranges).
  void copy_master_to_kept_weights();
  // The BF16 weights (the device's storage dtype: bf16 bits on a GPU, bf16 values in f32 on the CPU) of the
  // flat elements [first, first + count) into host memory, made from the master where the model keeps none
  // (FP8 primary weights): the same bits either way (what a checkpoint's weights file holds).
  void weights_to_host(int64_t first, int64_t count, void* dst) const;
  ParamViews& grads() { return grads_; }
  // The FP32 master weights. With the distributed optimizer only this rank's shard exists: master().flat
  // is [shard().shard] (elements shard().begin .. of the flat layout) and the per-parameter views are empty.
  ParamViews& master() { return master_; }
  // Data parallelism: which part of the flat buffers this rank's optimizer owns (the whole buffer
  // without the distributed optimizer), and the weights and gradients over the padded length.
  const ShardLayout& shard() const { return shard_; }
  bool sharded() const { return layout_.distributed_optimizer; }
  Tensor weights_padded() const {  // (FP8 primary weights are never sharded: their empty flat view)
    return primary_ ? weights_.flat : weight_buf_.as({shard_.padded}, weights_.flat.dtype);
  }
  Tensor grads_padded() const { return grad_buf_.as({shard_.padded}, grads_.flat.dtype); }
  // The communicator the sharded weights are all-gathered through (sync_weights_from_master); the trainer's.
  void set_communicator(parallel::Communicator* comm) { comm_ = comm; }
  // With the distributed optimizer: every rank's shard of the weights to every rank (no-op otherwise).
  void gather_weights();
  // --overlap-param-gather: after a step the weights' all-gather is still in flight; the next forward calls
  // (*gate)(begin, end) before it reads the flat elements [begin, end) of the embedding, of each layer and
  // of the final norm with the LM head, and makes a layer's quantized copies (prepare_weights) only then.
  using WeightGate = std::function<void(int64_t begin, int64_t end)>;
  void weights_arrive_during_forward(const WeightGate* gate);
  // The gate's owner goes away before a forward has passed it: wait for all the weights now and make
  // their quantized copies (a no-op when no weights are pending).
  void settle_pending_weights();
  // The gate the next forward will pass (null when no weights are pending): tests wrap it to watch it.
  const WeightGate* weight_gate() const { return weights_pending_ ? gate_ : nullptr; }
  // Host values of the flat elements [offset, offset + count) into the master weights: the part this rank
  // owns (all of it without the distributed optimizer). Initialisation and imports, not the loop.
  void write_master(int64_t offset, const float* values, int64_t count);

  // Megatron initialisation into the fp32 master weights (deterministic in seed), copied to the
  // bf16 weights. N(0, std) for matrices; linear_proj and linear_fc2 use std/sqrt(2L); norms 1. Under LoRA the
  // base gets the same values (its BF16 weights bit for bit the full model's) and the adapters init_adapters'.
  void init_parameters(uint64_t seed);
  // LoRA: the adapters' initial values (lora_initial_values: A from --lora-a-init, B zero) into the master
  // weights, copied to their BF16 weights; the base untouched (an import fills it: write_base).
  void init_adapters(uint64_t seed);
  // Copies master -> weights (rounded to bf16), e.g. after a test edits the master copy, and
  // re-quantizes the weights of quantized layers.
  void sync_weights_from_master();
  // Quantizes the weights of every non-BF16 linear layer from the current bf16 weights: once per
  // optimizer step, reused by all micro-batches of the next step.
  void prepare_weights();
  void zero_grads();
  // Telemetry of the last backward run with MicroBatchOptions::collect_quant_stats.
  std::vector<LinearStats> quant_stats() const;
  const PrecisionPlan& plan() const { return plan_; }
  // The run's document-aware packing (RunLayout::packing): which positions the loss counts (data/documents.h).
  const data::DocumentPacking& packing() const { return layout_.packing; }
  // FP8 delayed scaling's amax histories and scales (not enabled() for other recipes): updated after
  // each micro-batch's backward (queue_backward); a checkpoint saves and restores `all`.
  const DelayedScalingState& delayed_scaling() const { return fp8_state_; }

  // Forward of one micro-batch: tokens/labels are host arrays of B*S ids (a label may be -1: not counted).
  // With RunLayout::packing the model masks the labels, restarts the RoPE positions and splits the attention
  // into documents as its flags say (data/documents.h). Returns the sum of the per-token losses (fp32 per
  // token, summed in double; a masked position adds 0). `positions` (B*S, each restarting at 0 with a document)
  // is given exactly when RunLayout::packing.explicit_documents (SFT packs) and then makes the documents.
  double forward(const int32_t* tokens, const int32_t* labels, const int32_t* positions = nullptr);
  // forward() then backward, accumulating grads += d(loss_sum * grad_scale)/dθ; `step` seeds the
  // gradients' stochastic rounding and switches telemetry for this backward.
  double forward_backward(const int32_t* tokens, const int32_t* labels, float grad_scale, const MicroBatchOptions& step = {},
                          const int32_t* positions = nullptr);

  // The same without reading the loss back: the per-token losses of the micro-batch stay on the
  // device in slot `slot` (0 <= slot < loss_micro_batches) until add_loss_sums reads them, so nothing
  // waits for the device between micro-batches.
  void queue_forward(int64_t slot, const int32_t* tokens, const int32_t* labels, const int32_t* positions = nullptr);
  void queue_forward_backward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale,
                              const MicroBatchOptions& step = {}, const int32_t* positions = nullptr);
  // queue_forward_backward's two halves, so the trainer times Megatron's forward-compute (the batch, the
  // forward and the loss with its gradient) and backward-compute apart: each training forward is followed by
  // its backward.
  // `counter` (MicroBatchOptions::counter of the backward that follows) seeds LoRA's dropout masks, which
  // the backward (and a recomputed forward) regenerate from it.
  void queue_training_forward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale,
                              const int32_t* positions = nullptr, uint64_t counter = 0);
  void queue_backward(const MicroBatchOptions& step);
  // One copy of the losses of slots [0, slots) to the host (waits for the device), then
  // acc += (Σ losses of slot s, in double from 0) for s = 0, 1, ... in order; returns acc. This is
  // exactly the sequence of additions `acc += forward_backward(...)` makes, micro-batch by micro-batch.
  double add_loss_sums(int64_t slots, double acc);
  // One forward and backward of a micro-batch of token 0 whose results are thrown away (the gradients zeroed,
  // FP8 delayed scaling's histories and scales reset to their start, no loss read): every GEMM of a step runs
  // once. pretrain_llama's cuBLASLt algorithm selection runs it before the loop, before the weights are
  // initialised or loaded (backend/gemm_algorithms.h). Needs no weights.
  void run_discarded_step();
  // Evaluation (issue 43, lib/eval): the forward of one micro-batch as forward() (tokens/labels: host arrays of
  // B*S ids; a label -1 is not counted) with its per-position losses (fp32 -log p(label), 0 where the label is -1)
  // into `losses` [B*S]; with `greedy`, greedy[i] = 1 where label i >= 0 is the first largest of position i's
  // logits (lm-eval's is_greedy, torch.argmax's first index on ties), else 0 [B*S]. The logits rows of the counted
  // positions are read to the host for it (an evaluation's cost, not training's). model/llama_score.cpp.
  void score(const int32_t* tokens, const int32_t* labels, std::vector<float>& losses, std::vector<uint8_t>* greedy);
  int64_t loss_slots() const { return layout_.loss_micro_batches; }

 private:
  ParamViews views_at(void* base, DType t, Device d, bool group_relative) const;
  ParamViews views_of(const Buffer& buf, DType t) const;
  void allocate_activations();
  // fused: the training forward, whose layer l > 0 finds its ln1 made by layer l-1's output add, and whose
  // output add makes the next layer's ln1 (or the final norm); false: a layer on its own (recomputation).
  void layer_forward(int64_t l, const Tensor& out, bool fused);
  void run_forward(float grad_scale, bool want_grad);
  void run_backward(const MicroBatchOptions& step);
  void upload_batch(const int32_t* tokens, const int32_t* labels, const int32_t* positions);
  void upload_packed(const int32_t* tokens, const int32_t* labels, const int32_t* positions);
  void prepare_layer_weights(int64_t layer);
  // FP8 primary weights: the BF16 rounding of linear `kind` of `layer`'s master in primary_scratch_.
  Tensor rounded_master_weight(int64_t layer, int kind);
  // The weight the backward of linear `kind` of `layer` is given: its BF16 weight, or for an FP8 primary
  // weight the rounded master when this backward records telemetry (its only reader), else the empty view.
  Tensor backward_weight(int64_t layer, int kind, const MicroBatchOptions& step);
  void before_reading_weights(int64_t begin, int64_t end, int64_t layer);  // layer -1: not a decoder layer
  void use_loss_slot(int64_t slot);
  void mark_greedy_labels();  // score(): greedy_out_ from the logits before the loss overwrites them
  void update_delayed_scaling();  // after each micro-batch's backward (FP8 delayed scaling only)
  // LoRA: the adapter of linear `kind` of layer `l` (no-op without one). Forward: y += its output for input x;
  // backward: its A and B gradients from dy and x, dx += its input gradient. (model/lora.h gives the formula.)
  void adapter_forward(int64_t l, int kind, const Tensor& y, const Tensor& x);
  void adapter_backward(int64_t l, int kind, const Tensor& dx, const Tensor& dy, const Tensor& x);
  Tensor lora_h(int64_t l, int kind) const;  // A's output of that adapter in this micro-batch (acts_.layers[l].lora_h)
  // LoRA (llama_lora.cpp): the frozen base's buffer and per-parameter views, the flat views of the adapters, each
  // adapter's A and B views; the listener's news that layer l's adapters (and those above) have final gradients.
  void allocate_lora_views(DType storage, DType grad_type);
  void allocate_weight_t_scratches();
  // LoRA: values [lo, hi) of base entry i (a quantized-only linear) arrived; once all have, its copies are made.
  void write_frozen_linear(size_t i, int64_t lo, int64_t hi, const float* values);
  void adapters_final_from(int64_t l, const MicroBatchOptions& step) const;
  void layer_backward(int64_t l, const LayerParams& g, const Tensor& g_ln1, const Tensor& g_ln2,
                      const MicroBatchOptions& step);

  enum LinearSlot { kQkv = 0, kProj = 1, kFc1 = 2, kFc2 = 3 };  // kLinearNames
  LinearLayer& linear(int64_t layer, int kind) { return linears_[static_cast<size_t>(layer * 4 + kind)]; }
  // The model's context tagged with the linear layer of slot `kind` (the roofline report's rows).
  OpContext linear_ctx(int kind) const {
    constexpr LinearKind kinds[4] = {LinearKind::Qkv, LinearKind::Proj, LinearKind::Fc1, LinearKind::Fc2};
    return with_linear(ctx_, kinds[kind]);
  }

  ModelConfig cfg_;
  int64_t B_, S_;
  OpContext ctx_;
  PrecisionPlan plan_;
  RunLayout layout_;
  MemoryPlan mem_;
  std::vector<Buffer> quant_buffers_;
  std::vector<LinearLayer> linears_;  // [layer*4 + {qkv, proj, fc1, fc2}]
  std::vector<std::unique_ptr<LinearWorkspace>> linear_workspaces_;  // one per distinct (format, shape)
  std::vector<QuantizedTensor> weight_t_;  // LoRA: the frozen linears' Wᵀ scratches (MemoryPlan::weight_t_scratches)
  DelayedScalingState fp8_state_;
  std::vector<ParamEntry> entries_;       // the trainable parameters (the flat buffers' layout)
  std::vector<ParamEntry> base_entries_;  // param_layout(cfg_): the whole model (the base under LoRA)
  int64_t trainable_ = 0;
  ShardLayout shard_;
  // LoRA: the frozen base's BF16 weights (lora_base_kept_ranges of base_entries_, packed; its quantized-only
  // linears have none: their copies are made at load from the one-layer BF16 scratch base_scratch_, each from
  // its values assembled on the host as they arrive, pending_); each base entry's packed offset (-1: not kept)
  // and, for a quantized-only linear, the digest of its BF16 values (base_checksum's); views of each adapter's
  // A and B in the flat weights and gradients ([layer * 4 + kind]; no data where a target has none); the dropout
  // counter of the micro-batch whose forward ran last (its backward regenerates the masks); whether that
  // forward was a training one (evaluation drops nothing); the frozen norms' weight gradients, computed by the
  // norms' backward with their input gradients and discarded (f32 [hidden]).
  Buffer base_buf_, base_scratch_;
  std::vector<int64_t> base_packed_;
  std::vector<uint64_t> base_digests_;
  std::vector<bool> base_digested_;
  struct PendingLinear {
    std::vector<float> values;
    int64_t written = 0;
  };
  std::map<size_t, PendingLinear> pending_;  // base entry -> its values so far
  struct AdapterViews {
    Tensor a, b;
  };
  std::vector<AdapterViews> adapter_w_, adapter_g_;
  uint64_t lora_counter_ = 0;
  bool lora_training_ = false;
  std::vector<uint8_t>* greedy_out_ = nullptr;  // score()'s request of the next forward
  const int32_t* greedy_labels_ = nullptr;
  Buffer norm_grad_sink_;
  parallel::Communicator* comm_ = nullptr;
  const WeightGate* gate_ = nullptr;  // --overlap-param-gather (weights_arrive_during_forward)
  bool weights_pending_ = false;      // the next forward waits for the weights and prepares them
  bool backward_pending_ = false;     // queue_training_forward ran; its queue_backward has not
  Buffer weight_buf_, grad_buf_, master_buf_;
  // FP8 primary weights (RunLayout::fp8_primary_weights in effect): weight_buf_ holds only the flat ranges
  // kept_ (bf16_weight_ranges), packed in order; primary_scratch_ one FP8 layer's BF16 weight at a time.
  bool primary_ = false;
  std::vector<int64_t> kept_;
  Buffer primary_scratch_;
  ParamViews weights_, grads_, master_;
  ParamViews grad_work_;  // BF16 main grads: where the backward writes a group's FP32 gradients

  // Activations of one micro-batch (saved for backward) and backward scratch, all in arena_ as
  // mem_.arena places them.
  Buffer arena_;
  Activations<Tensor> acts_;
  Tensor losses_;  // the slot of acts_.losses_all the next cross-entropy writes
  std::vector<float> host_losses_;  // [loss_micro_batches * T]
  UploadStaging staging_;            // pinned host staging of tokens+labels (+ packing's), 2 slots
  // Document-aware packing (RunLayout::packing), sized at construction: the host side of the micro-batch's
  // masked labels [T], RoPE positions [T] and document offsets [T+1], and what the ops are given (their host
  // copies and the arena's acts_.positions / acts_.doc_offsets; empty without the flags).
  std::vector<int32_t> host_labels_, host_positions_, host_offsets_;
  TokenPositions positions_{};
  DocumentBoundaries docs_{};
  AttentionShape attention_shape() const {
    return {B_, S_, cfg_.num_attention_heads, cfg_.num_query_groups, cfg_.kv_channels, docs_};
  }
};

// The model's ops report to `timers` (OpContext::timers) while this lives; to the previous ones after.
class ScopedTimers {
 public:
  ScopedTimers(LlamaModel& m, Timers* timers) : model_(m), previous_(m.context().timers) { m.set_timers(timers); }
  ~ScopedTimers() { model_.set_timers(previous_); }
  ScopedTimers(const ScopedTimers&) = delete;
  ScopedTimers& operator=(const ScopedTimers&) = delete;

 private:
  LlamaModel& model_;
  Timers* const previous_;
};

// The parameters in the order of the flat buffers (Megatron names, shapes, offsets, init): the embedding,
// kEntriesPerLayer per decoder layer (ln1, qkv, proj, ln2, fc1, fc2), the final norm, the LM head.
std::vector<ParamEntry> param_layout(const ModelConfig& cfg);
// Views by parameter of a flat buffer at `base` laid out as `entries` (param_layout(cfg)); group_relative: each
// layer's views start at the group's own offset 0 (the BF16-main-grads scratch of one group).
// An entry with a negative offset has no storage (its view's data is null).
ParamViews param_views(const ModelConfig& cfg, const std::vector<ParamEntry>& entries, void* base, DType t, Device d,
                       bool group_relative = false);

// FP8 primary weights: views of the BF16 weights kept in the flat ranges `kept` (bf16_weight_ranges), packed in
// order at `base`; the other entries' views have no storage, and flat is [0].
ParamViews kept_weight_views(const ModelConfig& cfg, std::vector<ParamEntry> entries, const std::vector<int64_t>& kept,
                             void* base, DType t, Device d);

// cos/sin tables [S, d/2] of Megatron's rotary embedding (Llama 3.1 frequency scaling if enabled).
void rope_tables(const ModelConfig& cfg, int64_t seq_length, float* cos_out, float* sin_out);

}  // namespace pl
