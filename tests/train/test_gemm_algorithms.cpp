// cuBLASLt's algorithm per GEMM (backend/gemm_algorithms.h, issue 39) on the CPU, where there is nothing to
// choose: the list's JSON (written and read back, every malformed field refused in one line), its way through a
// checkpoint (a fake list saved as gemm_algorithms.json and read back, checked against the manifest), and the
// model's discarded step, which must leave no trace in the run that follows.
#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/device_info.h"
#include "backend/gemm_algorithms.h"
#include "config/model_config.h"
#include "config/precision_recipe.h"
#include "data/mock_dataset.h"
#include "model/llama.h"
#include "model/precision_plan.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/mock_runs.h"
#include "train/run_recorder.h"
#include "train/trainer.h"

namespace pl {
namespace {

GemmAlgorithms fake_list() {
  GemmAlgorithms g;
  g.device = "NVIDIA H200 (sm_90), cuBLASLt 130100";
  for (int i = 0; i < 3; ++i) {
    GemmAlgorithmChoice c;
    c.key = "TN m=" + std::to_string(4096 << i) + " n=4096 k=4096 ld=4096/4096/4096 bf16xbf16->bf16 SCALAR_32F "
            "host-alpha align=256/256/256";
    for (size_t w = 0; w < c.algo.size(); ++w) c.algo[w] = 0x0123456789abcdefULL * (w + 1) + static_cast<uint64_t>(i);
    c.description = "id 31 tile " + std::to_string(i) + " stages 18 split-k 1 reduction 0";
    c.source = i == 0 ? "heuristic" : "timed";
    c.candidates = i == 0 ? 1 : 4;
    c.chosen = i == 0 ? 0 : i;
    c.heuristic_ms = i == 0 ? 0.0 : 1.25;
    c.chosen_ms = i == 0 ? 0.0 : 1.0;
    g.choices.push_back(c);
  }
  return g;
}

TEST(GemmAlgorithms, TheJsonRoundTripsAndTheSummaryCounts) {
  const GemmAlgorithms g = fake_list();
  const std::string text = gemm_algorithms_json(g);
  EXPECT_EQ(gemm_algorithms_from_json(nlohmann::json::parse(text), "t"), g);
  EXPECT_EQ(gemm_algorithms_summary(g),
            "cuBLASLt algorithms: 3 GEMM shapes, 2 timed: 2 took another than the heuristic's first (2.000 ms per call "
            "of each timed shape together, against 2.500 ms with the heuristic's first)");
  EXPECT_EQ(gemm_algorithms_summary(GemmAlgorithms{}), "cuBLASLt algorithms: 0 GEMM shapes, the heuristic's first for each");
}

TEST(GemmAlgorithms, EveryMalformedFieldIsOneLineNamingIt) {
  const nlohmann::json good = nlohmann::json::parse(gemm_algorithms_json(fake_list()));
  const auto refused = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = good;
    edit(j);
    test::expect_one_line_error([&] { gemm_algorithms_from_json(j, "ckpt/gemm_algorithms.json"); },
                                  {"ckpt/gemm_algorithms.json", needle});
  };
  refused([](nlohmann::json& j) { j.erase("device"); }, "not a GEMM algorithm list");
  refused([](nlohmann::json& j) { j["choices"][1]["algo"][3] = "12345"; }, "choice 1: an algo word must be 16");
  refused([](nlohmann::json& j) { j["choices"][1]["algo"][3] = "0123456789ABCDEF"; }, "lower-case hex");
  refused([](nlohmann::json& j) { j["choices"][0]["algo"].erase(0); }, "must have 8 words");
  refused([](nlohmann::json& j) { j["choices"][2]["chosen"] = 4; }, "chosen 4 of 4 candidates");
  refused([](nlohmann::json& j) { j["choices"][2]["chosen_ms"] = -1.0; }, "times must be finite");
  refused([](nlohmann::json& j) { j["choices"][2]["key"] = j["choices"][0]["key"]; }, "is listed twice");
  refused([](nlohmann::json& j) { j["choices"][0].erase("source"); }, "choice 0 has no \"source\"");
  refused([](nlohmann::json& j) { j["choices"][0]["candidates"] = "4"; }, "\"candidates\" must be an integer");
}

TEST(GemmAlgorithms, TheCpuHasNothingToChoose) {
  const OpContext cpu{};
  set_gemm_algorithm_policy(cpu, GemmAlgorithmPolicy::Timed, 4);
  EXPECT_TRUE(gemm_algorithm_choices(cpu).empty());
  EXPECT_TRUE(install_gemm_algorithms(cpu, fake_list()).empty());
}

struct TinyRun {
  TrainConfig t;
  ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
  std::unique_ptr<data::MockGPTDataset> data;
  std::unique_ptr<LlamaModel> model;
  explicit TinyRun(const std::string& recipe) {
    t.train_iters = 3;
    t.global_batch_size = 4;
    t.micro_batch_size = 2;
    t.seq_length = 32;
    const PrecisionPlan plan =
        make_precision_plan(m, load_precision_recipe(std::string(PL_CONFIG_DIR) + "/recipes/" + recipe + ".json"));
    data = std::make_unique<data::MockGPTDataset>(data::MockDataConfig{m.vocab_size, m.vocab_size - 1, t.seq_length, 64, 5});
    RunLayout layout;
    layout.loss_micro_batches = t.num_micro_batches();
    model = std::make_unique<LlamaModel>(m, t.micro_batch_size, t.seq_length, OpContext{}, plan, layout);
  }
  std::vector<double> losses() {
    test::RunRecorder rec;
    Trainer(*model, t, Batches{test::mock_batches(*data, t)}, {&rec}).run();
    return rec.loss();
  }
};

// The selection pass runs before the weights are made; the run after it is the run without it, bit for bit
// (FP8 delayed scaling's histories included: the pass resets them).
TEST(GemmAlgorithms, TheDiscardedStepLeavesNoTrace) {
  for (const char* recipe : {"bf16_mixed", "bf16_with_fp8_delayed_scaling_mixed", "bf16_with_nvfp4_mixed"}) {
    SCOPED_TRACE(recipe);
    TinyRun plain(recipe), passed(recipe);
    passed.model->run_discarded_step();
    const std::vector<float> grads(static_cast<const float*>(passed.model->grads().flat.data),
                                   static_cast<const float*>(passed.model->grads().flat.data) + passed.model->num_params());
    EXPECT_TRUE(std::all_of(grads.begin(), grads.end(), [](float g) { return g == 0.0f; }));
    plain.model->init_parameters(1234);
    passed.model->init_parameters(1234);
    const std::vector<double> a = plain.losses(), b = passed.losses();
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0);
  }
}

