// Real-data plumbing: Megatron's blending index and blend sizes, --data-path parsing, the sample
// index of a small corpus derived by hand, the GPTDataset index cache, and TrainingData over
// indexed datasets (single and blended) and mock data.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/blended_dataset.h"
#include "data/data_pipeline.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/mock_dataset.h"

#include "test_util.h"

namespace {

using namespace pl::data;
namespace fs = std::filesystem;

// `n` documents of varying length (1..23 tokens, the last one eod) with token values that say
// which document they came from: document d holds (d * 7 + k) % (vocab - 1), then eod.
std::string data_pipeline_write_corpus(const pl::test::TempDir& dir, const std::string& name, int n, int32_t vocab = 1000) {
  const std::string prefix = (dir.path() / name).string();
  IndexedDatasetWriter w(prefix, vocab);
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc;
    const int len = 1 + (d * 13) % 23;
    for (int k = 0; k + 1 < len; ++k) doc.push_back((d * 7 + k) % (vocab - 1));
    doc.push_back(vocab - 1);
    w.add_document(doc);
  }
  w.finalize();
  return prefix;
}

TEST(DataBlend, BlendingIndexFollowsMegatronsGreedyRule) {
  // Derived by hand: at sample k pick argmax_d w_d * max(k, 1) - count_d, ties to the lowest d.
  //   k=0 (x1): .5 .3 .2 -> 0     k=1 (x1): -.5 .3 .2 -> 1    k=2: 0 -.4 .4 -> 2
  //   k=3: .5 -.1 -.4 -> 0        k=4: 0 .2 -.2 -> 1          k=5: .5 -.5 0 -> 0
  //   k=6: 0 -.2 .2 -> 2          k=7: .5 .1 -.6 -> 0         k=8: 0 .4 -.4 -> 1     k=9: .5 -.3 -.2 -> 0
  const std::vector<double> w{0.5, 0.3, 0.2};
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(w, 10, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{0, 1, 2, 0, 1, 0, 2, 0, 1, 0}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 0, 1, 1, 2, 1, 3, 2, 4}));
  // Equal weights: the tie at k=0 and k=2 goes to dataset 0.
  build_blending_indices(std::vector<double>{0.5, 0.5}, 4, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{0, 1, 0, 1}));
  EXPECT_EQ(dsi, (std::vector<int64_t>{0, 0, 1, 1}));
}

TEST(DataBlend, WeightsAndSurplusSizes) {
  EXPECT_EQ(normalize_blend_weights(std::vector<double>{1, 3}), (std::vector<double>{0.25, 0.75}));
  // ceil(ceil(1000 * 0.3) * 1.005) = ceil(301.5) = 302; ceil(ceil(10 * 0.25) * 1.005) = ceil(3.015) = 4.
  EXPECT_EQ(blended_dataset_samples(1000, 0.3), 302);
  EXPECT_EQ(blended_dataset_samples(10, 0.25), 4);
  EXPECT_EQ(blended_dataset_samples(0, 0.5), 0);
  pl::test::expect_one_line_error([] { normalize_blend_weights(std::vector<double>{1, 0}); }, {"weight 0", "dataset 2"});
}

