#pragma once
// What generate and evaluate share: where the weights come from (a checkpoint's masters, a LoRA checkpoint with its
// base, or a Hugging Face directory), the tokenizer that goes with them, and the device they run on.
#include <CLI/CLI.hpp>

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
struct WeightsFlags;
WeightsSource open_weights(const WeightsFlags& f);

// The tokenizer, in this order: --tokenizer-type/--tokenizer-model; in a Hugging Face directory a Meta
// tokenizer.model, else an export's record (convert_checkpoint writes kHfTokenizerRecordName); for a checkpoint the
// tokenizer record of the data it trained on (its saved command line's --data-path). `source` says which.
std::unique_ptr<data::Tokenizer> find_tokenizer(const WeightsFlags& f, const WeightsSource& w, std::string& source);

// The flags both tools take for these: --load, --init-from-hf, --tokenizer-type, --tokenizer-model.
struct WeightsFlags {
  std::string load, init_from_hf, tokenizer_type, tokenizer_model;
};
void add_weights_flags(CLI::App& app, WeightsFlags& f);

// --device cpu | cuda: the context (BF16 rounding on the CPU, as training's) and, for cuda, the device state.
OpContext open_device(const std::string& device, DeviceStateHandle& state);

}  // namespace pl::app
