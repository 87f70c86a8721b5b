#include "model/llama.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "model/init.h"

namespace pl {

namespace {
enum LinearKind { kQkv = 0, kProj = 1, kFc1 = 2, kFc2 = 3 };

DType float_storage(const OpContext& ctx) {
  // The CPU backend stores bf16 tensors as FP32 holding bf16 values (backend/ops.h).
  return ctx.device == Device::CPU ? DType::F32 : DType::BF16;
}
}  // namespace

LlamaModel::LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx)
    : LlamaModel(cfg, micro_batch, seq_length, ctx, bf16_plan(cfg.num_layers)) {}

LlamaModel::LlamaModel(const ModelConfig& cfg, int64_t micro_batch, int64_t seq_length, const OpContext& ctx,
                       const PrecisionPlan& plan, const ModelOptions& options)
    : cfg_(cfg), B_(micro_batch), S_(seq_length), ctx_(ctx), plan_(plan), opt_(options) {
  PL_CHECK(micro_batch > 0 && seq_length > 0, "model needs a positive micro-batch and sequence length");
  PL_CHECK(options.loss_micro_batches >= 1, "internal: loss_micro_batches = {} (must be >= 1)",
           options.loss_micro_batches);
  PL_CHECK(static_cast<int64_t>(plan_.layer_format.size()) == cfg.num_layers,
           "internal: precision plan for {} layers, model has {}", plan_.layer_format.size(), cfg.num_layers);
  build_param_layout();
  const size_t n = static_cast<size_t>(num_params_);
  mem_.weights = static_cast<double>(n * dtype_size(float_storage(ctx_)));
  mem_.grads = mem_.master = static_cast<double>(n * 4);
  mem_.optimizer = static_cast<double>(n * 8);  // AdamW m and v, fp32 (allocated by AdamW)
  if (!opt_.plan_only) {
    weight_buf_ = Buffer(n * dtype_size(float_storage(ctx_)), ctx_.device);
    grad_buf_ = Buffer(n * 4, ctx_.device);
    master_buf_ = Buffer(n * 4, ctx_.device);
    weights_ = views_of(weight_buf_, float_storage(ctx_));
    grads_ = views_of(grad_buf_, DType::F32);
    master_ = views_of(master_buf_, DType::F32);
  }
  allocate_activations();
  // Ops with grow-only device scratch size it on their first call: make the gradient-norm reduction's
  // happen now rather than in the training loop.
  if (!opt_.plan_only && ctx_.device == Device::CUDA) (void)sum_of_squares(ctx_, grads_.flat);
}

void LlamaModel::build_param_layout() {
  const int64_t h = cfg_.hidden_size, V = cfg_.vocab_size, f = cfg_.ffn_hidden_size;
  const double std = cfg_.init_method_std;
  const double out_std = std / std::sqrt(2.0 * static_cast<double>(cfg_.num_layers));  // scaled_init_method_normal
  auto add = [&](std::string name, int64_t rows, int64_t cols, bool matrix, double init_std) {
    entries_.push_back({std::move(name), rows, cols, num_params_, matrix, init_std});
    num_params_ += rows * cols;
  };
  add("embedding.word_embeddings.weight", V, h, true, std);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = fmt::format("decoder.layers.{}.", l);
    add(p + "self_attention.linear_qkv.layer_norm_weight", 1, h, false, 0.0);
    add(p + "self_attention.linear_qkv.weight", cfg_.qkv_dim(), h, true, std);
    add(p + "self_attention.linear_proj.weight", h, cfg_.q_dim(), true, out_std);
    add(p + "mlp.linear_fc1.layer_norm_weight", 1, h, false, 0.0);
    add(p + "mlp.linear_fc1.weight", 2 * f, h, true, std);
    add(p + "mlp.linear_fc2.weight", h, f, true, out_std);
  }
  add("decoder.final_layernorm.weight", 1, h, false, 0.0);
  add("output_layer.weight", V, h, true, std);
  PL_CHECK(num_params_ == cfg_.num_parameters(), "internal: parameter layout {} != {}", num_params_,
           cfg_.num_parameters());
}

