// Megatron indexed dataset (.bin/.idx, SPEC-MEGATRON §5): writer/reader round trip, the exact
// .idx bytes of a small hand-derived case, dtype choice, validation of corrupt files, and a
// GPTDataset built over an IndexedDataset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer_record.h"
#include "io/atomic_file.h"

#include "test_util.h"

namespace {

using namespace pl::data;
using Bytes = std::vector<unsigned char>;

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

void put_u64(Bytes& b, size_t at, uint64_t v) {
  for (int k = 0; k < 8; ++k) b[at + k] = static_cast<unsigned char>(v >> (8 * k));
}

std::vector<int32_t> get_all(const IndexedDataset& ds, int64_t seq) {
  std::vector<int32_t> out(static_cast<size_t>(ds.sequence_lengths()[static_cast<size_t>(seq)]));
  ds.get(seq, 0, static_cast<int64_t>(out.size()), out.data());
  return out;
}

// The two documents [1, 2, 3] and [4, 5] with vocab 100 (uint16).
std::string write_small(const pl::test::TempDir& dir, const std::string& name = "small") {
  const std::string prefix = (dir.path() / name).string();
  IndexedDatasetWriter w(prefix, 100);
  const std::vector<int32_t> a{1, 2, 3}, b{4, 5};
  w.add_document(a);
  w.add_document(b);
  w.finalize();
  return prefix;
}

TEST(DataIndexedFormat, SmallIdxBytesMatchHandDerived) {
  pl::test::TempDir dir;
  const std::string prefix = write_small(dir);
  const Bytes expected_idx = {
      // magic "MMIDIDX\0\0"
      0x4D, 0x4D, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00,
      // u64 version = 1
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // u8 dtype code = 8 (uint16, vocab 100 < 65500)
      0x08,
      // u64 sequence count S = 2
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // u64 document count D = 3
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // int32 lengths [3, 2]
      0x03, 0x00, 0x00, 0x00,
      0x02, 0x00, 0x00, 0x00,
      // int64 pointers [0, 6] (3 tokens * 2 bytes)
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      // int64 document indices [0, 1, 2]
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  EXPECT_EQ(expected_idx.size(), 34u + 2 * 4 + 2 * 8 + 3 * 8);
  EXPECT_EQ(read_bytes(prefix + ".idx"), expected_idx);
  // .bin: uint16 little-endian tokens 1 2 3 4 5, no header or padding.
  const Bytes expected_bin = {0x01, 0x00, 0x02, 0x00, 0x03, 0x00, 0x04, 0x00, 0x05, 0x00};
  EXPECT_EQ(read_bytes(prefix + ".bin"), expected_bin);
  EXPECT_FALSE(std::filesystem::exists(prefix + ".idx.tmp"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
}

TEST(DataIndexedFormat, OptimalDtype) {
  EXPECT_EQ(optimal_indexed_dtype(100), IndexedDType::uint16);
  EXPECT_EQ(optimal_indexed_dtype(32000), IndexedDType::uint16);
  EXPECT_EQ(optimal_indexed_dtype(65499), IndexedDType::uint16);
  EXPECT_EQ(optimal_indexed_dtype(65500), IndexedDType::int32);
  EXPECT_EQ(optimal_indexed_dtype(128256), IndexedDType::int32);
}

TEST(DataIndexedRoundTrip, Int32ForLlama3Vocab) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "llama").string();
  IndexedDatasetWriter w(prefix, 128256);
  EXPECT_EQ(w.dtype(), IndexedDType::int32);
  const std::vector<int32_t> a{128000, 9906, 1917, 128001}, b{0, 128255};
  w.add_document(a);
  w.add_document(b);
  w.finalize();
  const Bytes idx = read_bytes(prefix + ".idx");
  ASSERT_GE(idx.size(), 18u);
  EXPECT_EQ(idx[17], 4);  // int32
  EXPECT_EQ(read_bytes(prefix + ".bin").size(), 6u * 4);
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.dtype(), IndexedDType::int32);
  EXPECT_EQ(ds.item_size(), 4u);
  EXPECT_EQ(get_all(ds, 0), a);
  EXPECT_EQ(get_all(ds, 1), b);
  EXPECT_EQ(ds.sequence_pointers(), (std::vector<int64_t>{0, 16}));
}

TEST(DataIndexedRoundTrip, AnEmptyDocumentIsABoundaryWithoutASequence) {
  // preprocess_data.py hands IndexedDatasetBuilder.add_document an empty tensor with no lengths
  // for a document that tokenized to nothing: the document index repeats, no sequence is added.
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "e").string();
  IndexedDatasetWriter w(prefix, 258);
  const std::vector<int32_t> a{1, 2, 257}, b{3, 257};
  w.add_empty_document();
  w.add_document(a);
  w.add_empty_document();
  w.add_document(b);
  w.finalize();
  const std::vector<int32_t> lengths{3, 2};
  const std::vector<int64_t> docs{0, 0, 1, 1, 2};
  EXPECT_EQ(read_bytes(prefix + ".idx"), encode_indexed_index(IndexedDType::uint16, lengths, docs));
  IndexedDataset ds(prefix);
  EXPECT_EQ(ds.document_indices(), docs);
  EXPECT_EQ(get_all(ds, 1), b);
}

