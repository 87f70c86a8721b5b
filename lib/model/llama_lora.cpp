// LlamaModel's LoRA half (issue 41; model/lora.h): the frozen base's storage and the adapters' views, their
// initial values, and each adapter's forward and backward around its base GEMM. The rest of the model is llama.cpp.
#include <algorithm>

#include "core/checksum.h"
#include "core/error.h"
#include "numerics/bf16.h"
#include "model/llama.h"

namespace pl {

void LlamaModel::allocate_lora_views(DType storage, DType grad_type) {
  // The frozen base's BF16 weights by parameter, those it keeps packed (its quantized-only linears' views have no
  // data); the flat views are the adapters'.
  const std::vector<int64_t> kept = lora_base_kept_ranges(cfg_, plan_);
  int64_t packed = 0;
  base_packed_.assign(base_entries_.size(), -1);
  for (size_t i = 0, r = 0; i < base_entries_.size(); ++i) {
    const ParamEntry& e = base_entries_[i];
    while (r < kept.size() && kept[r + 1] <= e.offset) {
      packed += kept[r + 1] - kept[r];
      r += 2;
    }
    if (r < kept.size() && kept[r] <= e.offset) base_packed_[i] = packed + (e.offset - kept[r]);
  }
  int64_t kept_elements = 0;
  for (size_t r = 0; r < kept.size(); r += 2) kept_elements += kept[r + 1] - kept[r];
  base_buf_ = Buffer(static_cast<size_t>(kept_elements) * dtype_size(storage), ctx_.device);
  base_scratch_ = Buffer(static_cast<size_t>(lora_base_scratch_elements(plan_)) * dtype_size(storage), ctx_.device);
  base_digests_.assign(base_entries_.size(), 0);
  base_digested_.assign(base_entries_.size(), false);
  weights_ = kept_weight_views(cfg_, base_entries_, kept, base_buf_.data(), storage, ctx_.device);
  weights_.flat = weight_buf_.as({trainable_}, storage);
  grads_.flat = grad_buf_.as({trainable_}, grad_type);
  // (With the distributed optimizer only this rank's shard of the adapters' master weights: ShardLayout.)
  master_.flat = sharded() ? master_buf_.as({shard_.shard}, DType::F32) : master_buf_.as({trainable_}, DType::F32);
  norm_grad_sink_ = Buffer(static_cast<size_t>(cfg_.hidden_size) * 4, ctx_.device);
  adapter_w_.resize(static_cast<size_t>(cfg_.num_layers * kLoraTargets));
  adapter_g_.resize(adapter_w_.size());
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      const int64_t i = lora_entry_index(*layout_.lora, l, k);
      if (i < 0) continue;
      const ParamEntry &a = entries_[static_cast<size_t>(i)], &b = entries_[static_cast<size_t>(i + 1)];
      const auto views = [&](const Tensor& flat) {
        return AdapterViews{flat.rows(a.offset, a.numel()).view({a.rows, a.cols}),
                            flat.rows(b.offset, b.numel()).view({b.rows, b.cols})};
      };
      adapter_w_[static_cast<size_t>(l * kLoraTargets + k)] = views(weights_.flat);
      adapter_g_[static_cast<size_t>(l * kLoraTargets + k)] = views(grads_.flat);
    }
}

// LoRA's frozen linears whose Wᵀ is made per dgrad: one columnwise scratch per distinct (plan, kind).
void LlamaModel::allocate_weight_t_scratches() {
  for (int64_t first : mem_.weight_t_scratches) {
    const LinearPlan& p = plan_.linears[static_cast<size_t>(first)];
    weight_t_.push_back(allocate_quantized(quant_buffers_, ctx_.device, *p.w, p.out, p.in, false, true));
  }
}

void LlamaModel::init_adapters(uint64_t seed) {
  PL_CHECK(lora(), "internal: init_adapters without LoRA");
  std::vector<float> staging;
  for (int64_t l = 0; l < cfg_.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      const int64_t i = lora_entry_index(*layout_.lora, l, k);
      for (int64_t j = i; i >= 0 && j < i + 2; ++j) {  // A, then B
        const ParamEntry& e = entries_[static_cast<size_t>(j)];
        staging.resize(static_cast<size_t>(e.numel()));
        lora_initial_values(cfg_, *layout_.lora, k, j == i, seed, static_cast<uint64_t>(j), staging.data(), e.numel());
        write_master(e.offset, staging.data(), e.numel());
      }
    }
  sync_weights_from_master();
  zero_grads();
}

namespace {
// values rounded to the device's BF16 storage on the host (copy_master_to_param's op: the device's bits).
std::vector<uint8_t> rounded_for_storage(const float* values, int64_t n, DType storage, bool round_bf16) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(storage));
  const OpContext host{.device = Device::CPU, .round_bf16 = round_bf16};
  copy_master_to_param(host, Tensor(bytes.data(), {n}, storage), Tensor(const_cast<float*>(values), {n}, DType::F32));
  return bytes;
}
}  // namespace

