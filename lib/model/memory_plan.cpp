#include "model/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/checked_math.h"
#include "core/error.h"
#include "model/linear_layer.h"
#include "model/llama.h"
#include "model/lora.h"

namespace pl {

int64_t largest_grad_group(const ModelConfig& cfg) {
  // The groups of param_layout: the embedding, each layer's kEntriesPerLayer entries, the final norm
  // with the LM head (up to the end).
  const std::vector<ParamEntry> e = param_layout(cfg);
  int64_t largest = e[1].offset;  // the embedding
  for (size_t first = 1; first < e.size(); first += kEntriesPerLayer) {
    const size_t next = first + kEntriesPerLayer;
    largest = std::max(largest, (next < e.size() ? e[next].offset : cfg.num_parameters()) - e[first].offset);
  }
  return largest;
}

bool fp8_primary_weight_linear(const LinearPlan& p) {
  return p.quantized() && (*p.w == QuantFormat::FP8_E4M3 || *p.w == QuantFormat::FP8_E5M2 || *p.w == QuantFormat::MXFP8);
}

const char* fp8_primary_weights_off_because(const PrecisionPlan& plan, const RunLayout& opt) {
  if (!opt.fp8_primary_weights) return nullptr;
  if (std::none_of(plan.linears.begin(), plan.linears.end(), fp8_primary_weight_linear)) return nullptr;
  if (opt.lora)
    return "--peft lora freezes the base: its FP8 linears are quantized once at load and keep no BF16 or master copy";
  if (opt.optimizer_offload)
    return "--optimizer-cpu-offload keeps the master weights on the host, where the FP8 copies are not made";
  if (opt.distributed_optimizer)
    return "the distributed optimizer all-gathers BF16 weights (its FP8 all-gather is not built)";
  return nullptr;
}

bool fp8_primary_weights_in_effect(const PrecisionPlan& plan, const RunLayout& opt) {
  return opt.fp8_primary_weights && fp8_primary_weights_off_because(plan, opt) == nullptr &&
         std::any_of(plan.linears.begin(), plan.linears.end(), fp8_primary_weight_linear);
}

namespace {
// The flat ranges of param_layout(cfg) (merged where adjacent) without the linear matrices `leave_out` names.
std::vector<int64_t> ranges_without_linears(const ModelConfig& cfg, const PrecisionPlan& plan,
                                            const std::function<bool(const LinearPlan&)>& leave_out) {
  const std::vector<ParamEntry> entries = param_layout(cfg);
  std::vector<int64_t> ranges;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ParamEntry& e = entries[i];
    if (const int kind = linear_of_entry(cfg, i); kind >= 0) {
      const int64_t layer = static_cast<int64_t>((i - 1) / kEntriesPerLayer);
      if (leave_out(plan.linear(layer, kind))) continue;
    }
    if (!ranges.empty() && ranges.back() == e.offset)
      ranges.back() = e.offset + e.numel();
    else
      ranges.insert(ranges.end(), {e.offset, e.offset + e.numel()});
  }
  return ranges;
}
}  // namespace

int linear_of_entry(const ModelConfig& cfg, size_t i) {
  // The linear matrices of layer l are its entries 1, 2, 4, 5 (qkv, proj, fc1, fc2: param_layout).
  constexpr int kLinearOfEntry[kEntriesPerLayer] = {-1, 0, 1, -1, 2, 3};
  if (i < 1 || i >= 1 + kEntriesPerLayer * static_cast<size_t>(cfg.num_layers)) return -1;
  return kLinearOfEntry[(i - 1) % kEntriesPerLayer];
}

std::vector<int64_t> bf16_weight_ranges(const ModelConfig& cfg, const PrecisionPlan& plan, const RunLayout& opt) {
  const bool primary = fp8_primary_weights_in_effect(plan, opt);
  return ranges_without_linears(cfg, plan, [primary](const LinearPlan& p) { return primary && fp8_primary_weight_linear(p); });
}

bool frozen_quantized_linear(const LinearPlan& p) { return p.quantized() && !p.delayed(); }

std::vector<int64_t> lora_base_kept_ranges(const ModelConfig& cfg, const PrecisionPlan& plan) {
  return ranges_without_linears(cfg, plan, frozen_quantized_linear);
}

int64_t lora_base_scratch_elements(const PrecisionPlan& plan) {
  int64_t largest = 0;
  for (const LinearPlan& p : plan.linears)
    if (frozen_quantized_linear(p)) largest = std::max(largest, p.in * p.out);
  return largest;
}

