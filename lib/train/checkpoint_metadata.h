#pragma once
// The two JSON files of a checkpoint (train/checkpoint.h): metadata.json, the run as it was saved (model
// config, recipe, train settings and state, data position, RNG, command line), and manifest.json's text.
// The manifest is read back, file by file, where the files are verified (train/checkpoint.cpp).
#include <cstdint>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace pl {

std::string checkpoint_metadata_text(const TrainState& state, int64_t optimizer_steps, const RunDescription& run,
                                     bool fp8_delayed_scaling);
std::string checkpoint_manifest_text(int64_t iteration, const std::vector<CheckpointFile>& files);

// Fills v's model, recipe_name, train, state and optimizer_steps from metadata.json at `meta_path`, whose
// iteration must be v.iteration, the manifest's. Any problem: one pl::Error line naming the file and field.
void read_checkpoint_metadata(const std::string& meta_path, const std::string& manifest_path, VerifiedCheckpoint& v);

// A checksum as the manifest writes it: "0x" and 16 hex digits.
std::string hex64(uint64_t v);

}  // namespace pl
