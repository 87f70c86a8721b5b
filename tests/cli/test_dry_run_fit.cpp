// pretrain_llama --dry-run's fit table (issue 12's acceptance): for llama3_8b at micro-batch 1 it names a
// flag set for the H100, and re-running with that flag set and --dry-run-gpu h100 plans a GPU total under
// the H100's usable memory. --dry-run-gpu's rules are one-line errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;



// The line of `out` that contains `needle` (empty when none).
std::string line_with(const std::string& out, const std::string& needle) {
  for (const std::string& l : pl::test::split_lines(out))
    if (l.find(needle) != std::string::npos) return l;
  return "";
}

// The GB figure of a memory plan row ("pretrain_llama | memory <name>  <GB> GB  <MB> MB"), or -1.
double plan_row_gb(const std::string& out, const std::string& row) {
  const std::regex re("\\| memory " + row + " +([0-9.]+) GB");
  for (const std::string& l : pl::test::split_lines(out)) {
    std::smatch m;
    if (std::regex_search(l, m, re)) return std::stod(m[1]);
  }
  return -1.0;
}

std::string fixed2(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", x);
  return buf;
}

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

TEST(DryRunFit, TheTableNamesAFlagSetForTheH100ThatFitsItWhenRerun) {
  const std::vector<std::string> base = {"--model", "llama3_8b", "--micro-batch-size", "1", "--dry-run"};
  const ProcessResult r = run_app(base);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // One row per GPU, then the footer.
  for (const char* gpu : {"H100 80GB", "H200 141GB", "B200 180GB", "GB300 288GB", "RTX 5090 32GB"})
    EXPECT_NE(line_with(r.out, "| fit    " + std::string(gpu)), "") << gpu << " row missing:\n" << r.out;
  EXPECT_NE(line_with(r.out, "one data-parallel rank; a run on N GPUs: --dry-run-world-size N (under mpirun: its world size)"), "") << r.out;
  // The plan's lines come first, unchanged: the table follows the last memory line.
  EXPECT_LT(r.out.find("| memory Megatron's theoretical"), r.out.find("| fit    ")) << r.out;

  // H100 row: "<gpu> (sm_90) <usable> <needed> no <flags> (GPU x GB, host y GB)".
  const std::string h100 = line_with(r.out, "| fit    H100 80GB");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(h100, m, std::regex(R"(\(sm_90\) +([0-9.]+) +([0-9.]+)  no    (--.*) \(GPU ([0-9.]+) GB)")))
      << h100;
  const double usable = std::stod(m[1]), needed = std::stod(m[2]), flag_gpu = std::stod(m[4]);
  const std::string flags = m[3];
  // Needed: the dry run's own plan (planned for sm_90 as the H100 is), over the usable memory.
  EXPECT_NEAR(needed, plan_row_gb(r.out, "total"), 0.006) << r.out;
  EXPECT_GT(needed, usable);
  EXPECT_LT(flag_gpu, usable);
  EXPECT_NE(flags.find("--optimizer-cpu-offload"), std::string::npos) << flags;
  // usable = 81559 MiB - 0.5 GiB - 1 GiB - 3% (the fit rule, in GB to the table's two decimals).
  const double total = 81559.0 * 1048576.0;
  EXPECT_NEAR(usable, (total - 1.5 * 1073741824.0 - 0.03 * total) / 1e9, 0.006);

  // Re-run with that flag set for the H100: the plan's GPU total is under the H100's usable memory, and
  // the last line says it fits as given.
  std::vector<std::string> again = base;
  for (const std::string& w : words(flags)) again.push_back(w);
  again.insert(again.end(), {"--dry-run-gpu", "h100"});
  const ProcessResult s = run_app(again);
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const double on_gpu = plan_row_gb(s.out, "total on the GPU");
  ASSERT_GT(on_gpu, 0.0) << s.out;
  EXPECT_LT(on_gpu, usable) << s.out;
  EXPECT_NEAR(on_gpu, flag_gpu, 0.006);
  EXPECT_GT(plan_row_gb(s.out, "total on the host"), 0.0) << s.out;
  EXPECT_NE(line_with(s.out, "dry run for GPU H100 80GB (--dry-run-gpu h100): sm_90, 81559 MiB"), "") << s.out;
  const auto lines = pl::test::split_lines(s.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("cheapest flags for H100 80GB (" + fixed2(usable) + " GB usable): as given (GPU"), std::string::npos) << lines.back();
}

// --dry-run-gpu b200 plans for sm_100, where NVFP4 GEMMs are native (the plan line says it), and its
// last line names what fits the B200.
TEST(DryRunFit, DryRunGpuPlansForThatGpusSm) {
  const ProcessResult r = run_app({"--model", "llama3_8b", "--micro-batch-size", "1", "--dry-run", "--dry-run-gpu", "b200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(line_with(r.out, "quantized GEMMs planned for sm_100: nvfp4 native"), "") << r.out;
  const auto lines = pl::test::split_lines(r.out);
  ASSERT_FALSE(lines.empty());
  EXPECT_NE(lines.back().find("cheapest flags for B200 180GB ("), std::string::npos) << lines.back();
  // Without the option the plan is for the default sm_90, where NVFP4 is emulated.
  const ProcessResult d = run_app({"--model", "llama3_8b", "--micro-batch-size", "1", "--dry-run"});
  ASSERT_EQ(d.exit_code, 0) << d.err;
  EXPECT_NE(line_with(d.out, "quantized GEMMs planned for sm_90 (no GPU opened: the default): nvfp4 emulated"), "")
      << d.out;
  EXPECT_EQ(line_with(d.out, "cheapest flags for"), "") << d.out;
}

void expect_one_line_error(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  const ProcessResult r = run_app(args);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << n << " not in: " << lines[0];
}

TEST(DryRunFit, DryRunGpuRules) {
  expect_one_line_error({"--model", "llama3_8b", "--dry-run", "--dry-run-gpu", "a100"},
                        {"--dry-run-gpu", "a100", "h100, h200, b200, gb300, rtx5090"});
  expect_one_line_error({"--model", "llama3_8b", "--dry-run-gpu", "h100"}, {"--dry-run-gpu h100 needs --dry-run"});
  expect_one_line_error({"--model", "llama3_8b", "--dry-run", "--device", "cpu", "--dry-run-gpu", "h100"},
                        {"--dry-run-gpu", "--device cpu"});
}

}  // namespace
