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
#include <string>
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

// What a sampler reads: size() samples of sample_length() tokens each (GPTDataset, BlendedDataset).
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t sample_length() const = 0;
  virtual void get(int64_t idx, std::span<int32_t> out) const = 0;
};

// Micro-batch `micro` of the global batch whose first sample is `first_sample`, in the order of
// Megatron's MegatronPretrainingSampler (DP = 1): samples first_sample + micro*micro_batch + [0,
// micro_batch). tokens[b*seq + t] = text_b[t], labels[b*seq + t] = text_b[t+1] (seq =
// sample_length() - 1); pad ids become 0 as in GPTDataset.__getitem__ (with the default configs no
// sample is ever padded). Fails with one line when the source has too few samples.
void fill_micro_batch(const SampleSource& source, int32_t pad_token_id, int64_t first_sample, int64_t micro,
                      int64_t micro_batch, std::span<int32_t> tokens, std::span<int32_t> labels);

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
// The sequence indices [begin, end) of one split range (GPTDataset's `indices`).
std::vector<int32_t> sequence_range(int64_t begin, int64_t end);

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

// Where GPTDataset keeps its three index arrays between runs (Megatron's
// <path_prefix>/cache/GPTDataset_indices). `dataset_id` names the low-level data (its path prefix and
// size); the description built from it and the split, sample count, sequence length and seed decides
// whether a cached entry is reused. Empty dir: no cache.
struct GPTIndexCache {
  std::string dir;
  std::string dataset_id;
};
enum class CacheStatus { off, loaded, built_and_saved, built_not_saved };

class GPTDataset final : public SampleSource {
 public:
  // indices: the sequences this split exposes (Megatron `indexed_indices`); num_samples: samples
  // requested (nullopt: one epoch). Builds the document, sample and shuffle indices, or loads them
  // from `cache` when a cached entry has the same description (and saves them there otherwise).
  GPTDataset(std::shared_ptr<const LowLevelDataset> dataset, std::vector<int32_t> indices,
             std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config,
             const GPTIndexCache& cache = {});

  // len(dataset): samples in the sample index (>= num_samples).
  int64_t size() const override { return static_cast<int64_t>(sample_index_.size() / 2) - 1; }
  // Tokens of one sample: sequence_length + add_extra_token.
  int64_t sample_length() const override;
  // __getitem__(idx) before the tokens/labels split: the sample's text through the shuffle index,
  // padded with pad_token_id if short (only a valid split kept partial can be short).
  void get(int64_t idx, std::span<int32_t> out) const override;

  const GPTDatasetConfig& config() const { return config_; }
  int64_t tokens_per_epoch() const { return tokens_per_epoch_; }
  int64_t num_epochs() const { return num_epochs_; }
  bool separate_final_epoch() const { return separate_final_epoch_; }
  const std::vector<int32_t>& document_index() const { return document_index_; }
  const std::vector<int64_t>& sample_index() const { return sample_index_; }  // [size()+1][2]
  const std::vector<int64_t>& shuffle_index() const { return shuffle_index_; }
  Split split() const { return split_; }
  int64_t num_sequences() const { return num_sequences_; }  // in this split
  CacheStatus cache_status() const { return cache_status_; }
  const std::string& cache_note() const { return cache_note_; }  // where, or why not saved

 private:
  int64_t index_bytes() const;
  int64_t plan_epochs(const std::vector<int32_t>& indices, std::optional<int64_t> num_samples);
  void build_indices(const std::vector<int32_t>& indices, int64_t samples_sans_final_epoch);
  bool load_cached(const std::string& base, const std::string& description, int64_t docs);
  void save_cached(const std::string& base, const std::string& description);
  std::shared_ptr<const LowLevelDataset> dataset_;
  GPTDatasetConfig config_;
  int64_t tokens_per_epoch_ = 0;
  int64_t num_epochs_ = 0;
  bool separate_final_epoch_ = false;
  std::vector<int32_t> document_index_;
  std::vector<int64_t> sample_index_;
  std::vector<int64_t> shuffle_index_;
  Split split_ = Split::train;
  int64_t num_sequences_ = 0;
  CacheStatus cache_status_ = CacheStatus::off;
  std::string cache_note_;
};

}  // namespace pl::data
