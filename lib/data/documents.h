#pragma once
// Document-aware packing (Megatron's --eod-mask-loss, --reset-position-ids, --reset-attention-mask, issue 27):
// what a micro-batch's tokens say about its documents. Followed: Megatron-LM
// megatron/core/datasets/gpt_dataset.py, _get_ltor_masks_and_position_ids (per sample of `seq` input tokens):
//   eod_mask_loss:        loss_mask[data == eod] = 0 (no loss on the prediction made FROM an EOD);
//   reset_position_ids:   positions restart after each EOD (the token after an EOD has position 0);
//   reset_attention_mask: attention_mask[(i+1):, :(i+1)] = 0 for each EOD at i: a document ends with its EOD
//                         (inclusive), attention is causal within each document only.
// An EOD that is the last token of its sample starts no new document (Megatron's slices are then empty).
#include <cstdint>
#include <span>

namespace pl::data {

struct DocumentPacking {
  int32_t eod = -1;  // the EOD token id (mock data: DataConfig::mock_eod; .bin/.idx: the tokenizer record); -1: unknown
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // SFT packs (data/sft_dataset.h): the data gives every token's position in its example, and a document starts
  // where a position is 0 (and at each sample start); reset_position_ids and reset_attention_mask are then set
  // too, and nothing is derived from EOD tokens.
  bool explicit_documents = false;
  bool any() const { return eod_mask_loss || reset_position_ids || reset_attention_mask || explicit_documents; }
};

// A label the loss ignores (cross-entropy gives it loss 0 and gradient 0): a masked position.
inline constexpr int32_t kIgnoredLabel = -1;

// True when position t (input token `token`, label `label`) counts in the loss: its label is not kIgnoredLabel and,
// with eod_mask_loss, its input token is not the EOD.
inline bool counted_in_loss(const DocumentPacking& p, int32_t token, int32_t label) {
  return label != kIgnoredLabel && !(p.eod_mask_loss && token == p.eod);
}

// The labels the loss sees: labels[t], or kIgnoredLabel where counted_in_loss is false. Returns the positions
// counted (the micro-batch's "num_tokens" of Megatron's loss_func).
int64_t masked_labels(const DocumentPacking& p, std::span<const int32_t> tokens, std::span<const int32_t> labels,
                      std::span<int32_t> out);
// The positions counted without writing anything (the trainer's normalization).
int64_t counted_tokens(const DocumentPacking& p, std::span<const int32_t> tokens, std::span<const int32_t> labels);

// RoPE positions of the batch*seq tokens (sample by sample): t % seq, restarted after each EOD with
// reset_position_ids.
void position_ids(const DocumentPacking& p, std::span<const int32_t> tokens, int64_t seq, std::span<int32_t> out);

// The documents of the micro-batch as backend/ops.h DocumentBoundaries offsets: offsets[0] = 0, one boundary after
// each EOD that is not the last token of its sample and one at each sample end, offsets[count] = batch*seq.
// out must hold batch*seq + 1 values (the worst case: every token its own document). Returns count.
int64_t document_offsets(const DocumentPacking& p, std::span<const int32_t> tokens, int64_t seq, std::span<int32_t> out);

// The same offsets from explicit positions (explicit_documents): a boundary before each token whose position is 0
// (the first token of an example or of a pack's padding) and at each sample end. Returns count.
int64_t document_offsets_from_positions(std::span<const int32_t> positions, int64_t seq, std::span<int32_t> out);

// The packing an SFT dataset implies (explicit_documents with reset_position_ids and reset_attention_mask), for
// the memory plan before the data is read; `flags` (Megatron's) when `sft` is false. --eod-mask-loss is refused
// with SFT data in one line: its loss mask comes with the data.
DocumentPacking packing_for_data(bool sft, DocumentPacking flags);

}  // namespace pl::data
