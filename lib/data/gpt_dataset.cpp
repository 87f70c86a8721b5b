#include "data/gpt_dataset.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/checksum.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/npy.h"
#include "data/numpy_rng.h"

namespace pl::data {

void fill_micro_batch(const SampleSource& source, int32_t pad_token_id, int64_t first_sample, int64_t micro,
                      int64_t micro_batch, std::span<int32_t> tokens, std::span<int32_t> labels) {
  const int64_t seq = source.sample_length() - 1;
  PL_CHECK(micro_batch >= 1 && micro >= 0 && first_sample >= 0, "data: bad micro-batch request ({} x {} at sample {})",
           micro, micro_batch, first_sample);
  PL_CHECK(static_cast<int64_t>(tokens.size()) == micro_batch * seq && static_cast<int64_t>(labels.size()) == micro_batch * seq,
           "data: micro-batch buffers hold {} and {} tokens, need {}", tokens.size(), labels.size(), micro_batch * seq);
  const int64_t first = first_sample + micro * micro_batch;
  PL_CHECK(first + micro_batch <= source.size(), "data: the run needs samples up to {} but the dataset has {}",
           first + micro_batch, source.size());
  std::vector<int32_t> text(static_cast<size_t>(seq + 1));
  for (int64_t b = 0; b < micro_batch; ++b) {
    source.get(first + b, text);
    int32_t* tk = tokens.data() + b * seq;
    int32_t* lb = labels.data() + b * seq;
    for (int64_t t = 0; t < seq; ++t) {
      tk[t] = text[static_cast<size_t>(t)] == pad_token_id ? 0 : text[static_cast<size_t>(t)];
      lb[t] = text[static_cast<size_t>(t + 1)] == pad_token_id ? 0 : text[static_cast<size_t>(t + 1)];
    }
  }
}

const char* split_name(Split s) {
  constexpr const char* kNames[] = {"train", "valid", "test"};
  const auto i = static_cast<size_t>(s);
  return i < std::size(kNames) ? kNames[i] : "?";
}

std::array<double, 3> parse_split(std::string_view split) {
  // Megatron: list(map(float, re.findall(r"[.0-9]+", split))), padded with zeros to 3, normalized.
  std::vector<double> w;
  size_t i = 0;
  while (i < split.size()) {
    auto is_num = [](char c) { return c == '.' || (c >= '0' && c <= '9'); };
    if (!is_num(split[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < split.size() && is_num(split[j])) ++j;
    const std::string tok(split.substr(i, j - i));
    char* end = nullptr;
    const double v = std::strtod(tok.c_str(), &end);
    if (end != tok.c_str() + tok.size()) pl::fail("split '{}': '{}' is not a number", split, tok);
    w.push_back(v);
    i = j;
  }
  if (w.empty() || w.size() > 3)
    pl::fail("split '{}': expected 1 to 3 weights (train,valid,test), got {}", split, w.size());
  w.resize(3, 0.0);
  const double sum = (w[0] + w[1]) + w[2];
  if (!(sum > 0.0) || !std::isfinite(sum)) pl::fail("split '{}': weights must have a positive sum", split);
  return {w[0] / sum, w[1] / sum, w[2] / sum};
}

std::array<std::optional<std::pair<int64_t, int64_t>>, 3> split_ranges(std::string_view split,
                                                                       int64_t num_elements) {
  const std::array<double, 3> w = parse_split(split);
  // Book-ends: functools.reduce(lambda a, b: a + [a[-1] + b], [[0], *w]), summed left to right.
  const double ends[4] = {0.0, 0.0 + w[0], (0.0 + w[0]) + w[1], ((0.0 + w[0]) + w[1]) + w[2]};
  std::array<std::optional<std::pair<int64_t, int64_t>>, 3> out;
  for (int k = 0; k < 3; ++k) {
    if (ends[k + 1] <= ends[k]) continue;  // convert_split_vector_to_split_matrix: no overlap -> None
    // Python round() on a float rounds half to even; nearbyint does too in the default rounding mode.
    const auto b = static_cast<int64_t>(std::nearbyint(ends[k] * static_cast<double>(num_elements)));
    const auto e = static_cast<int64_t>(std::nearbyint(ends[k + 1] * static_cast<double>(num_elements)));
    out[k] = std::make_pair(b, e);
  }
  return out;
}

std::vector<int32_t> sequence_range(int64_t begin, int64_t end) {
  std::vector<int32_t> v;
  v.reserve(static_cast<size_t>(end - begin));
  for (int64_t i = begin; i < end; ++i) v.push_back(static_cast<int32_t>(i));
  return v;
}

std::vector<int64_t> build_sample_index(std::span<const int32_t> sizes,
                                        std::span<const int32_t> document_index,
                                        int64_t sequence_length, int64_t num_epochs,
                                        int64_t tokens_per_epoch, bool drop_last_partial_sequence,
                                        int add_extra_token) {
  PL_CHECK(sequence_length >= 1, "GPT dataset: sequence length must be >= 1, got {}", sequence_length);
  PL_CHECK(num_epochs >= 1 && tokens_per_epoch >= 1 && !document_index.empty(),
           "GPT dataset: nothing to sample (epochs {}, tokens per epoch {})", num_epochs, tokens_per_epoch);
  const int64_t total = num_epochs * tokens_per_epoch - add_extra_token;
  int64_t num_samples;
  if (drop_last_partial_sequence) {
    num_samples = total / sequence_length;
  } else {
    // helpers.cpp: ceil(float(total) / seq_length), in single precision.
    num_samples = static_cast<int64_t>(std::ceil(static_cast<float>(total) / static_cast<float>(sequence_length)));
  }
  std::vector<int64_t> idx(static_cast<size_t>(2 * (num_samples + 1)));
  const auto last_doc = static_cast<int64_t>(document_index.size()) - 1;
  int64_t doc_pos = 0;  // position in document_index
  int64_t doc_offset = 0;
  idx[0] = 0;
  idx[1] = 0;
  for (int64_t s = 1; s <= num_samples; ++s) {
    int64_t remaining = sequence_length + add_extra_token;
    while (remaining != 0) {
      const int64_t doc_len = sizes[static_cast<size_t>(document_index[static_cast<size_t>(doc_pos)])] - doc_offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        // The sample ends inside this document; the next one starts add_extra_token back, so
        // consecutive samples overlap by that token and the label stream stays continuous.
        doc_offset += remaining + doc_len - add_extra_token;
        remaining = 0;
      } else {
        if (doc_pos == last_doc) {  // out of documents (only with a kept partial last sample)
          doc_offset = sizes[static_cast<size_t>(document_index[static_cast<size_t>(doc_pos)])] - add_extra_token;
          break;
        }
        ++doc_pos;
        doc_offset = 0;
      }
    }
    idx[static_cast<size_t>(2 * s)] = doc_pos;
    idx[static_cast<size_t>(2 * s + 1)] = doc_offset;
  }
  return idx;
}

namespace {
// _build_document_index(documents, num_epochs, rs, separate_final_epoch=False): tile and shuffle.
void append_shuffled_epochs(std::vector<int32_t>& out, const std::vector<int32_t>& documents,
                            int64_t epochs, RandomStateMt& rs) {
  const size_t begin = out.size();
  for (int64_t e = 0; e < epochs; ++e) out.insert(out.end(), documents.begin(), documents.end());
  rs.shuffle(std::span<int32_t>(out.data() + begin, out.size() - begin));
}

// _build_shuffle_index for [first, last): arange shuffled with the shared RandomState.
void append_shuffled_range(std::vector<int64_t>& out, int64_t first, int64_t last, RandomStateMt& rs) {
  const size_t begin = out.size();
  for (int64_t i = first; i < last; ++i) out.push_back(i);
  rs.shuffle(std::span<int64_t>(out.data() + begin, out.size() - begin));
}

// Everything the three index arrays depend on, one "key: value" per line. Its checksum64 names the
// cache entry (Megatron uses md5 of its own description, which we cannot reproduce byte for byte, so
// there is no point in matching the hash function).
std::string index_description(const std::string& dataset_id, const std::vector<int32_t>& indices,
                              std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& c) {
  return fmt::format(
      "class: GPTDataset\nformat: 2\ndataset: {}\nsplit: {}\nsequences: {} [{}, {}] checksum {:016x}\nnum_samples: {}\n"
      "sequence_length: {}\nrandom_seed: {}\nadd_extra_token_to_sequence: {}\n"
      "drop_last_partial_validation_sequence: {}\n",
      dataset_id, split_name(split), indices.size(), indices.empty() ? -1 : indices.front(),
      indices.empty() ? -1 : indices.back(), checksum64(indices.data(), indices.size() * sizeof(int32_t)), num_samples ? std::to_string(*num_samples) : "one epoch",
      c.sequence_length, c.random_seed, c.add_extra_token_to_sequence, c.drop_last_partial_validation_sequence);
}

template <typename T>
std::vector<T> npy_values(const NpyArray& a) {
  std::vector<T> v(static_cast<size_t>(a.numel()));
  std::memcpy(v.data(), a.bytes.data(), a.bytes.size());
  return v;
}
}  // namespace

// A cached entry is used only when its description matches exactly and the arrays are consistent
// with it (sizes, value ranges); anything else means rebuild.
bool GPTDataset::load_cached(const std::string& base, const std::string& description, int64_t docs) {
  try {
    // Anything unreadable -- missing, or a FIFO or a directory (io/file_checks.h: refused, not a hang) --
    // is a cache miss, as is a corrupt array.
    if (read_regular_file(base + "description.txt") != description) return false;
    const NpyArray doc = read_npy(base + "document_index.npy");
    const NpyArray smp = read_npy(base + "sample_index.npy");
    const NpyArray shf = read_npy(base + "shuffle_index.npy");
    if (doc.dtype != "<i4" || doc.shape.size() != 1 || smp.dtype != "<i8" || smp.shape.size() != 2 ||
        smp.shape[1] != 2 || smp.shape[0] < 1 || shf.dtype != "<i8" || shf.shape.size() != 1 ||
        shf.shape[0] != smp.shape[0] - 1 || doc.shape[0] != num_epochs_ * docs)
      return false;
    std::vector<int32_t> d = npy_values<int32_t>(doc);
    std::vector<int64_t> si = npy_values<int64_t>(smp), sh = npy_values<int64_t>(shf);
    const int64_t n = dataset_->num_sequences(), total = shf.shape[0];
    for (const int32_t x : d)
      if (x < 0 || x >= n) return false;
    for (size_t r = 0; r < si.size(); r += 2)
      if (si[r] < 0 || si[r] >= static_cast<int64_t>(d.size()) || si[r + 1] < 0) return false;
    for (const int64_t x : sh)
      if (x < 0 || x >= total) return false;
    document_index_ = std::move(d);
    sample_index_ = std::move(si);
    shuffle_index_ = std::move(sh);
    return true;
  } catch (const Error&) {
    return false;  // unreadable or corrupt: rebuild
  }
}

// Arrays first, the description last: an entry without its description is never used, so a crash
// mid-save leaves nothing that a later run would trust.
void GPTDataset::save_cached(const std::string& base, const std::string& description) {
  try {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(base).parent_path(), ec);
    if (ec) throw Error(fmt::format("cannot create {}: {}", std::filesystem::path(base).parent_path().string(), ec.message()));
    const int64_t rows = size() + 1;
    write_npy(base + "document_index.npy", "<i4", {static_cast<int64_t>(document_index_.size())},
              document_index_.data(), document_index_.size() * sizeof(int32_t));
    write_npy(base + "sample_index.npy", "<i8", {rows, 2}, sample_index_.data(), sample_index_.size() * sizeof(int64_t));
    write_npy(base + "shuffle_index.npy", "<i8", {static_cast<int64_t>(shuffle_index_.size())}, shuffle_index_.data(),
              shuffle_index_.size() * sizeof(int64_t));
    write_file_atomically(base + "description.txt", description);
    cache_status_ = CacheStatus::built_and_saved;
    cache_note_ = base + "*";
  } catch (const Error& e) {
    cache_status_ = CacheStatus::built_not_saved;  // a read-only data directory is not an error
    cache_note_ = e.what();
  }
}

GPTDataset::GPTDataset(std::shared_ptr<const LowLevelDataset> dataset, std::vector<int32_t> indices,
                       std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config,
                       const GPTIndexCache& cache)
    : dataset_(std::move(dataset)), config_(config), split_(split) {
  PL_CHECK(dataset_ != nullptr, "GPT dataset: no low-level dataset");
  num_sequences_ = static_cast<int64_t>(indices.size());
  const int64_t samples_sans_final_epoch = plan_epochs(indices, num_samples);
  // Built or loaded, the three indices live in host memory: refused with one line before allocating.
  check_host_memory(index_bytes(),
                    fmt::format("building the {} split's dataset indices ({} epochs of {} sequences, {} samples of {} tokens)",
                                split_name(split), num_epochs_, num_sequences_, num_samples.value_or(-1),
                                config_.sequence_length),
                    split == Split::train ? "lower --train-iters or --global-batch-size"
                                          : "lower --eval-iters (or raise --eval-interval)");
  if (cache.dir.empty()) {
    build_indices(indices, samples_sans_final_epoch);
    return;
  }
  const std::string description = index_description(cache.dataset_id, indices, num_samples, split, config_);
  const std::string base = fmt::format("{}/{:016x}-GPTDataset-{}-", cache.dir, checksum64(description.data(), description.size()),
                                       split_name(split));
  if (load_cached(base, description, static_cast<int64_t>(indices.size()))) {
    cache_status_ = CacheStatus::loaded;
    cache_note_ = base + "*";
    return;
  }
  build_indices(indices, samples_sans_final_epoch);
  save_cached(base, description);
}

// The bytes of the document, sample and shuffle indices plan_epochs has sized (checked arithmetic:
// they follow from the requested sample count, user input).
int64_t GPTDataset::index_bytes() const {
  const int64_t add = config_.add_extra_token_to_sequence ? 1 : 0;
  constexpr std::string_view what = "the dataset indices' size";
  const int64_t tokens = checked_mul(num_epochs_, tokens_per_epoch_, what);
  const int64_t samples = (tokens - add) / config_.sequence_length + 1;
  const int64_t document = checked_product({num_epochs_, num_sequences_, 4}, what);
  const int64_t sample = checked_product({checked_add(samples, 1, what), 2, 8}, what);
  const int64_t shuffle = checked_mul(samples, 8, what);
  return checked_add(checked_add(document, sample, what), shuffle, what);
}

// Tokens per epoch, epochs and whether the final epoch is shuffled apart (what the indices are built
// from, and what the summary shows whether they are built or loaded); returns the samples before
// the final epoch.
int64_t GPTDataset::plan_epochs(const std::vector<int32_t>& indices, std::optional<int64_t> num_samples) {
  const int64_t seq = config_.sequence_length;
  const int add = config_.add_extra_token_to_sequence ? 1 : 0;
  PL_CHECK(seq >= 1, "GPT dataset: sequence length must be >= 1, got {}", seq);
  PL_CHECK(!num_samples || *num_samples >= 0, "GPT dataset: num_samples must be >= 0, got {}", *num_samples);
  const std::span<const int32_t> lengths = dataset_->sequence_lengths();
  const int64_t n = static_cast<int64_t>(lengths.size());

  // Tokens per epoch over the split's sequences.
  tokens_per_epoch_ = 0;
  for (const int32_t i : indices) {
    PL_CHECK(i >= 0 && i < n, "GPT dataset: sequence index {} out of range [0, {})", i, n);
    tokens_per_epoch_ += lengths[static_cast<size_t>(i)];
  }
  PL_CHECK(tokens_per_epoch_ >= 1, "GPT dataset {} split: no tokens in {} sequences", split_name(split_),
           indices.size());

  // _get_num_epochs: the smallest e with e * tokens_per_epoch >= num_samples * seq + add.
  num_epochs_ = 1;
  if (num_samples) {
    PL_CHECK(*num_samples <= (std::numeric_limits<int64_t>::max() - add) / seq,
             "GPT dataset: {} samples of {} tokens is too many", *num_samples, seq);
    const int64_t requested = *num_samples * seq + add;
    if (requested > tokens_per_epoch_) num_epochs_ = (requested + tokens_per_epoch_ - 1) / tokens_per_epoch_;
  }
  const int64_t docs = static_cast<int64_t>(indices.size());
  PL_CHECK(num_epochs_ <= std::numeric_limits<int64_t>::max() / 4 / docs,
           "GPT dataset: {} epochs of {} sequences is too many", num_epochs_, docs);

  // separate_final_epoch: the last epoch is shuffled apart when it contributes few samples.
  int64_t samples_sans_final_epoch = 0;
  separate_final_epoch_ = false;
  if (num_epochs_ > 1) {
    samples_sans_final_epoch = ((num_epochs_ - 1) * tokens_per_epoch_ - add) / seq;
    const int64_t from_final = *num_samples - samples_sans_final_epoch;
    const int64_t per_epoch = (tokens_per_epoch_ - add) / seq;
    PL_CHECK(from_final >= 0 && from_final <= per_epoch + 1,
             "GPT dataset: inconsistent epoch split ({} samples from the final epoch, {} per epoch)",
             from_final, per_epoch);
    separate_final_epoch_ = from_final < static_cast<int64_t>(0.80 * static_cast<double>(per_epoch));
  }
  return samples_sans_final_epoch;
}

void GPTDataset::build_indices(const std::vector<int32_t>& indices, int64_t samples_sans_final_epoch) {
  const int64_t seq = config_.sequence_length;
  const int add = config_.add_extra_token_to_sequence ? 1 : 0;
  const int64_t docs = static_cast<int64_t>(indices.size());
  const std::span<const int32_t> lengths = dataset_->sequence_lengths();
  RandomStateMt rs(config_.random_seed);

  // Document index: e epochs tiled and shuffled together, or e-1 together then the last alone.
  document_index_.reserve(static_cast<size_t>(num_epochs_ * docs));
  append_shuffled_epochs(document_index_, indices, separate_final_epoch_ ? num_epochs_ - 1 : num_epochs_, rs);
  if (separate_final_epoch_) append_shuffled_epochs(document_index_, indices, 1, rs);

  // Sample index.
  const bool drop_last = split_ == Split::valid ? config_.drop_last_partial_validation_sequence : true;
  sample_index_ = build_sample_index(lengths, document_index_, seq, num_epochs_, tokens_per_epoch_,
                                     drop_last, add);

  // Shuffle index: [0, total) shuffled, or [0, sans_final) and [sans_final, total) separately.
  const int64_t total = size();
  shuffle_index_.reserve(static_cast<size_t>(total));
  const int64_t first_part = separate_final_epoch_ ? samples_sans_final_epoch : total;
  append_shuffled_range(shuffle_index_, 0, first_part, rs);
  if (separate_final_epoch_) append_shuffled_range(shuffle_index_, first_part, total, rs);
}

int64_t GPTDataset::sample_length() const {
  return config_.sequence_length + (config_.add_extra_token_to_sequence ? 1 : 0);
}

void GPTDataset::get(int64_t idx, std::span<int32_t> out) const {
  PL_CHECK(idx >= 0 && idx < size(), "GPT dataset: sample {} out of range [0, {})", idx, size());
  const int64_t want = sample_length();
  PL_CHECK(static_cast<int64_t>(out.size()) == want, "GPT dataset: sample buffer holds {} tokens, need {}",
           out.size(), want);
  const int add = config_.add_extra_token_to_sequence ? 1 : 0;
  const auto j = static_cast<size_t>(shuffle_index_[static_cast<size_t>(idx)]);
  const int64_t beg = sample_index_[2 * j], beg_off = sample_index_[2 * j + 1];
  const int64_t end = sample_index_[2 * j + 2], end_off = sample_index_[2 * j + 3];
  const std::span<const int32_t> lengths = dataset_->sequence_lengths();

  int64_t n = 0;
  auto take = [&](int64_t pos, int64_t offset, int64_t length) {
    const int32_t doc = document_index_[static_cast<size_t>(pos)];
    PL_CHECK(offset >= 0 && length >= 0 && offset + length <= lengths[static_cast<size_t>(doc)] &&
                 n + length <= want,
             "GPT dataset: sample {} reads {} tokens at {} of sequence {} (length {})", idx, length, offset,
             doc, lengths[static_cast<size_t>(doc)]);
    dataset_->get(doc, offset, length, out.data() + n);
    n += length;
  };
  if (beg == end) {
    take(beg, beg_off, end_off - beg_off + add);
  } else {
    for (int64_t p = beg; p <= end; ++p) {
      const int64_t off = p > beg ? 0 : beg_off;
      const int64_t len = p < end ? lengths[static_cast<size_t>(document_index_[static_cast<size_t>(p)])] - off
                                  : end_off + add;
      take(p, off, len);
    }
  }
  for (; n < want; ++n) out[static_cast<size_t>(n)] = config_.pad_token_id;
}

}  // namespace pl::data