TEST(DataBlend, ParseDataPath) {
  const DataBlend one = parse_data_path({"data/a_text_document"});
  EXPECT_EQ(one.prefixes, (std::vector<std::string>{"data/a_text_document"}));
  EXPECT_EQ(one.weights, (std::vector<double>{1.0}));
  const DataBlend two = parse_data_path({"0.3", "A", "0.7", "B"});
  EXPECT_EQ(two.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_DOUBLE_EQ(two.weights[0], 0.3);
  EXPECT_DOUBLE_EQ(two.weights[1], 0.7);
  using pl::test::expect_one_line_error;
  expect_one_line_error([] { parse_data_path({"0.5"}); }, {"--data-path", "weight without a dataset"});
  expect_one_line_error([] { parse_data_path({"A", "B"}); }, {"--data-path", "weight before each prefix"});
  expect_one_line_error([] { parse_data_path({"0.3", "A", "0.7"}); }, {"--data-path", "weight before each prefix"});
  expect_one_line_error([] { parse_data_path({"0.3", "A", "x", "B"}); }, {"'x'", "weight of 'B'"});
  expect_one_line_error([] { parse_data_path({"0.3", "0.5", "0.7", "B"}); }, {"'0.5'", "prefix"});
  expect_one_line_error([] { parse_data_path({"-1", "A", "1", "B"}); }, {"weight -1", "dataset 1"});
}

// A corpus whose sample index can be followed by hand: sequence lengths 5, 3, 7, one epoch, the
// document order fixed to [1, 0, 2], 4 tokens per sample + 1 extra.
TEST(DataSampleIndex, SmallCorpusByHand) {
  const std::vector<int32_t> sizes{5, 3, 7}, doc_index{1, 0, 2};
  // (15 - 1) / 4 = 3 samples. Sample 0: doc 1 [0,3) + doc 0 [0,2) -> ends at (1, 1). Sample 1: doc 0
  // [1,5) + doc 2 [0,1) -> (2, 0). Sample 2: doc 2 [0,5) -> (2, 4): each starts on its predecessor's
  // last token, so the label stream is continuous.
  EXPECT_EQ(build_sample_index(sizes, doc_index, 4, 1, 15, true, 1),
            (std::vector<int64_t>{0, 0, 1, 1, 2, 0, 2, 4}));
  // Keeping the last partial sample (validation): ceil(14 / 4) = 4 samples, the last one stops at the
  // end of doc 2 with offset 7 - 1 = 6 and is padded.
  EXPECT_EQ(build_sample_index(sizes, doc_index, 4, 1, 15, false, 1),
            (std::vector<int64_t>{0, 0, 1, 1, 2, 0, 2, 4, 2, 6}));
}

TEST(DataIndexCache, BuildsSavesLoadsAndRebuildsWhenTheDescriptionChanges) {
  pl::test::TempDir dir;
  const std::string prefix = data_pipeline_write_corpus(dir, "c_text_document", 60);
  auto low = std::make_shared<const IndexedDataset>(prefix);
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < 50; ++i) idx.push_back(i);
  GPTDatasetConfig gc;
  gc.sequence_length = 8;
  const std::string cache = (dir.path() / "cache").string();
  const GPTIndexCache where{cache, "corpus c"};

  const GPTDataset built(low, idx, 100, Split::train, gc, where);
  EXPECT_EQ(built.cache_status(), CacheStatus::built_and_saved);
  int files = 0;
  for (const auto& e : fs::directory_iterator(cache)) files += e.path().filename().string().find("-GPTDataset-train-") != std::string::npos;
  EXPECT_EQ(files, 4);  // document, sample, shuffle index + description

  const GPTDataset loaded(low, idx, 100, Split::train, gc, where);
  EXPECT_EQ(loaded.cache_status(), CacheStatus::loaded);
  EXPECT_EQ(loaded.document_index(), built.document_index());
  EXPECT_EQ(loaded.sample_index(), built.sample_index());
  EXPECT_EQ(loaded.shuffle_index(), built.shuffle_index());
  EXPECT_EQ(loaded.num_epochs(), built.num_epochs());
  EXPECT_EQ(loaded.tokens_per_epoch(), built.tokens_per_epoch());
  EXPECT_EQ(loaded.separate_final_epoch(), built.separate_final_epoch());
  EXPECT_EQ(built.num_epochs(), 2);  // the epoch plan is what a loaded entry must reproduce

  // Another seed is another description: a second entry, different order.
  GPTDatasetConfig other = gc;
  other.random_seed = 7;
  const GPTDataset reseeded(low, idx, 100, Split::train, other, where);
  EXPECT_EQ(reseeded.cache_status(), CacheStatus::built_and_saved);
  EXPECT_NE(reseeded.shuffle_index(), built.shuffle_index());

  // Damaged cache files (both entries' shuffle indices) are rebuilt (same result), never trusted.
  for (const auto& e : fs::directory_iterator(cache))
    if (e.path().filename().string().find("-GPTDataset-train-shuffle_index.npy") != std::string::npos)
      fs::resize_file(e.path(), 100);
  int rebuilt = 0;
  const GPTDataset again(low, idx, 100, Split::train, gc, where);
  rebuilt += again.cache_status() == CacheStatus::built_and_saved;
  const GPTDataset again2(low, idx, 100, Split::train, other, where);
  rebuilt += again2.cache_status() == CacheStatus::built_and_saved;
  EXPECT_EQ(rebuilt, 2);
  EXPECT_EQ(again.shuffle_index(), built.shuffle_index());
  EXPECT_EQ(again2.shuffle_index(), reseeded.shuffle_index());

  // An unwritable cache location: built in memory, said why.
  const std::string blocker = dir.write("not_a_dir", "x");
  const GPTDataset nowhere(low, idx, 100, Split::train, gc, GPTIndexCache{blocker + "/sub", "corpus c"});
  EXPECT_EQ(nowhere.cache_status(), CacheStatus::built_not_saved);
  EXPECT_EQ(nowhere.shuffle_index(), built.shuffle_index());
}

