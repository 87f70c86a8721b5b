// LlamaModel's LoRA half (issue 41; model/lora.h): the frozen base's storage and the adapters' views, their
// initial values, and each adapter's forward and backward around its base GEMM. The rest of the model is llama.cpp.
#include <algorithm>

#include "core/checksum.h"
#include "core/error.h"
#include "numerics/bf16.h"
#include "model/llama.h"

namespace pl {

void LlamaModel::allocate_lora_views(DType storage, DType grad_type) {
  // The frozen base's BF16 weights by parameter; the flat views are the adapters'.
  base_buf_ = Buffer(static_cast<size_t>(cfg_.num_parameters()) * dtype_size(storage), ctx_.device);
  weights_ = param_views(cfg_, base_entries_, base_buf_.data(), storage, ctx_.device);
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

void LlamaModel::write_base(int64_t offset, const float* values, int64_t count) {
  if (!lora()) return write_master(offset, values, count);
  // Rounded on the host by the same op as copy_master_to_param's (the device's bits), then copied down.
  const OpContext host{.device = Device::CPU, .round_bf16 = ctx_.round_bf16};
  const DType storage = weights_.flat.dtype;
  const Tensor base = base_buf_.as({cfg_.num_parameters()}, storage);
  const int64_t piece = std::min<int64_t>(count, kOffloadChunkElements);
  std::vector<uint8_t> bytes(static_cast<size_t>(piece) * dtype_size(storage));
  for (int64_t b = 0; b < count; b += piece) {
    const int64_t len = std::min(piece, count - b);
    copy_master_to_param(host, Tensor(bytes.data(), {len}, storage), Tensor(const_cast<float*>(values + b), {len}, DType::F32));
    copy_from_host(base.rows(offset + b, len), bytes.data());
  }
}

uint64_t LlamaModel::base_checksum() const {
  PL_CHECK(lora(), "internal: base_checksum without LoRA");
  // In pieces of 32 Mi elements (64 MiB of BF16 bits: whole checksum chunks), the CPU's FP32 storage of BF16
  // values narrowed to their bits so every device hashes the same bytes.
  const DType storage = weights_.flat.dtype;
  const int64_t n = cfg_.num_parameters(), piece = int64_t{1} << 25;
  const Tensor base = base_buf_.as({n}, storage);
  std::vector<uint8_t> raw(static_cast<size_t>(std::min(n, piece)) * dtype_size(storage));
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(n, piece)));
  Checksum64 sum;
  for (int64_t b = 0; b < n; b += piece) {
    const int64_t len = std::min(piece, n - b);
    copy_to_host(raw.data(), base.rows(b, len));
    if (storage == DType::BF16) {
      sum.update(raw.data(), static_cast<size_t>(len) * 2);
      continue;
    }
    const auto* f = reinterpret_cast<const float*>(raw.data());
    for (int64_t i = 0; i < len; ++i) bits[static_cast<size_t>(i)] = num::float_to_bf16_bits(f[i]);
    sum.update(bits.data(), static_cast<size_t>(len) * 2);
  }
  return sum.digest();
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
    xin = acts_.lora_in.view({acts_.lora_in.numel()}).rows(0, T * x.dim(1)).view({T, x.dim(1)});
    dropout(ctx, xin, x, p, kLoraDropoutSeed, stream, lora_counter_);
  }
  const Tensor h = lora_h(l, kind);
  linear_forward(ctx, h, xin, w.a);
  const Tensor u = acts_.lora_out.view({acts_.lora_out.numel()}).rows(0, T * y.dim(1)).view({T, y.dim(1)});
  linear_forward(ctx, u, h, w.b);
  if (drop && !pre) dropout(ctx, u, u, p, kLoraDropoutSeed, stream, lora_counter_);
  if (s != 1.0f) scale(ctx, u, u, s);
  add(ctx, y, y, u);
}

Tensor LlamaModel::lora_h(int64_t l, int kind) const {
  int64_t before = 0;
  for (int k = 0; k < kind; ++k) before += layout_.lora->targets[static_cast<size_t>(k)] ? 1 : 0;
  const int64_t T = B_ * S_;
  return acts_.layers[static_cast<size_t>(l)].lora_h.rows(before * T, T);
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
    du = acts_.lora_out.view({acts_.lora_out.numel()}).rows(0, T * out).view({T, out});
    if (s != 1.0f) scale(dgrad, du, dy, s);
    if (drop && !pre) dropout(dgrad, du, s != 1.0f ? du : dy, p, kLoraDropoutSeed, stream, lora_counter_);
  }
  linear_backward_weight(wgrad, g.b, du, lora_h(l, kind));
  const Tensor dh = acts_.lora_dh.view({acts_.lora_dh.numel()}).rows(0, T * c.dim).view({T, c.dim});
  linear_backward_input(dgrad, dh, du, w.b);
  const Tensor scratch = acts_.lora_in.view({acts_.lora_in.numel()}).rows(0, T * in).view({T, in});
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
