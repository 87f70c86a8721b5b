#include "data/indexed_dataset.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

#include "core/checksum.h"
#include "core/error.h"
#include "data/tokenizer_record.h"
#include "io/file_checks.h"
#include "io/mapped_file.h"

static_assert(std::endian::native == std::endian::little, "the .bin/.idx format is little-endian");

namespace pl::data {
namespace {

template <class T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <class T>
void store(std::vector<unsigned char>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// n tokens of type T at src, as int32 (IndexedDataset::get).
template <class T>
void convert(const unsigned char* src, int64_t n, int32_t* out, const std::string& bin, int64_t seq) {
  for (int64_t k = 0; k < n; ++k) {
    const T v = load<T>(src + k * static_cast<int64_t>(sizeof(T)));
    if constexpr (sizeof(T) >= sizeof(int32_t) && !std::is_same_v<T, int32_t>) {
      PL_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
               "{}: token {} in sequence {} does not fit int32", bin, static_cast<int64_t>(v), seq);
    }
    out[k] = static_cast<int32_t>(v);
  }
}

// Tokens are written to the .bin in pieces of this size.
constexpr size_t kBinFlushBytes = 64u << 20;

// Item bytes and name by dtype code (IndexedDType); code 0 and codes past the table are unknown.
struct DTypeInfo {
  size_t size;
  const char* name;
};
constexpr DTypeInfo kDTypes[] = {{0, "unknown"}, {1, "uint8"},   {1, "int8"},    {2, "int16"}, {4, "int32"},
                                 {8, "int64"},   {8, "float64"}, {4, "float32"}, {2, "uint16"}};
const DTypeInfo& dtype_info(uint8_t code) { return kDTypes[code < std::size(kDTypes) ? code : 0]; }

// A pair being replaced (its publish journal exists) may be half old, half new: refused.
void refuse_mid_replacement(const std::string& path_prefix) {
  const std::string journal = indexed_dataset_journal_path(path_prefix);
  const std::optional<JournalState> js = file_set_journal_state(journal);
  if (!js) return;
  if (js->alive)
    pl::fail("{}.bin/.idx: mid-replacement: process {} is publishing a new dataset here ({}); retry when it has "
             "finished",
             path_prefix, js->pid, journal);
  pl::fail("{}.bin/.idx: mid-replacement: process {} died while publishing a new dataset here ({}); run "
           "preprocess_data with this output again: it first completes or undoes that replacement",
           path_prefix, js->pid, journal);
}

// The .idx header: its dtype code and counts, the counts checked against the file's size.
struct IndexHeader {
  uint8_t code = 0;
  uint64_t sequences = 0, documents = 0;
  bool with_modes = false;  // one mode byte per sequence after the document indices
};

IndexHeader read_index_header(const std::string& ip, const std::vector<unsigned char>& idx) {
  const uint64_t fsize = idx.size();
  PL_CHECK(fsize >= kIndexedHeaderBytes, "{}: truncated: {} bytes, shorter than the {}-byte header", ip, fsize,
           kIndexedHeaderBytes);
  PL_CHECK(std::memcmp(idx.data(), kIndexedMagic, sizeof(kIndexedMagic)) == 0,
           "{}: bad magic: not a Megatron indexed dataset index (expected \"MMIDIDX\\x00\\x00\")", ip);
  const uint64_t version = load<uint64_t>(idx.data() + 9);
  PL_CHECK(version == kIndexedVersion, "{}: unsupported version {} (expected 1)", ip, version);
  IndexHeader h;
  h.code = idx[17];
  PL_CHECK(h.code != 6 && h.code != 7, "{}: dtype code {} ({}) is a float type; token ids must be integers", ip,
           static_cast<int>(h.code), indexed_dtype_name(h.code));
  PL_CHECK(indexed_dtype_size(h.code) != 0, "{}: unknown dtype code {} (expected 1-5 or 8)", ip, static_cast<int>(h.code));
  const uint64_t S = h.sequences = load<uint64_t>(idx.data() + 18);
  const uint64_t D = h.documents = load<uint64_t>(idx.data() + 26);

  // Exact size: 34 + 12*S + 8*D (+ S bytes of sequence modes). Bound S and D by the file size
  // first so nothing below can overflow.
  const uint64_t body = fsize - kIndexedHeaderBytes;
  PL_CHECK(S <= body / 12, "{}: truncated: header says {} sequences but the file has {} bytes", ip, S, fsize);
  PL_CHECK(D <= body / 8, "{}: truncated: header says {} documents but the file has {} bytes", ip, D, fsize);
  const uint64_t expected = kIndexedHeaderBytes + 12 * S + 8 * D;
  PL_CHECK(fsize >= expected,
           "{}: truncated: header says {} sequences and {} documents ({} bytes) but the file has {} bytes", ip, S, D,
           expected, fsize);
  h.with_modes = fsize == expected + S && S > 0;
  PL_CHECK(fsize == expected || h.with_modes,
           "{}: size mismatch: header says {} sequences and {} documents ({} bytes, or {} with sequence modes) "
           "but the file has {} bytes",
           ip, S, D, expected, expected + S, fsize);
  PL_CHECK(S <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max()),
           "{}: {} sequences is more than this reader supports (2^31-1)", ip, S);
  PL_CHECK(D >= 1, "{}: document count is 0 (document indices must start with 0 and end with {})", ip, S);
  return h;
}

}  // namespace

