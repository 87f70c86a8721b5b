#pragma once
// Megatron's indexed dataset (SPEC-MEGATRON §5): "<prefix>.idx" (header, sequence lengths,
// byte pointers, document indices) + "<prefix>.bin" (raw token ids). Little-endian throughout.
// Followed: Megatron-LM megatron/core/datasets/indexed_dataset.py (_IndexWriter, _IndexReader,
// IndexedDataset.get, DType.optimal_dtype) as described by the spec.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/gpt_dataset.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace pl::data {

// DType codes of the .idx header.
enum class IndexedDType : uint8_t {
  uint8 = 1,
  int8 = 2,
  int16 = 3,
  int32 = 4,
  int64 = 5,
  float64 = 6,
  float32 = 7,
  uint16 = 8,
};

// Bytes per item of a dtype code; 0 for an unknown code.
size_t indexed_dtype_size(uint8_t code);
const char* indexed_dtype_name(uint8_t code);
// DType.optimal_dtype: uint16 if vocab_size < 65500, else int32.
IndexedDType optimal_indexed_dtype(int64_t vocab_size);

inline constexpr char kIndexedMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kIndexedVersion = 1;
inline constexpr size_t kIndexedHeaderBytes = 34;

// The journal a dataset's publish (FileSet, io/atomic_file.h) keeps while it replaces
// "<prefix>.bin/.idx/.tokenizer.json": "<prefix>.publish-journal".
std::string indexed_dataset_journal_path(const std::string& prefix);

// A read-only view of "<prefix>.bin/.idx". The .idx is read and fully validated in the
// constructor; the .bin is memory-mapped read-only (unmapped in the destructor). Every problem
// is a one-line pl::Error naming the file. A pair that does not belong together is refused
// naming both files: a .bin whose size is not what the .idx implies (last pointer + last length x
// item size), or — when the tokenizer sidecar records them — a .bin size or .idx checksum other
// than the sidecar's; so is a dataset with a publish journal (mid-replacement).
class IndexedDataset final : public LowLevelDataset {
 public:
  explicit IndexedDataset(const std::string& path_prefix);
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  // Tokens [offset, offset + length) of sequence `seq`, converted to int32 (bounds-checked).
  void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override;

  const std::vector<int64_t>& sequence_pointers() const { return pointers_; }
  const std::vector<int64_t>& document_indices() const { return document_indices_; }
  IndexedDType dtype() const { return dtype_; }
  size_t item_size() const { return item_size_; }
  bool has_sequence_modes() const { return !modes_.empty(); }
  const std::vector<int8_t>& sequence_modes() const { return modes_; }
  const std::string& bin_path() const { return bin_path_; }

 private:
  std::string idx_path_, bin_path_;
  IndexedDType dtype_ = IndexedDType::int32;
  size_t item_size_ = 4;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_;
  std::vector<int8_t> modes_;
  MappedFile bin_;  // the .bin (nothing mapped when it is empty)

  // The constructor's steps after the .idx header (each check a one-line pl::Error): the lengths and
  // pointers (returns the .bin size they imply), the document indices, then the .bin checked and mapped.
  int64_t read_sequences(const unsigned char* p, uint64_t count);
  void read_document_indices(const unsigned char* p, uint64_t count);
  void map_bin(const std::string& path_prefix, int64_t data_end, const std::vector<unsigned char>& idx);
};

// Writes "<prefix>.bin/.idx" as preprocess_data.py does without --split-sentences: each document
// is one sequence, document_indices = [0, 1, ..., N] (an empty document repeats the last index).
// Tokens stream into the .bin's temporary in 64 MiB pieces (a corpus need not fit in memory; only
// the per-document lengths are kept); finalize() writes the .idx's. Both are members of `set`
// (io/atomic_file.h), which the caller publishes with its other files; without one, the writer
// keeps its own set (journal indexed_dataset_journal_path) and finalize() publishes the pair. A
// writer (or set) destroyed unpublished removes its temporaries; the old pair stays.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string path_prefix, int64_t vocab_size, FileSet* set = nullptr);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(IndexedDatasetWriter&&) noexcept = default;
  IndexedDatasetWriter& operator=(IndexedDatasetWriter&&) noexcept = default;

  // Tokens must lie in [0, vocab_size). One document = one sequence (also when `tokens` is empty).
  void add_document(std::span<const int32_t> tokens);
  // A document boundary with no sequence: what preprocess_data.py records for a document that
  // tokenized to nothing (IndexedDatasetBuilder.add_document(tensor=[], lengths=[]) appends a
  // document index equal to the previous one and no sequence).
  void add_empty_document();
  void finalize();

  IndexedDType dtype() const { return dtype_; }
  // Sequences written so far (empty documents add none).
  int64_t num_documents() const { return static_cast<int64_t>(lengths_.size()); }
  // After finalize(): the .bin's size and the checksum64 of the .idx bytes (for the sidecar).
  uint64_t bin_bytes() const { return bin_bytes_; }
  uint64_t idx_checksum() const { return idx_checksum_; }

 private:
  std::string prefix_;
  int64_t vocab_size_;
  IndexedDType dtype_;
  bool finalized_ = false;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_{0};
  void flush_bin();
  std::vector<unsigned char> bin_;  // tokens not yet written to the .bin's temporary
  std::unique_ptr<FileSet> own_set_;  // when no set was given
  FileSet* set_ = nullptr;
  AtomicFile* bin_out_ = nullptr;  // "<prefix>.bin", a member of set_, added on the first flush
  uint64_t bin_bytes_ = 0, idx_checksum_ = 0;
};

// The exact .idx bytes for the given sequences (one per document) and dtype; exposed for tests.
std::vector<unsigned char> encode_indexed_index(IndexedDType dtype, std::span<const int32_t> lengths,
                                                std::span<const int64_t> document_indices);

}  // namespace pl::data
