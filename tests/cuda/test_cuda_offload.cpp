// The optimizer offload on a GPU: the gradients go down on the copy stream while the backward runs, AdamW
// runs on the host (the CPU backend's op, bf16 bits into pinned staging), the weights come back up on the
// copy stream, and the next forward waits for them. Three steps of llama_tiny with two micro-batches
// each, offloaded and on the device, from the same initial weights: the gradient norms, the master
// weights, the BF16 weights and both moments must agree bit for bit (the element math is the shared
// num::adamw_element_stored; the gradient norm is the same device op in both runs).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "cuda_test_util.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "train/optimizer.h"

namespace pl {
namespace {

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(t.bytes());
  copy_to_host(out.data(), t);
  return out;
}

TEST(CudaOffload, OffloadedStepsAreBitIdenticalToOnDeviceSteps) {
  PL_REQUIRE_CUDA_DEVICE();
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t B = 2, S = 64, T = B * S;
  struct Side {
    std::unique_ptr<LlamaModel> model;
    std::unique_ptr<AdamW> opt;
  };
  auto make = [&](bool offload) {
    ModelOptions mo;
    mo.optimizer_offload = offload;
    mo.exp_avg = mo.exp_avg_sq = DType::BF16;
    Side s;
    s.model = std::make_unique<LlamaModel>(m, B, S, test::cuda_ctx(), bf16_plan(m), mo);
    s.model->init_parameters(1234);
    OptimizerConfig oc;
    oc.exp_avg_dtype = oc.exp_avg_sq_dtype = DType::BF16;
    oc.offload = offload;
    oc.offload_chunk_elements = 40961;  // several chunks, cut at odd places, more chunks than staging slots
    s.opt = std::make_unique<AdamW>(*s.model, oc);
    return s;
  };
  Side dev = make(false), off = make(true);
  ASSERT_EQ(off.model->master().flat.device, Device::CPU);
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, S, 64, 7});
  std::vector<int32_t> tok(static_cast<size_t>(T)), lab(static_cast<size_t>(T));
  for (int step = 1; step <= 3; ++step) {
    for (Side* s : {&dev, &off}) s->model->zero_grads();
    for (int mb = 0; mb < 2; ++mb) {
      data.micro_batch((step - 1) * 4, mb, B, tok, lab);
      const uint64_t counter = static_cast<uint64_t>(step * 2 + mb);
      const double a = dev.model->forward_backward(tok.data(), lab.data(), 0.5f, StepOptions{counter});
      const double b = off.model->forward_backward(
          tok.data(), lab.data(), 0.5f, StepOptions{counter, false, mb == 1 ? off.opt->gradient_copy_listener() : nullptr});
      EXPECT_EQ(a, b) << "loss, step " << step << " micro-batch " << mb;
    }
    const AdamW::Result a = dev.opt->step(1e-3 * step), b = off.opt->step(1e-3 * step);
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    EXPECT_EQ(bytes_of(dev.model->master().flat), bytes_of(off.model->master().flat)) << "master, step " << step;
    EXPECT_EQ(bytes_of(dev.model->weights().flat), bytes_of(off.model->weights().flat)) << "weights, step " << step;
    EXPECT_EQ(bytes_of(dev.opt->moment1_tensor()), bytes_of(off.opt->moment1_tensor())) << "m, step " << step;
    EXPECT_EQ(bytes_of(dev.opt->moment2_tensor()), bytes_of(off.opt->moment2_tensor())) << "v, step " << step;
  }
}

}  // namespace
}  // namespace pl