ParamViews LlamaModel::views_of(const Buffer& buf, DType t) const {
  const size_t es = dtype_size(t);
  auto view = [&](const ParamEntry& e) {
    return e.rows == 1 ? buf.as({e.cols}, t, e.offset * es) : buf.as({e.rows, e.cols}, t, e.offset * es);
  };
  ParamViews v;
  size_t i = 0;
  v.embedding = view(entries_[i++]);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    LayerParams lp;
    lp.ln1 = view(entries_[i++]);
    lp.qkv = view(entries_[i++]);
    lp.proj = view(entries_[i++]);
    lp.ln2 = view(entries_[i++]);
    lp.fc1 = view(entries_[i++]);
    lp.fc2 = view(entries_[i++]);
    v.layers.push_back(lp);
  }
  v.final_norm = view(entries_[i++]);
  v.lm_head = view(entries_[i++]);
  v.flat = buf.as({num_params_}, t);
  return v;
}

void LlamaModel::allocate_activations() {
  const int64_t T = B_ * S_, h = cfg_.hidden_size, f = cfg_.ffn_hidden_size, V = cfg_.vocab_size;
  const int64_t nq = cfg_.num_attention_heads, d = cfg_.kv_channels, qkv = cfg_.qkv_dim();
  const DType act = float_storage(ctx_);
  // Input and output widths of the four linears: qkv, proj, fc1 (gate|up), fc2.
  const int64_t lin_in[4] = {h, nq * d, h, f};
  const int64_t lin_out[4] = {qkv, h, 2 * f, h};
  auto linear_in = [&](int k) { return lin_in[k]; };
  auto linear_out = [&](int k) { return lin_out[k]; };
  // Carve every tensor from one arena: first count, then allocate, then place.
  struct Slot {
    Tensor* t;
    std::vector<int64_t> dims;
    DType type;
  };
  std::vector<Slot> slots;
  auto want = [&](Tensor& t, std::vector<int64_t> dims, DType type) { slots.push_back({&t, std::move(dims), type}); };
  acts_.resize(cfg_.num_layers);
  want(tokens_, {T}, DType::I32);
  want(labels_, {T}, DType::I32);
  want(embed_out_, {T, h}, act);
  // Layer l's input is layer l-1's output buffer; layer 0 reads the embedding output. With full
  // recomputation only these inputs are kept per layer; the rest is one set shared by all layers
  // and refilled by re-running the layer's forward in the backward pass.
  for (int64_t l = 1; l < cfg_.num_layers; ++l) want(acts_[l].resid_in, {T, h}, act);
  for (int64_t l = 0; l < (opt_.recompute ? 1 : cfg_.num_layers); ++l) {
    LayerActs& a = acts_[l];
    want(a.ln1, {T, h}, act);
    want(a.rstd1, {T}, DType::F32);
    want(a.qkv, {T, qkv}, act);
    want(a.attn, {T, nq * d}, act);
    want(a.lse, {B_, nq, S_}, DType::F32);
    want(a.resid_mid, {T, h}, act);
    want(a.ln2, {T, h}, act);
    want(a.rstd2, {T}, DType::F32);
    want(a.fc1, {T, 2 * f}, act);
    want(a.swi, {T, f}, act);
  }
  want(resid_out_, {T, h}, act);
  want(lnf_, {T, h}, act);
  want(rstdf_, {T}, DType::F32);
  want(logits_, {T, V}, act);
  want(losses_all_, {opt_.loss_micro_batches, T}, DType::F32);
  want(rope_cos_, {S_, d / 2}, DType::F32);
  want(rope_sin_, {S_, d / 2}, DType::F32);
  want(d_resid_, {T, h}, act);
  want(d_ln_, {T, h}, act);
  want(d_h_, {T, h}, act);
  want(d_qkv_, {T, qkv}, act);
  want(d_attn_, {T, nq * d}, act);
  want(d_fc1_, {T, 2 * f}, act);
  want(d_swi_, {T, f}, act);
  // Scratch of the quantized GEMMs, by how they run (LinearLayer::scratch_need): the CPU's FP32
  // emulation; on a GPU BF16 operands where a format is emulated, nothing where it is native, plus
  // the FP32 telemetry reference when statistics may be collected.
  LinearExecution exec;
  exec.device = ctx_.device;
  exec.telemetry = opt_.quant_telemetry;
  // The GPU of the context's device state (so the plan is the GPU's); without one (a plan-only model,
  // --dry-run) the default, unless a GPU is named.
  const int opened = device_sm(ctx_);
  exec.gpu_sm = opt_.gpu_sm > 0 ? opt_.gpu_sm : (opened > 0 ? opened : kPlanDefaultSm);
  int64_t scratch_a = 0, scratch_b = 0;
  std::vector<LinearFormat> quantized_formats;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LinearFormat f = plan_.layer_format[l];
    if (f == LinearFormat::BF16) continue;
    if (std::find(quantized_formats.begin(), quantized_formats.end(), f) == quantized_formats.end())
      quantized_formats.push_back(f);
    for (int k = 0; k < 4; ++k) {
      const LinearLayer::ScratchNeed need = LinearLayer::scratch_need(f, exec, T, linear_in(k), linear_out(k));
      scratch_a = std::max(scratch_a, need.a);
      scratch_b = std::max(scratch_b, need.b);
    }
  }
  if (scratch_a > 0) want(quant_scratch_a_, {scratch_a}, DType::F32);
  if (scratch_b > 0) want(quant_scratch_b_, {scratch_b}, DType::F32);
  if (ctx_.device == Device::CUDA && !quantized_formats.empty()) {
    std::string how;
    for (LinearFormat f : quantized_formats)
      how += fmt::format("{}{} {}", how.empty() ? "" : ", ", format_name(f), exec.native(f) ? "native" : "emulated");
    const char* source = opt_.gpu_sm > 0 ? "" : (opened > 0 ? " (this GPU)" : " (no GPU opened: the default)");
    mem_.gemm_note = fmt::format("quantized GEMMs planned for sm_{}{}: {}; their scratch {:.2f} MB{} is in "
                                 "activations and scratch",
                                 exec.gpu_sm, source, how, static_cast<double>(scratch_a + scratch_b) * 4 / 1048576.0,
                                 exec.telemetry ? " (with the quantization-statistics reference)" : "");
  }
  auto bytes_of = [](const Slot& s) {
    int64_t n = 1;
    for (int64_t x : s.dims) n *= x;
    return (static_cast<size_t>(n) * dtype_size(s.type) + 255) / 256 * 256;
  };
  size_t total = 0;
  for (const Slot& s : slots) total += bytes_of(s);
  mem_.activations = static_cast<double>(total);
  // Quantized weight copies per layer, plus one transient x/dy workspace per distinct (format, linear).
  std::vector<std::pair<LinearFormat, int>> workspace_keys;
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    for (int k = 0; k < 4; ++k) {
      const LinearFormat f = plan_.layer_format[l];
      mem_.quantized += static_cast<double>(LinearLayer::weight_bytes(f, linear_in(k), linear_out(k)));
      if (f != LinearFormat::BF16 &&
          std::find(workspace_keys.begin(), workspace_keys.end(), std::pair{f, k}) == workspace_keys.end()) {
        workspace_keys.emplace_back(f, k);
        mem_.quantized += static_cast<double>(LinearWorkspace::bytes(f, T, linear_in(k), linear_out(k)));
      }
    }
  if (ctx_.device == Device::CUDA) {
    // cuBLASLt 32 MiB (SPEC-GPU §2) plus the workspace of cuDNN's SDPA backward in the chosen mode. These
    // are planning estimates (the plan is made before any GPU is touched, --dry-run included); on the GPU
    // the graphs are built at start-up and the banner reports cuDNN's own get_workspace_size()
    // (cuda::attention_prepare), which must fit in the estimate plus the arena's slack.
    //   deterministic (--deterministic-mode): Hopper's dP-workspace path keeps dP for a whole
    //     [B, heads, S, S] in BF16: B·heads·S²·2 bytes (an upper estimate; Blackwell needs less);
    //   default (non-deterministic): FP32 dQ accumulators and the softmax row sums,
    //     B·heads·S·(4·d + 4) bytes (SPEC-GPU §1.7), counted twice for cuDNN's tile padding and scratch.
    const double bhs = static_cast<double>(B_) * static_cast<double>(cfg_.num_attention_heads) *
                       static_cast<double>(S_);
    const double nondet = 2.0 * bhs * (4.0 * static_cast<double>(cfg_.kv_channels) + 4.0);
    const double det = std::max(nondet, 2.0 * bhs * static_cast<double>(S_));
    mem_.workspace = 32.0 * 1024 * 1024 + (opt_.deterministic_attention ? det : nondet);
  }
  if (opt_.plan_only) return;
  arena_ = Buffer(total, ctx_.device);
  size_t off = 0;
  for (const Slot& s : slots) {
    Tensor t(static_cast<char*>(arena_.data()) + off, {}, s.type, ctx_.device);
    t.ndim = static_cast<int>(s.dims.size());
    for (int i = 0; i < t.ndim; ++i) t.shape[i] = s.dims[i];
    *s.t = t;
    off += bytes_of(s);
  }
  acts_[0].resid_in = embed_out_;
  if (opt_.recompute)
    for (int64_t l = 1; l < cfg_.num_layers; ++l) {
      const Tensor in = acts_[l].resid_in;
      acts_[l] = acts_[0];
      acts_[l].resid_in = in;
    }

  linears_.reserve(static_cast<size_t>(cfg_.num_layers * 4));
  std::vector<LinearWorkspace*> workspace_of(workspace_keys.size());
  for (size_t i = 0; i < workspace_keys.size(); ++i) {
    const auto [f, k] = workspace_keys[i];
    linear_workspaces_.push_back(std::make_unique<LinearWorkspace>(
        LinearWorkspace::allocate(quant_buffers_, ctx_.device, f, T, linear_in(k), linear_out(k))));
    workspace_of[i] = linear_workspaces_.back().get();
  }
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    for (int k = 0; k < 4; ++k) {
      const LinearFormat f = plan_.layer_format[l];
      LinearWorkspace* ws = nullptr;
      for (size_t i = 0; i < workspace_keys.size(); ++i)
        if (workspace_keys[i] == std::pair{f, k}) ws = workspace_of[i];
      linears_.emplace_back(f, plan_.nvfp4, T, linear_in(k), linear_out(k), static_cast<uint32_t>((l * 4 + k) * 4),
                            ctx_.device, quant_buffers_, ws, quant_scratch_a_, quant_scratch_b_);
    }

  std::vector<float> cos(static_cast<size_t>(S_ * d / 2)), sin(cos.size());
  rope_tables(cfg_, S_, cos.data(), sin.data());
  copy_from_host(rope_cos_, cos.data());
  copy_from_host(rope_sin_, sin.data());
  losses_ = losses_all_.rows(0, 1).view({T});
  host_losses_.resize(static_cast<size_t>(opt_.loss_micro_batches * T));
  // Pinned staging for tokens + labels, two slots (see UploadStaging): allocated here, never in the loop.
  staging_ = UploadStaging(2 * static_cast<size_t>(T) * sizeof(int32_t), 2, ctx_.device);
}

