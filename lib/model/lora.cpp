#include "model/lora.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/checksum.h"
#include "core/error.h"
#include "model/init.h"
#include "numerics/bf16.h"
#include "model/llama.h"

namespace pl {

namespace {
// The module path of target k inside a decoder layer (Megatron's: attention linears under self_attention).
const char* lora_module_path(int target) { return target <= 1 ? "self_attention" : "mlp"; }
}  // namespace

int64_t lora_targets_before(const LoraConfig& lora, int target) {
  int64_t n = 0;
  for (int k = 0; k < target; ++k) n += lora.targets[static_cast<size_t>(k)] ? 1 : 0;
  return n;
}

std::vector<ParamEntry> lora_layout(const ModelConfig& cfg, const LoraConfig& lora) {
  std::vector<ParamEntry> entries;
  int64_t offset = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      if (!lora.targets[static_cast<size_t>(k)]) continue;
      const LoraAdapterShape s = lora_adapter_shape(cfg, k);
      const std::string p = fmt::format("decoder.layers.{}.{}.{}.adapter.", l, lora_module_path(k), kLoraTargetNames[k]);
      entries.push_back({p + "linear_in.weight", lora.dim, s.in, offset, true, 0.0});
      offset += lora.dim * s.in;
      entries.push_back({p + "linear_out.weight", s.out, lora.dim, offset, true, 0.0});
      offset += s.out * lora.dim;
    }
  return entries;
}

int64_t lora_entry_index(const LoraConfig& lora, int64_t layer, int target) {
  if (!lora.targets[static_cast<size_t>(target)]) return -1;
  return 2 * (layer * lora_targets_before(lora, kLoraTargets) + lora_targets_before(lora, target));
}

void lora_initial_values(const ModelConfig& cfg, const LoraConfig& lora, int target, bool is_a, uint64_t seed,
                         uint64_t index, float* out, int64_t n) {
  if (!is_a) {
    for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
    return;
  }
  const double in = static_cast<double>(lora_adapter_shape(cfg, target).in), r = static_cast<double>(lora.dim);
  // A tensor id past every base tensor's (param_layout's indices), so the adapters draw their own values.
  const uint64_t id = (uint64_t{1} << 40) + index;
  if (lora.a_init == LoraAInit::Xavier)
    fill_normal(out, n, std::sqrt(2.0 / (in + r)), seed, id);
  else
    fill_uniform(out, n, 1.0 / std::sqrt(in), seed, id);
}

uint64_t lora_bf16_digest(const float* values, int64_t n) {
  Checksum64 sum;
  constexpr int64_t kPiece = int64_t{1} << 24;  // 32 MiB of BF16 bits: whole checksum chunks
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(n, kPiece)));
  for (int64_t b = 0; b < n; b += kPiece) {
    const int64_t len = std::min(kPiece, n - b);
    for (int64_t i = 0; i < len; ++i) bits[static_cast<size_t>(i)] = num::float_to_bf16_bits(values[b + i]);
    sum.update(bits.data(), static_cast<size_t>(len) * 2);
  }
  return sum.digest();
}

uint64_t lora_fold_digests(const std::vector<uint64_t>& digests) {
  Checksum64 sum;
  sum.update(digests.data(), digests.size() * sizeof(uint64_t));
  return sum.digest();
}

uint64_t lora_base_checksum(const ModelConfig& cfg, const std::vector<float>& base) {
  LoraBaseChecksum sum(cfg);
  sum.add(0, base.data(), static_cast<int64_t>(base.size()));
  return sum.checksum();
}

LoraBaseChecksum::LoraBaseChecksum(const ModelConfig& cfg) {
  for (const ParamEntry& e : param_layout(cfg)) {
    begin_.push_back(e.offset);
    size_.push_back(e.numel());
  }
  entries_.resize(begin_.size());
}

void LoraBaseChecksum::add(int64_t offset, const float* values, int64_t count) {
  constexpr int64_t kChunk = static_cast<int64_t>(Checksum64::kChunkBytes / 2);  // BF16 values per chunk
  auto it = std::upper_bound(begin_.begin(), begin_.end(), offset);
  PL_CHECK(it != begin_.begin(), "internal: base checksum of flat offset {}", offset);
  for (size_t i = static_cast<size_t>(it - begin_.begin()) - 1; i < begin_.size() && begin_[i] < offset + count; ++i) {
    const int64_t lo = std::max(offset, begin_[i]), hi = std::min(offset + count, begin_[i] + size_[i]);
    if (lo >= hi) continue;
    Entry& e = entries_[i];
    PL_CHECK(lo - begin_[i] == e.next, "internal: the base's values of entry {} out of order ({} after {})", i,
             lo - begin_[i], e.next);
    for (int64_t b = lo; b < hi; b += kChunk) {  // a chunk's worth at a time: at most two chunks held
      const int64_t len = std::min(kChunk, hi - b);
      for (int64_t k = 0; k < len; ++k) e.tail.push_back(num::float_to_bf16_bits(values[b - offset + k]));
      const size_t whole = e.tail.size() / static_cast<size_t>(kChunk) * static_cast<size_t>(kChunk);
      if (whole == 0) continue;
      e.sum.update(e.tail.data(), whole * 2);
      e.tail.erase(e.tail.begin(), e.tail.begin() + static_cast<std::ptrdiff_t>(whole));
    }
    e.next += hi - lo;
    if (e.next < size_[i]) continue;
    if (!e.tail.empty()) e.sum.update(e.tail.data(), e.tail.size() * 2);  // the last, short piece
    e.digest = e.sum.digest();
    std::vector<uint16_t>().swap(e.tail);
  }
}

uint64_t LoraBaseChecksum::checksum() const {
  std::vector<uint64_t> digests;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    PL_CHECK(e.next == size_[i], "internal: the base's entry {} has {} of its {} values", i, e.next, size_[i]);
    digests.push_back(e.digest);
  }
  return lora_fold_digests(digests);
}

}  // namespace pl
