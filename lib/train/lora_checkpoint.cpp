// A LoRA checkpoint's frozen base read back from its record (train/checkpoint.h stream_lora_base, read_lora_base):
// what convert_checkpoint --merge-lora streams and generate --load of a LoRA checkpoint starts from.
#include <algorithm>

#include "core/error.h"
#include "model/init.h"
#include "model/lora.h"
#include "train/checkpoint.h"
#include "train/checkpoint_metadata.h"

namespace pl {

void stream_lora_base(const VerifiedCheckpoint& c, const std::string& hf_dir, const FlatWeightWriter& write) {
  PL_CHECK(c.lora.has_value(), "internal: the base of a checkpoint without adapters");
  const std::string& source = c.lora_base.source;
  LoraBaseChecksum checksum(c.model);
  const FlatWeightWriter tee = [&](int64_t offset, const float* v, int64_t n) {
    checksum.add(offset, v, n);
    write(offset, v, n);
  };
  std::string from = source;
  if (!hf_dir.empty() || source.starts_with("hf ")) {
    const std::string dir = hf_dir.empty() ? source.substr(3) : hf_dir;
    from = "hf " + dir;
    read_hf_weights(dir, c.model, tee);
  } else if (source.starts_with("checkpoint ")) {
    const VerifiedCheckpoint full = verify_checkpoint(source.substr(11));
    PL_CHECK(!full.lora && full.model.num_parameters() == c.model.num_parameters(),
             "{}: its base {} is not a checkpoint of every parameter of {}", c.path, source, c.model.name);
    stream_master_weights(full, tee);
  } else if (source.starts_with("init seed ")) {
    const uint64_t seed = std::stoull(source.substr(10));
    const std::vector<ParamEntry> layout = param_layout(c.model);
    std::vector<float> values;
    for (size_t i = 0; i < layout.size(); ++i) {
      values.resize(static_cast<size_t>(layout[i].numel()));
      initial_parameter_values(layout[i], static_cast<uint64_t>(i), seed, values.data());
      tee(layout[i].offset, values.data(), layout[i].numel());
    }
  } else {
    fail("{}: the base's source '{}' is none this program writes (hf DIR, checkpoint DIR, init seed N)", c.path, source);
  }
  const uint64_t sum = checksum.checksum();
  PL_CHECK(sum == c.lora_base.checksum,
           "{}: its adapters were trained over a base with weights checksum {}, but {} has {} (the base changed; give "
           "the one it trained on{})",
           c.path, hex64(c.lora_base.checksum), from, hex64(sum), source.starts_with("hf ") ? " with --init-from-hf DIR" : "");
}

std::vector<float> read_lora_base(const VerifiedCheckpoint& c, const std::string& hf_dir) {
  std::vector<float> base(static_cast<size_t>(c.model.num_parameters()));
  stream_lora_base(c, hf_dir,
                   [&](int64_t offset, const float* v, int64_t n) { std::copy(v, v + n, base.begin() + offset); });
  return base;
}

}  // namespace pl
