// HfTensorGatherer and HfExportStream (model/hf_llama.h): flat values gathered into whole Hugging Face tensors, and a
// Hugging Face directory written tensor by tensor as they complete.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "io/atomic_file.h"
#include "model/hf_llama.h"

namespace pl {

HfTensorGatherer::HfTensorGatherer(const ModelConfig& cfg, Gathered gathered, Whole whole)
    : gathered_(std::move(gathered)), whole_(std::move(whole)), slots_(hf_llama_tensor_layout(cfg)) {
  by_offset_.resize(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) by_offset_[i] = i;
  std::sort(by_offset_.begin(), by_offset_.end(), [&](size_t a, size_t b) { return slots_[a].offset < slots_[b].offset; });
}

void HfTensorGatherer::write(int64_t offset, const float* values, int64_t count) {
  // The tensors overlapping [offset, offset + count), from the last one starting at or before offset.
  auto it = std::upper_bound(by_offset_.begin(), by_offset_.end(), offset,
                             [&](int64_t o, size_t s) { return o < slots_[s].offset; });
  PL_CHECK(it != by_offset_.begin(), "internal: flat offset {} before the first Hugging Face tensor", offset);
  for (--it; it != by_offset_.end(); ++it) {
    const size_t i = *it;
    const HfTensorSlot& s = slots_[i];
    if (s.offset >= offset + count) break;
    const int64_t lo = std::max(offset, s.offset), hi = std::min(offset + count, s.offset + s.numel());
    if (lo >= hi) continue;
    if (whole_ && lo == s.offset && hi == s.offset + s.numel() && !pending_.count(i)) {
      whole_(s, i, values + (lo - offset));  // the whole tensor at once: no copy
      continue;
    }
    Pending& p = pending_[i];
    if (p.values.empty()) {
      p.values.assign(static_cast<size_t>(s.numel()), 0.0f);
      pending_elements_ += s.numel();
      peak_pending_ = std::max(peak_pending_, pending_elements_);
    }
    std::copy(values + (lo - offset), values + (hi - offset), p.values.begin() + (lo - s.offset));
    p.written += hi - lo;
    if (p.written < s.numel()) continue;
    gathered_(s, i, p.values.data());
    pending_elements_ -= s.numel();
    pending_.erase(i);
  }
}

namespace {
std::vector<SafetensorsTensorOut> bf16_tensors_of(const ModelConfig& cfg) {
  std::vector<SafetensorsTensorOut> tensors;
  for (const HfTensorSlot& s : hf_llama_tensor_layout(cfg)) tensors.push_back({s.name, "BF16", s.shape, nullptr});
  return tensors;
}
}  // namespace

HfExportStream::HfExportStream(const ModelConfig& cfg, const std::string& dir, const HfExportOptions& opts,
                               Adjust adjust)
    : config_text_(hf_llama_config_json(cfg, opts)),  // refuses what HF cannot express, before anything is written
      dir_(dir),
      adjust_(std::move(adjust)),
      writer_(std::make_unique<SafetensorsStreamWriter>(dir, bf16_tensors_of(cfg), opts.max_shard_bytes)),
      gatherer_(
          cfg,
          [this](const HfTensorSlot& s, size_t i, float* values) {
            if (adjust_) adjust_(s, values);
            writer_->put(i, values);
          },
          adjust_ ? HfTensorGatherer::Whole{}
                  : [this](const HfTensorSlot&, size_t i, const float* values) { writer_->put(i, values); }) {}

HfExportStream::~HfExportStream() = default;

std::vector<std::string> HfExportStream::finish() {
  PL_CHECK(gatherer_.incomplete() == 0, "internal: {}: {} Hugging Face tensors incomplete (first: {})", dir_,
           gatherer_.incomplete(), gatherer_.first_incomplete());
  std::vector<std::string> files = writer_->finish();  // (a tensor never written at all is named there)
  write_file_atomically((std::filesystem::path(dir_) / "config.json").string(), config_text_);
  files.push_back("config.json");
  return files;
}

HfStreamingPeak hf_streaming_host_peak(const ModelConfig& cfg, bool lora) {
  const std::vector<HfTensorSlot> slots = hf_llama_tensor_layout(cfg);
  const HfTensorSlot& big = *std::max_element(slots.begin(), slots.end(),
                                              [](const HfTensorSlot& a, const HfTensorSlot& b) { return a.numel() < b.numel(); });
  // The fused linear a LoRA base assembles: qkv [q + 2 kv, h], fc1 [2 f, h], proj [h, q], fc2 [h, f].
  const int64_t h = cfg.hidden_size, linear = std::max({cfg.qkv_dim() * h, 2 * cfg.ffn_hidden_size * h, h * cfg.q_dim()});
  const double bytes = 6.0 * static_cast<double>(big.numel()) + (lora ? 6.0 * static_cast<double>(linear) : 0.0);
  return {bytes, fmt::format("{} [{}]", big.name, fmt::join(big.shape, ", "))};
}

}  // namespace pl