// One dataset split 90/8/2 into sequences of 16 tokens, 64/24/8 samples, its index cache in DIR/cache.
DataConfig split_90_8_2(const pl::test::TempDir& dir, const std::string& prefix) {
  DataConfig c;
  c.data_path = {prefix};
  c.split = "90,8,2";
  c.seq_length = 16;
  c.num_samples = {64, 24, 8};
  c.cache_path = (dir.path() / "cache").string();
  return c;
}

// The one check of the ids the model reads is where a micro-batch is built: an id outside the model's vocabulary
// (data tokenized for a larger one) is one line naming the sample and its split; within the vocabulary, or with
// no vocabulary given, nothing is refused.
TEST(DataTrainingData, AnIdOutsideTheModelsVocabularyIsRefusedNamingItsSample) {
  pl::test::TempDir dir;
  const std::string prefix = data_pipeline_write_corpus(dir, "wide_text_document", 200, 1000);  // ids up to 999
  DataConfig c = split_90_8_2(dir, prefix);
  std::vector<int32_t> tokens(2 * 16), labels(2 * 16);
  const TrainingData unchecked(c);
  EXPECT_NO_THROW(unchecked.micro_batch(Split::train, 8, 1, 2, tokens, labels));
  c.vocab_size = 1000;
  EXPECT_NO_THROW(TrainingData(c).micro_batch(Split::train, 8, 1, 2, tokens, labels));
  int32_t largest = 0;
  for (int32_t id : tokens) largest = std::max(largest, id);
  ASSERT_GT(largest, 0);
  c.vocab_size = largest;  // the largest id of samples 10 and 11 is now one past the vocabulary
  const TrainingData narrow(c);
  pl::test::expect_one_line_error([&] { narrow.micro_batch(Split::train, 8, 1, 2, tokens, labels); },
                                  {"data: sample 1", "of the train split holds token id " + std::to_string(largest),
                                   "outside the model's vocabulary [0, " + std::to_string(largest) + ")"});
}

TEST(DataTrainingData, SingleDatasetSplitsAndSamplesMatchGPTDataset) {
  pl::test::TempDir dir;
  const std::string prefix = data_pipeline_write_corpus(dir, "one_text_document", 200);
  const TrainingData data(split_90_8_2(dir, prefix));
  ASSERT_NE(data.split(Split::train), nullptr);
  ASSERT_NE(data.split(Split::valid), nullptr);
  ASSERT_NE(data.split(Split::test), nullptr);
  EXPECT_GE(data.split(Split::valid)->size(), 24);

  // The train split is GPTDataset over sequences [0, 180) (round(0.9 * 200)).
  auto low = std::make_shared<const IndexedDataset>(prefix);
  std::vector<int32_t> idx;
  for (int32_t i = 0; i < 180; ++i) idx.push_back(i);
  GPTDatasetConfig gc;
  gc.sequence_length = 16;
  const GPTDataset ref(low, idx, 64, Split::train, gc);
  EXPECT_EQ(data.split(Split::train)->size(), ref.size());
  std::vector<int32_t> a(17), b(17), tokens(2 * 16), labels(2 * 16);
  for (int64_t i = 0; i < ref.size(); ++i) {
    data.split(Split::train)->get(i, a);
    ref.get(i, b);
    ASSERT_EQ(a, b) << "sample " << i;
  }
  // Micro-batch 1 of the global batch starting at sample 8 is samples 10 and 11.
  data.micro_batch(Split::train, 8, 1, 2, tokens, labels);
  ref.get(11, b);
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(tokens[16 + t], b[t]);
    EXPECT_EQ(labels[16 + t], b[t + 1]);
  }
  // The summary names the dataset and every split.
  std::string all;
  for (const auto& l : data.summary()) all += l + "\n";
  EXPECT_NE(all.find("200 sequences"), std::string::npos) << all;
  EXPECT_NE(all.find("train: 180 sequences"), std::string::npos) << all;
  EXPECT_NE(all.find("valid: 16 sequences"), std::string::npos) << all;
  EXPECT_NE(all.find("test: 4 sequences"), std::string::npos) << all;
}

