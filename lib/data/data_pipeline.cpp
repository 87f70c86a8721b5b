#include "data/data_pipeline.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <optional>

#include "core/checksum.h"
#include "core/error.h"
#include "data/blended_dataset.h"
#include "data/documents.h"
#include "data/indexed_dataset.h"
#include "data/mock_dataset.h"
#include "data/tokenizer_record.h"

namespace pl::data {
namespace {

std::optional<double> parse_weight(const std::string& s) {
  double v = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

GPTDatasetConfig gpt_config(const DataConfig& c) { return {.sequence_length = c.seq_length, .random_seed = c.seed}; }

std::string cache_note(const GPTDataset& d) {
  switch (d.cache_status()) {
    case CacheStatus::off: return "not cached";
    case CacheStatus::loaded: return "indices loaded from " + d.cache_note();
    case CacheStatus::built_and_saved: return "indices built, cached in " + d.cache_note();
    case CacheStatus::built_not_saved: return "indices built, not cached (" + d.cache_note() + ")";
  }
  return "";
}

std::string split_line(const std::string& what, const GPTDataset& d, int64_t needed) {
  return fmt::format("{} {}: {} sequences, {} tokens per epoch, {} epoch{}{}, {} samples (the run reads {}), {}", what,
                     split_name(d.split()), d.num_sequences(), d.tokens_per_epoch(), d.num_epochs(),
                     d.num_epochs() == 1 ? "" : "s", d.separate_final_epoch() ? " (final epoch shuffled apart)" : "",
                     d.size(), needed, cache_note(d));
}

}  // namespace

DataConfig data_config_for_run(DataConfig flags, int64_t model_vocab_size, int64_t seq_length,
                               const std::array<int64_t, 3>& num_samples) {
  flags.vocab_size = model_vocab_size;
  flags.mock_vocab_size = std::min<int64_t>(model_vocab_size, 32000);
  flags.mock_eod = flags.mock_vocab_size - 1;
  flags.seq_length = seq_length;
  flags.num_samples = num_samples;
  return flags;
}

DataBlend parse_data_path(const std::vector<std::string>& args) {
  PL_CHECK(!args.empty(), "--data-path: no dataset given");
  DataBlend b;
  if (args.size() == 1) {
    PL_CHECK(!parse_weight(args[0]), "--data-path: '{}' is a weight without a dataset prefix after it", args[0]);
    b.prefixes = args;
    b.weights = {1.0};
    return b;
  }
  PL_CHECK(args.size() % 2 == 0 && parse_weight(args[0]),
           "--data-path: several datasets need a weight before each prefix ('0.3 PREFIX_A 0.7 PREFIX_B'), got {} "
           "values starting with '{}'",
           args.size(), args[0]);
  std::vector<double> w;
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::optional<double> v = parse_weight(args[i]);
    PL_CHECK(v.has_value(), "--data-path: '{}' (value {}) should be the weight of '{}'", args[i], i + 1, args[i + 1]);
    PL_CHECK(!parse_weight(args[i + 1]), "--data-path: '{}' (value {}) should be a dataset prefix, not a number",
             args[i + 1], i + 2);
    w.push_back(*v);
    b.prefixes.push_back(args[i + 1]);
  }
  b.weights = normalize_blend_weights(w);
  return b;
}

bool data_path_is_sft(const std::vector<std::string>& data_path) {
  if (data_path.empty()) return false;
  const DataBlend blend = parse_data_path(data_path);
  for (const std::string& p : blend.prefixes)
    PL_CHECK(!is_sft_dataset(p) || blend.prefixes.size() == 1,
             "--data-path: {} is an SFT dataset ({}); a run takes one SFT dataset alone, not in a blend", p,
             sft_record_path(p));
  return is_sft_dataset(blend.prefixes[0]);
}

TrainingData::TrainingData(const DataConfig& config) : config_(config) {
  PL_CHECK(config_.seq_length >= 1, "data: sequence length must be >= 1, got {}", config_.seq_length);
  for (const int64_t n : config_.num_samples) PL_CHECK(n >= 0, "data: sample counts must be >= 0, got {}", n);
  if (mock())
    build_mock();
  else if (data_path_is_sft(config_.data_path))
    build_sft(parse_data_path(config_.data_path).prefixes[0]);
  else
    build_indexed();
}

// One SFT dataset, split over its examples and packed (data/sft_dataset.h); its tokenizer record gives the EOD id
// and the vocabulary.
void TrainingData::build_sft(const std::string& prefix) {
  const DataConfig& c = config_;
  sft_ = std::make_shared<const SftData>(prefix, c.split, c.seq_length, parse_packing_algorithm(c.packing_algorithm),
                                         c.seed);
  for (const std::string& line : sft_->summary()) summary_.push_back(line);
  const std::optional<TokenizerRecord> rec = read_tokenizer_record(prefix);  // (SftData required it)
  note_eod(rec->eod, tokenizer_record_path(prefix), true);
  recorded_vocab_size_ = rec->vocab_size;
  recorded_vocab_source_ = tokenizer_record_path(prefix);
  PL_CHECK(c.num_samples[1] == 0 || sft_->packs(Split::valid) > 0,
           "{}: --split {} leaves the validation split no example, but the run evaluates ({} samples); change --split "
           "or pass --eval-iters 0",
           prefix, c.split, c.num_samples[1]);
}

bool TrainingData::has_split(Split s) const {
  return sft_ ? sft_->packs(s) > 0 : splits_[static_cast<size_t>(s)] != nullptr;
}

void TrainingData::build_mock() {
  const DataConfig& c = config_;
  summary_.push_back(fmt::format("Megatron MockGPTDataset: vocab {}, eod {}, split 1,1,1 (mock data ignores --split), "
                                 "seed {}",
                                 c.mock_vocab_size, c.mock_eod, c.seed));
  eod_ = static_cast<int32_t>(c.mock_eod);
  auto low = std::make_shared<const MockGPTLowLevelDataset>(c.mock_vocab_size, c.mock_eod);
  const auto ranges = split_ranges("1,1,1", low->num_sequences());
  for (const Split s : {Split::train, Split::valid, Split::test}) {
    const auto& r = ranges[static_cast<size_t>(s)];
    if (!r) continue;
    auto d = std::make_shared<const GPTDataset>(low, sequence_range(r->first, r->second),
                                                c.num_samples[static_cast<size_t>(s)], s, gpt_config(c));
    summary_.push_back(split_line("mock", *d, c.num_samples[static_cast<size_t>(s)]));
    splits_[static_cast<size_t>(s)] = std::move(d);
  }
}

void TrainingData::build_indexed() {
  const DataConfig& c = config_;
  const DataBlend blend = parse_data_path(c.data_path);
  const bool blended = blend.prefixes.size() > 1;
  std::vector<std::shared_ptr<const IndexedDataset>> low;
  std::vector<GPTIndexCache> caches;  // per dataset: where and under which id its indices are cached
  for (size_t d = 0; d < blend.prefixes.size(); ++d) {
    auto ds = std::make_shared<const IndexedDataset>(blend.prefixes[d]);
    int64_t tokens = 0;
    for (const int32_t n : ds->sequence_lengths()) tokens += n;
    const std::optional<TokenizerRecord> rec = read_tokenizer_record(blend.prefixes[d]);
    summary_.push_back(fmt::format(
        "dataset {}: {} ({} sequences, {} tokens, {}, {}){}", d + 1, blend.prefixes[d], ds->num_sequences(), tokens,
        indexed_dtype_name(static_cast<uint8_t>(ds->dtype())),
        rec ? fmt::format("tokenizer {} vocab {} eod {}", rec->type, rec->vocab_size, rec->eod)
            : std::string("no tokenizer record"),
        blended ? fmt::format(", weight {:.4f}", blend.weights[d]) : ""));
    note_eod(rec ? rec->eod : -1, tokenizer_record_path(blend.prefixes[d]), d == 0);
    if (rec && rec->vocab_size > recorded_vocab_size_) {
      recorded_vocab_size_ = rec->vocab_size;
      recorded_vocab_source_ = tokenizer_record_path(blend.prefixes[d]);
    }
    // The indices depend on the sequence lengths: their checksum keeps a rewritten dataset (same path,
    // count and size, other documents or order) from reusing another one's cache.
    const std::span<const int32_t> lengths = ds->sequence_lengths();
    caches.push_back(GPTIndexCache{
        c.cache_path.empty() ? (std::filesystem::path(blend.prefixes[d]) / "cache" / "GPTDataset_indices").string()
                             : c.cache_path,
        fmt::format("{} ({} sequences, {} bytes of .bin, lengths checksum {:016x})",
                    std::filesystem::absolute(blend.prefixes[d]).lexically_normal().string(), ds->num_sequences(),
                    std::filesystem::file_size(ds->bin_path()), checksum64(lengths.data(), lengths.size_bytes()))});
    low.push_back(std::move(ds));
  }
  for (const Split s : {Split::train, Split::valid, Split::test}) {
    const int64_t target = c.num_samples[static_cast<size_t>(s)];
    std::vector<std::shared_ptr<const SampleSource>> parts;
    for (size_t d = 0; d < low.size(); ++d) {
      const auto ranges = split_ranges(c.split, low[d]->num_sequences());
      const auto& r = ranges[static_cast<size_t>(s)];
      if (!r) break;  // a 0 weight in --split: no such split for any dataset
      if (r->first == r->second) {
        // An empty test split (common: 969,30,1 of a few hundred documents) only skips the final test
        // evaluation; an empty split the run must read from is an error.
        if (s == Split::test)
          summary_.push_back(fmt::format("dataset {}: the test split of --split {} is empty: no test evaluation", d + 1,
                                         c.split));
        else
          PL_CHECK(target == 0,
                   "{}: --split {} leaves the {} split none of its {} sequences, but the run reads {} {} samples; "
                   "change --split or bring more documents",
                   blend.prefixes[d], c.split, split_name(s), low[d]->num_sequences(), target, split_name(s));
        parts.clear();
        break;
      }
      const int64_t wanted = blended ? blended_dataset_samples(target, blend.weights[d]) : target;
      auto g = std::make_shared<const GPTDataset>(low[d], sequence_range(r->first, r->second), wanted, s, gpt_config(c),
                                                  caches[d]);
      summary_.push_back(split_line(fmt::format("dataset {}", d + 1), *g, wanted));
      parts.push_back(std::move(g));
    }
    if (parts.empty()) continue;
    if (!blended) {
      splits_[static_cast<size_t>(s)] = std::move(parts.front());
    } else {
      splits_[static_cast<size_t>(s)] = std::make_shared<const BlendedDataset>(std::move(parts), blend.weights, target);
      summary_.push_back(fmt::format("blend {}: {} samples from {} datasets", split_name(s), target, low.size()));
    }
  }
  PL_CHECK(splits_[0] != nullptr, "--split {} gives the train split no data", c.split);
}

// One dataset's EOD id (-1: it has no tokenizer record at `record`) into the data's: every dataset must name
// the same one.
void TrainingData::note_eod(int32_t eod, const std::string& record, bool first) {
  if (!eod_problem_.empty()) return;
  if (eod < 0) {
    eod_ = -1;
    eod_problem_ = fmt::format("{} does not exist (data without a tokenizer record has no known EOD id)", record);
  } else if (first) {
    eod_ = eod;
  } else if (eod != eod_) {
    eod_problem_ = fmt::format("{} names EOD {} but an earlier dataset's record names {}", record, eod, eod_);
    eod_ = -1;
  }
}

DocumentPacking document_packing(const TrainingData& data, DocumentPacking flags) {
  if (!flags.any()) return flags;
  const char* flag = flags.eod_mask_loss ? "--eod-mask-loss"
                     : flags.reset_position_ids ? "--reset-position-ids"
                                                : "--reset-attention-mask";
  PL_CHECK(data.eod_token() >= 0, "{} needs the data's EOD token id: {}", flag, data.eod_problem());
  flags.eod = data.eod_token();
  return flags;
}

void TrainingData::micro_batch(Split s, int64_t first_sample, int64_t micro, int64_t micro_batch,
                               std::span<int32_t> tokens, std::span<int32_t> labels,
                               std::span<int32_t> positions) const {
  PL_CHECK(positions.empty() != sft(), "internal: a micro-batch of {} data {} positions", sft() ? "SFT" : "GPT",
           positions.empty() ? "without" : "with");
  if (sft_) {
    const auto seq = static_cast<size_t>(sft_->seq_length());
    PL_CHECK(tokens.size() == static_cast<size_t>(micro_batch) * seq, "internal: SFT micro-batch of {} ids for {} x {}",
             tokens.size(), micro_batch, seq);
    for (int64_t b = 0; b < micro_batch; ++b) {
      const size_t at = static_cast<size_t>(b) * seq;
      sft_->sample(s, first_sample + micro * micro_batch + b, tokens.subspan(at, seq), labels.subspan(at, seq),
                   positions.subspan(at, seq));
    }
  } else {
    const SampleSource* src = split(s);
    PL_CHECK(src != nullptr, "data: the {} split has no data", split_name(s));
    fill_micro_batch(*src, pad_token_id(), first_sample, micro, micro_batch, tokens, labels);
  }
  check_ids_in_vocab(s, first_sample + micro * micro_batch, static_cast<int64_t>(tokens.size()) / micro_batch, tokens,
                     labels);
}

void TrainingData::check_ids_in_vocab(Split s, int64_t first, int64_t seq, std::span<const int32_t> tokens,
                                      std::span<const int32_t> labels) const {
  const int64_t vocab = config_.vocab_size;
  if (vocab <= 0) return;
  const auto outside = [vocab](int32_t id) { return id < 0 || id >= vocab; };
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int32_t bad = outside(tokens[k]) ? tokens[k] : (outside(labels[k]) && labels[k] != kIgnoredLabel ? labels[k] : 0);
    PL_CHECK(bad == 0, "data: sample {} of the {} split holds token id {}, outside the model's vocabulary [0, {}): "
             "the data was tokenized for another vocabulary (see its .tokenizer.json, or use a model config with "
             "a larger vocab_size)",
             first + static_cast<int64_t>(k) / seq, split_name(s), bad, vocab);
  }
}

}  // namespace pl::data