TEST(DataIndexedRoundTrip, LengthsTokensDocumentIndices) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "rt_text_document").string();
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 37; ++d) {
    std::vector<int32_t> doc;
    const int n = (d * 7919) % 53;  // includes empty documents (d = 0)
    for (int k = 0; k < n; ++k) doc.push_back((d * 131 + k * 17) % 1000);
    docs.push_back(doc);
  }
  {
    IndexedDatasetWriter w(prefix, 1000);
    for (const auto& d : docs) w.add_document(d);
    EXPECT_EQ(w.num_documents(), 37);
    w.finalize();
  }
  IndexedDataset ds(prefix);
  ASSERT_EQ(ds.num_sequences(), 37);
  EXPECT_EQ(ds.dtype(), IndexedDType::uint16);
  EXPECT_FALSE(ds.has_sequence_modes());
  std::vector<int64_t> expected_docs;
  for (int64_t i = 0; i <= 37; ++i) expected_docs.push_back(i);
  EXPECT_EQ(ds.document_indices(), expected_docs);
  int64_t ptr = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    EXPECT_EQ(ds.sequence_lengths()[i], static_cast<int32_t>(docs[i].size()));
    EXPECT_EQ(ds.sequence_pointers()[i], ptr);
    ptr += static_cast<int64_t>(docs[i].size()) * 2;
    EXPECT_EQ(get_all(ds, static_cast<int64_t>(i)), docs[i]);
  }
  // A partial read.
  std::vector<int32_t> part(3);
  ASSERT_EQ(docs[1].size(), 22u);
  ds.get(1, 2, 3, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{docs[1][2], docs[1][3], docs[1][4]}));
  // Bounds.
  pl::test::expect_one_line_error([&] { ds.get(37, 0, 0, part.data()); }, {prefix + ".bin", "out of range"});
  pl::test::expect_one_line_error([&] { ds.get(-1, 0, 0, part.data()); }, {"out of range"});
  const int64_t n5 = ds.sequence_lengths()[5];
  pl::test::expect_one_line_error([&] { ds.get(5, n5 - 1, 2, part.data()); }, {"out of range"});
  pl::test::expect_one_line_error([&] { ds.get(5, -1, 1, part.data()); }, {"out of range"});
}

