#pragma once
// Megatron's mock GPT data (SPEC-MEGATRON §4): MockGPTLowLevelDataset + GPTDataset on the train
// split of "1,1,1", and the micro-batch order of MegatronPretrainingSampler (DP = 1).
// Followed: Megatron-LM d7288711 megatron/core/datasets/gpt_dataset.py (MockGPTLowLevelDataset,
// MockGPTDataset, GPTDataset.__getitem__).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/gpt_dataset.h"

namespace pl::data {

// 100000 documents; document i has length L_i from default_rng(0).integers(1, 4096, 100000, int32)
// and tokens [(1, 2, ..., L_i - 1) % vocab_size, eod].
class MockGPTLowLevelDataset final : public LowLevelDataset {
 public:
  static constexpr uint64_t kSeed = 0;
  static constexpr int64_t kSize = 100000;
  static constexpr int32_t kMaxSequenceLength = 4096;  // lengths are in [1, kMaxSequenceLength)

  MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod);
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override;

  int64_t vocab_size() const { return vocab_size_; }
  int32_t eod() const { return eod_; }

 private:
  int64_t vocab_size_;
  int32_t eod_;
  std::vector<int32_t> lengths_;
};

struct MockDataConfig {
  int64_t vocab_size;
  int64_t eod;
  int64_t seq_length;
  int64_t num_samples;  // train_iters * global batch for the train split
  uint32_t random_seed = 1234;
  Split split = Split::train;  // of "1,1,1" (Megatron forces that split for mock data)
};

class MockGPTDataset {
 public:
  explicit MockGPTDataset(const MockDataConfig& config);

  // Samples in the split's index (>= num_samples; 16648 for train at seq 4096).
  int64_t size() const { return gpt_->size(); }
  // seq_length + 1 tokens of dataset index `index` (through the shuffle index).
  void sample(int64_t index, std::span<int32_t> tokens_out) const;
  // Micro-batch `micro_index` of the global batch starting at dataset index first_sample, in
  // Megatron's sampler order (see fill_micro_batch); tokens and labels are [micro_batch*seq].
  void micro_batch(int64_t first_sample, int64_t micro_index, int64_t micro_batch, std::span<int32_t> tokens,
                   std::span<int32_t> labels) const;

  const GPTDataset& gpt() const { return *gpt_; }

 private:
  MockDataConfig config_;
  std::shared_ptr<const MockGPTLowLevelDataset> low_;
  std::unique_ptr<GPTDataset> gpt_;
};

}  // namespace pl::data
