#pragma once
// What generate and evaluate share: where the weights come from (a checkpoint's masters, a LoRA checkpoint with its
// base, or a Hugging Face directory), the tokenizer that goes with them, and the device they run on.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "data/tokenizer.h"
#include "train/checkpoint.h"

namespace pl::app {

struct WeightsSource {
  std::optional<VerifiedCheckpoint> ckpt;  // --load (a LoRA checkpoint has ckpt->lora)
  std::string hf_dir;                      // --init-from-hf (with a LoRA --load: its base's new place)
  ModelConfig cfg;
  std::string describe() const;  // "checkpoints/x/iter_0000100 (LoRA dim 8 over hf base)" / "hf DIR"
};
// --load DIR and/or --init-from-hf DIR (both only for a LoRA checkpoint, whose base moved): verified, with the
// model's configuration. One-line errors naming the flags.
WeightsSource open_weights(const std::string& load, const std::string& init_from_hf);

// The tokenizer, in this order: --tokenizer-type/--tokenizer-model; in a Hugging Face directory a Meta
// tokenizer.model, else an export's record (convert_checkpoint writes kHfTokenizerRecordName); for a checkpoint the
// tokenizer record of the data it trained on (its saved command line's --data-path). `source` says which.
std::unique_ptr<data::Tokenizer> find_tokenizer(const std::string& type, const std::string& model_path,
                                                const WeightsSource& w, std::string& source);

// --device cpu | cuda: the context (BF16 rounding on the CPU, as training's) and, for cuda, the device state.
OpContext open_device(const std::string& device, DeviceStateHandle& state);

}  // namespace pl::app