size_t indexed_dtype_size(uint8_t code) { return dtype_info(code).size; }
const char* indexed_dtype_name(uint8_t code) { return dtype_info(code).name; }

IndexedDType optimal_indexed_dtype(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::uint16 : IndexedDType::int32;
}

std::vector<unsigned char> encode_indexed_index(IndexedDType dtype, std::span<const int32_t> lengths,
                                                std::span<const int64_t> document_indices) {
  const size_t item = indexed_dtype_size(static_cast<uint8_t>(dtype));
  PL_CHECK(item != 0, "indexed dataset: unknown dtype code {}", static_cast<int>(dtype));
  std::vector<unsigned char> out;
  out.reserve(kIndexedHeaderBytes + lengths.size() * 12 + document_indices.size() * 8);
  out.resize(sizeof(kIndexedMagic));
  std::memcpy(out.data(), kIndexedMagic, sizeof(kIndexedMagic));
  store<uint64_t>(out, kIndexedVersion);
  store<uint8_t>(out, static_cast<uint8_t>(dtype));
  store<uint64_t>(out, lengths.size());
  store<uint64_t>(out, document_indices.size());
  for (int32_t n : lengths) store<int32_t>(out, n);
  int64_t pointer = 0;
  for (int32_t n : lengths) {
    store<int64_t>(out, pointer);
    pointer += static_cast<int64_t>(n) * static_cast<int64_t>(item);
  }
  for (int64_t d : document_indices) store<int64_t>(out, d);
  return out;
}

std::string indexed_dataset_journal_path(const std::string& prefix) { return prefix + ".publish-journal"; }

// ---------------------------------------------------------------------------------------------
// IndexedDataset

IndexedDataset::IndexedDataset(const std::string& path_prefix)
    : idx_path_(path_prefix + ".idx"), bin_path_(path_prefix + ".bin") {
  refuse_mid_replacement(path_prefix);
  const std::vector<unsigned char> idx = read_regular_file_bytes(idx_path_);
  const IndexHeader h = read_index_header(idx_path_, idx);
  item_size_ = indexed_dtype_size(h.code);
  dtype_ = static_cast<IndexedDType>(h.code);
  const unsigned char* p = idx.data() + kIndexedHeaderBytes;
  const int64_t data_end = read_sequences(p, h.sequences);
  p += 12 * h.sequences;
  read_document_indices(p, h.documents);
  p += 8 * h.documents;
  if (h.with_modes) modes_.assign(p, p + h.sequences);
  map_bin(path_prefix, data_end, idx);
}

