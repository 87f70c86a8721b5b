#pragma once
// The three splits a run reads, built as Megatron's BlendedMegatronDatasetBuilder builds them: mock
// data (no --data-path), one indexed dataset, or a weighted blend of several, each split by the
// --split string and sampled by GPTDataset (whose indices are cached next to the data).
// Followed: Megatron-LM megatron/core/datasets/blended_megatron_dataset_builder.py and
// megatron/training/utils.py get_blend_from_list.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/documents.h"
#include "data/gpt_dataset.h"
#include "data/sft_dataset.h"

namespace pl::data {

struct DataConfig {
  // --data-path as given: "PREFIX", or "W1 PREFIX1 W2 PREFIX2 ..."; empty means mock data.
  std::vector<std::string> data_path;
  std::string split = "969,30,1";   // Megatron's default; mock data always uses "1,1,1"
  std::string cache_path;           // --data-cache-path; empty: <prefix>/cache/GPTDataset_indices
  uint32_t seed = 1234;             // --data-seed: every GPTDataset's RandomState
  int64_t seq_length = 0;
  std::array<int64_t, 3> num_samples{};  // train, valid, test (TrainConfig::*_samples)
  int64_t vocab_size = 0;           // the model's: every id of a micro-batch must be below it (0: not checked)
  int64_t mock_vocab_size = 0;      // mock data only
  int64_t mock_eod = 0;
  std::string packing_algorithm = "first_fit_shuffle";  // --packing-algorithm: SFT data only (data/sft_dataset.h)
};

// The data of a run: `flags` (paths, split, cache, seed) completed with the sequence length, the
// samples each split must provide, and the mock vocabulary as Megatron-Bridge sets it up (its
// NullTokenizer: vocab 32000, eod 31999; the model's own vocab, eod = vocab - 1, when smaller).
DataConfig data_config_for_run(DataConfig flags, int64_t model_vocab_size, int64_t seq_length,
                               const std::array<int64_t, 3>& num_samples);

// A --data-path list: prefixes and their normalized weights (a single prefix has weight 1).
struct DataBlend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};
// "PREFIX" or "W1 P1 W2 P2 ...": one-line error for anything else (a weight that is not a positive
// number, an odd count, several prefixes without weights).
DataBlend parse_data_path(const std::vector<std::string>& args);
// True when --data-path names one SFT dataset (data/sft_dataset.h: PREFIX.sft.json exists); false for mock data
// and pretraining data. An SFT dataset in a blend is a one-line error (one SFT dataset per run).
bool data_path_is_sft(const std::vector<std::string>& data_path);

class TrainingData {
 public:
  explicit TrainingData(const DataConfig& config);

  bool mock() const { return config_.data_path.empty(); }
  // An SFT dataset (packed examples with their loss mask and documents: data/sft_dataset.h).
  bool sft() const { return sft_ != nullptr; }
  const SftData* sft_data() const { return sft_.get(); }
  // The split's samples; nullptr when the split has no sequences (e.g. a 0 weight in --split), and for SFT data.
  const SampleSource* split(Split s) const { return splits_[static_cast<size_t>(s)].get(); }
  // Whether split s has samples (GPT samples or SFT packs).
  bool has_split(Split s) const;
  int32_t pad_token_id() const { return -1; }  // GPTDataset's _PAD_TOKEN_ID
  // Human-readable lines: each dataset (documents, tokens, dtype, weight) and each split (sequences,
  // tokens per epoch, epochs, samples, index cache).
  const std::vector<std::string>& summary() const { return summary_; }
  const DataConfig& config() const { return config_; }
  // The largest vocabulary any dataset's tokenizer record (preprocess_data's .tokenizer.json) names;
  // 0 when no dataset has a record (Megatron-made data, mock data).
  int64_t recorded_vocab_size() const { return recorded_vocab_size_; }
  const std::string& recorded_vocab_source() const { return recorded_vocab_source_; }
  // The EOD token id of the data (document-aware packing): mock data's, or the one the tokenizer records of
  // all datasets name; -1 when it is unknown, and then eod_problem() says why (a missing record file, two
  // records that disagree).
  int32_t eod_token() const { return eod_; }
  const std::string& eod_problem() const { return eod_problem_; }

  // Micro-batch `micro` of the global batch starting at `first_sample` of split `s`. `positions` is filled for SFT
  // data (the position of each token in its example) and must be empty otherwise. The one check of the ids the
  // model reads: one outside the model's vocabulary (data tokenized for a larger one) is a one-line error naming
  // its sample and split (a label may be kIgnoredLabel: not counted in the loss).
  void micro_batch(Split s, int64_t first_sample, int64_t micro, int64_t micro_batch, std::span<int32_t> tokens,
                   std::span<int32_t> labels, std::span<int32_t> positions = {}) const;

 private:
  void build_mock();
  void build_indexed();
  void build_sft(const std::string& prefix);
  void note_eod(int32_t eod, const std::string& record, bool first);
  void check_ids_in_vocab(Split s, int64_t first, int64_t seq, std::span<const int32_t> tokens,
                          std::span<const int32_t> labels) const;

  DataConfig config_;
  std::array<std::shared_ptr<const SampleSource>, 3> splits_;
  std::shared_ptr<const SftData> sft_;
  std::vector<std::string> summary_;
  int64_t recorded_vocab_size_ = 0;
  std::string recorded_vocab_source_;
  int32_t eod_ = -1;
  std::string eod_problem_;
};

// `flags` (Megatron's --eod-mask-loss, --reset-position-ids, --reset-attention-mask) with the data's EOD id;
// a one-line error naming the first flag given and why the data has no EOD id (e.g. the missing
// "<prefix>.tokenizer.json") when a flag is given and the id is unknown. No flag: returned as given.
DocumentPacking document_packing(const TrainingData& data, DocumentPacking flags);

}  // namespace pl::data