int64_t primary_weight_scratch_elements(const PrecisionPlan& plan, const RunLayout& opt) {
  if (!fp8_primary_weights_in_effect(plan, opt)) return 0;
  int64_t largest = 0;
  for (const LinearPlan& p : plan.linears)
    if (fp8_primary_weight_linear(p)) largest = std::max(largest, p.in * p.out);
  return largest;
}

ShardLayout shard_layout(int64_t num_params, const RunLayout& options) {
  ShardLayout s;
  s.num_params = s.padded = s.shard = num_params;
  if (!options.distributed_optimizer) return s;
  PL_CHECK(options.dp_size >= 1 && options.dp_rank >= 0 && options.dp_rank < options.dp_size,
           "internal: data-parallel rank {} of {}", options.dp_rank, options.dp_size);
  const int64_t unit = options.dp_size * kShardAlignElements;
  s.padded = (num_params + unit - 1) / unit * unit;
  s.shard = s.padded / options.dp_size;
  s.begin = options.dp_rank * s.shard;
  return s;
}

namespace {

// The weights and gradients (every rank holds them, padded with the distributed optimizer), the master
// weights and the moments (one rank's shard), and the offload's host buffers.
void plan_parameters(MemoryPlan& mem, const ModelConfig& cfg, const PrecisionPlan& plan, DType act,
                     const RunLayout& opt) {
  // --peft lora: the flat buffers hold the adapters; the frozen base adds its BF16 weights only.
  const int64_t trainable = opt.lora ? lora_parameter_count(cfg, *opt.lora) : cfg.num_parameters();
  const ShardLayout shard = shard_layout(trainable, opt);
  const size_t n = static_cast<size_t>(shard.padded), owned = static_cast<size_t>(shard.shard);
  mem.weights = static_cast<double>(n * dtype_size(act));
  if (opt.lora) {  // the base's BF16 weights but those of its quantized-only linears, and their load scratch
    const std::vector<int64_t> kept = lora_base_kept_ranges(cfg, plan);
    int64_t elements = lora_base_scratch_elements(plan);
    for (size_t r = 0; r < kept.size(); r += 2) elements += kept[r + 1] - kept[r];
    mem.base_bf16 = static_cast<double>(static_cast<size_t>(elements) * dtype_size(act));
    mem.weights += mem.base_bf16;
    mem.weights_label = "weights (adapters + frozen base, bf16 but its quantized linears)";
  }
  if (fp8_primary_weights_in_effect(plan, opt)) {  // (never sharded: no padding)
    const std::vector<int64_t> kept = bf16_weight_ranges(cfg, plan, opt);
    int64_t elements = primary_weight_scratch_elements(plan, opt);
    for (size_t r = 0; r < kept.size(); r += 2) elements += kept[r + 1] - kept[r];
    mem.weights = static_cast<double>(static_cast<size_t>(elements) * dtype_size(act));
    mem.weights_label = "weights (bf16 but FP8 layers)";
  }
  mem.master = static_cast<double>(owned * 4);
  // BF16 main grads: 2 bytes on the GPU (the CPU keeps bf16 values in FP32 storage).
  mem.grads = static_cast<double>(n * (opt.bf16_main_grads ? dtype_size(act) : 4));
  if (opt.bf16_main_grads) mem.grads_label = "gradients (bf16)";
  // AdamW m and v in their dtypes (fp32, or bf16 under the precision-aware optimizer; allocated by AdamW)
  mem.optimizer = static_cast<double>(owned * (dtype_size(opt.exp_avg) + dtype_size(opt.exp_avg_sq)));
  if (opt.exp_avg != DType::F32 || opt.exp_avg_sq != DType::F32)
    mem.optimizer_label = fmt::format("optimizer (Adam m {}, v {})", opt.exp_avg == DType::BF16 ? "bf16" : "fp32",
                                      opt.exp_avg_sq == DType::BF16 ? "bf16" : "fp32");
  if (opt.optimizer_offload) {
    mem.offload = true;
    mem.host_grads = mem.grads;  // the host copy of the gradients, in their dtype
    const size_t slot = static_cast<size_t>(std::min<int64_t>(kOffloadChunkElements, static_cast<int64_t>(n)));
    mem.host_staging = static_cast<double>(slot * dtype_size(act) * kOffloadStagingSlots);
  }
}

// Every tensor is carved from one arena, each rounded up to 256 bytes, in the order asked for.
struct ArenaLayout {
  size_t total = 0;
  void want(ArenaSlot& s, std::vector<int64_t> dims, DType type) {
    // Checked: the shapes come from the model config and the batch flags (user input).
    constexpr std::string_view what = "the activation memory plan (micro-batch x sequence x model sizes)";
    int64_t count = 1;
    for (int64_t x : dims) count = checked_mul(count, x, what);
    const int64_t bytes = checked_mul(count, static_cast<int64_t>(dtype_size(type)), what);
    s = {std::move(dims), type, total};
    total = static_cast<size_t>(checked_add(static_cast<int64_t>(total), checked_add(bytes, 255, what) / 256 * 256, what));
  }
};

// --peft lora: each layer's A outputs (in its activation set: shared as the rest under recomputation) and the
// adapters' scratch (Activations::lora_in, lora_out, lora_dh).
void plan_lora_activations(Activations<ArenaSlot>& a, ArenaLayout& arena, const ModelConfig& cfg, const LoraConfig& lora,
                           int64_t T, DType act, const RecomputeConfig& recompute) {
  const int64_t targets = lora_targets_before(lora, kLoraTargets);
  int64_t in = 0, out = 0;
  for (int k = 0; k < kLoraTargets; ++k) {
    if (!lora.targets[static_cast<size_t>(k)]) continue;
    in = std::max(in, lora_adapter_shape(cfg, k).in);
    out = std::max(out, lora_adapter_shape(cfg, k).out);
  }
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const auto owner = static_cast<size_t>(recompute.activation_owner(static_cast<int64_t>(l)));
    if (owner < l)
      a.layers[l].lora_h = a.layers[owner].lora_h;
    else
      arena.want(a.layers[l].lora_h, {targets * T, lora.dim}, act);
  }
  arena.want(a.lora_in, {T, in}, act);
  arena.want(a.lora_out, {T, out}, act);
  arena.want(a.lora_dh, {T, lora.dim}, act);
}