int64_t IndexedDataset::read_sequences(const unsigned char* p, uint64_t count) {
  const std::string& ip = idx_path_;
  lengths_.resize(count);
  for (uint64_t i = 0; i < count; ++i, p += 4) {
    lengths_[i] = load<int32_t>(p);
    PL_CHECK(lengths_[i] >= 0, "{}: sequence {} has negative length {}", ip, i, lengths_[i]);
  }
  pointers_.resize(count);
  int64_t expect_ptr = 0;
  const auto item = static_cast<int64_t>(item_size_);
  for (uint64_t i = 0; i < count; ++i, p += 8) {
    pointers_[i] = load<int64_t>(p);
    PL_CHECK(pointers_[i] == expect_ptr,
             "{}: bad pointer: sequence {} points at byte {} but the lengths before it give {}", ip, i, pointers_[i],
             expect_ptr);
    // lengths <= 2^31-1, item <= 8, S <= 2^31-1: the sum stays below 2^65... check each step.
    const int64_t add = static_cast<int64_t>(lengths_[i]) * item;
    PL_CHECK(expect_ptr <= std::numeric_limits<int64_t>::max() - add, "{}: sequence {} ends past 2^63 bytes", ip,
             i);
    expect_ptr += add;
  }
  return expect_ptr;  // last pointer + last length * itemsize
}

void IndexedDataset::read_document_indices(const unsigned char* p, uint64_t count) {
  const std::string& ip = idx_path_;
  document_indices_.resize(count);
  for (uint64_t i = 0; i < count; ++i, p += 8) {
    document_indices_[i] = load<int64_t>(p);
    if (i == 0) {
      PL_CHECK(document_indices_[0] == 0, "{}: document indices must start at 0, found {}", ip, document_indices_[0]);
    } else {
      PL_CHECK(document_indices_[i] >= document_indices_[i - 1],
               "{}: document indices decrease at {} ({} after {})", ip, i, document_indices_[i],
               document_indices_[i - 1]);
    }
  }
  PL_CHECK(document_indices_.back() == static_cast<int64_t>(lengths_.size()),
           "{}: last document index is {} but there are {} sequences", ip, document_indices_.back(), lengths_.size());
}

void IndexedDataset::map_bin(const std::string& path_prefix, int64_t data_end, const std::vector<unsigned char>& idx) {
  const std::string &ip = idx_path_, &bp = bin_path_;
  const UniqueFd fd = open_regular_file(bp);  // (a FIFO or a directory: one line, no hang)
  const uint64_t bsize = file_size(fd);
  PL_CHECK(bsize >= static_cast<uint64_t>(data_end), "{}: too short: the index ({}) needs {} bytes but the file has {}",
           bp, ip, data_end, bsize);
  PL_CHECK(bsize <= static_cast<uint64_t>(data_end),
           "{}: size mismatch: the index ({}) needs {} bytes but the file has {}; the two are not from the same run", bp,
           ip, data_end, bsize);
  // The sidecar, when it records the published pair, catches a same-size .bin/.idx from another run.
  const std::optional<TokenizerRecord> rec = read_tokenizer_record(path_prefix);
  PL_CHECK(!rec || rec->data_bin_bytes < 0 || static_cast<uint64_t>(rec->data_bin_bytes) == bsize,
           "{}: size mismatch: {} records {} bytes but the file has {}; the two are not from the same run", bp,
           tokenizer_record_path(path_prefix), rec->data_bin_bytes, bsize);
  if (rec && !rec->data_idx_checksum64.empty()) {
    const std::string sum = fmt::format("{:016x}", checksum64(idx.data(), idx.size()));
    PL_CHECK(sum == rec->data_idx_checksum64,
             "{}: checksum {} differs from the {} that {} records; the two are not from the same run", ip, sum,
             rec->data_idx_checksum64, tokenizer_record_path(path_prefix));
  }
  bin_ = MappedFile(fd, static_cast<size_t>(bsize));
}