void LlamaModel::init_parameters(uint64_t seed) {
  // Values are generated on the host (counter-based, so identical for every device) tensor by
  // tensor and copied into the fp32 master buffer wherever it lives.
  std::vector<float> staging;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const ParamEntry& e = entries_[i];
    const Tensor dst = master_.flat.rows(e.offset, e.numel());
    float* m = ctx_.device == Device::CPU ? dst.f32() : (staging.resize(static_cast<size_t>(e.numel())), staging.data());
    if (e.init_std == 0.0)
      fill_ones(m, e.numel());
    else
      fill_normal(m, e.numel(), e.init_std, seed, static_cast<uint64_t>(i));
    if (ctx_.device != Device::CPU) copy_from_host(dst, m);
  }
  sync_weights_from_master();
  zero_grads();
}

void LlamaModel::sync_weights_from_master() {
  copy_master_to_param(ctx_, weights_.flat, master_.flat);
  prepare_weights();
}

void LlamaModel::prepare_weights() {
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerParams& w = weights_.layers[l];
    const Tensor* ws[4] = {&w.qkv, &w.proj, &w.fc1, &w.fc2};
    for (int k = 0; k < 4; ++k) linear(l, k).prepare_weight(ctx_, *ws[k]);
  }
}

void LlamaModel::set_collect_quant_stats(bool on) {
  for (LinearLayer& lin : linears_) lin.set_collect_stats(on);
}

