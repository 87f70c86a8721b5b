// A LoRA checkpoint's frozen base read back from its record (train/checkpoint.h read_lora_base): what the merge,
// convert_checkpoint --merge-lora and generate --load of a LoRA checkpoint start from.
#include <algorithm>

#include "core/checksum.h"
#include "core/error.h"
#include "model/init.h"
#include "numerics/bf16.h"
#include "train/checkpoint.h"
#include "train/checkpoint_metadata.h"

namespace pl {

namespace {
// The checksum LlamaModel::base_checksum computes of the same values: their BF16 bits in flat order.
uint64_t bf16_checksum(const std::vector<float>& values) {
  Checksum64 sum;
  const size_t piece = Checksum64::kChunkBytes / 2 * 32;  // 32 chunks of BF16 bits at a time
  std::vector<uint16_t> bits(std::min(piece, values.size()));
  for (size_t b = 0; b < values.size(); b += piece) {
    const size_t len = std::min(piece, values.size() - b);
    for (size_t i = 0; i < len; ++i) bits[i] = num::float_to_bf16_bits(values[b + i]);
    sum.update(bits.data(), len * 2);
  }
  return sum.digest();
}
}  // namespace

std::vector<float> read_lora_base(const VerifiedCheckpoint& c, const std::string& hf_dir) {
  PL_CHECK(c.lora.has_value(), "internal: read_lora_base of a checkpoint without adapters");
  const std::string& source = c.lora_base.source;
  std::vector<float> base(static_cast<size_t>(c.model.num_parameters()));
  const auto write = [&](int64_t offset, const float* v, int64_t n) { std::copy(v, v + n, base.begin() + offset); };
  std::string from = source;
  if (!hf_dir.empty() || source.starts_with("hf ")) {
    const std::string dir = hf_dir.empty() ? source.substr(3) : hf_dir;
    from = "hf " + dir;
    read_hf_weights(dir, c.model, write);
  } else if (source.starts_with("checkpoint ")) {
    const VerifiedCheckpoint full = verify_checkpoint(source.substr(11));
    PL_CHECK(!full.lora && full.model.num_parameters() == c.model.num_parameters(),
             "{}: its base {} is not a checkpoint of every parameter of {}", c.path, source, c.model.name);
    stream_master_weights(full, write);
  } else if (source.starts_with("init seed ")) {
    const uint64_t seed = std::stoull(source.substr(10));
    const std::vector<ParamEntry> layout = param_layout(c.model);
    for (size_t i = 0; i < layout.size(); ++i)
      initial_parameter_values(layout[i], static_cast<uint64_t>(i), seed, base.data() + layout[i].offset);
  } else {
    fail("{}: the base's source '{}' is none this program writes (hf DIR, checkpoint DIR, init seed N)", c.path, source);
  }
  const uint64_t sum = bf16_checksum(base);
  PL_CHECK(sum == c.lora_base.checksum,
           "{}: its adapters were trained over a base with weights checksum {}, but {} has {} (the base changed; give "
           "the one it trained on{})",
           c.path, hex64(c.lora_base.checksum), from, hex64(sum), source.starts_with("hf ") ? " with --init-from-hf DIR" : "");
  return base;
}

}  // namespace pl
