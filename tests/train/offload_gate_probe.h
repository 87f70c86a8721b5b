#pragma once
// The per-layer wait of --overlap-cpu-optimizer-d2h-h2d, observed (tests/train/test_optimizer_offload.cpp on
// the CPU, tests/cuda/test_cuda_offload.cpp with events on a GPU): after an offloaded, overlapped step the
// host worker is held back before it queues the LM head's last chunk (the chunk hook blocks until the
// forward has passed layer 0's gate, or 10 s); the next forward runs with a probe around the model's gate.
// If the forward waited for the whole model, layer 0's gate would wait for the held-back chunk: the hook
// times out and the probe sees the last chunk queued. Deterministic: no sleeps, no timings.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "train/optimizer.h"

namespace pl::test {

struct GateProbe {
  bool layer0_before_last_chunk = false;  // layer 0's gate opened while the last chunk was not queued
  bool hook_timed_out = false;            // the worker waited 10 s for layer 0 in vain
  bool last_chunk_queued = false;         // by the end of the forward (the LM head's gate waited for it)
  int gates = 0;                          // gates the forward passed (embedding, each layer and its next norm, the head)
  double loss = 0.0;                      // the forward's loss sum after the step
};

// at_layer0: runs on the caller's thread inside layer 0's gate, after it opened (a GPU test records and
// waits for an event there: the device has reached layer 0 while the last upload is not even queued).
inline GateProbe probe_overlapped_forward(const OpContext& ctx, const std::function<void()>& at_layer0 = {}) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const int64_t S = 16, chunk = 8192;
  RunLayout mo;
  mo.optimizer_offload = true;
  mo.exp_avg = mo.exp_avg_sq = DType::BF16;
  LlamaModel model(m, 1, S, ctx, bf16_plan(m), mo);
  model.init_parameters(1234);
  OptimizerConfig oc;
  oc.exp_avg_dtype = oc.exp_avg_sq_dtype = DType::BF16;
  oc.offload = oc.overlap_host_step = true;
  oc.offload_chunk_elements = chunk;
  AdamW opt(model, oc);
  const std::vector<ParamEntry>& entries = model.param_entries();
  const int64_t last_begin = (m.num_parameters() - 1) / chunk * chunk;
  const int64_t layer0_begin = entries[1].offset, layer0_end = entries[1 + kEntriesPerLayer].offset;
  EXPECT_LE(layer0_end, last_begin - chunk) << "the chunk held back must lie after layer 0";
  std::atomic<bool> last_queued{false}, timed_out{false};
  std::promise<void> layer0_passed;
  std::shared_future<void> passed = layer0_passed.get_future().share();
  // (The hook runs on the worker after each chunk's upload is queued, before the worker publishes it.)
  opt.set_host_chunk_listener([&, passed](int64_t begin) {
    if (begin == last_begin - chunk && passed.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
      timed_out = true;
    if (begin == last_begin) last_queued = true;
  });
  data::MockGPTDataset data(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, S, 8, 7});
  std::vector<int32_t> tok(S), lab(S);
  data.micro_batch(0, 0, 1, tok, lab);
  model.zero_grads();
  model.forward_backward(tok.data(), lab.data(), 0.5f, MicroBatchOptions{0, false, opt.gradient_copy_listener()});
  opt.step(1e-3);
  GateProbe r;
  const LlamaModel::WeightGate* inner = model.weight_gate();
  EXPECT_NE(inner, nullptr) << "the overlapped step left no gate for the next forward";
  if (inner == nullptr) return r;
  bool released = false;
  const LlamaModel::WeightGate probe = [&](int64_t begin, int64_t end) {
    (*inner)(begin, end);
    ++r.gates;
    if (begin != layer0_begin) return;
    r.layer0_before_last_chunk = !last_queued;
    if (at_layer0) at_layer0();
    layer0_passed.set_value();
    released = true;
  };
  model.weights_arrive_during_forward(&probe);
  r.loss = model.forward(tok.data(), lab.data());
  if (!released) layer0_passed.set_value();
  opt.finish_host_step();
  r.last_chunk_queued = last_queued;
  r.hook_timed_out = timed_out;
  return r;
}

}  // namespace pl::test