std::vector<std::string> MemoryPlan::describe() const {
  const std::pair<const char*, double> rows[] = {
      {"weights (bf16)", weights},          {"gradients (fp32)", grads},
      {"master weights (fp32)", master},    {"optimizer state (Adam m, v fp32)", optimizer},
      {"activations and scratch", activations}, {"quantized copies", quantized},
      {"library workspaces", workspace}};
  std::vector<std::string> out;
  for (const auto& [name, bytes] : rows)
    out.push_back(fmt::format("{:<34} {:>10.3f} GB  {:>12.2f} MB", name, bytes / 1e9, bytes / 1048576.0));
  out.push_back(fmt::format("{:<34} {:>10.3f} GB  {:>12.2f} MB", "weights and optimizer (Megatron's category)",
                            weights_and_optimizer() / 1e9, weights_and_optimizer() / 1048576.0));
  out.push_back(fmt::format("{:<34} {:>10.3f} GB  {:>12.2f} MB", "total", total() / 1e9, total() / 1048576.0));
  if (!gemm_note.empty()) out.push_back(gemm_note);
  return out;
}

std::vector<LinearStats> LlamaModel::quant_stats() const {
  std::vector<LinearStats> out;
  for (size_t i = 0; i < linears_.size(); ++i)
    if (linears_[i].format() != LinearFormat::BF16 && !linears_[i].stats().empty())
      out.push_back({static_cast<int64_t>(i / 4), kLinearNames[i % 4], linears_[i].stats()});
  return out;
}

