// The optimizer offload (--optimizer-cpu-offload) on the CPU backend: the same host path a GPU run takes
// (gradient chunks copied to a pinned host buffer as the backward announces them, the CPU op over each
// chunk writing a staging slot, the slot uploaded) with the copies between host buffers. It must change
// where the state lives, never the numbers: bit-identical to the on-device AdamW step for chunk sizes
// that cut parameters and no-decay ranges anywhere. With --overlap-cpu-optimizer-d2h-h2d the host step
// runs on the worker thread, embedding first, while the next forward waits per layer: the same numbers
// again, and the chunks in the forward's order. CudaOffload.*: the same on a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "cuda/cuda_test_util.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "train/offload_gate_probe.h"
#include "train/optimizer.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

struct Side {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<AdamW> opt;
};

struct OffloadCase {
  OpContext ctx;               // the CPU backend, or the test GPU
  int64_t chunk = 4097;        // the offload's chunk size
  DType moments = DType::F32;  // Adam m and v
  bool bf16_grads = false;     // --main-grads-dtype bf16
  bool overlap = false;        // --overlap-cpu-optimizer-d2h-h2d
};

Side make_side(const ModelConfig& m, int64_t B, int64_t S, bool offload, const OffloadCase& c) {
  RunLayout mo;
  mo.optimizer_offload = offload;
  mo.exp_avg = mo.exp_avg_sq = c.moments;
  mo.bf16_main_grads = c.bf16_grads;
  Side s;
  s.model = std::make_unique<LlamaModel>(m, B, S, c.ctx, bf16_plan(m), mo);
  s.model->init_parameters(1234);
  OptimizerConfig oc;
  oc.exp_avg_dtype = oc.exp_avg_sq_dtype = c.moments;
  oc.offload = offload;
  oc.offload_chunk_elements = c.chunk;
  oc.overlap_host_step = offload && c.overlap;
  s.opt = std::make_unique<AdamW>(*s.model, oc);
  return s;
}

std::vector<uint8_t> offload_bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  copy_to_host(out.data(), t);
  return out;
}

// Three steps of two micro-batches each; the offloaded side hears the last micro-batch's backward
// announce its final gradients (as the trainer wires it), except in step 2, where nobody listens and
// the step itself copies everything down. Losses, gradient norms, masters, weights and both moments must
// agree bit for bit. On a GPU the attention backward is made deterministic, so the two backward passes
// give the same gradients. With the overlap the next forward starts while the host step runs (its losses
// show whether it read every layer's new weights); the state is compared after finish_host_step.
void expect_offload_matches(const OffloadCase& c) {
  const test::DeterministicAttention deterministic;
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t B = 2, S = 32, T = B * S;
  Side dev = make_side(m, B, S, false, c), off = make_side(m, B, S, true, c);
  ASSERT_NE(off.opt->gradient_copy_listener(), nullptr);
  EXPECT_EQ(dev.opt->gradient_copy_listener(), nullptr);
  ASSERT_EQ(off.model->master().flat.device, Device::CPU);
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, S, 64, 7});
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(static_cast<size_t>(T));
  for (int step = 1; step <= 3; ++step) {
    for (Side* s : {&dev, &off}) s->model->zero_grads();
    for (int mb = 0; mb < 2; ++mb) {
      data.micro_batch((step - 1) * 4, mb, B, tok, lab);
      const uint64_t counter = static_cast<uint64_t>(step * 2 + mb);
      const double la = dev.model->forward_backward(tok.data(), lab.data(), 0.5f, MicroBatchOptions{counter});
      const bool listen = mb == 1 && step != 2;
      const double lb = off.model->forward_backward(
          tok.data(), lab.data(), 0.5f, MicroBatchOptions{counter, false, listen ? off.opt->gradient_copy_listener() : nullptr});
      EXPECT_EQ(la, lb) << "loss, step " << step << " micro-batch " << mb;
    }
    const AdamW::Result a = dev.opt->step(1e-3 * step), b = off.opt->step(1e-3 * step);
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    if (c.overlap && step < 3) continue;  // the next forward meets the host step in flight
    off.opt->finish_host_step();
    EXPECT_EQ(offload_bytes_of(dev.model->master().flat), offload_bytes_of(off.model->master().flat)) << "master, step " << step;
    EXPECT_EQ(offload_bytes_of(dev.model->weights().flat), offload_bytes_of(off.model->weights().flat)) << "weights, step " << step;
    EXPECT_EQ(offload_bytes_of(dev.opt->moment1_tensor()), offload_bytes_of(off.opt->moment1_tensor())) << "m, step " << step;
    EXPECT_EQ(offload_bytes_of(dev.opt->moment2_tensor()), offload_bytes_of(off.opt->moment2_tensor())) << "v, step " << step;
  }
  // The weights changed at all (the comparison above is not between two untouched models).
  const Side fresh = make_side(m, B, S, false, c);
  EXPECT_NE(offload_bytes_of(fresh.model->weights().flat), offload_bytes_of(off.model->weights().flat));
}