void LlamaModel::write_base(int64_t offset, const float* values, int64_t count) {
  if (!lora()) return write_master(offset, values, count);
  // Entry by entry: a kept one's part rounded into its packed place; a quantized-only linear's part into its
  // host assembly, quantized once complete.
  const DType storage = weights_.flat.dtype;
  const Tensor base = base_buf_.as({static_cast<int64_t>(base_buf_.bytes() / dtype_size(storage))}, storage);
  auto it = std::upper_bound(base_entries_.begin(), base_entries_.end(), offset,
                             [](int64_t o, const ParamEntry& e) { return o < e.offset; });
  for (size_t i = static_cast<size_t>(std::distance(base_entries_.begin(), it)) - 1; i < base_entries_.size(); ++i) {
    const ParamEntry& e = base_entries_[i];
    const int64_t lo = std::max(offset, e.offset), hi = std::min(offset + count, e.offset + e.numel());
    if (e.offset >= offset + count) break;
    if (lo >= hi) continue;
    if (base_packed_[i] < 0) {
      write_frozen_linear(i, lo - e.offset, hi - e.offset, values + (lo - offset));
      continue;
    }
    for (int64_t b = lo; b < hi; b += kOffloadChunkElements) {
      const int64_t len = std::min(kOffloadChunkElements, hi - b);
      const std::vector<uint8_t> bytes = rounded_for_storage(values + (b - offset), len, storage, ctx_.round_bf16);
      copy_from_host(base.rows(base_packed_[i] + (b - e.offset), len), bytes.data());
    }
  }
}

void LlamaModel::write_frozen_linear(size_t i, int64_t lo, int64_t hi, const float* values) {
  const ParamEntry& e = base_entries_[i];
  PendingLinear& p = pending_[i];
  if (p.values.empty()) p.values.assign(static_cast<size_t>(e.numel()), 0.0f);
  std::copy(values, values + (hi - lo), p.values.begin() + lo);
  p.written += hi - lo;
  if (p.written < e.numel()) return;
  // Complete: its BF16 rounding to the one-layer scratch, quantized as prepare_weight does for a trained weight.
  const DType storage = weights_.flat.dtype;
  const std::vector<uint8_t> bytes = rounded_for_storage(p.values.data(), e.numel(), storage, ctx_.round_bf16);
  const Tensor scratch = base_scratch_.as({e.numel()}, storage);
  copy_from_host(scratch, bytes.data());
  const int64_t layer = static_cast<int64_t>((i - 1) / kEntriesPerLayer);
  const int kind = linear_of_entry(cfg_, i);
  linear(layer, kind).prepare_weight(linear_ctx(kind), scratch.view({e.rows, e.cols}));
  base_digests_[i] = lora_bf16_digest(p.values.data(), e.numel());
  base_digested_[i] = true;
  pending_.erase(i);
}

uint64_t LlamaModel::base_checksum() const {
  PL_CHECK(lora(), "internal: base_checksum without LoRA");
  PL_CHECK(pending_.empty(), "internal: the base's checksum while {} of its linear layers are incomplete", pending_.size());
  // Entry by entry (lora.h lora_base_checksum): a kept one read back (the CPU's FP32 storage of BF16 values gives
  // the same bits), a quantized-only linear's digest from its load.
  const DType storage = weights_.flat.dtype;
  std::vector<uint64_t> digests(base_entries_.size());
  std::vector<uint8_t> raw;
  std::vector<float> values;
  for (size_t i = 0; i < base_entries_.size(); ++i) {
    const ParamEntry& e = base_entries_[i];
    if (base_packed_[i] < 0) {
      PL_CHECK(base_digested_[i], "internal: the base's linear {} was never written", e.name);
      digests[i] = base_digests_[i];
      continue;
    }
    raw.resize(static_cast<size_t>(e.numel()) * dtype_size(storage));
    copy_to_host(raw.data(), base_buf_.as({e.numel()}, storage, static_cast<size_t>(base_packed_[i]) * dtype_size(storage)));
    values.resize(static_cast<size_t>(e.numel()));
    for (int64_t k = 0; k < e.numel(); ++k)
      values[static_cast<size_t>(k)] = storage == DType::BF16
                                           ? num::bf16_bits_to_float(reinterpret_cast<const uint16_t*>(raw.data())[k])
                                           : reinterpret_cast<const float*>(raw.data())[k];
    digests[i] = lora_bf16_digest(values.data(), e.numel());
  }
  return lora_fold_digests(digests);
}

