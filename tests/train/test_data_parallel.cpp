// Data parallelism in one process: the shard layout, the gradient buckets, the checksum put together
// from chunk digests, and the distributed optimizer over one rank against the plain optimizer (the same
// code path as N ranks but the collectives, bit for bit). The N-rank runs are tests/cli/test_data_parallel_cli.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/checksum.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/gradient_sync.h"
#include "train/mock_runs.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

RunLayout dp_options(int64_t size, int64_t rank, bool distributed = true) {
  RunLayout o;
  o.dp_size = size;
  o.dp_rank = rank;
  o.distributed_optimizer = distributed;
  return o;
}

TEST(ShardLayout, RanksOwnContiguousAlignedShardsThatCoverTheParameters) {
  const int64_t n = 1000003;
  for (int64_t dp : {1, 2, 3, 8}) {
    int64_t covered = 0;
    for (int64_t r = 0; r < dp; ++r) {
      const ShardLayout s = shard_layout(n, dp_options(dp, r));
      EXPECT_EQ(s.padded % (dp * kShardAlignElements), 0) << dp;
      EXPECT_GE(s.padded, n);
      EXPECT_LT(s.padded - n, dp * kShardAlignElements);
      EXPECT_EQ(s.shard * dp, s.padded);
      EXPECT_EQ(s.begin, r * s.shard);
      EXPECT_EQ(s.begin % kShardAlignElements, 0);
      covered += s.real_end() - s.begin;
    }
    EXPECT_EQ(covered, n) << dp;
  }
  // Without the distributed optimizer: one shard, the whole unpadded buffer, whatever the rank.
  const ShardLayout whole = shard_layout(n, dp_options(4, 3, false));
  EXPECT_EQ(whole.padded, n);
  EXPECT_EQ(whole.shard, n);
  EXPECT_EQ(whole.begin, 0);
}

TEST(GradBuckets, WholeGroupsFromTheTopEachAtLeastTheBucketSize) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const std::vector<ParamEntry> e = param_layout(m);
  const int64_t n = m.num_parameters(), padded = n + 100;
  // No overlap: one bucket, everything.
  const auto one = grad_buckets(e, n, padded, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, 0);
  EXPECT_EQ(one[0].end, padded);
  // One element per bucket asked: one bucket per group (the LM head with the final norm, each layer, the
  // embedding), top down.
  const auto groups = grad_buckets(e, n, padded, 1);
  ASSERT_EQ(groups.size(), static_cast<size_t>(m.num_layers + 2));
  EXPECT_EQ(groups.front().end, padded);
  EXPECT_EQ(groups.front().begin, e[1 + kEntriesPerLayer * static_cast<size_t>(m.num_layers)].offset);
  EXPECT_EQ(groups.back().begin, 0);
  EXPECT_EQ(groups.back().end, e[1].offset);
  for (size_t i = 1; i < groups.size(); ++i) EXPECT_EQ(groups[i].end, groups[i - 1].begin);
  // A size of one layer and a half: every bucket but the last (the embedding's) holds at least that.
  const int64_t layer = e[1 + kEntriesPerLayer].offset - e[1].offset;
  const auto mid = grad_buckets(e, n, padded, layer + layer / 2);
  EXPECT_LT(mid.size(), groups.size());
  for (size_t i = 0; i + 1 < mid.size(); ++i) EXPECT_GE(mid[i].end - mid[i].begin, layer + layer / 2) << i;
  EXPECT_EQ(mid.back().begin, 0);
}

TEST(DdpBucketSize, MegatronsDefaults) {
  TrainConfig t;
  t.data_parallel_size = 8;
  EXPECT_EQ(ddp_bucket_elements(t), 0);  // no overlap: one bucket
  t.overlap_grad_reduce = true;
  EXPECT_EQ(ddp_bucket_elements(t), 40000000);
  t.data_parallel_size = 64;
  EXPECT_EQ(ddp_bucket_elements(t), 64000000);
  t.ddp_bucket_size = 12345;
  EXPECT_EQ(ddp_bucket_elements(t), 12345);
}

TEST(CheckpointChecksum, PutTogetherFromChunkDigestsEqualsTheWholeFile) {
  const size_t K = Checksum64::kChunkBytes;
  std::mt19937 rng(5);
  std::vector<unsigned char> bytes(3 * K + 777);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  std::vector<uint64_t> digests;
  for (size_t off = 0; off < bytes.size(); off += K)
    digests.push_back(checksum_chunk_digest(bytes.data() + off, std::min(K, bytes.size() - off)));
  EXPECT_EQ(checksum_from_chunks(digests, bytes.size()), checksum64(bytes.data(), bytes.size()));
  std::swap(digests[0], digests[1]);
  EXPECT_NE(checksum_from_chunks(digests, bytes.size()), checksum64(bytes.data(), bytes.size()));
  EXPECT_THROW(checksum_from_chunks(digests, bytes.size() + K), Error);
}

TEST(DataParallelFlags, MegatronsRulesAndWhatIsNotImplemented) {
  TrainConfig t;
  t.overlap_param_gather = true;
  test::expect_one_line_error([&] { validate_train_config(t); }, {"--overlap-param-gather", "--use-distributed-optimizer"});
  t.use_distributed_optimizer = true;
  test::expect_one_line_error([&] { validate_train_config(t); }, {"--overlap-param-gather", "--overlap-grad-reduce"});
  t.overlap_grad_reduce = true;
  EXPECT_NO_THROW(validate_train_config(t));
  TrainConfig d;
  d.data_parallel_size = 2;
  d.global_batch_size = 6;
  d.micro_batch_size = 2;
  test::expect_one_line_error([&] { validate_train_config(d); }, {"--global-batch-size 6", "data-parallel size 2", "= 4"});
  d.global_batch_size = 8;
  d.use_precision_aware_optimizer = true;
  test::expect_one_line_error([&] { validate_train_config(d); }, {"--use-precision-aware-optimizer", "--use-distributed-optimizer"});
}