void LlamaModel::zero_grads() { fill_zero(ctx_, grads_.flat); }

// The only check of the ids: the GPU kernels (embedding, cross-entropy) trust them and read nothing
// back. An id outside [0, V) fails here, naming the sample of the micro-batch and the position.
void LlamaModel::upload_batch(const int32_t* tokens, const int32_t* labels) {
  const int64_t V = cfg_.vocab_size, T = B_ * S_;
  for (int64_t i = 0; i < T; ++i) {
    PL_CHECK(tokens[i] >= 0 && tokens[i] < V,
             "token id {} of sample {} of the micro-batch (position {}) is outside the vocabulary [0, {})", tokens[i],
             i / S_, i % S_, V);
    PL_CHECK(labels[i] >= 0 && labels[i] < V,
             "label id {} of sample {} of the micro-batch (position {}) is outside the vocabulary [0, {})", labels[i],
             i / S_, i % S_, V);
  }
  // CUDA: async copies from pinned staging on the default stream, ordered before the ops that read the
  // ids and after those of the previous micro-batch; CPU: memcpy.
  staging_.upload({{tokens_, tokens}, {labels_, labels}});
}

void LlamaModel::use_loss_slot(int64_t slot) {
  PL_CHECK(slot >= 0 && slot < opt_.loss_micro_batches, "internal: loss slot {} of {}", slot,
           opt_.loss_micro_batches);
  losses_ = losses_all_.rows(slot, 1).view({B_ * S_});
}

