#include "data/mock_dataset.h"

#include <limits>

#include "core/error.h"
#include "data/numpy_rng.h"

namespace pl::data {

MockGPTLowLevelDataset::MockGPTLowLevelDataset(int64_t vocab_size, int64_t eod) : vocab_size_(vocab_size) {
  PL_CHECK(vocab_size >= 2, "mock data: vocab size must be >= 2, got {}", vocab_size);
  PL_CHECK(eod >= 0 && eod < vocab_size && eod <= std::numeric_limits<int32_t>::max(),
           "mock data: eod token {} is outside the vocabulary [0, {})", eod, vocab_size);
  eod_ = static_cast<int32_t>(eod);
  Pcg64 rng(kSeed);
  lengths_ = rng.integers(1, kMaxSequenceLength, kSize);
}

void MockGPTLowLevelDataset::get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  PL_CHECK(seq >= 0 && seq < kSize, "mock data: sequence {} out of range [0, {})", seq, kSize);
  const int64_t n = lengths_[static_cast<size_t>(seq)];
  PL_CHECK(offset >= 0 && length >= 0 && offset + length <= n,
           "mock data: tokens [{}, {}) of sequence {} out of range (length {})", offset, offset + length, seq, n);
  for (int64_t k = offset; k < offset + length; ++k)
    *out++ = k == n - 1 ? eod_ : static_cast<int32_t>((k + 1) % vocab_size_);
}

MockGPTDataset::MockGPTDataset(const MockDataConfig& config) : config_(config) {
  PL_CHECK(config.seq_length >= 1, "mock data: seq_length must be >= 1, got {}", config.seq_length);
  PL_CHECK(config.num_samples >= 0, "mock data: num_samples must be >= 0, got {}", config.num_samples);
  low_ = std::make_shared<const MockGPTLowLevelDataset>(config.vocab_size, config.eod);
  // Mock data ignores the configured split and uses "1,1,1" (blended_megatron_dataset_config.py).
  const auto ranges = split_ranges("1,1,1", low_->num_sequences());
  const auto [begin, end] = *ranges[static_cast<int>(config.split)];
  gpt_ = std::make_unique<GPTDataset>(low_, sequence_range(begin, end), config.num_samples, config.split,
                                      GPTDatasetConfig{.sequence_length = config.seq_length,
                                                       .random_seed = config.random_seed,
                                                       .add_extra_token_to_sequence = true});
}

void MockGPTDataset::sample(int64_t index, std::span<int32_t> tokens_out) const {
  PL_CHECK(index >= 0 && index < size(), "mock data: sample {} out of range [0, {})", index, size());
  gpt_->get(index, tokens_out);
}

void MockGPTDataset::micro_batch(int64_t first_sample, int64_t micro_index, int64_t micro_batch,
                                 std::span<int32_t> tokens, std::span<int32_t> labels) const {
  fill_micro_batch(*gpt_, gpt_->config().pad_token_id, first_sample, micro_index, micro_batch, tokens, labels);
}

}  // namespace pl::data
