// GPU conformance of data parallelism's training path over one rank (issue 13): the Trainer with the
// distributed optimizer, --overlap-grad-reduce and --overlap-param-gather through the NCCL communicator
// (reduce to owner per bucket, weight broadcasts per bucket with the forward waiting on per-collective
// events, the sharded gradient norm from sum_of_squares_chunks, the padded buffers) must train exactly as
// the plain optimizer on the same GPU: over one rank every collective is the identity, so the losses, the
// gradient norms and the master weights are the same bits. Compiled always; skips without a device or NCCL.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "cuda_test_util.h"
#include "data/mock_dataset.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

struct GpuRun {
  test::RunRecorder result;
  std::vector<float> master;  // the first num_params master weights
};

GpuRun train_on_gpu(const std::string& recipe, bool distributed, bool nccl) {
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  TrainConfig t;
  t.train_iters = 4;
  t.warmup_iters = 1;
  t.global_batch_size = 4;
  t.micro_batch_size = 2;
  t.seq_length = 64;
  t.use_distributed_optimizer = distributed;
  t.overlap_grad_reduce = distributed;
  t.overlap_param_gather = distributed;
  t.ddp_bucket_size = 1;  // a bucket per group of parameters: many collectives and marks
  const PrecisionPlan plan =
      make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length,
                                                  t.train_iters * t.global_batch_size, 1234});
  RunLayout o;
  o.distributed_optimizer = distributed;
  o.loss_micro_batches = t.num_micro_batches();
  o.deterministic_attention = true;  // (its workspace)
  const parallel::World world = parallel::World::single();
  const OpContext ctx = test::cuda_ctx();
  const test::DeterministicAttention deterministic;  // the two runs must differ only in the data-parallel path
  const std::unique_ptr<parallel::Communicator> comm = parallel::make_communicator(world, ctx, nccl);
  LlamaModel model(m, t.micro_batch_size, t.seq_length, ctx, plan, o);
  model.set_communicator(comm.get());
  model.init_parameters(7);
  GpuRun r;
  Trainer trainer(
      model, t,
      Batches{[&](int64_t first, int64_t micro, std::span<int32_t> tok, std::span<int32_t> lab, std::span<int32_t>) {
        data.micro_batch(first, micro, t.micro_batch_size, tok, lab);
      }},
      {&r.result}, DataParallelRanks{&world, comm.get()});
  trainer.run();
  r.master.resize(static_cast<size_t>(model.num_params()));
  copy_to_host(r.master.data(), model.master().flat.rows(0, model.num_params()));
  EXPECT_EQ(r.result.end->allocations_in_loop, 0u);
  return r;
}

void expect_same_training(const std::string& recipe) {
  SCOPED_TRACE(recipe);
  const GpuRun plain = train_on_gpu(recipe, false, false), sharded = train_on_gpu(recipe, true, true);
  ASSERT_EQ(plain.result.loss().size(), sharded.result.loss().size());
  for (size_t i = 0; i < plain.result.loss().size(); ++i) {
    EXPECT_EQ(plain.result.loss()[i], sharded.result.loss()[i]) << "iteration " << i + 1;
    EXPECT_EQ(plain.result.grad_norm()[i], sharded.result.grad_norm()[i]) << "iteration " << i + 1;
  }
  EXPECT_EQ(std::memcmp(plain.master.data(), sharded.master.data(), plain.master.size() * 4), 0)
      << "the master weights differ";
}

TEST(CudaDataParallel, OneRankNcclDistributedOptimizerWithOverlapsTrainsAsThePlainOptimizerBf16) {
  PL_REQUIRE_CUDA_DEVICE();
  if (parallel::nccl_version() == "not built") GTEST_SKIP() << "this build has no NCCL (see the CMake banner)";
  expect_same_training("bf16_mixed");
}

TEST(CudaDataParallel, OneRankNcclDistributedOptimizerWithOverlapsTrainsAsThePlainOptimizerNvfp4) {
  PL_REQUIRE_CUDA_DEVICE();
  if (parallel::nccl_version() == "not built") GTEST_SKIP() << "this build has no NCCL (see the CMake banner)";
  expect_same_training("bf16_with_nvfp4_mixed");
}

}  // namespace
}  // namespace pl