void LlamaModel::queue_forward(int64_t slot, const int32_t* tokens, const int32_t* labels) {
  use_loss_slot(slot);
  upload_batch(tokens, labels);
  run_forward(0.0f, false);
}

void LlamaModel::queue_forward_backward(int64_t slot, const int32_t* tokens, const int32_t* labels, float grad_scale) {
  use_loss_slot(slot);
  upload_batch(tokens, labels);
  run_forward(grad_scale, true);
  run_backward();
}

double LlamaModel::forward(const int32_t* tokens, const int32_t* labels) {
  queue_forward(0, tokens, labels);
  return add_loss_sums(1, 0.0);
}

double LlamaModel::forward_backward(const int32_t* tokens, const int32_t* labels, float grad_scale) {
  queue_forward_backward(0, tokens, labels, grad_scale);
  return add_loss_sums(1, 0.0);
}

double LlamaModel::add_loss_sums(int64_t slots, double acc) {
  PL_CHECK(slots >= 1 && slots <= opt_.loss_micro_batches, "internal: reading {} loss slots of {}", slots,
           opt_.loss_micro_batches);
  const int64_t T = B_ * S_;
  copy_to_host(host_losses_.data(), losses_all_.rows(0, slots));  // the one device -> host wait
  for (int64_t m = 0; m < slots; ++m) {
    double sum = 0.0;
    const float* l = host_losses_.data() + m * T;
    for (int64_t i = 0; i < T; ++i) sum += l[i];
    acc += sum;
  }
  return acc;
}

// One decoder layer: out = h + MLP(norm(h)) with h = x + Attn(norm(x)), x = acts_[l].resid_in.
void LlamaModel::layer_forward(int64_t l, const Tensor& out) {
  const AttentionShape as{B_, S_, cfg_.num_attention_heads, cfg_.num_query_groups, cfg_.kv_channels};
  const float eps = static_cast<float>(cfg_.layernorm_epsilon);
  const int64_t rotated = cfg_.num_attention_heads + cfg_.num_query_groups;
  LayerActs& a = acts_[l];
  const LayerParams& w = weights_.layers[l];
  rmsnorm_forward(ctx_, a.ln1, a.rstd1, a.resid_in, w.ln1, eps);
  linear(l, kQkv).forward(ctx_, a.qkv, a.ln1, w.qkv);
  rope_forward(ctx_, a.qkv, rope_cos_, rope_sin_, S_, rotated, cfg_.kv_channels);
  attention_forward(ctx_, a.attn, a.lse, a.qkv, as);
  linear(l, kProj).forward(ctx_, d_h_, a.attn, w.proj);  // d_h_ is free during the forward: scratch
  add(ctx_, a.resid_mid, a.resid_in, d_h_);
  rmsnorm_forward(ctx_, a.ln2, a.rstd2, a.resid_mid, w.ln2, eps);
  linear(l, kFc1).forward(ctx_, a.fc1, a.ln2, w.fc1);
  swiglu_forward(ctx_, a.swi, a.fc1);
  linear(l, kFc2).forward(ctx_, d_h_, a.swi, w.fc2);
  add(ctx_, out, a.resid_mid, d_h_);
}

void LlamaModel::run_forward(float grad_scale, bool want_grad) {
  const float eps = static_cast<float>(cfg_.layernorm_epsilon);
  embedding_forward(ctx_, embed_out_, tokens_, weights_.embedding);
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    layer_forward(l, l + 1 < cfg_.num_layers ? acts_[l + 1].resid_in : resid_out_);
  rmsnorm_forward(ctx_, lnf_, rstdf_, resid_out_, weights_.final_norm, eps);
  linear_forward(ctx_, logits_, lnf_, weights_.lm_head);
  cross_entropy_forward_backward(ctx_, losses_, logits_, labels_, want_grad ? grad_scale : 0.0f);
}