// One micro-batch's activations and their gradients, B x S = T tokens.
void plan_activations(Activations<ArenaSlot>& a, ArenaLayout& arena, const ModelConfig& cfg, int64_t B, int64_t S,
                      int64_t T, DType act, const RunLayout& opt) {
  const int64_t h = cfg.hidden_size, f = cfg.ffn_hidden_size, V = cfg.vocab_size;
  const int64_t nq = cfg.num_attention_heads, d = cfg.kv_channels, qkv = cfg.qkv_dim(), L = cfg.num_layers;
  const auto want = [&](ArenaSlot& s, std::vector<int64_t> dims, DType type) { arena.want(s, std::move(dims), type); };
  a.layers.resize(static_cast<size_t>(L));
  want(a.tokens, {T}, DType::I32);
  want(a.labels, {T}, DType::I32);
  // Document-aware packing's uploads (RunLayout::packing): a few bytes per token, only with their flags.
  if (opt.packing.reset_position_ids) want(a.positions, {T}, DType::I32);
  if (opt.packing.reset_attention_mask) want(a.doc_offsets, {T + 1}, DType::I32);
  want(a.embed_out, {T, h}, act);
  // Layer l's input is layer l-1's output buffer; layer 0 reads the embedding output. Under recomputation a layer
  // keeps its input (keeps_input) and its other activations live in its activation set, shared with the layers
  // that are never alive with it and refilled by re-running the layer's forward in the backward pass
  // (config/recompute_config.h): the first layer of a set (its owner) plans it, the others take its slots.
  const RecomputeConfig& rc = opt.recompute;
  a.layers[0].resid_in = a.embed_out;
  for (int64_t l = 1; l < L; ++l) {
    const int64_t owner = rc.activation_owner(l);
    if (rc.keeps_input(l) || owner == l)  // owner == l: the first uniform chunk plans the shared input slots
      want(a.layers[l].resid_in, {T, h}, act);
    else
      a.layers[l].resid_in = a.layers[owner].resid_in;
  }
  for (int64_t l = 0; l < L; ++l) {
    auto& s = a.layers[l];
    const int64_t owner = rc.activation_owner(l);
    if (owner < l) {
      const ArenaSlot in = s.resid_in;
      s = a.layers[owner];
      s.resid_in = in;
      continue;
    }
    want(s.ln1, {T, h}, act);
    want(s.rstd1, {T}, DType::F32);
    want(s.qkv, {T, qkv}, act);
    want(s.attn, {T, nq * d}, act);
    want(s.lse, {B, nq, S}, DType::F32);
    want(s.resid_mid, {T, h}, act);
    want(s.ln2, {T, h}, act);
    want(s.rstd2, {T}, DType::F32);
    want(s.fc1, {T, 2 * f}, act);
    want(s.swi, {T, f}, act);
  }
  want(a.resid_out, {T, h}, act);
  want(a.lnf, {T, h}, act);
  want(a.rstdf, {T}, DType::F32);
  want(a.logits, {T, V}, act);
  want(a.losses_all, {opt.loss_micro_batches, T}, DType::F32);
  want(a.rope_cos, {S, d / 2}, DType::F32);
  want(a.rope_sin, {S, d / 2}, DType::F32);
  want(a.d_resid, {T, h}, act);
  want(a.d_ln, {T, h}, act);
  want(a.d_h, {T, h}, act);
  want(a.d_qkv, {T, qkv}, act);
  want(a.d_attn, {T, nq * d}, act);
  want(a.d_fc1, {T, 2 * f}, act);
  want(a.d_swi, {T, f}, act);
  if (opt.lora) plan_lora_activations(a, arena, cfg, *opt.lora, T, act, opt.recompute);
}

