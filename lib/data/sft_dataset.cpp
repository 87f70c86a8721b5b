// SFT datasets: the record, NeMo's packing and the packed samples (see sft_dataset.h).
#include "data/sft_dataset.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <functional>
#include <filesystem>
#include <optional>

#include "core/checksum.h"
#include "core/error.h"
#include "data/documents.h"
#include "data/numpy_rng.h"
#include "data/sft_format.h"
#include "data/tokenizer_record.h"
#include "io/file_checks.h"
#include "io/json_text.h"

namespace pl::data {

namespace {

constexpr int kSftRecordVersion = 1;

// FNV-1a 64 of bytes in memory, as fnv1a64_file_hex hashes a file.
std::string fnv1a64_hex(const unsigned char* p, size_t n) { return fmt::format("{:016x}", fnv1a64(p, n)); }

// Bins of capacity `size` with the leftmost bin whose room is at least `need` found in O(log bins): a max
// tree over the bins' free room (NeMo's first_fit scans the bins in order; this finds the same bin).
class FirstFit {
 public:
  FirstFit(size_t max_bins, int64_t size) : size_(size) {
    while (leaves_ < std::max<size_t>(max_bins, 1)) leaves_ *= 2;
    room_.assign(2 * leaves_, -1);  // -1: no bin there yet
  }
  // The bin the length goes into (a new one when none has room).
  size_t place(int64_t len) {
    size_t bin = room_[1] >= len ? leftmost(len) : bins_++;
    if (room_[leaves_ + bin] < 0) set(bin, size_);
    set(bin, room_[leaves_ + bin] - len);
    return bin;
  }
  size_t bins() const { return bins_; }

