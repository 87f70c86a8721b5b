// plan_memory is the model's allocation: the arena and the quantized copies LlamaModel allocates
// are exactly the plan's figures, and the layout's slots tile the arena (shared only where full
// recomputation shares them).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "core/tensor.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"

namespace pl {
namespace {

TEST(ModelMemoryPlan, TheModelAllocatesExactlyThePlan) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  for (const char* recipe : {"bf16_mixed", "bf16_with_nvfp4_mixed", "bf16_with_mxfp8_mixed"})
    for (bool recompute : {false, true}) {
      SCOPED_TRACE(std::string(recipe) + (recompute ? " recompute" : ""));
      const PrecisionPlan plan =
          make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
      RunLayout o{};
      if (recompute) o.recompute = RecomputeConfig::full();
      o.loss_micro_batches = 3;
      const MemoryPlan mem = plan_memory(m, 2, 64, Device::CPU, plan, o, 0);
      const size_t before = memory_stats(Device::CPU).allocated;
      const LlamaModel model(m, 2, 64, OpContext{}, plan, o);
      const size_t allocated = memory_stats(Device::CPU).allocated - before;
      EXPECT_EQ(static_cast<double>(model.activation_bytes()), mem.activations);
      EXPECT_EQ(static_cast<double>(allocated), mem.weights + mem.grads + mem.master + mem.activations + mem.quantized);
      EXPECT_EQ(model.memory_plan().total(), mem.total());
      EXPECT_EQ(mem.quantized > 0, !plan.all_bf16());
    }
}

// Document-aware attention (issue 27) adds its THD graphs' workspace to the GPU plan: the FP32 dQ
// accumulators at the qkv row width, T·(nq + 2 nkv)·d·4 bytes, and the ragged offsets and lengths of the
// largest bucket (4 INT64 arrays of T + 1 and T INT32, each 16-byte aligned); nothing else changes.
TEST(ModelMemoryPlan, DocumentAttentionPlansItsWorkspace) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const PrecisionPlan plan =
      make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_mixed.json"));
  RunLayout docs{};
  docs.packing.reset_attention_mask = true;
  const MemoryPlan dense = plan_memory(m, 2, 64, Device::CUDA, plan, RunLayout{}, 90);
  const MemoryPlan with_docs = plan_memory(m, 2, 64, Device::CUDA, plan, docs, 90);
  const double T = 128, offsets = 4 * ((T + 1) * 8 + 8) + T * 4;  // (129·8 = 1032) rounds up to 1040
  EXPECT_EQ(with_docs.workspace - dense.workspace, T * static_cast<double>(m.qkv_dim()) * 4 + offsets);
  EXPECT_EQ(with_docs.activations, dense.activations + 768) << "the document offsets' upload [T+1] i32, 256-byte rounded";
  EXPECT_EQ(plan_memory(m, 2, 64, Device::CPU, plan, docs, 0).workspace, 0.0) << "no GPU library on the CPU";
}

// Document-aware packing (RunLayout::packing) adds its two i32 uploads to the arena, each with its own flag:
// RoPE positions [T] and document offsets [T+1], 256-byte rounded, and the model allocates that plan.
TEST(ModelMemoryPlan, PackingAddsOnlyItsUploads) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  const PrecisionPlan plan = bf16_plan(m);
  const double plain = plan_memory(m, 2, 64, Device::CPU, plan, RunLayout{}, 0).activations;
  const auto with = [&](bool mask, bool positions, bool docs) {
    RunLayout o;
    o.packing = data::DocumentPacking{127, mask, positions, docs};
    return o;
  };
  const double T = 128;
  EXPECT_EQ(plan_memory(m, 2, 64, Device::CPU, plan, with(true, false, false), 0).activations, plain);
  EXPECT_EQ(plan_memory(m, 2, 64, Device::CPU, plan, with(false, true, false), 0).activations, plain + 4 * T);
  EXPECT_EQ(plan_memory(m, 2, 64, Device::CPU, plan, with(false, false, true), 0).activations, plain + 768);
  const RunLayout all = with(true, true, true);
  const MemoryPlan mem = plan_memory(m, 2, 64, Device::CPU, plan, all, 0);
  EXPECT_EQ(mem.activations, plain + 4 * T + 768);  // (T + 1) * 4 = 516 bytes -> 768
  const size_t before = memory_stats(Device::CPU).allocated;
  const LlamaModel model(m, 2, 64, OpContext{}, plan, all);
  EXPECT_EQ(static_cast<double>(memory_stats(Device::CPU).allocated - before),
            mem.weights + mem.grads + mem.master + mem.activations + mem.quantized);
}