TEST(OptimizerOffload, ChunkedHostStepIsBitIdenticalToTheOnDeviceStep) {
  // 4097 elements: chunks cut tensors and the norm weights' no-decay ranges at odd places.
  expect_offload_matches({OpContext{}, 4097, DType::F32, false});
  expect_offload_matches({OpContext{}, 4097, DType::BF16, false});
  expect_offload_matches({OpContext{}, 4097, DType::BF16, true});  // BF16 main grads
}

TEST(OptimizerOffload, OverlappedHostStepIsBitIdenticalToo) {
  expect_offload_matches({OpContext{}, 4097, DType::BF16, false, true});
  expect_offload_matches({OpContext{}, 4097, DType::BF16, true, true});  // BF16 main grads
}

// The order of the host step's chunks (the test hook): from the LM head down without the overlap (the
// order the gradients arrive in), from the embedding up with it (the order the next forward reads).
TEST(OptimizerOffload, OverlappedHostStepUpdatesTheEmbeddingFirst) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  for (const bool overlap : {false, true}) {
    Side s = make_side(m, 1, 16, true, {OpContext{}, 50000, DType::BF16, false, overlap});
    EXPECT_EQ(s.opt->overlapped(), overlap);
    std::vector<int64_t> order;  // written by the worker, read after finish_host_step
    s.opt->set_host_chunk_listener([&](int64_t begin) { order.push_back(begin); });
    data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, 16, 8, 7});
    std::vector<int32_t> tok(16), lab(16);
    data.micro_batch(0, 0, 1, tok, lab);
    s.model->zero_grads();
    s.model->forward_backward(tok.data(), lab.data(), 0.5f);
    s.opt->step(1e-3);
    s.opt->finish_host_step();
    const int64_t chunks = (m.num_parameters() + 49999) / 50000;
    ASSERT_EQ(static_cast<int64_t>(order.size()), chunks);
    for (int64_t i = 0; i < chunks; ++i)
      EXPECT_EQ(order[static_cast<size_t>(i)], 50000 * (overlap ? i : chunks - 1 - i)) << "chunk " << i;
  }
}

// The next forward waits per layer, not for the whole model (offload_gate_probe.h): layer 0's gate opens
// while the host step still holds back the LM head's last chunk; the LM head's gate then waits for it.
TEST(OptimizerOffload, OverlappedForwardPassesLayerZeroBeforeTheLastChunkIsQueued) {
  const test::GateProbe r = test::probe_overlapped_forward(OpContext{});
  EXPECT_TRUE(r.layer0_before_last_chunk);
  EXPECT_FALSE(r.hook_timed_out);
  EXPECT_TRUE(r.last_chunk_queued);
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  // The embedding; each layer's weights, then the norm its fused output add computes (the next layer's ln1
  // or the final norm: add_rmsnorm_forward); the final norm with the LM head.
  EXPECT_EQ(r.gates, 2 * m.num_layers + 2);
  EXPECT_TRUE(std::isfinite(r.loss));
}

