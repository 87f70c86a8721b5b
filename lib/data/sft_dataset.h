#pragma once
// Supervised fine-tuning datasets (issue 28): what preprocess_data --dataset-type sft writes for an output
// prefix P, and how the trainer reads it back as packed sequences.
//
//   P.bin / P.idx      the examples' token ids, one example per document (a Megatron indexed pair)
//   P.loss_mask        one byte per token of P.bin, in its order: 1 for an answer token (data/sft_format.h), else 0
//   P.sft.json         what the set holds (counts, template, truncation) and the loss mask's size and checksum
//   P.tokenizer.json   the tokenizer record (data/tokenizer_record.h), as for pretraining data
// `--data-path P` names the set; the trainer knows it for an SFT dataset by P.sft.json.
//
// Packing follows NeMo (nemo/utils/sequence_packing_utils.py and GPTSFTPackedDataset in
// nemo/collections/llm/gpt/data/core.py, read at NeMo 8cfedd72):
// - an example of n tokens takes n - 1 positions of a pack (its inputs are tokens [0, n-1), its labels tokens
//   [1, n)), so it fits a pack of S positions when n - 1 <= S;
// - create_packing_strategy lists the lengths in ascending order, then first_fit_shuffle shuffles that list
//   (numpy's global RNG in NeMo; here numpy.random.RandomState(--data-seed), one stream for the whole
//   packing) or first_fit_decreasing sorts it in descending order; first_fit puts each length into the first
//   pack with room for it, else opens a new pack;
// - fill_packing_strategy then deals the examples of each length, from 0 to S: a permutation of that
//   length's examples (RandomState.permutation, same stream), popped from its end into the packs that hold
//   the length, pack by pack in order;
// - inside a pack, an example's label positions count in the loss where its next token is an answer token
//   (NeMo's loss_mask[1:]), its positions restart at 0, and attention stays inside it; the positions left
//   at the end of a pack are padding (token eod, as NeMo pads with eos_id; no loss; one more segment of
//   their own, as NeMo's cu_seqlens appends max_length).
// The split (--split) is over examples in file order (Megatron's split_ranges); each split is packed on its
// own. Sample k of a split is pack k mod (number of packs): the packs in order, again from the first after the
// last (an epoch each).
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/checksum.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer_record.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace pl::data {

class RandomStateMt;
struct SftExample;

struct SftRecord {
  int64_t examples = 0;        // written (dropped ones are not)
  int64_t chat_examples = 0;   // of them, in the "messages" shape
  int64_t tokens = 0;          // in P.bin
  int64_t answer_tokens = 0;   // mask bytes that are 1
  int64_t truncated = 0;       // examples shortened to max_seq_length
  int64_t dropped = 0;         // examples longer than max_seq_length, left out (overlong "drop"), or with no answer left
  int64_t max_seq_length = 0;  // 0: none given
  std::string overlong = "truncate";  // what was done to longer examples: truncate | drop
  std::string chat_template;          // llama3 | plain (the tokenizer's; data/sft_format.h)
  bool prepend_bos = false;           // input/output examples start with bos
  int64_t loss_mask_bytes = 0;
  std::string loss_mask_fnv1a64;      // 16 lowercase hex digits
};

std::string sft_record_path(const std::string& prefix);     // "P.sft.json"
std::string sft_loss_mask_path(const std::string& prefix);  // "P.loss_mask"
// True when "P.sft.json" exists: the prefix names an SFT dataset. "P.loss_mask" without it is refused (half a set).
bool is_sft_dataset(const std::string& prefix);
std::string sft_record_text(const SftRecord& r);
// The record of P; a missing or malformed file is a one-line error naming it.
SftRecord read_sft_record(const std::string& prefix);

// preprocess_data's writer of one SFT set: P.bin/.idx, P.loss_mask, P.sft.json and P.tokenizer.json, every one a
// member of `set` (io/atomic_file.h), which the caller publishes: the old set stays until the new one is whole.
class SftDatasetWriter {
 public:
  SftDatasetWriter(std::string prefix, const TokenizerRecord& tokenizer, FileSet& set);
  // One example: its tokens into P.bin, its answer flags into P.loss_mask.
  void add(const SftExample& e);
  // `r` carries what only the caller knows (truncated, dropped, max_seq_length, overlong, template,
  // prepend_bos); the counts and the mask's checksum are filled in here. Writes the two records.
  void finalize(SftRecord r);
  const SftRecord& record() const { return record_; }
  const IndexedDatasetWriter& ids() const { return ids_; }

 private:
  void flush_mask();
  std::string prefix_;
  TokenizerRecord tokenizer_;
  FileSet& set_;
  IndexedDatasetWriter ids_;
  AtomicFile* mask_out_ = nullptr;
  std::vector<unsigned char> mask_;  // bytes not yet written
  uint64_t mask_hash_ = kFnv1aBasis;
  SftRecord record_;
};

enum class PackingAlgorithm { first_fit_shuffle, first_fit_decreasing };
PackingAlgorithm parse_packing_algorithm(std::string_view name);  // one-line error naming both choices
const char* packing_algorithm_name(PackingAlgorithm a);

// The packs of examples whose lengths (positions each takes, every one in [1, pack_size]) are given: each pack
// lists example indices in the order they are laid out. Deterministic in `rng`'s state.
std::vector<std::vector<int64_t>> pack_examples(std::span<const int64_t> lengths, int64_t pack_size,
                                                PackingAlgorithm algorithm, RandomStateMt& rng);

// One SFT dataset opened for training: P.bin/.idx with P.loss_mask (checked against P.sft.json), split over
// examples and packed into sequences of `seq_length` positions.
class SftData {
 public:
  SftData(const std::string& prefix, std::string_view split, int64_t seq_length, PackingAlgorithm algorithm,
          uint32_t seed);

  const SftRecord& record() const { return record_; }
  int64_t seq_length() const { return seq_; }
  // Packs of split s (0 when the split has no example).
  int64_t packs(Split s) const;
  // Sample `index` of split s (its pack index mod packs(s)) into seq_length() entries of each span: input
  // tokens, labels (kIgnoredLabel where the loss does not count), positions (restarting at 0 with each example
  // and with the padding).
  void sample(Split s, int64_t index, std::span<int32_t> tokens, std::span<int32_t> labels,
              std::span<int32_t> positions) const;
  // "SFT dataset: N examples, packed into M sequences of S tokens, answer tokens K%", then one line per split.
  std::vector<std::string> summary() const;

 private:
  struct Packed {
    std::vector<int64_t> begin;     // pack p holds examples order[begin[p] .. begin[p+1])
    std::vector<int32_t> order;     // example indices
    int64_t examples = 0, positions = 0, answer_labels = 0;
  };
  Packed pack_split(int64_t first, int64_t last, PackingAlgorithm algorithm, RandomStateMt& rng);
  int64_t length_of(int64_t example) const;  // positions it takes in a pack: min(n, S + 1) - 1

  std::string prefix_;
  SftRecord record_;
  std::unique_ptr<IndexedDataset> ids_;
  MappedFile mask_;
  std::vector<int64_t> token_offset_;  // example e's tokens start at token_offset_[e] of P.bin (and of the mask)
  int64_t seq_ = 0;
  int32_t pad_ = 0;  // the eod id
  int64_t cut_at_load_ = 0, skipped_ = 0;  // examples longer than S + 1 (their end cut); examples with no answer label
  std::array<Packed, 3> splits_;
  std::array<bool, 3> has_split_{};
  PackingAlgorithm algorithm_ = PackingAlgorithm::first_fit_shuffle;
};

}  // namespace pl::data