TEST(ModelMemoryPlan, TheSlotsTileTheArena) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_small.json");
  const PrecisionPlan plan =
      make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json"));
  using M = RecomputeConfig::Method;
  for (const RecomputeConfig rc : {RecomputeConfig{}, RecomputeConfig::full(), RecomputeConfig{M::Uniform, 3},
                                   RecomputeConfig{M::Block, 5}}) {
    SCOPED_TRACE(rc.describe());
    const bool recompute = rc.on() && rc.activation_owner(1) == 0;  // layer 1 shares layer 0's set
    RunLayout o{};
    o.recompute = rc;
    const MemoryPlan mem = plan_memory(m, 2, 128, Device::CUDA, plan, o, 90);
    const Activations<ArenaSlot>& a = mem.arena;
    std::map<size_t, const ArenaSlot*> by_offset;  // distinct slots, by where they start
    auto add = [&](const ArenaSlot* s) {
      if (!s->dims.empty()) by_offset[s->offset] = s;
    };
    for (const ArenaSlot* s : Activations<ArenaSlot>::all(a)) add(s);
    for (const auto& l : a.layers)
      for (const ArenaSlot* s : Activations<ArenaSlot>::Layer::all(l)) add(s);
    size_t end = 0;
    for (const auto& [offset, s] : by_offset) {
      EXPECT_EQ(offset, end) << "a gap or an overlap before offset " << offset;
      int64_t n = 1;
      for (int64_t d : s->dims) n *= d;
      end = offset + (static_cast<size_t>(n) * dtype_size(s->type) + 255) / 256 * 256;
    }
    EXPECT_EQ(static_cast<double>(end), mem.activations);
    // Layer 0 reads the embedding output; with recomputation the other layers keep only their input.
    EXPECT_EQ(a.layers[0].resid_in.offset, a.embed_out.offset);
    EXPECT_EQ(a.layers[1].ln1.offset == a.layers[0].ln1.offset, recompute);
    EXPECT_NE(a.layers[1].resid_in.offset, a.layers[2].resid_in.offset);
    // Uniform 3: layer 4 (second place of its chunk) takes layer 1's input slot and set; layer 3 keeps its input.
    // Block 5: layers 1-4 share layer 0's set, layers 5-7 keep their own.
    if (rc == RecomputeConfig{M::Uniform, 3}) {
      EXPECT_EQ(a.layers[4].resid_in.offset, a.layers[1].resid_in.offset);
      EXPECT_EQ(a.layers[4].qkv.offset, a.layers[1].qkv.offset);
      EXPECT_NE(a.layers[3].resid_in.offset, a.layers[0].resid_in.offset);
      EXPECT_EQ(a.layers[3].qkv.offset, a.layers[0].qkv.offset);
    }
    if (rc.method == M::Block) {
      EXPECT_EQ(a.layers[4].fc1.offset, a.layers[0].fc1.offset);
      EXPECT_NE(a.layers[5].fc1.offset, a.layers[0].fc1.offset);
      EXPECT_NE(a.layers[6].fc1.offset, a.layers[5].fc1.offset);
    }
    EXPECT_EQ(a.tokens.type, DType::I32);
    EXPECT_EQ(a.embed_out.type, DType::BF16);  // a GPU plan
    // One x/dy workspace per linear kind of the quantized layers; BF16 layers have none.
    EXPECT_EQ(mem.workspaces.size(), 4u);
    for (size_t i = 0; i < plan.linears.size(); ++i)
      EXPECT_EQ(mem.workspace_of[i] < 0, !plan.linears[i].quantized()) << "linear " << i;
  }
}

}  // namespace
}  // namespace pl
