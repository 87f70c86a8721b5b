// The optimizer offload (--optimizer-cpu-offload) on the CPU backend: the same host path a GPU run takes
// (gradient chunks copied to a pinned host buffer as the backward announces them, the CPU op over each
// chunk writing a staging slot, the slot uploaded) with the copies between host buffers. It must change
// where the state lives, never the numbers: bit-identical to the on-device AdamW step for chunk sizes
// that cut parameters and no-decay ranges anywhere.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "train/optimizer.h"

namespace pl {
namespace {

struct Side {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<AdamW> opt;
};

Side make_side(const ModelConfig& m, int64_t B, int64_t S, bool offload, int64_t chunk, DType moments) {
  ModelOptions mo;
  mo.optimizer_offload = offload;
  mo.exp_avg = mo.exp_avg_sq = moments;
  Side s;
  s.model = std::make_unique<LlamaModel>(m, B, S, OpContext{}, bf16_plan(m), mo);
  s.model->init_parameters(1234);
  OptimizerConfig oc;
  oc.exp_avg_dtype = oc.exp_avg_sq_dtype = moments;
  oc.offload = offload;
  oc.offload_chunk_elements = chunk;
  s.opt = std::make_unique<AdamW>(*s.model, oc);
  return s;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.data, b.data, a.bytes()) == 0;
}

// Three steps of two micro-batches each; the offloaded side hears the last micro-batch's backward
// announce its final gradients (as the trainer wires it), except in step 2, where nobody listens and
// the step itself copies everything down.
void expect_offload_matches(int64_t chunk, DType moments) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t B = 2, S = 32, T = B * S;
  Side dev = make_side(m, B, S, false, chunk, moments), off = make_side(m, B, S, true, chunk, moments);
  ASSERT_NE(off.opt->gradient_copy_listener(), nullptr);
  EXPECT_EQ(dev.opt->gradient_copy_listener(), nullptr);
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, S, 64, 7});
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(static_cast<size_t>(T));
  for (int step = 1; step <= 3; ++step) {
    for (Side* s : {&dev, &off}) s->model->zero_grads();
    for (int mb = 0; mb < 2; ++mb) {
      data.micro_batch((step - 1) * 4, mb, B, tok, lab);
      const uint64_t counter = static_cast<uint64_t>(step * 2 + mb);
      dev.model->forward_backward(tok.data(), lab.data(), 0.5f, StepOptions{counter});
      const bool listen = mb == 1 && step != 2;
      off.model->forward_backward(tok.data(), lab.data(), 0.5f,
                                  StepOptions{counter, false, listen ? off.opt->gradient_copy_listener() : nullptr});
    }
    const AdamW::Result a = dev.opt->step(1e-3 * step), b = off.opt->step(1e-3 * step);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
    EXPECT_TRUE(same_bytes(dev.model->master().flat, off.model->master().flat)) << "master, step " << step;
    EXPECT_TRUE(same_bytes(dev.model->weights().flat, off.model->weights().flat)) << "weights, step " << step;
    EXPECT_TRUE(same_bytes(dev.opt->moment1_tensor(), off.opt->moment1_tensor())) << "m, step " << step;
    EXPECT_TRUE(same_bytes(dev.opt->moment2_tensor(), off.opt->moment2_tensor())) << "v, step " << step;
  }
  // The weights changed at all (the comparison above is not between two untouched models).
  const Side fresh = make_side(m, B, S, false, chunk, moments);
  EXPECT_FALSE(same_bytes(fresh.model->weights().flat, off.model->weights().flat));
}

TEST(OptimizerOffload, ChunkedHostStepIsBitIdenticalToTheOnDeviceStep) {
  // 4097 elements: chunks cut tensors and the norm weights' no-decay ranges at odd places.
  expect_offload_matches(4097, DType::F32);
  expect_offload_matches(4097, DType::BF16);
}

TEST(OptimizerOffload, OneChunkAndChunksOfOneNormWeightAgreeToo) {
  expect_offload_matches(int64_t{1} << 30, DType::F32);  // one chunk: the whole model
  expect_offload_matches(256, DType::BF16);              // hidden 256: a norm weight is exactly one chunk
}

// The model allocates its master weights where the optimizer will update them; on the CPU backend that
// is host memory either way, and the plan books master and moments on the host side.
TEST(OptimizerOffload, MemoryPlanMovesMasterAndMomentsToTheHost) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  ModelOptions on, plain;
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
