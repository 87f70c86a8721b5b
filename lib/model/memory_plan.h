#pragma once
// The memory a model takes on its device, by category, and its activation arena's layout, from config,
// plan and options alone: --dry-run and the fit check build no model; LlamaModel allocates this layout.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/lora_config.h"
#include "config/model_config.h"
#include "config/recompute_config.h"
#include "core/tensor.h"
#include "data/documents.h"
#include "model/precision_plan.h"
#include "numerics/reduce.h"

namespace pl {

// How a run lays the model out in memory (what is kept for the backward pass, where the optimizer
// state lives and in which dtypes, how it is sharded over ranks, how much scratch is planned): not the
// model's shape (ModelConfig) but the run's choices that size and place its buffers.
struct RunLayout {
  // --recompute-granularity full, --recompute-method, --recompute-num-layers (config/recompute_config.h): which
  // layers keep only their input and run their forward again in the backward; their activations share sets.
  RecomputeConfig recompute{};
  // The GPU (compute capability) the quantized GEMMs' scratch is sized for on CUDA, or 0: the one
  // opened, else (--dry-run) kPlanDefaultSm. See LinearLayer::scratch_need, MemoryPlan::gemm_note.
  int gpu_sm = 0;
  // --log-quant-stats-interval > 0: a GPU plans the statistics' FP32 reference scratch (the CPU always has it).
  bool quant_telemetry = true;
  // Micro-batches whose per-token losses stay on the device until add_loss_sums reads them together
  // (the trainer: its micro-batches per iteration, so the loss is read once per iteration).
  int64_t loss_micro_batches = 1;
  // --deterministic-mode: plan the workspace of cuDNN's deterministic attention backward (chosen by
  // the device state's deterministic_attention).
  bool deterministic_attention = false;
  // The precision-aware optimizer's moment dtypes (--exp-avg-dtype / --exp-avg-sq-dtype): F32 or BF16.
  DType exp_avg = DType::F32;
  DType exp_avg_sq = DType::F32;
  // --optimizer-cpu-offload: the FP32 master weights and the moments live on the host, with a pinned host
  // copy of the gradients and a pinned staging ring for the updated weights (AdamW's offload path).
  bool optimizer_offload = false;
  // --main-grads-dtype bf16: the main grads are BF16 (FP32 storage of bf16 values on the CPU); each
  // micro-batch's gradients of one group of parameters (the LM head with the final norm, one layer, the
  // embedding) are computed in an FP32 scratch of the largest group and added in, rounded once.
  bool bf16_main_grads = false;
  // FP8 primary weights (Megatron's fp8_param_gather, the recipe's field or --[no-]fp8-param-gather): the
  // weights of the linear layers whose weight format is FP8 (per-tensor or MXFP8) live only as their FP8
  // copies, made by the optimizer step from the FP32 master (each one through a transient BF16 rounding of
  // that linear's master, so codes and scales are those of the BF16 path); no BF16 copy of them is kept.
  // Asked for; whether it is in effect: fp8_primary_weights_off_because.
  bool fp8_primary_weights = false;
  // Data parallelism (issue 13): the ranks and, with --use-distributed-optimizer, the sharding of the
  // optimizer state (ShardLayout below): the weights and gradients padded to the sharded size, the FP32
  // master weights and the moments only for this rank's shard.
  int64_t dp_size = 1;
  int64_t dp_rank = 0;
  bool distributed_optimizer = false;
  // Document-aware packing (--eod-mask-loss, --reset-position-ids, --reset-attention-mask): the model derives
  // each micro-batch's loss mask, RoPE positions and document offsets from its tokens (data/documents.h) and
  // uploads them with it; the arena gets positions [T] and offsets [T+1] (i32) only when their flag is on.
  data::DocumentPacking packing{};
  // --peft lora (issue 41): the trainable parameters are LoRA's adapters (model/lora.h lora_layout), which the flat
  // weights, gradients, master weights and moments hold; the base is frozen: its BF16 weights (and the quantized
  // copies its recipe makes of them) with no gradients, master weights or optimizer state. Empty: every parameter
  // trains (pretraining, full fine-tuning).
  std::optional<LoraConfig> lora{};
};

// The flat buffers across the data-parallel ranks with Megatron's distributed optimizer (ZeRO-1): the
// buffer is padded to `padded` elements and rank r owns the contiguous range [r*shard, (r+1)*shard) of
// the master weights, the moments and the reduced gradients. Megatron pads each bucket to a multiple of
// lcm(dp, 128) elements (megatron/core/distributed/param_and_grad_buffer.py, _pad_end_of_bucket_if_needed)
// so every rank's slice is aligned for NCCL; here the one flat buffer is padded so that every shard is a
// multiple of kShardAlignElements: the gradient norm's chunk (num::kSumSquaresChunk, 65536 elements,
// 256-byte aligned in BF16 and FP32), so no chunk straddles two ranks and the sharded norm is the
// one-rank norm bit for bit (AdamW, sum_of_squares_chunks; at most 65536 x dp padding elements). Without the
// distributed optimizer: one shard that is the whole, unpadded buffer. The padding's gradients stay zero,
// so its master weights and moments stay zero through every step.
inline constexpr int64_t kShardAlignElements = num::kSumSquaresChunk;
struct ShardLayout {
  int64_t num_params = 0;  // the model's parameters (the real elements)
  int64_t padded = 0;      // the flat weights and gradients (num_params rounded up)
  int64_t shard = 0;       // elements per rank
  int64_t begin = 0;       // this rank's first element
  int64_t end() const { return begin + shard; }
  // This rank's real elements: [real_begin(), real_end()) (empty for a rank that holds only padding).
  int64_t real_end() const { return std::min(end(), num_params); }
  int64_t real_begin() const { return std::min(begin, real_end()); }
  int64_t real_size() const { return real_end() - real_begin(); }
};
ShardLayout shard_layout(int64_t num_params, const RunLayout& options);

// The offload's host step runs over the flat buffers in chunks of this many elements; the updated
// weights of a chunk go to the device through one of kOffloadStagingSlots pinned slots (a ring: a slot
// is refilled once its previous upload has finished).
// 64 Mi elements (128 MiB of bf16 per slot): about 120 chunks for 8B parameters, so the per-chunk timer
// events stay well inside the timers' level-1 event pool.
inline constexpr int64_t kOffloadChunkElements = int64_t{1} << 26;
inline constexpr int kOffloadStagingSlots = 4;

// The storage of "bf16" weights and activations: FP32 holding bf16 values on the CPU (backend/ops.h).
inline DType float_storage(Device d) { return d == Device::CPU ? DType::F32 : DType::BF16; }

struct ArenaSlot {  // one tensor of the activation arena; empty dims: not used by this model
  std::vector<int64_t> dims;
  DType type = DType::F32;
  size_t offset = 0;  // bytes from the arena's start
};

// The tensors of one micro-batch's forward and backward, named once: ArenaSlot in the layout, Tensor
// in the model. all(x) lists every member of x (the one list that maps the layout onto the model).
template <class T>
struct Activations {
  struct Layer {
    T resid_in, ln1, rstd1, qkv, attn, lse, resid_mid, ln2, rstd2, fc1, swi;
    T lora_h;  // --peft lora: A's output of each adapter of the layer, [targets * T, dim] (target order), for B's wgrad
    template <class S>
    static auto all(S& s) {
      return std::array{&s.resid_in, &s.ln1, &s.rstd1, &s.qkv, &s.attn, &s.lse, &s.resid_mid, &s.ln2, &s.rstd2,
                        &s.fc1, &s.swi, &s.lora_h};
    }
  };
  std::vector<Layer> layers;  // with full recomputation layers 1.. share layer 0's slots but resid_in
  T tokens, labels, embed_out, resid_out, lnf, rstdf, logits, losses_all, rope_cos, rope_sin;
  T positions, doc_offsets;  // i32 [T] and [T+1]: RunLayout::packing's RoPE positions and document offsets
  T d_resid, d_ln, d_h, d_qkv, d_attn, d_fc1, d_swi, quant_scratch_a, quant_scratch_b;
  T grad_scratch;  // fp32 [largest parameter group] with BF16 main grads (RunLayout::bf16_main_grads)
  // --peft lora's scratch, shared by every adapter: the dropped input and, in backward, the input's gradient
  // [T, largest in]; the adapter's output and, in backward, its scaled gradient [T, largest out]; A's output's
  // gradient [T, dim].
  T lora_in, lora_out, lora_dh;
  template <class S>
  static auto all(S& s) {
    return std::array{&s.tokens, &s.labels, &s.embed_out, &s.resid_out, &s.lnf, &s.rstdf, &s.logits,
                      &s.losses_all, &s.rope_cos, &s.rope_sin, &s.positions, &s.doc_offsets, &s.d_resid, &s.d_ln, &s.d_h, &s.d_qkv,
                      &s.d_attn, &s.d_fc1, &s.d_swi, &s.quant_scratch_a, &s.quant_scratch_b, &s.grad_scratch,
                      &s.lora_in, &s.lora_out, &s.lora_dh};
  }
};

// Bytes the model needs on its device, by category, and where its buffers go.
struct MemoryPlan {
  double weights = 0, grads = 0, master = 0, optimizer = 0, activations = 0, quantized = 0, workspace = 0;
  // --optimizer-cpu-offload: master and optimizer are on the host, with these pinned host buffers:
  // the FP32 copy of the gradients and the weight staging ring (0 without offload).
  bool offload = false;
  double host_grads = 0, host_staging = 0;
  // GPU plans with quantized layers: the execution their GEMMs' buffers are sized for ("quantized
  // GEMMs planned for sm_90 ...: nvfp4 emulated; ..."); empty otherwise. Last of log::memory_plan_lines.
  std::string gemm_note;
  // The optimizer row's name in log::memory_plan_lines: empty for the FP32 moments (the default name),
  // else the moments' dtypes ("optimizer (Adam m bf16, v bf16)").
  std::string optimizer_label;
  // The gradients row's name: empty for FP32 main grads, "gradients (bf16)" with --main-grads-dtype bf16.
  std::string grads_label;
  // The weights row's name: empty for BF16 weights of every parameter; with FP8 primary weights
  // "weights (bf16 but FP8 layers)": the other BF16 weights and the FP8 layers' BF16 rounding scratch.
  std::string weights_label;
  // --peft lora: the frozen base's bytes, its BF16 part (embedding, norms, LM head, BF16 layers and the one-layer
  // load scratch; in `weights`) and its quantized linears' stored copies (in `quantized`).
  double base_bf16 = 0, base_quantized = 0;
  // FP8 delayed scaling: the bytes of the amax histories and scales (part of `quantized`; 0 otherwise).
  double fp8_histories = 0;
  Activations<ArenaSlot> arena;  // the activation arena (activations bytes)
  // The transient x/dy copies: one workspace per distinct (plan, kind) of quantized linear, named by
  // the first linear [layer*4 + kind] that uses it; workspace_of[linear] indexes them (-1: BF16).
  std::vector<int64_t> workspaces, workspace_of;
  // LoRA's frozen quantized-only linears whose Wᵀ is made per dgrad (LinearLayer::weight_transposable): one scratch
  // columnwise copy per distinct (plan, kind), named by its first linear; weight_t_of[linear] indexes them (-1: Wᵀ
  // stored, or none).
  std::vector<int64_t> weight_t_scratches, weight_t_of;
  // Bytes on the model's device (without offload: every category).
  double total() const {
    return weights + grads + (offload ? 0.0 : master + optimizer) + activations + quantized + workspace;
  }
  // Bytes the offload keeps on the host (0 without offload).
  double host_total() const { return offload ? master + optimizer + host_grads + host_staging : 0.0; }
  double weights_and_optimizer() const { return weights + grads + master + optimizer; }
  std::array<double, 7> categories() const { return {weights, grads, master, optimizer, activations, quantized, workspace}; }
  // The categories on the model's device (with offload, master and optimizer are 0 there).
  std::array<double, 7> device_categories() const {
    return {weights, grads, offload ? 0.0 : master, offload ? 0.0 : optimizer, activations, quantized, workspace};
  }
};

// FP8 primary weights (RunLayout::fp8_primary_weights). A linear layer whose weight the optimizer keeps
// only in FP8: quantized with an FP8 weight format (FP8 per-tensor or MXFP8; NVFP4 is Megatron's separate
// fp4_param_gather, not built).
bool fp8_primary_weight_linear(const LinearPlan& p);
// Why FP8 primary weights are not in effect although asked for: the optimizer offload (the master weights
// are on the host, where the codes are not made) or the distributed optimizer (its all-gather is of BF16
// weights); nullptr when they are in effect, or not asked for, or the plan has no FP8 weight.
const char* fp8_primary_weights_off_because(const PrecisionPlan& plan, const RunLayout& options);
bool fp8_primary_weights_in_effect(const PrecisionPlan& plan, const RunLayout& options);
// The flat ranges [begin, end) (begin0, end0, begin1, ...: sorted, disjoint, adjacent ones merged) whose BF16
// weights the model keeps: all [0, num_parameters) unless FP8 primary weights are in effect, which leave out
// the matrices of the fp8_primary_weight_linear layers.
std::vector<int64_t> bf16_weight_ranges(const ModelConfig& cfg, const PrecisionPlan& plan, const RunLayout& options);
// The linear slot (0 qkv, 1 proj, 2 fc1, 3 fc2) of param_layout(cfg)'s entry i, or -1 when it is no linear matrix.
int linear_of_entry(const ModelConfig& cfg, size_t i);
// Elements of the transient BF16 weight of one FP8 primary-weight linear (the largest): 0 when not in effect.
int64_t primary_weight_scratch_elements(const PrecisionPlan& plan, const RunLayout& options);

// LoRA (RunLayout::lora): a frozen base linear layer kept only as its quantized copies, quantized once at load from
// a transient BF16 rounding of its values: every quantized linear but FP8 delayed scaling's (whose weight scale
// follows its amax history, so its copies are made again from BF16 weights after each step).
bool frozen_quantized_linear(const LinearPlan& p);
// The base's flat ranges [begin, end) (param_layout's offsets; sorted, merged) whose BF16 weights a LoRA model keeps:
// every parameter but the matrices of the frozen_quantized_linear layers; and the largest of those matrices (the
// one-layer BF16 scratch they are quantized from at load).
std::vector<int64_t> lora_base_kept_ranges(const ModelConfig& cfg, const PrecisionPlan& plan);
int64_t lora_base_scratch_elements(const PrecisionPlan& plan);

// Elements of the largest group of parameters whose gradients become final together in the backward:
// the LM head with the final norm, one decoder layer, or the embedding (the BF16 main grads' scratch).
int64_t largest_grad_group(const ModelConfig& cfg);

// micro_batch x seq_length tokens per forward on `device`. opened_sm: the compute capability of the
// GPU this process has opened, or 0 (used when options.gpu_sm is 0; neither: kPlanDefaultSm).
MemoryPlan plan_memory(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, Device device,
                       const PrecisionPlan& plan, const RunLayout& options, int opened_sm);

}  // namespace pl
