// The optimizer offload (--optimizer-cpu-offload) on the CPU backend: the same host path a GPU run takes
// (gradient chunks copied to a pinned host buffer as the backward announces them, the CPU op over each
// chunk writing a staging slot, the slot uploaded) with the copies between host buffers. It must change
// where the state lives, never the numbers: bit-identical to the on-device AdamW step for chunk sizes
// that cut parameters and no-decay ranges anywhere. CudaOffload.*: the same on a GPU.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "cuda/cuda_test_util.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "train/optimizer.h"

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
  s.opt = std::make_unique<AdamW>(*s.model, oc);
  return s;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  copy_to_host(out.data(), t);
  return out;
}

// Three steps of two micro-batches each; the offloaded side hears the last micro-batch's backward
// announce its final gradients (as the trainer wires it), except in step 2, where nobody listens and
// the step itself copies everything down. Losses, gradient norms, masters, weights and both moments must
// agree bit for bit. On a GPU the attention backward is made deterministic, so the two backward passes
// give the same gradients.
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
      const double la = dev.model->forward_backward(tok.data(), lab.data(), 0.5f, StepOptions{counter});
      const bool listen = mb == 1 && step != 2;
      const double lb = off.model->forward_backward(
          tok.data(), lab.data(), 0.5f, StepOptions{counter, false, listen ? off.opt->gradient_copy_listener() : nullptr});
      EXPECT_EQ(la, lb) << "loss, step " << step << " micro-batch " << mb;
    }
    const AdamW::Result a = dev.opt->step(1e-3 * step), b = off.opt->step(1e-3 * step);
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    EXPECT_EQ(bytes_of(dev.model->master().flat), bytes_of(off.model->master().flat)) << "master, step " << step;
    EXPECT_EQ(bytes_of(dev.model->weights().flat), bytes_of(off.model->weights().flat)) << "weights, step " << step;
    EXPECT_EQ(bytes_of(dev.opt->moment1_tensor()), bytes_of(off.opt->moment1_tensor())) << "m, step " << step;
    EXPECT_EQ(bytes_of(dev.opt->moment2_tensor()), bytes_of(off.opt->moment2_tensor())) << "v, step " << step;
  }
  // The weights changed at all (the comparison above is not between two untouched models).
  const Side fresh = make_side(m, B, S, false, c);
  EXPECT_NE(bytes_of(fresh.model->weights().flat), bytes_of(off.model->weights().flat));
}

TEST(OptimizerOffload, ChunkedHostStepIsBitIdenticalToTheOnDeviceStep) {
  // 4097 elements: chunks cut tensors and the norm weights' no-decay ranges at odd places.
  expect_offload_matches({OpContext{}, 4097, DType::F32, false});
  expect_offload_matches({OpContext{}, 4097, DType::BF16, false});
  expect_offload_matches({OpContext{}, 4097, DType::BF16, true});  // BF16 main grads
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