// A run's list goes into the checkpoint as gemm_algorithms.json (listed in the manifest with its checksum) and
// comes back equal; a checkpoint without one (the CPU's) has none; a file changed after verification is refused.
TEST(GemmAlgorithms, ACheckpointKeepsTheListAndGivesItBack) {
  test::TempDir dir;
  TinyRun run("bf16_mixed");
  run.model->init_parameters(1);
  Trainer tr(*run.model, run.t, Batches{}, {});
  RunDescription d = test::mock_run_description(run.m, "bf16_mixed", run.t);
  TrainState st;
  st.iteration = 1;
  save_checkpoint((dir.path() / "none").string(), 0, *run.model, tr.optimizer(), st, d);
  EXPECT_TRUE(read_gemm_algorithms(verify_checkpoint((dir.path() / "none").string())).empty());
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "none" / "iter_0000001" / kGemmAlgorithmsFile));
  d.gemm_algorithms = fake_list();
  save_checkpoint((dir.path() / "with").string(), 0, *run.model, tr.optimizer(), st, d);
  const VerifiedCheckpoint c = verify_checkpoint((dir.path() / "with").string());
  EXPECT_EQ(read_gemm_algorithms(c), fake_list());
  // Changed after verification: refused, naming the file.
  const std::filesystem::path file = dir.path() / "with" / "iter_0000001" / kGemmAlgorithmsFile;
  std::ofstream(file, std::ios::app) << " ";
  test::expect_one_line_error([&] { (void)read_gemm_algorithms(c); }, {file.string(), "changed since"});
}

}  // namespace
}  // namespace pl