// What the quantized GEMMs need beyond the activations: the largest scratch of one GEMM and how each
// format runs ("nvfp4 emulated", one per format in order of first use).
struct GemmScratch {
  int64_t a = 0, b = 0;
  std::string how;
};

// The quantized weight copies per layer, plus one transient x/dy workspace per distinct (plan, kind), in
// mem.quantized; the scratch by how the GEMMs run (LinearLayer::scratch_need): the CPU's FP32 emulation;
// on a GPU BF16 operands where a format is emulated, nothing where it is native, plus the FP32 telemetry
// reference when statistics may be collected.
GemmScratch plan_linears(MemoryPlan& mem, const PrecisionPlan& plan, const LinearExecution& exec, int64_t T,
                         bool lora) {
  GemmScratch scratch;
  mem.workspace_of.assign(plan.linears.size(), -1);
  mem.weight_t_of.assign(plan.linears.size(), -1);
  for (size_t i = 0; i < plan.linears.size(); ++i) {
    const LinearPlan& p = plan.linears[i];
    // LoRA's frozen base: W's rowwise copy only, Wᵀ made per dgrad into one scratch per (plan, kind).
    const bool transposed = lora && frozen_quantized_linear(p) && LinearLayer::weight_transposable(p);
    mem.quantized += static_cast<double>(LinearLayer::weight_bytes(p, transposed));
    if (lora) mem.base_quantized += static_cast<double>(LinearLayer::weight_bytes(p, transposed));
    if (transposed) {
      size_t first = i % 4;
      while (plan.linears[first] != p) first += 4;
      if (first < i) {
        mem.weight_t_of[i] = mem.weight_t_of[first];
      } else {
        mem.weight_t_of[i] = static_cast<int64_t>(mem.weight_t_scratches.size());
        mem.weight_t_scratches.push_back(static_cast<int64_t>(i));
        mem.quantized += static_cast<double>(quantized_tensor_bytes(*p.w, p.out, p.in, false, true));
      }
    }
    if (!p.quantized()) continue;
    const std::string used = fmt::format("{} {}", format_name(p), exec.native(p) ? "native" : "emulated");
    if (scratch.how.find(used) == std::string::npos) scratch.how += (scratch.how.empty() ? "" : ", ") + used;
    const LinearLayer::ScratchNeed need = LinearLayer::scratch_need(p, exec, T);
    scratch.a = std::max(scratch.a, need.a);
    scratch.b = std::max(scratch.b, need.b);
    size_t first = i % 4;  // the first linear of this kind with this plan
    while (plan.linears[first] != p) first += 4;
    if (first < i) {
      mem.workspace_of[i] = mem.workspace_of[first];
      continue;
    }
    mem.workspace_of[i] = static_cast<int64_t>(mem.workspaces.size());
    mem.workspaces.push_back(static_cast<int64_t>(i));
    mem.quantized += static_cast<double>(LinearWorkspace::bytes(p, T));
  }
  // FP8 delayed scaling's amax histories and scales (DelayedScalingState), counted as quantized state.
  mem.fp8_histories = static_cast<double>(DelayedScalingState::bytes(plan));
  mem.quantized += mem.fp8_histories;
  return scratch;
}