TEST(DataIndexedRoundTrip, ReadsSequenceModesAndOtherDtypes) {
  pl::test::TempDir dir;
  const std::string prefix = write_small(dir);
  // Optional trailing int8[S] sequence modes are accepted.
  Bytes idx = read_bytes(prefix + ".idx");
  idx.push_back(0);
  idx.push_back(1);
  write_bytes(prefix + ".idx", idx);
  {
    IndexedDataset ds(prefix);
    EXPECT_TRUE(ds.has_sequence_modes());
    EXPECT_EQ(ds.sequence_modes(), (std::vector<int8_t>{0, 1}));
    EXPECT_EQ(get_all(ds, 0), (std::vector<int32_t>{1, 2, 3}));
  }
  // Hand-made uint8 / int8 / int16 / int64 files: [3 tokens] [2 tokens].
  const std::vector<std::pair<uint8_t, size_t>> dts = {{1, 1}, {2, 1}, {3, 2}, {5, 8}};
  for (auto [code, item] : dts) {
    SCOPED_TRACE(testing::Message() << "dtype " << int(code));
    const std::string p = (dir.path() / ("dt" + std::to_string(code))).string();
    const std::vector<int32_t> lens{3, 2};
    const std::vector<int64_t> docs{0, 1, 2};
    write_bytes(p + ".idx", encode_indexed_index(static_cast<IndexedDType>(code), lens, docs));
    const std::vector<int64_t> toks{7, 0, 100, 9, 1};
    Bytes bin;
    for (int64_t t : toks)
      for (size_t k = 0; k < item; ++k) bin.push_back(static_cast<unsigned char>(t >> (8 * k)));
    write_bytes(p + ".bin", bin);
    IndexedDataset ds(p);
    EXPECT_EQ(get_all(ds, 0), (std::vector<int32_t>{7, 0, 100}));
    EXPECT_EQ(get_all(ds, 1), (std::vector<int32_t>{9, 1}));
  }
}

// Each corrupt case: a one-line pl::Error naming the file and the problem.
class DataIndexedCorrupt : public testing::Test {
 protected:
  void SetUp() override {
    prefix_ = write_small(dir_);
    idx_ = read_bytes(prefix_ + ".idx");
    ASSERT_EQ(idx_.size(), 82u);
  }
  void expect_rejected(const Bytes& idx, const std::vector<std::string>& needles) {
    write_bytes(prefix_ + ".idx", idx);
    pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix_); }, needles);
  }
  std::string idx_path() const { return prefix_ + ".idx"; }
  std::string bin_path() const { return prefix_ + ".bin"; }

  pl::test::TempDir dir_;
  std::string prefix_;
  Bytes idx_;
};

TEST_F(DataIndexedCorrupt, ValidFileOpens) {
  IndexedDataset ds(prefix_);
  EXPECT_EQ(ds.num_sequences(), 2);
}

TEST_F(DataIndexedCorrupt, BadMagic) {
  Bytes b = idx_;
  b[0] = 'X';
  expect_rejected(b, {idx_path(), "bad magic"});
}

TEST_F(DataIndexedCorrupt, BadVersion) {
  Bytes b = idx_;
  put_u64(b, 9, 2);
  expect_rejected(b, {idx_path(), "version 2"});
}

TEST_F(DataIndexedCorrupt, FloatAndUnknownDtype) {
  Bytes b = idx_;
  b[17] = 7;
  expect_rejected(b, {idx_path(), "float32", "float"});
  b[17] = 6;
  expect_rejected(b, {idx_path(), "float64"});
  b[17] = 9;
  expect_rejected(b, {idx_path(), "unknown dtype code 9"});
  b[17] = 0;
  expect_rejected(b, {idx_path(), "unknown dtype code 0"});
}

TEST_F(DataIndexedCorrupt, TruncatedIdx) {
  Bytes b = idx_;
  b.resize(60);
  expect_rejected(b, {idx_path(), "truncated", "60 bytes"});
  b.resize(20);  // inside the header
  expect_rejected(b, {idx_path(), "truncated", "20 bytes"});
  b.clear();
  expect_rejected(b, {idx_path(), "truncated"});
  // A header claiming a huge count must not overflow or allocate.
  Bytes h = idx_;
  put_u64(h, 18, 1000);
  expect_rejected(h, {idx_path(), "truncated: header says 1000 sequences but the file has 82 bytes"});
  put_u64(h, 18, ~uint64_t{0});
  expect_rejected(h, {idx_path(), "truncated"});
  Bytes d = idx_;
  put_u64(d, 26, uint64_t{1} << 62);
  expect_rejected(d, {idx_path(), "truncated"});
}

