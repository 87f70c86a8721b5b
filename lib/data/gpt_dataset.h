#pragma once
// Megatron's GPTDataset index building and sample lookup (SPEC-MEGATRON §5, "GPTDataset"), written
// over an abstract low-level dataset so mock data and real .bin/.idx data share it.
//
// Followed: Megatron-LM d7288711 megatron/core/datasets/gpt_dataset.py (GPTDataset,
// _build_document_index, _build_shuffle_index, _query_document_sample_shuffle_indices),
// helpers.cpp build_sample_idx, blended_megatron_dataset_config.py (split parsing) and
// blended_megatron_dataset_builder.py (split book-ends -> int(round(b*N))).
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace pl::data {

// A list of token sequences: Megatron's IndexedDataset (GPT samples by *sequence*) or the mock one.
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  // Tokens per sequence (Megatron `sequence_lengths`, int32).
  virtual std::span<const int32_t> sequence_lengths() const = 0;
  // Writes tokens [offset, offset + length) of sequence `seq` to out[0 .. length).
  virtual void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const = 0;
  int64_t num_sequences() const { return static_cast<int64_t>(sequence_lengths().size()); }
};

enum class Split { train = 0, valid = 1, test = 2 };
const char* split_name(Split s);

// parse_and_normalize_split: the numbers of a split string ("99,1,0", "0.7 0.2 0.1"; missing
// trailing ones are 0), normalized to sum 1.
std::array<double, 3> parse_split(std::string_view split);
// The sequence range [begin, end) of each split over num_elements sequences, or nullopt for a
// split with zero weight: book-ends are cumulative sums, bounds int(round(b * N)) (half to even).
// "1,1,1" over 100000 -> [0,33333) [33333,66667) [66667,100000).
std::array<std::optional<std::pair<int64_t, int64_t>>, 3> split_ranges(std::string_view split,
                                                                       int64_t num_elements);

struct GPTDatasetConfig {
  int64_t sequence_length = 0;
  uint32_t random_seed = 1234;                      // numpy.random.RandomState seed
  bool add_extra_token_to_sequence = true;          // samples carry sequence_length + 1 tokens
  bool drop_last_partial_validation_sequence = true;  // only the valid split may keep a partial last
  int32_t pad_token_id = -1;                        // Megatron _PAD_TOKEN_ID
};

// helpers.cpp build_sample_idx: rows (document-index position, offset) of every sample start,
// flattened [num_samples + 1][2].
std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes,
                                        std::span<const int32_t> document_index,
                                        int64_t sequence_length, int64_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        int add_extra_token);

class GPTDataset {
 public:
  // indices: the sequences this split exposes (Megatron `indexed_indices`); num_samples: samples
  // requested (nullopt: one epoch). Builds the document, sample and shuffle indices.
  GPTDataset(std::shared_ptr<const LowLevelDataset> dataset, std::vector<int32_t> indices,
             std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config);

  // len(dataset): samples in the sample index (>= num_samples).
  int64_t size() const { return static_cast<int64_t>(sample_index_.size() / 2) - 1; }
  // Tokens of one sample: sequence_length + add_extra_token.
  int64_t sample_length() const;
  // __getitem__(idx) before the tokens/labels split: the sample's text through the shuffle index,
  // padded with pad_token_id if short (only a valid split kept partial can be short).
  void get(int64_t idx, std::span<int32_t> out) const;

  const GPTDatasetConfig& config() const { return config_; }
  const LowLevelDataset& dataset() const { return *dataset_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  const std::vector<int32_t>& document_index() const { return document_index_; }
  const std::vector<int64_t>& sample_index() const { return sample_index_; }  // [size()+1][2]
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }

 private:
  std::shared_ptr<const LowLevelDataset> dataset_;
  GPTDatasetConfig config_;
  int64_t tokens_per_epoch_ = 0;
  int64_t num_epochs_ = 0;
  bool separate_final_epoch_ = false;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;
  std::vector<int64_t> shuffle_index_;
};

}  // namespace pl::data
