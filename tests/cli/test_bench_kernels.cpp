// bench_kernels (issue 39) on the CPU, llama_tiny: it runs in a few seconds; its kernel table has every quantize
// variant the recipes use and an expand row per emulated format for each of the four linear layers, and a GEMM
// row per layer and pass; every number is positive and finite; --json holds the same rows; --budget-seconds
// stops it early with what it has; a bad flag is one stderr line and exit 2.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace pl {
namespace {

using test::ProcessResult;
using test::TempDir;

const std::string kTool = PL_BENCH_KERNELS_PATH;
const std::vector<std::string> kLayers = {"qkv", "proj", "fc1", "fc2"};
// What lib/model/linear_layer.cpp quantizes in each recipe (x forward, x wgrad, W, dy).
const std::vector<std::string> kVariants = {
    "fp8cs x e4m3 row (+col amax)",       "fp8cs x e4m3 row (producer amax)",
    "fp8cs x e4m3 col (wgrad)",           "fp8cs W e4m3 row+col",
    "fp8cs dy e5m2 row+col",              "fp8cs dy e5m2 row+col (producer amax)",
    "fp8ds x e4m3 row (scale given)",     "fp8ds W e4m3 row+col (scale given)",
    "fp8ds dy e5m2 row+col (scale given)", "mxfp8 x row",                       "mxfp8 x col (wgrad)",
    "mxfp8 W row+col",                    "mxfp8 dy row+col",                   "nvfp4 x 1x16 row (+RHT col amax)",
    "nvfp4 x 1x16 col RHT (wgrad)",       "nvfp4 W 16x16 row+col",              "nvfp4 dy row + col RHT, SR"};
// The CPU emulates every quantized GEMM: one expand row per format.
const std::vector<std::string> kExpands = {"fp8 fprop x,W -> fp32 (emulated)", "mxfp8 fprop x,W -> fp32 (emulated)",
                                           "nvfp4 fprop x,W -> fp32 (emulated)"};

ProcessResult run_tool(const std::vector<std::string>& args) { return test::run_process(kTool, args, 120.0); }

struct TableRow {
  std::string kernel, layer, shape, variant;
  double ms, gbps, pct;
};
struct GemmTableRow {
  std::string layer, shape, pass;
  double bf16, fp8, ratio;
};

bool positive(double v) { return std::isfinite(v) && v > 0.0; }

void parse(const std::string& out, std::vector<TableRow>& rows, std::vector<GemmTableRow>& gemms) {
  static const std::regex kRow(R"(^(quantize|expand) +(\w+) +(\S+) +(.+?) +(\S+) +(\S+) +(\S+)$)");
  static const std::regex kGemm(R"(^(qkv|proj|fc1|fc2) +(\d+x\d+x\d+) +(fprop|dgrad|wgrad) +(\S+) +(\S+) +(\S+)  emulated$)");
  std::smatch m;
  for (const std::string& l : test::split_lines(out)) {
    if (std::regex_match(l, m, kRow))
      rows.push_back({m[1], m[2], m[3], m[4], std::stod(m[5]), std::stod(m[6]), std::stod(m[7])});
    else if (std::regex_match(l, m, kGemm))
      gemms.push_back({m[1], m[2], m[3], std::stod(m[4]), std::stod(m[5]), std::stod(m[6])});
  }
}

TEST(BenchKernels, RunsOnLlamaTinyOnTheCpuWithEveryRowAndTheSameJson) {
  TempDir dir;
  const std::string json = (dir.path() / "kernels.json").string();
  const ProcessResult r = run_tool({"--device", "cpu", "--model", "llama_tiny", "--seq-length", "128",
                                    "--micro-batch-size", "1", "--machine-ceilings", (dir.path() / "none.json").string(),
                                    "--json", json});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  // The estimate comes before anything is measured; the ceiling says where it came from.
  const size_t est = r.out.find("bench_kernels: estimate ~"), ceil = r.out.find("bandwidth ceiling DRAM");
  ASSERT_NE(est, std::string::npos) << r.out;
  ASSERT_NE(ceil, std::string::npos) << r.out;
  EXPECT_LT(est, ceil);
  EXPECT_NE(r.out.find("measured now with the machine probe's stream_triad"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("stopped at"), std::string::npos) << r.out;

  std::vector<TableRow> rows;
  std::vector<GemmTableRow> gemms;
  parse(r.out, rows, gemms);
  ASSERT_EQ(rows.size(), kLayers.size() * (kVariants.size() + kExpands.size())) << r.out;
  size_t i = 0;
  for (const std::string& layer : kLayers) {
    for (const std::string& v : kVariants) {
      EXPECT_EQ(rows[i].kernel + " " + rows[i].layer + " " + rows[i].variant, "quantize " + layer + " " + v);
      ++i;
    }
    for (const std::string& v : kExpands) {
      EXPECT_EQ(rows[i].kernel + " " + rows[i].layer + " " + rows[i].variant, "expand " + layer + " " + v);
      ++i;
    }
  }
  for (const TableRow& t : rows)
    EXPECT_TRUE(positive(t.ms) && positive(t.gbps) && positive(t.pct)) << t.kernel << " " << t.variant;
  // llama_tiny: hidden 256, qkv 256 + 2 x 64, fc1 2 x 256; T = 128 tokens.
  EXPECT_EQ(rows[0].shape, "128x256");
  ASSERT_EQ(gemms.size(), kLayers.size() * 3) << r.out;
  const std::vector<std::string> passes = {"fprop", "dgrad", "wgrad"};
  for (size_t g = 0; g < gemms.size(); ++g) {
    EXPECT_EQ(gemms[g].layer, kLayers[g / 3]);
    EXPECT_EQ(gemms[g].pass, passes[g % 3]);
    EXPECT_TRUE(positive(gemms[g].bf16) && positive(gemms[g].fp8) && positive(gemms[g].ratio)) << gemms[g].layer;
  }
  EXPECT_EQ(gemms[0].shape, "128x384x256");  // qkv fprop: T x out x in
  EXPECT_EQ(gemms[2].shape, "384x256x128");  // qkv wgrad: out x in x T

  const nlohmann::json j = nlohmann::json::parse(test::read_text_file(json));
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["model"], "llama_tiny");
  EXPECT_EQ(j["tokens"], 128);
  EXPECT_EQ(j["complete"], true);
  EXPECT_TRUE(positive(j["ceiling"]["gbps"].get<double>()));
  ASSERT_EQ(j["kernels"].size(), rows.size());
  for (size_t k = 0; k < rows.size(); ++k) {
    const nlohmann::json& e = j["kernels"][k];
    EXPECT_EQ(e["kernel"].get<std::string>() + " " + e["linear"].get<std::string>() + " " + e["variant"].get<std::string>(),
              rows[k].kernel + " " + rows[k].layer + " " + rows[k].variant);
    for (const char* f : {"ms", "bytes", "gbps", "pct_of_ceiling"}) EXPECT_TRUE(positive(e[f].get<double>())) << f;
  }
  ASSERT_EQ(j["gemms"].size(), gemms.size());
  for (size_t g = 0; g < gemms.size(); ++g) {
    const nlohmann::json& e = j["gemms"][g];
    EXPECT_EQ(e["linear"], gemms[g].layer);
    EXPECT_EQ(e["pass"], gemms[g].pass);
    for (const char* f : {"bf16_tflops", "fp8_tflops", "fp8_over_bf16"}) EXPECT_TRUE(positive(e[f].get<double>())) << f;
  }
}

TEST(BenchKernels, StopsAtTheBudgetWithWhatItHas) {
  TempDir dir;
  const std::string json = (dir.path() / "k.json").string();
  const ProcessResult r = run_tool({"--device", "cpu", "--model", "llama_tiny", "--budget-seconds", "0.000001",
                                    "--machine-ceilings", "", "--json", json});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("bench_kernels: stopped at --budget-seconds 1e-06: 0 of "), std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(test::read_text_file(json));
  EXPECT_EQ(j["complete"], false);
  EXPECT_TRUE(j["kernels"].empty());
}

TEST(BenchKernels, ABadFlagIsOneLineAndExit2) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--frobnicate"}, {"--reps", "0"}, {"--reps", "abc"}, {"--device", "tpu"}, {"--seq-length", "-5"},
           {"--budget-seconds", "inf"}, {"--micro-batch-size", "99999999999999999999999"}}) {
    const ProcessResult r = run_tool(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.err;
    EXPECT_EQ(r.out, "") << args[0];
    const std::vector<std::string> lines = test::split_lines(r.err);
    ASSERT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(lines[0].rfind("bench_kernels: error: ", 0), 0u) << lines[0];
    EXPECT_NE(lines[0].find("(see --help)"), std::string::npos) << lines[0];
  }
  // A user error after parsing: one line, exit 1.
  const ProcessResult r = run_tool({"--device", "cpu", "--seq-length", "100", "--json", "/nonexistent_dir/k.json"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "bench_kernels: error: --json /nonexistent_dir/k.json: directory /nonexistent_dir does not exist\n");
  const ProcessResult t = run_tool({"--device", "cpu", "--seq-length", "100"});
  EXPECT_EQ(t.exit_code, 1) << t.err;
  EXPECT_EQ(test::split_lines(t.err).size(), 1u) << t.err;
  EXPECT_NE(t.err.find("must be a multiple of 32"), std::string::npos) << t.err;
}

}  // namespace
}  // namespace pl