TEST_F(DataIndexedCorrupt, ExtraBytes) {
  Bytes b = idx_;
  b.push_back(0);  // S = 2, so one byte is neither nothing nor sequence modes
  expect_rejected(b, {idx_path(), "size mismatch", "83 bytes"});
  b.push_back(0);
  b.push_back(0);
  expect_rejected(b, {idx_path(), "size mismatch"});
}

TEST_F(DataIndexedCorrupt, NegativeLength) {
  Bytes b = idx_;
  b[34] = 0xFF; b[35] = 0xFF; b[36] = 0xFF; b[37] = 0xFF;  // lengths[0] = -1
  expect_rejected(b, {idx_path(), "negative length"});
}

TEST_F(DataIndexedCorrupt, BadPointer) {
  Bytes b = idx_;
  put_u64(b, 34 + 8 + 8, 4);  // pointers[1] = 4, lengths give 6
  expect_rejected(b, {idx_path(), "bad pointer", "sequence 1"});
  Bytes c = idx_;
  put_u64(c, 34 + 8, 2);  // pointers[0] must be 0
  expect_rejected(c, {idx_path(), "bad pointer", "sequence 0"});
}

TEST_F(DataIndexedCorrupt, DocumentIndices) {
  Bytes b = idx_;
  put_u64(b, 58 + 8, 3);  // [0, 3, 2]: decreasing
  expect_rejected(b, {idx_path(), "document indices decrease"});
  Bytes c = idx_;
  put_u64(c, 58, 1);  // [1, 1, 2]: must start at 0
  expect_rejected(c, {idx_path(), "start at 0"});
  Bytes d = idx_;
  put_u64(d, 58 + 16, 1);  // [0, 1, 1]: last must be S = 2
  expect_rejected(d, {idx_path(), "last document index is 1"});
  Bytes e = idx_;
  put_u64(e, 26, 0);  // D = 0 with 24 bytes left over
  expect_rejected(e, {idx_path()});
}

TEST_F(DataIndexedCorrupt, BinTooShort) {
  Bytes bin = read_bytes(bin_path());
  bin.resize(8);
  write_bytes(bin_path(), bin);
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix_); }, {bin_path(), "too short", "10", "8"});
}

TEST_F(DataIndexedCorrupt, MissingFiles) {
  std::filesystem::remove(bin_path());
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix_); }, {bin_path(), "cannot open"});
  std::filesystem::remove(idx_path());
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix_); }, {idx_path(), "cannot open"});
}

TEST(DataIndexedWriter, RejectsOutOfVocabToken) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "w").string();
  IndexedDatasetWriter w(prefix, 100);
  const std::vector<int32_t> bad{1, 100};
  pl::test::expect_one_line_error([&] { w.add_document(bad); }, {prefix + ".idx", "outside the vocabulary"});
  const std::vector<int32_t> neg{-1};
  pl::test::expect_one_line_error([&] { w.add_document(neg); }, {"outside the vocabulary"});
}

// An in-memory LowLevelDataset over the same documents, to cross-check GPTDataset sampling.
class VectorDataset final : public LowLevelDataset {
 public:
  explicit VectorDataset(std::vector<std::vector<int32_t>> docs) : docs_(std::move(docs)) {
    for (const auto& d : docs_) lengths_.push_back(static_cast<int32_t>(d.size()));
  }
  std::span<const int32_t> sequence_lengths() const override { return lengths_; }
  void get(int64_t seq, int64_t offset, int64_t length, int32_t* out) const override {
    for (int64_t k = 0; k < length; ++k) out[k] = docs_[static_cast<size_t>(seq)][static_cast<size_t>(offset + k)];
  }