TEST(DataTrainingData, ARewrittenDatasetDoesNotReuseTheOldCache) {
  pl::test::TempDir dir;
  const std::string prefix = (dir.path() / "r_text_document").string();
  const auto write = [&](bool reversed) {  // the same documents (same count, same .bin size), two orders
    IndexedDatasetWriter w(prefix, 100);
    for (int k = 0; k < 60; ++k) {
      const int d = reversed ? 59 - k : k;
      w.add_document(std::vector<int32_t>(static_cast<size_t>(1 + d % 11), d % 99));
    }
    w.finalize();
  };
  DataConfig c;
  c.data_path = {prefix};
  c.split = "1,0,0";
  c.seq_length = 8;
  c.num_samples = {20, 0, 0};
  const auto note = [&] {
    const TrainingData d(c);
    return d.summary().at(1);
  };
  write(false);
  EXPECT_NE(note().find("indices built, cached"), std::string::npos);
  EXPECT_NE(note().find("indices loaded"), std::string::npos);
  write(true);
  EXPECT_NE(note().find("indices built, cached"), std::string::npos) << "stale cache reused after a rewrite";
}

TEST(DataTrainingData, BlendTakesSamplesByTheGreedyIndex) {
  pl::test::TempDir dir;
  const std::string a = data_pipeline_write_corpus(dir, "a_text_document", 120);
  const std::string b = data_pipeline_write_corpus(dir, "b_text_document", 80, 500);
  DataConfig c;
  c.data_path = {"1", a, "3", b};
  c.split = "1,0,0";
  c.seq_length = 8;
  c.num_samples = {100, 0, 0};
  const TrainingData data(c);
  EXPECT_EQ(data.split(Split::valid), nullptr);
  const auto* blend = dynamic_cast<const BlendedDataset*>(data.split(Split::train));
  ASSERT_NE(blend, nullptr);
  EXPECT_EQ(blend->size(), 100);
  EXPECT_EQ(blend->weights(), (std::vector<double>{0.25, 0.75}));
  // Each part was built for ceil(ceil(100 w) * 1.005) samples, and is the plain GPTDataset of its prefix.
  GPTDatasetConfig gc;
  gc.sequence_length = 8;
  std::vector<int32_t> all_a, all_b;
  for (int32_t i = 0; i < 120; ++i) all_a.push_back(i);
  for (int32_t i = 0; i < 80; ++i) all_b.push_back(i);
  const GPTDataset ga(std::make_shared<const IndexedDataset>(a), all_a, blended_dataset_samples(100, 0.25),
                      Split::train, gc);
  const GPTDataset gb(std::make_shared<const IndexedDataset>(b), all_b, blended_dataset_samples(100, 0.75),
                      Split::train, gc);
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices(std::vector<double>{0.25, 0.75}, 100, di, dsi);
  EXPECT_EQ(blend->dataset_index(), di);
  std::vector<int32_t> got(9), want(9);
  int from_b = 0;
  for (int64_t k = 0; k < 100; ++k) {
    blend->get(k, got);
    (di[k] == 0 ? ga : gb).get(dsi[k], want);
    ASSERT_EQ(got, want) << "blend sample " << k;
    from_b += di[k];
  }
  EXPECT_EQ(from_b, 75);
}

TEST(DataTrainingData, MockSplitsAreMegatronsOneOneOne) {
  DataConfig c;
  c.seq_length = 64;
  c.num_samples = {16, 8, 8};
  c.mock_vocab_size = 128;
  c.mock_eod = 127;
  const TrainingData data(c);
  const MockGPTDataset train({128, 127, 64, 16});
  const MockGPTDataset valid({128, 127, 64, 8, 1234, Split::valid});
  std::vector<int32_t> a(65), b(65);
  data.split(Split::train)->get(3, a);
  train.sample(3, b);
  EXPECT_EQ(a, b);
  data.split(Split::valid)->get(5, a);
  valid.sample(5, b);
  EXPECT_EQ(a, b);
  train.sample(5, b);
  EXPECT_NE(a, b);  // the validation documents are others
}

TEST(DataTrainingData, ErrorsNameTheProblem) {
  pl::test::TempDir dir;
  const std::string prefix = data_pipeline_write_corpus(dir, "tiny_text_document", 10);
  DataConfig c;
  c.seq_length = 8;
  c.data_path = {(dir.path() / "missing_text_document").string()};
  c.num_samples = {8, 0, 0};
  pl::test::expect_one_line_error([&] { TrainingData d(c); }, {"missing_text_document.idx"});
  // 10 documents split 969,30,1 leave the validation split none, but the run wants 8 samples from it.
  c.data_path = {prefix};
  c.num_samples = {8, 8, 0};
  pl::test::expect_one_line_error([&] { TrainingData d(c); }, {"tiny_text_document", "valid split", "--split"});
  c.num_samples = {8, 0, 0};
  c.split = "0,1,0";
  pl::test::expect_one_line_error([&] { TrainingData d(c); }, {"train split no data"});
}

}  // namespace
