// The fit table's arithmetic (model/fit_plan.h): the fit rule, and the cheapest flag set walked over the
// ladder for llama3_8b at seq 4096, micro-batch 1 with the playbook's NVFP4 recipe, checked against
// plan_memory recomputed here for the same flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "config/lora_config.h"
#include "backend/quantize.h"
#include "core/tensor.h"
#include "model/fit_plan.h"
#include "model/memory_plan.h"
#include "model/precision_plan.h"
#include "log/plan_log.h"

namespace pl {
namespace {

struct Llama8b {
  explicit Llama8b(const char* recipe = "bf16_with_nvfp4_mixed")
      : plan(make_precision_plan(model, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"))) {}
  ModelConfig model = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_8b.json");
  PrecisionPlan plan;
  // pretrain_llama's defaults but micro-batch 1: global batch 64, so 64 micro-batches' losses.
  FitRequest request(int64_t micro_batch = 1) const {
    FitRequest r{&model, micro_batch, 4096, &plan, RunLayout{}, false};
    r.options.loss_micro_batches = 64 / micro_batch;
    r.options.quant_telemetry = false;
    return r;
  }
  // plan_memory for `gpu` as pretrain_llama would plan it with these flags (independent of fit_plan's
  // plan_for_gpu: the options are spelled out here).
  MemoryPlan plan_with(const GpuSpec& gpu, int64_t mbs, bool bf16, bool offload, bool recompute,
                       bool main_grads = false, bool primary = false) const {
    RunLayout o;
    o.bf16_main_grads = main_grads;
    o.fp8_primary_weights = primary;
    o.loss_micro_batches = 64 / mbs;
    o.quant_telemetry = false;
    o.gpu_sm = gpu.sm;
    o.exp_avg = o.exp_avg_sq = bf16 ? DType::BF16 : DType::F32;
    o.optimizer_offload = offload;
    o.recompute = recompute ? RecomputeConfig::full() : RecomputeConfig{};
    return plan_memory(model, mbs, 4096, Device::CUDA, plan, o, 0);
  }
};

const GpuSpec& gpu(const char* key) {
  const GpuSpec* g = find_gpu(key);
  EXPECT_NE(g, nullptr) << key;
  return *g;
}

constexpr const char* kBf16Flags = "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16";

TEST(FitPlan, TheFitRuleIsTotalLessContextSlackAndMargin) {
  const GpuSpec& h100 = gpu("h100");
  const double total = 81559.0 * 1048576.0;
  EXPECT_EQ(h100.total_bytes(), total);
  EXPECT_DOUBLE_EQ(device_fit_slack(total), kArenaSlack + device_memory_margin(total));
  EXPECT_DOUBLE_EQ(usable_device_bytes(total), total - kCudaContextReserve - kArenaSlack - device_memory_margin(total));
  // The margin is 3% on an 80 GB GPU and the 2 GiB floor on a 32 GB one.
  EXPECT_GT(device_memory_margin(total), 2.0 * 1073741824.0);
  EXPECT_DOUBLE_EQ(device_memory_margin(gpu("rtx5090").total_bytes()), 2.0 * 1073741824.0);
  MemoryPlan p;
  p.activations = usable_device_bytes(total);
  EXPECT_TRUE(plan_fits(p, total));
  p.activations += 1.0;
  EXPECT_FALSE(plan_fits(p, total));
  // Offloaded master and moments are not on the GPU.
  p.offload = true;
  p.master = p.optimizer = 1e12;
  p.activations -= 1.0;
  EXPECT_TRUE(plan_fits(p, total));
}

TEST(FitPlan, KnownGpusAndNames) {
  EXPECT_EQ(known_gpu_keys(), "h100, h200, b200, gb300, rtx5090");
  EXPECT_EQ(known_gpus().size(), 5u);
  EXPECT_EQ(gpu("h200").total_mib, 143771);
  EXPECT_EQ(gpu("b200").sm, 100);
  EXPECT_EQ(gpu("rtx5090").sm, 120);
  EXPECT_EQ(find_gpu("a100"), nullptr);
  EXPECT_EQ(find_gpu("H100"), nullptr);  // the keys are lower case, as --dry-run-gpu takes them
}

// LoRA (issue 41) plans the adapters' optimizer state and the frozen base without a BF16 copy of its NVFP4 linears,
// and the ladder never offers what LoRA refuses (the offload, BF16 main grads, FP8 primary weights): 8B on a
// 32 GB RTX 5090 fits with BF16 moments and full recomputation.
TEST(FitPlan, LoraPlansTheAdaptersAndOffersOnlyWhatLoraServes) {
  const Llama8b m;
  FitRequest r = m.request();
  r.options.lora = LoraConfig{};
  const MemoryPlan p = plan_memory(m.model, 1, 4096, Device::CUDA, m.plan, r.options, 90);
  EXPECT_DOUBLE_EQ(p.master, 4.0 * static_cast<double>(lora_parameter_count(m.model, LoraConfig{})));
  EXPECT_LT(p.weights, 2.0 * static_cast<double>(m.model.num_parameters()) / 2.0) << "no BF16 copy of the NVFP4 linears";
  const FitResult f = cheapest_fit(r, gpu("rtx5090"));
  ASSERT_TRUE(f.found);
  EXPECT_EQ(f.flags.find("--optimizer-cpu-offload"), std::string::npos) << f.flags;
  EXPECT_EQ(f.flags.find("--main-grads-dtype"), std::string::npos) << f.flags;
  EXPECT_NE(f.flags.find("--recompute-granularity full"), std::string::npos) << f.flags;
}

// The recompute rung takes the fewest recomputed layers that fit (block N; N - 1 does not fit), and under LoRA the
// last rung offers a lighter base format, the lightest only where the lighter one does not fit: Llama 3 70B LoRA
// (NeMo's benchmark shape: dim 16 on linear_qkv, seq 4096, MBS 1) over a BF16 base is told the NVFP4 recipe on an
// H100 and the FP8 one on an H200.
TEST(FitPlan, TheRecomputeRungTakesTheFewestLayersAndLoraALighterBase) {
  const ModelConfig m70 = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama3_70b.json");
  const auto recipe = [&](const char* name) {
    return make_precision_plan(m70, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + name + ".json"));
  };
  const PrecisionPlan bf16 = recipe("bf16_mixed"), fp8 = recipe("bf16_with_fp8_current_scaling_mixed"),
                      nvfp4 = recipe("bf16_with_nvfp4_mixed");
  LoraConfig c{.dim = 16, .alpha = 32.0};
  c.targets = {true, false, false, false};
  FitRequest r{&m70, 1, 4096, &bf16, RunLayout{}, false};
  r.options.lora = c;
  r.options.loss_micro_batches = 32;
  r.options.quant_telemetry = false;
  r.lighter_bases = {{"bf16_with_fp8_current_scaling_mixed", &fp8}, {"bf16_with_nvfp4_mixed", &nvfp4}};
  const FitResult h100 = cheapest_fit(r, gpu("h100")), h200 = cheapest_fit(r, gpu("h200"));
  ASSERT_TRUE(h100.found && h200.found);
  EXPECT_EQ(h100.chosen.rung, 'q');
  EXPECT_EQ(h100.flags.rfind("--recipe bf16_with_nvfp4_mixed", 0), 0u) << h100.flags;
  EXPECT_EQ(h200.flags.rfind("--recipe bf16_with_fp8_current_scaling_mixed", 0), 0u) << h200.flags;
  // Without the lighter bases the B200 needs recomputation: the fewest layers, by bisection.
  r.lighter_bases.clear();
  const FitResult b200 = cheapest_fit(r, gpu("b200"));
  ASSERT_TRUE(b200.found);
  ASSERT_EQ(b200.chosen.options.recompute.method, RecomputeConfig::Method::Block) << b200.flags;
  const int64_t n = b200.chosen.options.recompute.num_layers;
  EXPECT_NE(b200.flags.find("--recompute-method block --recompute-num-layers " + std::to_string(n)), std::string::npos);
  RunLayout fewer = b200.chosen.options;
  fewer.recompute.num_layers = n - 1;
  EXPECT_TRUE(plan_fits(plan_for_gpu(r, b200.chosen.micro_batch, b200.chosen.options, gpu("b200")), gpu("b200").total_bytes()));
  EXPECT_FALSE(plan_fits(plan_for_gpu(r, b200.chosen.micro_batch, fewer, gpu("b200")), gpu("b200").total_bytes()));
}

// The LoRA rows of the plan against hand arithmetic on llama_tiny (NVFP4 in every layer, so every linear is frozen
// as its rowwise NVFP4 copy only: codes n/2 bytes, E4M3 block scales per 16x16 block, compact and swizzled): the BF16
// part is the embedding, the norms, the LM head and the one-layer load scratch, in FP32 storage on the CPU.
TEST(FitPlan, TheLoraBaseRowsAreTheHandArithmetic) {
  const ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  PrecisionRecipe rec = load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_mixed.json");
  RunLayout o{};
  o.lora = LoraConfig{.dim = 4, .alpha = 8.0};
  const MemoryPlan bf16 = plan_memory(m, 1, 64, Device::CUDA, make_precision_plan(m, rec), o, 90);
  // BF16 base: every parameter kept, 2 bytes each, nothing quantized; the adapters' own bytes besides.
  EXPECT_DOUBLE_EQ(bf16.base_bf16, 2.0 * static_cast<double>(m.num_parameters()));
  EXPECT_EQ(bf16.base_quantized, 0.0);
  EXPECT_DOUBLE_EQ(bf16.weights - bf16.base_bf16, 2.0 * static_cast<double>(lora_parameter_count(m, *o.lora)));
  const int64_t h = m.hidden_size, f = m.ffn_hidden_size, L = m.num_layers, V = m.vocab_size;
  const int64_t linear = m.qkv_dim() * h + h * m.q_dim() + 2 * f * h + h * f;
  const int64_t kept = 2 * V * h + (2 * L + 1) * h;  // embedding, LM head, the norms
  EXPECT_EQ(static_cast<int64_t>(m.num_parameters()), kept + L * linear);
  rec = load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/bf16_with_nvfp4_mixed.json");
  rec.first_last_layers_bf16 = false;
  const MemoryPlan fp4 = plan_memory(m, 1, 64, Device::CUDA, make_precision_plan(m, rec), o, 90);
  const int64_t scratch = std::max({m.qkv_dim() * h, h * m.q_dim(), 2 * f * h, h * f});  // the one-layer load scratch
  EXPECT_DOUBLE_EQ(fp4.base_bf16, 2.0 * static_cast<double>(kept + scratch));
  // Each linear's rowwise copy only (Wᵀ is made per dgrad into a shared scratch, not counted as the base): its codes
  // and block scales as backend/quantize.h lays them out.
  double rowwise = 0;
  for (const auto& [out, in] : {std::pair{m.qkv_dim(), h}, {h, m.q_dim()}, {2 * f, h}, {h, f}})
    rowwise += static_cast<double>(quantized_tensor_bytes(QuantFormat::NVFP4, out, in, true, false));
  EXPECT_DOUBLE_EQ(fp4.base_quantized, static_cast<double>(L) * rowwise);
  EXPECT_GE(fp4.base_quantized, 0.5 * static_cast<double>(L * linear)) << "at least the 4-bit codes";
}

TEST(FitPlan, Llama8bOnH200FitsWithBf16MomentsAndRecompute) {
  const Llama8b m;
  const GpuSpec& h200 = gpu("h200");
  EXPECT_FALSE(plan_fits(m.plan_with(h200, 1, false, false, false), h200.total_bytes()));
  EXPECT_TRUE(plan_fits(m.plan_with(h200, 1, true, false, true), h200.total_bytes()));
  // The ladder's choice fits and is no further down than BF16 moments + recompute (rung e).
  const FitResult f = cheapest_fit(m.request(), h200);
  ASSERT_TRUE(f.found);
  EXPECT_FALSE(f.fits_as_given);
  EXPECT_LE(f.chosen.rung, 'e');
  EXPECT_FALSE(f.chosen.options.optimizer_offload);
  EXPECT_EQ(f.flags.rfind(kBf16Flags, 0), 0u) << f.flags;
  EXPECT_LE(f.device_total, f.usable);
}

TEST(FitPlan, Llama8bOnH100NeedsTheOffload) {
  const Llama8b m;
  const GpuSpec& h100 = gpu("h100");
  // BF16 moments alone, even with full recomputation, do not fit 80 GB.
  EXPECT_FALSE(plan_fits(m.plan_with(h100, 1, true, false, false), h100.total_bytes()));
  EXPECT_FALSE(plan_fits(m.plan_with(h100, 1, true, false, true), h100.total_bytes()));
  const MemoryPlan off = m.plan_with(h100, 1, true, true, false);
  EXPECT_TRUE(plan_fits(off, h100.total_bytes()));
  const FitResult f = cheapest_fit(m.request(), h100);
  ASSERT_TRUE(f.found);
  EXPECT_EQ(f.chosen.rung, 'd');
  EXPECT_EQ(f.flags, std::string(kBf16Flags) + " --optimizer-cpu-offload");
  EXPECT_FALSE(f.micro_batch_changed);
  // The reported totals are plan_memory's for those flags.
  EXPECT_EQ(f.device_total, off.total());
  EXPECT_EQ(f.host_total, off.host_total());
  EXPECT_GT(f.host_total, 0.0);
  EXPECT_EQ(f.as_given_total, m.plan_with(h100, 1, false, false, false).total());
  EXPECT_EQ(f.usable, usable_device_bytes(h100.total_bytes()));
}

TEST(FitPlan, Llama8bFitsGb300AsGiven) {
  const Llama8b m;
  const GpuSpec& gb300 = gpu("gb300");
  const FitResult f = cheapest_fit(m.request(), gb300);
  EXPECT_TRUE(f.fits_as_given);
  EXPECT_TRUE(f.found);
  EXPECT_EQ(f.flags, "");
  const MemoryPlan p = m.plan_with(gb300, 1, false, false, false);
  EXPECT_EQ(f.device_total, p.total());
  EXPECT_EQ(f.as_given_total, p.total());
  EXPECT_EQ(f.host_total, 0.0);
  // Planned for sm_103: NVFP4 native, so no emulation scratch; smaller than the sm_90 plan.
  EXPECT_EQ(gb300.sm, 103);
  EXPECT_LT(p.total(), m.plan_with(gpu("h100"), 1, false, false, false).total());
}

TEST(FitPlan, Llama8bDoesNotFitAnRtx5090WithAnyOfThese) {
  const Llama8b m;
  const GpuSpec& rtx = gpu("rtx5090");
  const FitResult f = cheapest_fit(m.request(), rtx);
  EXPECT_FALSE(f.found);
  EXPECT_FALSE(f.fits_as_given);
  // The ladder's last rung is the smallest plan, and it is over the 5090's usable memory.
  EXPECT_GT(m.plan_with(rtx, 1, true, true, true).total(), usable_device_bytes(rtx.total_bytes()));
}

TEST(FitPlan, TheMicroBatchIsHalvedBeforeOffloadAndRecompute) {
  // llama3_8b at micro-batch 8 on an H200: BF16 moments alone do not fit, a smaller micro-batch does
  // (rung c), which is cheaper than the offload.
  const Llama8b m;
  const GpuSpec& h200 = gpu("h200");
  const FitResult f = cheapest_fit(m.request(8), h200);
  ASSERT_TRUE(f.found);
  EXPECT_FALSE(plan_fits(m.plan_with(h200, 8, true, false, false), h200.total_bytes()));
  EXPECT_EQ(f.chosen.rung, 'c');
  EXPECT_TRUE(f.micro_batch_changed);
  EXPECT_LT(f.chosen.micro_batch, 8);
  // The largest halved micro-batch that fits: twice it does not.
  EXPECT_TRUE(plan_fits(m.plan_with(h200, f.chosen.micro_batch, true, false, false), h200.total_bytes()));
  EXPECT_FALSE(plan_fits(m.plan_with(h200, 2 * f.chosen.micro_batch, true, false, false), h200.total_bytes()));
  // At each micro-batch the BF16 main grads come only after the BF16 moments alone did not fit there.
  const bool grads = f.chosen.options.bf16_main_grads;
  if (grads) EXPECT_FALSE(plan_fits(m.plan_with(h200, f.chosen.micro_batch, true, false, false), h200.total_bytes()));
  EXPECT_EQ(f.flags, "--micro-batch-size " + std::to_string(f.chosen.micro_batch) + " " + kBf16Flags +
                         (grads ? " --main-grads-dtype bf16" : ""));
  EXPECT_EQ(f.device_total, m.plan_with(h200, f.chosen.micro_batch, true, false, false, grads).total());
}

// The FP8 recipe's 8B (FP8 primary weights on, as the recipe's fp8_param_gather says): BF16 moments make it fit
// an H200 without the offload (issue 39); with them off, --fp8-param-gather is the ladder's first rung.
TEST(FitPlan, Fp8Llama8bFitsAnH200WithBf16MomentsAndFp8PrimaryWeights) {
  const Llama8b m("bf16_with_fp8_current_scaling_mixed");
  const GpuSpec& h200 = gpu("h200");
  FitRequest r = m.request();
  r.options.fp8_primary_weights = true;
  const FitResult f = cheapest_fit(r, h200);
  ASSERT_TRUE(f.found);
  EXPECT_FALSE(f.fits_as_given);
  EXPECT_EQ(f.chosen.rung, 'b');
  EXPECT_EQ(f.flags, kBf16Flags);
  EXPECT_EQ(f.device_total, m.plan_with(h200, 1, true, false, false, false, true).total());
  // About 13 GB less than the same plan with BF16 weights of the FP8 layers, which does not fit.
  const MemoryPlan without = m.plan_with(h200, 1, true, false, false);
  EXPECT_FALSE(plan_fits(without, h200.total_bytes()));
  EXPECT_NEAR(without.total() - f.device_total, 13.0e9, 0.3e9);
  // Off (--no-fp8-param-gather): the ladder turns it on first, then the moments.
  r.options.fp8_primary_weights = false;
  const FitResult g = cheapest_fit(r, h200);
  EXPECT_EQ(g.chosen.rung, 'b');
  EXPECT_EQ(g.flags, std::string(kBf16Flags) + " --fp8-param-gather");
  EXPECT_EQ(g.device_total, f.device_total);
}

// On an H100 the FP8 8B needs the offload, which turns FP8 primary weights off (the master is on the host),
// so BF16 main grads come with it; an explicit --fp8-param-gather is never turned off: no offload rung then.
TEST(FitPlan, Fp8Llama8bOnH100OffloadsUnlessFp8PrimaryWeightsWereAskedFor) {
  const Llama8b m("bf16_with_fp8_current_scaling_mixed");
  const GpuSpec& h100 = gpu("h100");
  FitRequest r = m.request();
  r.options.fp8_primary_weights = true;
  const FitResult f = cheapest_fit(r, h100);
  ASSERT_TRUE(f.found);
  EXPECT_EQ(f.chosen.rung, 'd');
  EXPECT_EQ(f.flags, std::string(kBf16Flags) + " --main-grads-dtype bf16 --optimizer-cpu-offload");
  EXPECT_FALSE(fp8_primary_weights_in_effect(m.plan, f.chosen.options));
  EXPECT_EQ(f.device_total, m.plan_with(h100, 1, true, true, false, true).total());
  EXPECT_FALSE(plan_fits(m.plan_with(h100, 1, true, true, false), h100.total_bytes()));  // without BF16 main grads
  r.fp8_param_gather_given = true;
  const FitResult g = cheapest_fit(r, h100);
  EXPECT_TRUE(!g.found || !g.chosen.options.optimizer_offload);
  if (g.found) EXPECT_TRUE(fp8_primary_weights_in_effect(m.plan, g.chosen.options));
}

TEST(FitPlan, TheUsersFlagsAreKeptAndNotRepeated) {
  const Llama8b m;
  FitRequest r = m.request();
  r.options.recompute = RecomputeConfig::full();  // --recompute-granularity full given
  r.options.exp_avg = r.options.exp_avg_sq = DType::BF16;
  r.precision_aware_given = true;
  const FitResult f = cheapest_fit(r, gpu("h100"));
  ASSERT_TRUE(f.found);
  EXPECT_EQ(f.chosen.options.recompute, RecomputeConfig::full());  // never removed nor changed
  EXPECT_EQ(f.flags, "--optimizer-cpu-offload");
  EXPECT_EQ(f.device_total, m.plan_with(gpu("h100"), 1, true, true, true).total());
  r.options.bf16_main_grads = true;  // --main-grads-dtype bf16 given: not repeated either
  EXPECT_EQ(cheapest_fit(r, gpu("h100")).flags, "--optimizer-cpu-offload");
}

// The table's text: a row that fits, one whose flags change the micro-batch (said to replace the given
// one, host part only with offload), one that nothing fits; the footer; --dry-run-gpu's line.
TEST(FitPlan, TableLines) {
  std::vector<log::FitRow> rows(3);
  rows[0] = {"GB300 288GB", 103, 298.35e9, 172.63e9, true, true, "", 0, 172.63e9, 0};
  rows[1] = {"H200 141GB", 90, 144.62e9, 235.77e9, false, true, "--micro-batch-size 1 --recompute full", 4, 140.98e9, 0};
  rows[2] = {"H100 80GB", 90, 81.34e9, 235.77e9, false, true, "--optimizer-cpu-offload", 0, 76.74e9, 96.5e9};
  const std::vector<std::string> t = log::fit_table_lines(rows, kCudaContextReserve, kArenaSlack);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_NE(t[0].find("0.5 GiB CUDA context"), std::string::npos) << t[0];
  EXPECT_EQ(t[2], "GB300 288GB (sm_103)      298.35    172.63  yes");
  EXPECT_EQ(t[3], "H200 141GB (sm_90)        144.62    235.77  no    --micro-batch-size 1 --recompute full (GPU 140.98 GB; "
                  "--micro-batch-size replaces the given 4)");
  EXPECT_EQ(t[4], "H100 80GB (sm_90)          81.34    235.77  no    --optimizer-cpu-offload (GPU 76.74 GB, host 96.50 GB)");
  EXPECT_EQ(t[5], "one data-parallel rank; a run on N GPUs: --dry-run-world-size N (under mpirun: its world size)");
  EXPECT_EQ(log::cheapest_flags_line(rows[0]), "cheapest flags for GB300 288GB (298.35 GB usable): as given (GPU 172.63 GB)");
  log::FitRow none = rows[2];
  none.found = false;
  EXPECT_NE(log::cheapest_flags_line(none).find("does not fit with any of these"), std::string::npos);
}

}  // namespace
}  // namespace pl