// In the training loop the host step runs into the next iteration: nothing between two iterations waits
// for it (in particular not the checkpoint callback, which the app passes always and which saves nothing
// here). The hook holds the worker at step 1's first chunk until the loop asks for iteration 2's first
// micro-batch: a wait for the host step in between would hold both for 10 s, and the hook would see it.
// The losses equal the run's without the overlap bit for bit.
TEST(OptimizerOffload, TrainerLetsTheHostStepRunIntoTheNextIteration) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  TrainConfig t;
  t.train_iters = 3;
  t.warmup_iters = 1;
  t.global_batch_size = t.micro_batch_size = 2;
  t.seq_length = 32;
  t.use_precision_aware_optimizer = t.optimizer_cpu_offload = true;
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length, 6, 1234});
  std::vector<double> losses[2];
  for (const bool overlap : {false, true}) {
    t.overlap_cpu_optimizer_d2h_h2d = overlap;
    RunLayout mo;
    mo.optimizer_offload = true;
    LlamaModel model(m, t.micro_batch_size, t.seq_length, OpContext{}, bf16_plan(m), mo);
    model.init_parameters(t.seed);
    std::promise<void> iteration2;
    const std::shared_future<void> asked = iteration2.get_future().share();
    std::atomic<bool> timed_out{false};
    std::atomic<int> steps{0};
    int64_t batches = 0;
    test::RunRecorder rec;  // (an observer at every iteration's end that saves nothing lets the host step run on)
    Trainer tr(
        model, t,
        Batches{[&](int64_t first, int64_t micro, std::span<int32_t> tok, std::span<int32_t> lab, std::span<int32_t>) {
          if (batches++ == 1) iteration2.set_value();
          data.micro_batch(first, micro, t.micro_batch_size, tok, lab);
        }},
        {&rec});
    tr.optimizer().set_host_chunk_listener([&, asked](int64_t begin) {
      if (begin == 0 && steps++ == 0 && overlap &&
          asked.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
        timed_out = true;
    });
    tr.run();
    losses[overlap ? 1 : 0] = rec.loss();
    EXPECT_FALSE(timed_out) << (overlap ? "overlapped" : "plain");
    EXPECT_EQ(steps, 3);
  }
  ASSERT_EQ(losses[1].size(), 3u);
  EXPECT_EQ(losses[0], losses[1]);
}

TEST(OptimizerOffload, OneChunkAndChunksOfOneNormWeightAgreeToo) {
  expect_offload_matches({OpContext{}, int64_t{1} << 30, DType::F32, false});  // one chunk: the whole model
  expect_offload_matches({OpContext{}, 256, DType::BF16, false});  // hidden 256: a norm weight is one chunk
}

// On a GPU: the gradients go down on the copy stream during the backward, AdamW runs on the host (bf16
// bits into pinned staging), the weights come back up on the copy stream and the next forward waits for
// them. With BF16 main grads the copies carry bf16 bits, which the GPU's step and the host's both read as
// bf16. 40961 elements: more chunks than staging slots. Compiled always; skipped without a device.
TEST(CudaOffload, OffloadedStepsAreBitIdenticalToOnDeviceSteps) {
  PL_REQUIRE_CUDA_DEVICE();
  expect_offload_matches({test::cuda_ctx(), 40961, DType::BF16, false});
}

TEST(CudaOffload, OffloadedStepsWithBf16MainGradsAreBitIdenticalToOnDeviceSteps) {
  PL_REQUIRE_CUDA_DEVICE();
  expect_offload_matches({test::cuda_ctx(), 40961, DType::BF16, true});
}

TEST(CudaOffload, OverlappedOffloadedStepsAreBitIdenticalToOnDeviceSteps) {
  PL_REQUIRE_CUDA_DEVICE();
  expect_offload_matches({test::cuda_ctx(), 40961, DType::BF16, false, true});
  expect_offload_matches({test::cuda_ctx(), 40961, DType::BF16, true, true});
}

// The model allocates its master weights where the optimizer will update them; on the CPU backend that
// is host memory either way, and the plan books master and moments on the host side.
TEST(OptimizerOffload, MemoryPlanMovesMasterAndMomentsToTheHost) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  RunLayout on, plain;
  on.optimizer_offload = true;
  on.exp_avg = on.exp_avg_sq = plain.exp_avg = plain.exp_avg_sq = DType::BF16;
  const PrecisionPlan p = bf16_plan(m);
  const MemoryPlan a = plan_memory(m, 1, 4096, Device::CUDA, p, plain, 90);
  const MemoryPlan b = plan_memory(m, 1, 4096, Device::CUDA, p, on, 90);
  const double n = static_cast<double>(m.num_parameters());
  EXPECT_EQ(a.host_total(), 0.0);
  EXPECT_DOUBLE_EQ(a.total() - b.total(), a.master + a.optimizer);
  EXPECT_DOUBLE_EQ(b.master, 4 * n);
  EXPECT_DOUBLE_EQ(b.optimizer, 4 * n);  // two bf16 moments
  EXPECT_DOUBLE_EQ(b.host_grads, 4 * n);
  EXPECT_DOUBLE_EQ(b.host_staging, static_cast<double>(kOffloadChunkElements * 2 * kOffloadStagingSlots));
  EXPECT_DOUBLE_EQ(b.host_total(), b.master + b.optimizer + b.host_grads + b.host_staging);
  EXPECT_DOUBLE_EQ(b.weights_and_optimizer(), a.weights_and_optimizer());  // Megatron's category: unchanged
}

}  // namespace
}  // namespace pl