// cuBLASLt's workspace (kGemmWorkspaceBytes, 32 MiB: SPEC-GPU §2) plus the workspace of cuDNN's SDPA backward in the chosen mode. These
// are planning estimates (the plan is made before any GPU is touched, --dry-run included); on the GPU
// the graphs are built at start-up and the banner reports cuDNN's own get_workspace_size()
// (cuda::attention_prepare), which must fit in the estimate plus the arena's slack.
//   deterministic (--deterministic-mode): Hopper's dP-workspace path keeps dP for a whole
//     [B, heads, S, S] in BF16: B·heads·S²·2 bytes (an upper estimate; Blackwell needs less);
//   default (non-deterministic): FP32 dQ accumulators and the softmax row sums,
//     B·heads·S·(4·d + 4) bytes (SPEC-GPU §1.7), counted twice for cuDNN's tile padding and scratch;
//   plus, always, the packed-layout attention's scratch (backend/cuda/attention_pack.h): should cuDNN
//     refuse the graph on strided views of the qkv rows, Q/K/V and dQ/dK/dV are packed copies,
//     2·T·(nq + 2·nkv)·d BF16 values shared by all layers. Whether it is needed is known only when the
//     graphs are built on the GPU, after the plan: it is reserved in the worst case (96 MiB at 8B, T 4096);
//   plus, with documents (RunLayout::packing.reset_attention_mask, backend/cuda/attention_graph.h), the THD graphs of
//     the largest bucket (T documents), which attention_prepare builds: cuDNN sizes their FP32 dQ
//     accumulators with dQ's own ragged layout (frontend ragged_workspace_size), which on the strided views
//     is the qkv row width: T·(nq + 2·nkv)·d·4 bytes on top (96 MiB at 8B, T 4096), and the ragged offsets
//     and lengths (backend/cuda/attention_pack.h DocumentScratch: 4 INT64 arrays of T + 1, T INT32, each
//     16-byte aligned; 144 KiB at T 4096). A deterministic document backward whose workspace would exceed
//     the dense deterministic one (the term above) falls back to the non-deterministic one.
double gpu_library_workspace(const ModelConfig& cfg, int64_t B, int64_t S, const RunLayout& opt) {
  const double bhs = static_cast<double>(B) * static_cast<double>(cfg.num_attention_heads) * static_cast<double>(S);
  const double nondet = 2.0 * bhs * (4.0 * static_cast<double>(cfg.kv_channels) + 4.0);
  const double det = std::max(nondet, 2.0 * bhs * static_cast<double>(S));
  const double T = static_cast<double>(B) * static_cast<double>(S);
  const double pack = 2.0 * T * static_cast<double>(cfg.qkv_dim()) * 2.0;
  const auto round16 = [](double bytes) { return std::ceil(bytes / 16.0) * 16.0; };
  const double documents =
      opt.packing.reset_attention_mask ? T * static_cast<double>(cfg.qkv_dim()) * 4.0 + 4.0 * round16((T + 1) * 8) + round16(T * 4)
                             : 0.0;
  return static_cast<double>(kGemmWorkspaceBytes) + (opt.deterministic_attention ? det : nondet) + pack + documents;
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& cfg, int64_t B, int64_t S, Device device, const PrecisionPlan& plan,
                       const RunLayout& opt, int opened_sm) {
  MemoryPlan mem;
  const DType act = float_storage(device);
  plan_parameters(mem, cfg, plan, act, opt);
  const int64_t T = checked_mul(B, S, "--micro-batch-size x --seq-length");
  ArenaLayout arena;
  plan_activations(mem.arena, arena, cfg, B, S, T, act, opt);
  const LinearExecution exec{.device = device,
                             .gpu_sm = opt.gpu_sm > 0 ? opt.gpu_sm : (opened_sm > 0 ? opened_sm : kPlanDefaultSm),
                             .telemetry = opt.quant_telemetry};
  const GemmScratch scratch = plan_linears(mem, plan, exec, T, opt.lora.has_value());
  if (opt.bf16_main_grads) arena.want(mem.arena.grad_scratch, {largest_grad_group(cfg)}, DType::F32);
  if (scratch.a > 0) arena.want(mem.arena.quant_scratch_a, {scratch.a}, DType::F32);
  if (scratch.b > 0) arena.want(mem.arena.quant_scratch_b, {scratch.b}, DType::F32);
  mem.activations = static_cast<double>(arena.total);
  if (device != Device::CUDA) return mem;
  if (!scratch.how.empty()) {
    const char* source = opt.gpu_sm > 0 ? "" : (opened_sm > 0 ? " (this GPU)" : " (no GPU opened: the default)");
    mem.gemm_note = fmt::format("quantized GEMMs planned for sm_{}{}: {}; their scratch {:.2f} MB{} is in "
                                "activations and scratch",
                                exec.gpu_sm, source, scratch.how,
                                static_cast<double>(scratch.a + scratch.b) * 4 / 1048576.0,
                                exec.telemetry ? " (with the quantization-statistics reference)" : "");
    if (mem.fp8_histories > 0)
      mem.gemm_note += fmt::format("; FP8 delayed scaling's amax histories and scales {:.2f} MB are in quantized copies",
                                   mem.fp8_histories / 1048576.0);
  }
  mem.workspace = gpu_library_workspace(cfg, B, S, opt);
  return mem;
}

}  // namespace pl