void LlamaModel::run_backward() {
  const AttentionShape as{B_, S_, cfg_.num_attention_heads, cfg_.num_query_groups, cfg_.kv_channels};
  const int64_t rotated = cfg_.num_attention_heads + cfg_.num_query_groups;
  // logits_ now holds dlogits.
  linear_backward_weight(ctx_, grads_.lm_head, logits_, lnf_);
  linear_backward_input(ctx_, d_ln_, logits_, weights_.lm_head);
  fill_zero(ctx_, d_resid_);
  rmsnorm_backward(ctx_, d_resid_, grads_.final_norm, d_ln_, resid_out_, weights_.final_norm, rstdf_);
  for (int64_t l = cfg_.num_layers - 1; l >= 0; --l) {
    // Full recomputation: refill the shared activations from the kept layer input (the layer
    // output goes to scratch; the stored outputs are never needed again).
    if (opt_.recompute) layer_forward(l, d_h_);
    LayerActs& a = acts_[l];
    const LayerParams& w = weights_.layers[l];
    LayerParams& g = grads_.layers[l];
    // d_resid_ = dL/d(layer output) = dL/d(resid_mid) through the MLP residual branch.
    linear(l, kFc2).backward(ctx_, d_swi_, g.fc2, d_resid_, a.swi, w.fc2, micro_counter_);
    swiglu_backward(ctx_, d_fc1_, d_swi_, a.fc1);
    linear(l, kFc1).backward(ctx_, d_ln_, g.fc1, d_fc1_, a.ln2, w.fc1, micro_counter_);
    rmsnorm_backward(ctx_, d_resid_, g.ln2, d_ln_, a.resid_mid, w.ln2, a.rstd2);
    // d_resid_ = dL/d(resid_mid); the attention branch.
    linear(l, kProj).backward(ctx_, d_attn_, g.proj, d_resid_, a.attn, w.proj, micro_counter_);
    attention_backward(ctx_, d_qkv_, d_attn_, a.attn, a.lse, a.qkv, as);
    rope_backward(ctx_, d_qkv_, rope_cos_, rope_sin_, S_, rotated, cfg_.kv_channels);
    linear(l, kQkv).backward(ctx_, d_ln_, g.qkv, d_qkv_, a.ln1, w.qkv, micro_counter_);
    rmsnorm_backward(ctx_, d_resid_, g.ln1, d_ln_, a.resid_in, w.ln1, a.rstd1);
  }
  embedding_backward(ctx_, grads_.embedding, d_resid_, tokens_);
}

void rope_tables(const ModelConfig& cfg, int64_t seq_length, float* cos_out, float* sin_out) {
  // MCore RotaryEmbedding: inv_freq_i = 1 / base^(2i/d) in fp32, optional Llama 3.1 _apply_scaling,
  // angle = float(pos) * inv_freq (fp32 outer product), cos/sin of that fp32 angle. We evaluate
  // each step in double and round to float at the points where MCore holds an fp32 tensor.
  const int64_t half = cfg.kv_channels / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(cfg.rotary_base, static_cast<double>(2 * i) / static_cast<double>(cfg.kv_channels));
    if (cfg.rope_scaling) {
      const double old_ctx = static_cast<double>(cfg.rope_original_max_position);
      const double low_wavelen = old_ctx / cfg.rope_low_freq_factor;
      const double high_wavelen = old_ctx / cfg.rope_high_freq_factor;
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_wavelen) {
        // high frequency: unchanged
      } else if (wavelen > low_wavelen) {
        f = f / cfg.rope_scaling_factor;
      } else {
        const double smooth = (old_ctx / wavelen - cfg.rope_low_freq_factor) /
                              (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
        f = (1.0 - smooth) * f / cfg.rope_scaling_factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  for (int64_t p = 0; p < seq_length; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(p) * inv_freq[i];
      cos_out[p * half + i] = static_cast<float>(std::cos(static_cast<double>(angle)));
      sin_out[p * half + i] = static_cast<float>(std::sin(static_cast<double>(angle)));
    }
}

}  // namespace pl
