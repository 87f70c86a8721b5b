#include "data/documents.h"

#include "core/error.h"

namespace pl::data {

int64_t masked_labels(const DocumentPacking& p, std::span<const int32_t> tokens, std::span<const int32_t> labels,
                      std::span<int32_t> out) {
  PL_CHECK(tokens.size() == labels.size() && out.size() == labels.size(),
           "internal: masked_labels over {} tokens, {} labels, {} outputs", tokens.size(), labels.size(), out.size());
  int64_t counted = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
    const bool counts = counted_in_loss(p, tokens[t], labels[t]);
    out[t] = counts ? labels[t] : kIgnoredLabel;
    counted += counts ? 1 : 0;
  }
  return counted;
}

int64_t counted_tokens(const DocumentPacking& p, std::span<const int32_t> tokens, std::span<const int32_t> labels) {
  PL_CHECK(tokens.size() == labels.size(), "internal: counted_tokens over {} tokens and {} labels", tokens.size(),
           labels.size());
  int64_t counted = 0;
  for (size_t t = 0; t < labels.size(); ++t) counted += counted_in_loss(p, tokens[t], labels[t]) ? 1 : 0;
  return counted;
}

void position_ids(const DocumentPacking& p, std::span<const int32_t> tokens, int64_t seq, std::span<int32_t> out) {
  PL_CHECK(seq > 0 && tokens.size() % static_cast<size_t>(seq) == 0 && out.size() == tokens.size(),
           "internal: position_ids of {} tokens in samples of {} into {}", tokens.size(), seq, out.size());
  int32_t pos = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    if (t % static_cast<size_t>(seq) == 0) pos = 0;
    out[t] = pos++;
    if (p.reset_position_ids && tokens[t] == p.eod) pos = 0;  // the next token starts a document at position 0
  }
}

int64_t document_offsets(const DocumentPacking& p, std::span<const int32_t> tokens, int64_t seq, std::span<int32_t> out) {
  PL_CHECK(seq > 0 && tokens.size() % static_cast<size_t>(seq) == 0 && out.size() == tokens.size() + 1,
           "internal: document_offsets of {} tokens in samples of {} into {}", tokens.size(), seq, out.size());
  int64_t count = 0;
  out[0] = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const bool sample_end = (t + 1) % static_cast<size_t>(seq) == 0;
    if (sample_end || (p.reset_attention_mask && tokens[t] == p.eod)) out[static_cast<size_t>(++count)] = static_cast<int32_t>(t + 1);
  }
  return count;
}

int64_t document_offsets_from_positions(std::span<const int32_t> positions, int64_t seq, std::span<int32_t> out) {
  PL_CHECK(seq > 0 && positions.size() % static_cast<size_t>(seq) == 0 && out.size() == positions.size() + 1,
           "internal: document_offsets_from_positions of {} tokens in samples of {} into {}", positions.size(), seq,
           out.size());
  int64_t count = 0;
  out[0] = 0;
  for (size_t t = 0; t < positions.size(); ++t) {
    const bool sample_end = (t + 1) % static_cast<size_t>(seq) == 0;
    const bool next_starts = t + 1 < positions.size() && positions[t + 1] == 0;
    if (sample_end || next_starts) out[static_cast<size_t>(++count)] = static_cast<int32_t>(t + 1);
  }
  return count;
}

DocumentPacking packing_for_data(bool sft, DocumentPacking flags) {
  if (!sft) return flags;
  PL_CHECK(!flags.eod_mask_loss, "--eod-mask-loss does not apply to an SFT dataset: its loss mask comes with the data "
                                 "(answer tokens only)");
  DocumentPacking p;
  p.eod = flags.eod;
  p.reset_position_ids = p.reset_attention_mask = p.explicit_documents = true;
  return p;
}

}  // namespace pl::data