 private:
  size_t leftmost(int64_t need) const {
    size_t i = 1;
    while (i < leaves_) i = room_[2 * i] >= need ? 2 * i : 2 * i + 1;
    return i - leaves_;
  }
  void set(size_t bin, int64_t room) {
    size_t i = leaves_ + bin;
    room_[i] = room;
    for (i /= 2; i >= 1; i /= 2) room_[i] = std::max(room_[2 * i], room_[2 * i + 1]);
  }
  int64_t size_;
  size_t leaves_ = 1, bins_ = 0;
  std::vector<int64_t> room_;
};

}  // namespace

std::string sft_record_path(const std::string& prefix) { return prefix + ".sft.json"; }
std::string sft_loss_mask_path(const std::string& prefix) { return prefix + ".loss_mask"; }

bool is_sft_dataset(const std::string& prefix) {
  std::error_code ec;
  if (std::filesystem::exists(sft_record_path(prefix), ec)) return true;
  // A loss mask without its record is half a set: read as pretraining data it would put the loss on the prompts.
  PL_CHECK(!std::filesystem::exists(sft_loss_mask_path(prefix), ec),
           "{} is there but {} is missing: half an SFT set (write it again with preprocess_data --dataset-type sft, "
           "or remove the .loss_mask to train on the tokens as pretraining data)",
           sft_loss_mask_path(prefix), sft_record_path(prefix));
  return false;
}

std::string sft_record_text(const SftRecord& r) {
  nlohmann::ordered_json j;
  j["version"] = kSftRecordVersion;
  j["kind"] = "pretrain_llama sft dataset";
  j["examples"] = r.examples;
  j["chat_examples"] = r.chat_examples;
  j["tokens"] = r.tokens;
  j["answer_tokens"] = r.answer_tokens;
  j["truncated"] = r.truncated;
  j["dropped"] = r.dropped;
  j["max_seq_length"] = r.max_seq_length;
  j["overlong"] = r.overlong;
  j["chat_template"] = r.chat_template;
  j["prepend_bos"] = r.prepend_bos;
  j["loss_mask_bytes"] = r.loss_mask_bytes;
  j["loss_mask_fnv1a64"] = r.loss_mask_fnv1a64;
  return j.dump(2) + "\n";
}

SftRecord read_sft_record(const std::string& prefix) {
  const std::string path = sft_record_path(prefix);
  const nlohmann::json j = parse_json_text(read_regular_file(path), path);
  PL_CHECK(j.is_object(), "{}: expected a JSON object", path);
  const int version = json_field<int>(j, "version", path);
  PL_CHECK(version == kSftRecordVersion, "{}: version {} is not supported (expected {})", path, version,
           kSftRecordVersion);
  SftRecord r;
  r.examples = json_field<int64_t>(j, "examples", path);
  r.chat_examples = json_field<int64_t>(j, "chat_examples", path);
  r.tokens = json_field<int64_t>(j, "tokens", path);
  r.answer_tokens = json_field<int64_t>(j, "answer_tokens", path);
  r.truncated = json_field<int64_t>(j, "truncated", path);
  r.dropped = json_field<int64_t>(j, "dropped", path);
  r.max_seq_length = json_field<int64_t>(j, "max_seq_length", path);
  r.overlong = json_field<std::string>(j, "overlong", path);
  r.chat_template = json_field<std::string>(j, "chat_template", path);
  r.prepend_bos = json_field<bool>(j, "prepend_bos", path);
  r.loss_mask_bytes = json_field<int64_t>(j, "loss_mask_bytes", path);
  r.loss_mask_fnv1a64 = json_field<std::string>(j, "loss_mask_fnv1a64", path);
  PL_CHECK(r.examples >= 0 && r.tokens >= 0 && r.answer_tokens >= 0 && r.answer_tokens <= r.tokens &&
               r.loss_mask_bytes == r.tokens,
           "{}: inconsistent counts (examples {}, tokens {}, answer tokens {}, loss mask bytes {})", path, r.examples,
           r.tokens, r.answer_tokens, r.loss_mask_bytes);
  return r;
}

SftDatasetWriter::SftDatasetWriter(std::string prefix, const TokenizerRecord& tokenizer, FileSet& set)
    : prefix_(std::move(prefix)), tokenizer_(tokenizer), set_(set), ids_(prefix_, tokenizer.vocab_size, &set) {}

void SftDatasetWriter::add(const SftExample& e) {
  PL_CHECK(e.tokens.size() == e.answer.size(), "internal: an SFT example of {} tokens and {} answer flags",
           e.tokens.size(), e.answer.size());
  ids_.add_document(e.tokens);
  for (const uint8_t a : e.answer) {
    const unsigned char byte = a ? 1 : 0;
    mask_.push_back(byte);
    mask_hash_ = fnv1a_step(mask_hash_, byte);
  }
  record_.examples += 1;
  record_.chat_examples += e.chat ? 1 : 0;
  record_.tokens += static_cast<int64_t>(e.tokens.size());
  record_.answer_tokens += e.answer_tokens();
  if (mask_.size() >= (size_t{16} << 20)) flush_mask();
}

void SftDatasetWriter::flush_mask() {
  if (mask_out_ == nullptr) mask_out_ = &set_.add(sft_loss_mask_path(prefix_));
  mask_out_->write(mask_.data(), mask_.size());
  mask_.clear();
}

void SftDatasetWriter::finalize(SftRecord r) {
  flush_mask();
  ids_.finalize();
  r.examples = record_.examples;
  r.chat_examples = record_.chat_examples;
  r.tokens = record_.tokens;
  r.answer_tokens = record_.answer_tokens;
  r.loss_mask_bytes = record_.tokens;
  r.loss_mask_fnv1a64 = fmt::format("{:016x}", mask_hash_);
  record_ = r;
  TokenizerRecord t = tokenizer_;
  t.data_bin_bytes = static_cast<int64_t>(ids_.bin_bytes());
  t.data_idx_checksum64 = fmt::format("{:016x}", ids_.idx_checksum());
  set_.add(tokenizer_record_path(prefix_)).write(tokenizer_record_text(t));
  set_.add(sft_record_path(prefix_)).write(sft_record_text(record_));
}

PackingAlgorithm parse_packing_algorithm(std::string_view name) {
  if (name == "first_fit_shuffle") return PackingAlgorithm::first_fit_shuffle;
  if (name == "first_fit_decreasing") return PackingAlgorithm::first_fit_decreasing;
  fail("--packing-algorithm {}: expected first_fit_shuffle (NeMo's default) or first_fit_decreasing", name);
}

const char* packing_algorithm_name(PackingAlgorithm a) {
  return a == PackingAlgorithm::first_fit_shuffle ? "first_fit_shuffle" : "first_fit_decreasing";
}

std::vector<std::vector<int64_t>> pack_examples(std::span<const int64_t> lengths, int64_t pack_size,
                                                PackingAlgorithm algorithm, RandomStateMt& rng) {
  // create_hist / create_packing_strategy: every length once per example, ascending.
  std::vector<std::vector<int64_t>> by_length(static_cast<size_t>(pack_size) + 1);
  for (size_t i = 0; i < lengths.size(); ++i) {
    PL_CHECK(lengths[i] >= 1 && lengths[i] <= pack_size, "internal: example length {} for packs of {}", lengths[i],
             pack_size);
    by_length[static_cast<size_t>(lengths[i])].push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t> seq_lens;
  seq_lens.reserve(lengths.size());
  for (size_t len = 0; len < by_length.size(); ++len) seq_lens.insert(seq_lens.end(), by_length[len].size(), len);
  if (algorithm == PackingAlgorithm::first_fit_shuffle) rng.shuffle(seq_lens);
  else std::stable_sort(seq_lens.begin(), seq_lens.end(), std::greater<>());
  // first_fit: the lengths of each bin, in the order they went in.
  FirstFit fit(seq_lens.size(), pack_size);
  std::vector<std::vector<int64_t>> bins;
  for (const int64_t len : seq_lens) {
    const size_t b = fit.place(len);
    if (b == bins.size()) bins.emplace_back();
    bins[b].push_back(len);
  }
  // fill_packing_strategy: each length's examples permuted, then popped from the end into the bins in order.
  for (auto& examples : by_length) {
    if (examples.empty()) continue;
    std::vector<int64_t> perm(examples.size());
    for (size_t k = 0; k < perm.size(); ++k) perm[k] = static_cast<int64_t>(k);
    rng.shuffle(perm);  // RandomState.permutation(n) = shuffle(arange(n))
    std::vector<int64_t> permuted(examples.size());
    for (size_t k = 0; k < perm.size(); ++k) permuted[k] = examples[static_cast<size_t>(perm[k])];
    examples = std::move(permuted);
  }
  for (auto& bin : bins)
    for (int64_t& slot : bin) {
      std::vector<int64_t>& pool = by_length[static_cast<size_t>(slot)];
      slot = pool.back();  // the length becomes the example laid out there
      pool.pop_back();
    }
  return bins;
}

SftData::SftData(const std::string& prefix, std::string_view split, int64_t seq_length, PackingAlgorithm algorithm,
                 uint32_t seed)
    : prefix_(prefix), record_(read_sft_record(prefix)), seq_(seq_length), algorithm_(algorithm) {
  PL_CHECK(seq_length >= 2, "--seq-length {}: an SFT pack needs at least 2 positions", seq_length);
  const std::optional<TokenizerRecord> tok = read_tokenizer_record(prefix);
  PL_CHECK(tok.has_value(), "{}: an SFT dataset needs its tokenizer record {} (preprocess_data writes it)",
           sft_record_path(prefix), tokenizer_record_path(prefix));
  pad_ = tok->eod;
  ids_ = std::make_unique<IndexedDataset>(prefix);
  const std::span<const int32_t> lengths = ids_->sequence_lengths();
  PL_CHECK(ids_->num_sequences() == record_.examples, "{}: {} examples recorded but {}.idx holds {}",
           sft_record_path(prefix), record_.examples, prefix, ids_->num_sequences());
  token_offset_.resize(lengths.size() + 1, 0);
  for (size_t e = 0; e < lengths.size(); ++e) token_offset_[e + 1] = token_offset_[e] + lengths[e];
  const std::string mask_path = sft_loss_mask_path(prefix);
  const UniqueFd fd = open_regular_file(mask_path);
  const uint64_t bytes = file_size(fd);
  PL_CHECK(bytes == static_cast<uint64_t>(token_offset_.back()) && record_.tokens == token_offset_.back(),
           "{}: {} bytes, but {}.bin holds {} tokens and {} records {}: the files are not from the same run", mask_path,
           bytes, prefix, token_offset_.back(), sft_record_path(prefix), record_.tokens);
  if (bytes > 0) mask_ = MappedFile(fd, bytes);
  PL_CHECK(fnv1a64_hex(mask_.data(), mask_.size()) == record_.loss_mask_fnv1a64,
           "{}: checksum mismatch against {}: the files are not from the same run", mask_path, sft_record_path(prefix));
  RandomStateMt rng(seed);
  const auto ranges = split_ranges(split, ids_->num_sequences());
  for (size_t s = 0; s < 3; ++s) {
    if (!ranges[s] || ranges[s]->first == ranges[s]->second) continue;
    splits_[s] = pack_split(ranges[s]->first, ranges[s]->second, algorithm, rng);
    has_split_[s] = !splits_[s].begin.empty() && splits_[s].begin.size() > 1;
  }
  PL_CHECK(has_split_[0], "{}: --split {} leaves the train split no example with an answer to learn", prefix, split);
}

int64_t SftData::length_of(int64_t e) const {
  const int64_t n = token_offset_[static_cast<size_t>(e) + 1] - token_offset_[static_cast<size_t>(e)];
  return std::min(n, seq_ + 1) - 1;
}

SftData::Packed SftData::pack_split(int64_t first, int64_t last, PackingAlgorithm algorithm, RandomStateMt& rng) {
  std::vector<int64_t> lengths, examples;
  Packed p;
  for (int64_t e = first; e < last; ++e) {
    const int64_t len = length_of(e);
    const int64_t off = token_offset_[static_cast<size_t>(e)];
    if (token_offset_[static_cast<size_t>(e) + 1] - off > seq_ + 1) ++cut_at_load_;
    // The labels are tokens [1, len]: an example none of whose labels is an answer teaches nothing.
    int64_t answers = 0;
    for (int64_t t = 1; t <= len; ++t) answers += mask_.data()[off + t];
    if (answers == 0) {
      ++skipped_;
      continue;
    }
    lengths.push_back(len);
    examples.push_back(e);
    p.positions += len;
    p.answer_labels += answers;
  }
  p.examples = static_cast<int64_t>(examples.size());
  if (examples.empty()) return p;
  const std::vector<std::vector<int64_t>> bins = pack_examples(lengths, seq_, algorithm, rng);
  p.begin.push_back(0);
  for (const auto& bin : bins) {
    for (const int64_t k : bin) p.order.push_back(static_cast<int32_t>(examples[static_cast<size_t>(k)]));
    p.begin.push_back(static_cast<int64_t>(p.order.size()));
  }
  return p;
}

int64_t SftData::packs(Split s) const {
  const Packed& p = splits_[static_cast<size_t>(s)];
  return has_split_[static_cast<size_t>(s)] ? static_cast<int64_t>(p.begin.size()) - 1 : 0;
}

void SftData::sample(Split s, int64_t index, std::span<int32_t> tokens, std::span<int32_t> labels,
                     std::span<int32_t> positions) const {
  const int64_t n = packs(s);
  PL_CHECK(n > 0, "data: the {} split of {} has no example", split_name(s), prefix_);
  PL_CHECK(static_cast<int64_t>(tokens.size()) == seq_ && labels.size() == tokens.size() &&
               positions.size() == tokens.size(),
           "internal: an SFT sample of {} positions into {} / {} / {}", seq_, tokens.size(), labels.size(),
           positions.size());
  const Packed& p = splits_[static_cast<size_t>(s)];
  const int64_t pack = index % n;
  int64_t at = 0;
  for (int64_t k = p.begin[static_cast<size_t>(pack)]; k < p.begin[static_cast<size_t>(pack) + 1]; ++k) {
    const int64_t e = p.order[static_cast<size_t>(k)], len = length_of(e);
    const int64_t off = token_offset_[static_cast<size_t>(e)];
    int32_t* in = tokens.data() + at;
    ids_->get(e, 0, len, in);
    int32_t last = 0;
    ids_->get(e, len, 1, &last);
    for (int64_t t = 0; t < len; ++t) {
      const int32_t next = t + 1 < len ? in[t + 1] : last;
      labels[static_cast<size_t>(at + t)] = mask_.data()[off + t + 1] ? next : kIgnoredLabel;
      positions[static_cast<size_t>(at + t)] = static_cast<int32_t>(t);
    }
    at += len;
  }
  for (int64_t t = at; t < seq_; ++t) {  // the padding: one segment, no loss
    tokens[static_cast<size_t>(t)] = pad_;
    labels[static_cast<size_t>(t)] = kIgnoredLabel;
    positions[static_cast<size_t>(t)] = static_cast<int32_t>(t - at);
  }
}

std::vector<std::string> SftData::summary() const {
  int64_t packs_all = 0, answers = 0, examples = 0;
  for (size_t s = 0; s < 3; ++s) {
    packs_all += packs(static_cast<Split>(s));
    answers += splits_[s].answer_labels;
    examples += splits_[s].examples;
  }
  std::vector<std::string> out;
  out.push_back(fmt::format("SFT dataset: {} examples, packed into {} sequences of {} tokens, answer tokens {:.1f}%",
                            examples, packs_all, seq_,
                            100.0 * static_cast<double>(answers) / std::max<double>(1.0, double(packs_all) * double(seq_))));
  out.push_back(fmt::format(
      "sft data: {} ({} examples, {} of them chats, {} tokens, {} answer tokens; template {}; preprocess: {} truncated, "
      "{} dropped{}); packing {} (seed of --data-seed)",
      prefix_, record_.examples, record_.chat_examples, record_.tokens, record_.answer_tokens, record_.chat_template,
      record_.truncated, record_.dropped,
      record_.max_seq_length > 0 ? fmt::format(" at --max-seq-length {}", record_.max_seq_length) : std::string(),
      packing_algorithm_name(algorithm_)));
  if (cut_at_load_ > 0 || skipped_ > 0)
    out.push_back(fmt::format("sft data: {} examples longer than --seq-length + 1 = {} tokens had their end cut; {} "
                              "examples with no answer label left were skipped",
                              cut_at_load_, seq_ + 1, skipped_));
  for (size_t s = 0; s < 3; ++s) {
    const Packed& p = splits_[s];
    if (!has_split_[s]) continue;
    const double cap = static_cast<double>(packs(static_cast<Split>(s))) * static_cast<double>(seq_);
    out.push_back(fmt::format("sft {}: {} examples -> {} packs, {:.1f}% of the positions filled, {:.1f}% answer labels",
                              split_name(static_cast<Split>(s)), p.examples, packs(static_cast<Split>(s)),
                              100.0 * static_cast<double>(p.positions) / cap,
                              100.0 * static_cast<double>(p.answer_labels) / cap));
  }
  return out;
}

}  // namespace pl::data