 private:
  std::vector<std::vector<int32_t>> docs_;
  std::vector<int32_t> lengths_;
};

TEST(DataIndexedGPT, GPTDatasetOverIndexedDataset) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "gpt_text_document").string();
  const int32_t vocab = 512, eod = 511;
  std::vector<std::vector<int32_t>> docs;
  for (int d = 0; d < 50; ++d) {
    std::vector<int32_t> doc;
    const int n = 1 + (d * 37) % 29;
    for (int k = 1; k < n; ++k) doc.push_back((d + k) % vocab);
    doc.push_back(eod);
    docs.push_back(doc);
  }
  {
    IndexedDatasetWriter w(prefix, vocab);
    for (const auto& d : docs) w.add_document(d);
    w.finalize();
  }
  auto low = std::make_shared<const IndexedDataset>(prefix);
  auto ref = std::make_shared<const VectorDataset>(docs);

  const int64_t seq = 16;
  GPTDatasetConfig gc;
  gc.sequence_length = seq;
  gc.random_seed = 1234;
  gc.add_extra_token_to_sequence = true;
  const auto ranges = split_ranges("1,1,1", low->num_sequences());
  const auto [begin, end] = *ranges[static_cast<int>(Split::train)];
  std::vector<int32_t> indices;
  for (int64_t i = begin; i < end; ++i) indices.push_back(static_cast<int32_t>(i));

  const int64_t num_samples = 40;  // more than one epoch of the train split
  GPTDataset gpt(low, indices, num_samples, Split::train, gc);
  GPTDataset gpt_ref(ref, indices, num_samples, Split::train, gc);
  ASSERT_GE(gpt.size(), num_samples);
  EXPECT_EQ(gpt.size(), gpt_ref.size());
  EXPECT_EQ(gpt.sample_length(), seq + 1);
  EXPECT_EQ(gpt.shuffle_index(), gpt_ref.shuffle_index());
  std::vector<int32_t> text(static_cast<size_t>(seq + 1)), want(static_cast<size_t>(seq + 1));
  for (int64_t i = 0; i < gpt.size(); ++i) {
    gpt.get(i, text);
    gpt_ref.get(i, want);
    EXPECT_EQ(text, want) << "sample " << i;
    for (int32_t t : text) EXPECT_TRUE(t >= 0 && t < vocab) << "sample " << i;
  }
}

}  // namespace

namespace {

TEST(DataIndexedWriter, AnUnfinalizedWriterLeavesNoFiles) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "gone").string();
  {
    IndexedDatasetWriter w(prefix, 100);
    const std::vector<int32_t> doc(1000, 7);
    for (int d = 0; d < 10; ++d) w.add_document(doc);
  }  // e.g. an exception while tokenizing: no .bin, .idx or .tmp remains
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  IndexedDatasetWriter w(prefix, 100);
  w.add_document(std::vector<int32_t>{1, 2, 3});
  w.finalize();
  EXPECT_EQ(std::filesystem::file_size(prefix + ".bin"), 6u);
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
}

}  // namespace

// Published as a pair (io/atomic_file.h FileSet): a reader never takes a mismatched .bin/.idx.
namespace {

std::string write_docs(const std::string& prefix, const std::vector<std::vector<int32_t>>& docs) {
  IndexedDatasetWriter w(prefix, 100);
  for (const auto& d : docs) w.add_document(d);
  w.finalize();
  return prefix;
}

TEST(DataIndexedPair, ANewBinBesideAnOldIdxIsRefusedNamingBoth) {
  pl::test::TempDir dir;
  const std::string prefix = write_docs((dir.path() / "p").string(), {{1, 2, 3}, {4, 5}});
  const Bytes old_idx = read_bytes(prefix + ".idx");
  write_docs(prefix, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}});
  write_bytes(prefix + ".idx", old_idx);  // what a crash between two plain renames could leave
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix); },
                                  {prefix + ".bin", prefix + ".idx", "needs 10 bytes", "has 18", "not from the same run"});
  // An old .bin beside a new .idx: too short, also naming both.
  write_docs(prefix, {{1}});
  const Bytes short_bin = read_bytes(prefix + ".bin");
  write_docs(prefix, {{1, 2, 3}, {4, 5}});
  write_bytes(prefix + ".bin", short_bin);
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix); }, {prefix + ".bin", prefix + ".idx", "too short"});
}