void IndexedDataset::get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const {
  PL_CHECK(seq >= 0 && seq < num_sequences(), "{}: sequence {} out of range [0, {})", bin_path_, seq,
           num_sequences());
  const int64_t n = lengths_[static_cast<size_t>(seq)];
  PL_CHECK(offset >= 0 && length >= 0 && offset <= n && length <= n - offset,
           "{}: tokens [{}, {}) of sequence {} out of range (length {})", bin_path_, offset, offset + length, seq, n);
  if (length == 0) return;
  const unsigned char* src = bin_.data() + pointers_[static_cast<size_t>(seq)] + offset * static_cast<int64_t>(item_size_);
  switch (dtype_) {
    case IndexedDType::uint8: convert<uint8_t>(src, length, out, bin_path_, seq); break;
    case IndexedDType::int8: convert<int8_t>(src, length, out, bin_path_, seq); break;
    case IndexedDType::int16: convert<int16_t>(src, length, out, bin_path_, seq); break;
    case IndexedDType::uint16: convert<uint16_t>(src, length, out, bin_path_, seq); break;
    case IndexedDType::int32: convert<int32_t>(src, length, out, bin_path_, seq); break;
    case IndexedDType::int64: convert<int64_t>(src, length, out, bin_path_, seq); break;
    default: pl::fail("{}: unsupported dtype {}", bin_path_, indexed_dtype_name(static_cast<uint8_t>(dtype_)));
  }
}

// ---------------------------------------------------------------------------------------------
// IndexedDatasetWriter

IndexedDatasetWriter::IndexedDatasetWriter(std::string path_prefix, int64_t vocab_size, FileSet* set)
    : prefix_(std::move(path_prefix)), vocab_size_(vocab_size), dtype_(optimal_indexed_dtype(vocab_size)), set_(set) {
  PL_CHECK(vocab_size >= 1 && vocab_size <= static_cast<int64_t>(std::numeric_limits<int32_t>::max()) + 1,
           "{}.idx: vocab size {} out of range", prefix_, vocab_size);
  if (set_ == nullptr) {
    own_set_ = std::make_unique<FileSet>(std::vector<std::string>{indexed_dataset_journal_path(prefix_)});
    set_ = own_set_.get();
  }
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> tokens) {
  PL_CHECK(!finalized_, "{}.idx: add_document after finalize", prefix_);
  PL_CHECK(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "{}.idx: document {} has {} tokens, more than 2^31-1", prefix_, lengths_.size(), tokens.size());
  PL_CHECK(lengths_.size() < static_cast<size_t>(std::numeric_limits<int32_t>::max()),
           "{}.idx: too many documents", prefix_);
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int32_t t = tokens[k];
    PL_CHECK(t >= 0 && t < vocab_size_, "{}.idx: document {} token {} is {}, outside the vocabulary [0, {})",
             prefix_, lengths_.size(), k, t, vocab_size_);
    if (dtype_ == IndexedDType::uint16)
      store<uint16_t>(bin_, static_cast<uint16_t>(t));
    else
      store<int32_t>(bin_, t);
  }
  if (bin_.size() >= kBinFlushBytes) flush_bin();
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::add_empty_document() {
  PL_CHECK(!finalized_, "{}.idx: add_empty_document after finalize", prefix_);
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

IndexedDatasetWriter::~IndexedDatasetWriter() = default;  // an unpublished set removes its temporaries

void IndexedDatasetWriter::flush_bin() {
  if (bin_out_ == nullptr) bin_out_ = &set_->add(prefix_ + ".bin");
  bin_out_->write(bin_.data(), bin_.size());
  bin_.clear();
}

void IndexedDatasetWriter::finalize() {
  PL_CHECK(!finalized_, "{}.idx: finalize called twice", prefix_);
  const auto idx = encode_indexed_index(dtype_, lengths_, document_indices_);
  flush_bin();
  set_->add(prefix_ + ".idx").write(idx.data(), idx.size());
  bin_bytes_ = bin_out_->bytes_written();
  // checksum64 of the .idx, chunk by chunk on this thread (equal by construction, core/checksum.h):
  // the .idx is small, and a writer free of OpenMP also works in a forked child.
  std::vector<uint64_t> digests;
  for (size_t off = 0; off < idx.size(); off += Checksum64::kChunkBytes)
    digests.push_back(checksum_chunk_digest(idx.data() + off, std::min(Checksum64::kChunkBytes, idx.size() - off)));
  idx_checksum_ = checksum_from_chunks(digests, idx.size());
  if (own_set_) own_set_->publish();
  finalized_ = true;
  bin_.clear();
  bin_.shrink_to_fit();
}

}  // namespace pl::data