// Under LoRA the gradients of the flat elements from layer l's first adapter to the end are final once layer l's
// backward is done (the adapters are laid out layer by layer): the listener (the gradient sync's buckets) hears so.
void LlamaModel::adapters_final_from(int64_t l, const MicroBatchOptions& step) const {
  if (!step.grads_final_from) return;
  for (int k = 0; k < kLoraTargets; ++k)
    if (const int64_t i = lora_entry_index(*layout_.lora, l, k); i >= 0)
      return (*step.grads_final_from)(entries_[static_cast<size_t>(i)].offset);
}

// The adapter's forward, Megatron-Bridge's order and roundings (model/lora.h): xin = drop_pre(x), h = A·xin
// (kept for B's wgrad), u = B·h, drop_post(u), u = (alpha/dim)·u, y = y + u; each step a BF16 activation. The
// scaling is skipped when alpha = dim (a multiply by 1 changes no value).
void LlamaModel::adapter_forward(int64_t l, int kind, const Tensor& y, const Tensor& x) {
  if (!lora()) return;
  const AdapterViews& w = adapter_w_[static_cast<size_t>(l * kLoraTargets + kind)];
  if (w.a.data == nullptr) return;
  const LoraConfig& c = *layout_.lora;
  const int64_t T = B_ * S_;
  const bool drop = lora_training_ && c.dropout > 0.0, pre = c.dropout_position == LoraDropoutPosition::Pre;
  const float p = static_cast<float>(c.dropout), s = static_cast<float>(c.scale());
  const uint32_t stream = lora_dropout_stream(l, kind);
  const OpContext ctx = with_pass(linear_ctx(kind), GemmPass::Fprop);
  Tensor xin = x;
  if (drop && pre) {
    xin = acts_.lora_in.leading(T, x.dim(1));
    dropout(ctx, xin, x, p, kLoraDropoutSeed, stream, lora_counter_);
  }
  const Tensor h = lora_h(l, kind);
  linear_forward(ctx, h, xin, w.a);
  const Tensor u = acts_.lora_out.leading(T, y.dim(1));
  linear_forward(ctx, u, h, w.b);
  if (drop && !pre) dropout(ctx, u, u, p, kLoraDropoutSeed, stream, lora_counter_);
  if (s != 1.0f) scale(ctx, u, u, s);
  add(ctx, y, y, u);
}

Tensor LlamaModel::lora_h(int64_t l, int kind) const {
  const int64_t T = B_ * S_;
  return acts_.layers[static_cast<size_t>(l)].lora_h.rows(lora_targets_before(*layout_.lora, kind) * T, T);
}

// The adapter's backward from dy (the base layer's output gradient) and x (its input), adjoint to
// adapter_forward step by step: du = drop_post(s·dy); dB += duᵀ·h; dh = du·B; dA += dhᵀ·drop_pre(x) (the
// dropped input regenerated); dxa = drop_pre(dh·A); dx += dxa.
void LlamaModel::adapter_backward(int64_t l, int kind, const Tensor& dx, const Tensor& dy, const Tensor& x) {
  if (!lora()) return;
  const size_t at = static_cast<size_t>(l * kLoraTargets + kind);
  const AdapterViews &w = adapter_w_[at], &g = adapter_g_[at];
  if (w.a.data == nullptr) return;
  const LoraConfig& c = *layout_.lora;
  const int64_t T = B_ * S_, in = x.dim(1), out = dy.dim(1);
  const bool drop = lora_training_ && c.dropout > 0.0, pre = c.dropout_position == LoraDropoutPosition::Pre;
  const float p = static_cast<float>(c.dropout), s = static_cast<float>(c.scale());
  const uint32_t stream = lora_dropout_stream(l, kind);
  const OpContext wgrad = with_pass(linear_ctx(kind), GemmPass::Wgrad), dgrad = with_pass(linear_ctx(kind), GemmPass::Dgrad);
  Tensor du = dy;
  if (s != 1.0f || (drop && !pre)) {
    du = acts_.lora_out.leading(T, out);
    if (s != 1.0f) scale(dgrad, du, dy, s);
    if (drop && !pre) dropout(dgrad, du, s != 1.0f ? du : dy, p, kLoraDropoutSeed, stream, lora_counter_);
  }
  linear_backward_weight(wgrad, g.b, du, lora_h(l, kind));
  const Tensor& dh = acts_.lora_dh;  // [T, dim]
  linear_backward_input(dgrad, dh, du, w.b);
  const Tensor scratch = acts_.lora_in.leading(T, in);
  Tensor xin = x;
  if (drop && pre) {
    dropout(wgrad, scratch, x, p, kLoraDropoutSeed, stream, lora_counter_);
    xin = scratch;
  }
  linear_backward_weight(wgrad, g.a, dh, xin);
  linear_backward_input(dgrad, scratch, dh, w.a);
  if (drop && pre) dropout(dgrad, scratch, scratch, p, kLoraDropoutSeed, stream, lora_counter_);
  add(dgrad, dx, dx, scratch);
}

}  // namespace pl