TEST(DataIndexedPair, ASidecarRecordingThePairCatchesASameSizeIdxFromAnotherRun) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "s").string();
  IndexedDatasetWriter w(prefix, 100);
  w.add_document(std::vector<int32_t>{1, 2, 3});
  w.add_document(std::vector<int32_t>{4, 5});
  w.finalize();
  TokenizerRecord rec;
  rec.type = "byte";
  rec.vocab_size = 100;
  rec.data_bin_bytes = static_cast<int64_t>(w.bin_bytes());
  rec.data_idx_checksum64 = fmt::format("{:016x}", w.idx_checksum());
  write_tokenizer_record(prefix, rec);
  EXPECT_EQ(rec.data_bin_bytes, 10);
  { IndexedDataset ok(prefix); }
  // Same token count, other document boundaries: the .idx sizes and the .bin size agree.
  const std::string other = write_docs((dir.path() / "o").string(), {{1, 2}, {3, 4, 5}});
  write_bytes(prefix + ".idx", read_bytes(other + ".idx"));
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix); },
                                  {prefix + ".idx", prefix + ".tokenizer.json", "checksum", "not from the same run"});
  // Without the sidecar's record nothing could tell (Megatron's own datasets have none).
  std::filesystem::remove(prefix + ".tokenizer.json");
  { IndexedDataset accepted(prefix); }
  // A .bin whose size differs from the sidecar's record (the .idx consistent with it) is refused too.
  write_bytes(prefix + ".idx", read_bytes(write_docs((dir.path() / "t").string(), {{1, 2, 3}, {4, 5}, {6}}) + ".idx"));
  write_bytes(prefix + ".bin", read_bytes((dir.path() / "t").string() + ".bin"));
  write_tokenizer_record(prefix, rec);
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix); },
                                  {prefix + ".bin", prefix + ".tokenizer.json", "records 10 bytes", "has 12"});
}

TEST(DataIndexedPair, AnInterruptedPublishIsRefusedUntilRecovered) {
  pl::test::TempDir dir;
  const std::string prefix = write_docs((dir.path() / "k").string(), {{1, 2, 3}, {4, 5}});
  // A writer killed after renaming its new .bin, before the .idx (kill point 1 of FileSet::publish).
  pid_t pid = 0;
  const auto write_until_killed = [&] {
    pl::set_publish_test_hook([](int point) {
      if (point == 1) ::raise(SIGKILL);
    });
    write_docs(prefix, {{9, 9, 9, 9, 9, 9, 9}});
  };
  ASSERT_EQ(pl::test::run_forked(write_until_killed, 60.0, &pid), 128 + SIGKILL);
  const std::string journal = indexed_dataset_journal_path(prefix);
  pl::test::expect_one_line_error([&] { IndexedDataset ds(prefix); },
                                  {prefix + ".bin/.idx", "mid-replacement", "process " + std::to_string(pid), "died",
                                   journal, "preprocess_data"});
  // The next writer of this dataset (here a plain recovery) completes it: the new pair.
  const std::string said = pl::recover_file_set(journal);
  EXPECT_NE(said.find("rolled forward"), std::string::npos) << said;
  IndexedDataset ds(prefix);
  ASSERT_EQ(ds.num_sequences(), 1);
  EXPECT_EQ(get_all(ds, 0), (std::vector<int32_t>{9, 9, 9, 9, 9, 9, 9}));
  EXPECT_FALSE(std::filesystem::exists(journal));
}

}  // namespace