// A tiny run whose optimizer may be the distributed one over one rank (padded buffers, a shard of the
// whole, the sharded checkpoint path).
struct TinyDpRun {
  TrainConfig t;
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  PrecisionPlan plan;
  std::unique_ptr<data::MockGPTDataset> data;
  std::unique_ptr<LlamaModel> model;
  TinyDpRun(const std::string& recipe, bool distributed, bool overlap) {
    m.hidden_size = 208;  // 16-divisible for NVFP4 blocks, and a parameter count the shard padding must round up
    t.train_iters = 4;
    t.warmup_iters = 1;
    t.global_batch_size = 4;
    t.micro_batch_size = 2;
    t.seq_length = 32;
    t.use_distributed_optimizer = distributed;
    t.overlap_grad_reduce = overlap;
    t.overlap_param_gather = overlap && distributed;
    t.ddp_bucket_size = 1;  // one bucket per group
    plan = make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
    data = std::make_unique<data::MockGPTDataset>(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length,
                                                                       t.train_iters * t.global_batch_size, 1234});
    RunLayout o;
    o.distributed_optimizer = distributed;
    model = std::make_unique<LlamaModel>(m, t.micro_batch_size, t.seq_length, OpContext{}, plan, o);
  }
  Trainer trainer() {
    return Trainer(*model, t, Batches{test::mock_batches(*data, t)}, {&recorded});
  }
  test::RunRecorder recorded;
};

void expect_one_rank_distributed_optimizer_is_bit_identical(const std::string& recipe) {
  SCOPED_TRACE(recipe);
  TinyDpRun plain(recipe, false, false), sharded(recipe, true, true);
  Trainer tp = plain.trainer(), ts = sharded.trainer();  // (the trainer gives the model its communicator)
  plain.model->init_parameters(7);
  sharded.model->init_parameters(7);
  EXPECT_GT(sharded.model->shard().padded, sharded.model->num_params());  // the padding is exercised
  tp.run();
  const log::RunEnd b = ts.run();
  const std::vector<double> a_loss = plain.recorded.loss(), b_loss = sharded.recorded.loss();
  const std::vector<double> a_norm = plain.recorded.grad_norm(), b_norm = sharded.recorded.grad_norm();
  ASSERT_EQ(a_loss.size(), b_loss.size());
  for (size_t i = 0; i < a_loss.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a_loss[i], &b_loss[i], sizeof(double)), 0) << i << ": " << a_loss[i] << " vs " << b_loss[i];
    EXPECT_EQ(std::memcmp(&a_norm[i], &b_norm[i], sizeof(double)), 0) << i;
  }
  EXPECT_EQ(b.allocations_in_loop, 0u);
  const size_t bytes = static_cast<size_t>(plain.model->num_params()) * 4;
  EXPECT_EQ(std::memcmp(plain.model->master().flat.data, sharded.model->master().flat.data, bytes), 0);
  // The padding's gradients, master weights and moments stayed zero.
  const int64_t n = sharded.model->num_params(), pad = sharded.model->shard().padded - n;
  const float* master = sharded.model->master().flat.f32() + n;
  const float* m1 = static_cast<const float*>(ts.optimizer().moment1().data()) + n;
  for (int64_t i = 0; i < pad; ++i) ASSERT_TRUE(master[i] == 0.0f && m1[i] == 0.0f) << i;

  // The sharded checkpoint path (one rank) writes the same files as the plain one.
  test::TempDir dir;
  const RunDescription d = test::mock_run_description(plain.m, recipe, plain.t);
  const parallel::World one = parallel::World::single();
  save_checkpoint((dir.path() / "plain").string(), 0, *plain.model, tp.optimizer(), ts.state(), d);
  save_checkpoint((dir.path() / "sharded").string(), 0, *sharded.model, ts.optimizer(), ts.state(), d, {}, &one);
  const VerifiedCheckpoint cp = verify_checkpoint((dir.path() / "plain").string());
  const VerifiedCheckpoint cs = verify_checkpoint((dir.path() / "sharded").string());
  ASSERT_EQ(cp.files.size(), cs.files.size());
  for (size_t i = 0; i < cp.files.size(); ++i)
    if (cp.files[i].dtype != "json") {
      EXPECT_EQ(cp.files[i].name, cs.files[i].name);
      EXPECT_EQ(cp.files[i].checksum, cs.files[i].checksum) << cp.files[i].name;
    }
  // And the sharded restore reads it back into a fresh sharded model.
  TinyDpRun again(recipe, true, true);
  Trainer tr = again.trainer();
  restore_checkpoint(cs, *again.model, tr.optimizer());
  EXPECT_EQ(std::memcmp(again.model->master().flat.data, sharded.model->master().flat.data, bytes), 0);
}

TEST(DistributedOptimizerOneRank, Bf16IsBitIdenticalToThePlainOptimizer) {
  expect_one_rank_distributed_optimizer_is_bit_identical("bf16_mixed");
}
TEST(DistributedOptimizerOneRank, Nvfp4IsBitIdenticalToThePlainOptimizer) {
  expect_one_rank_distributed_optimizer_is_bit_identical("bf16_with_nvfp4_mixed");
}

}  // namespace
}  // namespace pl
