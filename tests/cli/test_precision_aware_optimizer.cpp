// Megatron's precision-aware optimizer end to end (pretrain_llama --use-precision-aware-optimizer with
// --exp-avg-dtype / --exp-avg-sq-dtype / --main-grads-dtype / --main-params-dtype) on the CPU backend:
// the flags' rules (one line naming the flag), FP32 state through the flag is bit-identical to the
// default, BF16 moments stay within a stated loss gap of FP32 state on llama_small, and checkpoints keep
// each moment in its dtype (resume bit-identically; loading into FP32 state converts with a line;
// convert_checkpoint exports the FP32 masters as before).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::iteration_lines;

using pl::test::ProcessResult;

const std::string kSmall = std::string(PL_CONFIG_DIR) + "/models/llama_small.json";
const std::vector<std::string> kBf16Moments = {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16",
                                               "--exp-avg-sq-dtype", "bf16"};

std::vector<std::string> optimizer_tiny(const std::vector<std::string>& extra, const std::string& iters = "20") {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "2", "--train-iters", iters,
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "64"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

ProcessResult optimizer_run_ok(const std::vector<std::string>& args) {
  ProcessResult r = pl::test::run_process(kApp, args, 600.0);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return r;
}


double last_lm_loss(const std::string& out) {
  static const std::regex loss(R"(lm loss: ([0-9.E+-]+))");
  double v = -1.0;
  for (const std::string& l : pl::test::split_lines(out)) {
    std::smatch m;
    if (std::regex_search(l, m, loss)) v = std::stod(m[1]);
  }
  return v;
}

void optimizer_one_line_failure(const std::vector<std::string>& extra, const std::vector<std::string>& needles) {
  const ProcessResult r = pl::test::run_process(kApp, plus({"--model", kTiny, "--device", "cpu", "--dry-run"}, extra), 60.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  for (const std::string& n : needles) EXPECT_NE(lines[0].find(n), std::string::npos) << "'" << n << "' not in: " << lines[0];
}

// Megatron's rules (optimizer_config.py): the value sets; a non-fp32 dtype needs the flag; and what is
// not implemented here yet is refused with one line naming the flag.
TEST(PrecisionAwareOptimizer, BadFlagCombinationsAreRefusedNamingTheFlag) {
  optimizer_one_line_failure({"--exp-avg-dtype", "bf16"}, {"--exp-avg-dtype", "--use-precision-aware-optimizer"});
  optimizer_one_line_failure({"--exp-avg-sq-dtype", "bf16"}, {"--exp-avg-sq-dtype", "--use-precision-aware-optimizer"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--exp-avg-dtype", "fp8"}, {"--exp-avg-dtype", "fp8"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--main-params-dtype", "bf16"},
                             {"--main-params-dtype", "fp32, fp16"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--main-grads-dtype", "fp16"},
                             {"--main-grads-dtype", "fp32, bf16"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--main-params-dtype", "fp16"},
                             {"--main-params-dtype fp16", "not implemented yet"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--exp-avg-dtype", "fp16"},
                             {"--exp-avg-dtype fp16", "not implemented yet"});
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--exp-avg-sq-dtype", "fp16"},
                             {"--exp-avg-sq-dtype fp16", "not implemented yet"});
}

// The switch changes storage, not math: all-fp32 state with the flag prints the default run's iteration
// lines; the banner line appears only with the flag. --dry-run shows the BF16 moments' smaller row.
TEST(PrecisionAwareOptimizer, Fp32StateWithTheFlagIsBitIdenticalAndBf16ShrinksThePlan) {
  const ProcessResult plain = optimizer_run_ok(optimizer_tiny({"--disable-fp4"}));
  const ProcessResult flagged = optimizer_run_ok(optimizer_tiny({"--disable-fp4", "--use-precision-aware-optimizer", "--exp-avg-dtype",
                                                                 "fp32", "--main-params-dtype", "fp32"}));
  const auto a = iteration_lines(plain.out, 1), b = iteration_lines(flagged.out, 1);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  const std::string banner = "optimizer state (--use-precision-aware-optimizer): main grads fp32, master weights fp32, "
                             "exp_avg fp32, exp_avg_sq fp32";
  EXPECT_EQ(plain.out.find("--use-precision-aware-optimizer"), std::string::npos);
  EXPECT_NE(flagged.out.find(banner), std::string::npos) << flagged.out;

  auto optimizer_mb = [](const std::string& out, const std::string& row) {
    const std::regex re("memory " + row + R"( +[0-9.]+ GB +([0-9.]+) MB)");
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, re)) << out;
    return m.size() > 1 ? std::stod(m[1]) : -1.0;
  };
  const ProcessResult d32 = optimizer_run_ok(optimizer_tiny({"--dry-run"}));
  const ProcessResult d16 = optimizer_run_ok(plus(optimizer_tiny({"--dry-run"}), kBf16Moments));
  const ProcessResult d16m = optimizer_run_ok(plus(optimizer_tiny({"--dry-run"}), {"--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16"}));
  const double full = optimizer_mb(d32.out, R"(optimizer state \(Adam m, v fp32\))");
  EXPECT_NEAR(optimizer_mb(d16.out, R"(optimizer \(Adam m bf16, v bf16\))"), full / 2, 0.01);
  EXPECT_NEAR(optimizer_mb(d16m.out, R"(optimizer \(Adam m bf16, v fp32\))"), full * 3 / 4, 0.01);
}

// BF16 moments against FP32 state on llama_small (8 layers, hidden 256, 32k vocab; BF16 linears), 60
// iterations of 4 x 64 tokens: the final log interval's loss (the mean of iterations 41-60) within 0.25 of
// the FP32-state run's. Measured (AVX2 CI host, OpenBLAS SGEMM, 2 threads, about 40 s a run): 8.548249 FP32
// state, 8.549942 BF16 moments (gap +0.0017), 8.548232 with BF16 main grads too (gap -0.00002). The test ran
// 100 iterations of 4 x 128 tokens before: 579 s on that host against the tests' 600 s timeout; then (issue
// 25, oneDNN BF16 GEMMs): 8.0861 FP32 state vs 8.0537 BF16 moments (-0.032), 8.0965 with BF16 main grads
// (+0.010). For scale, 200-iteration runs of that shape: gaps -0.215 (seed 1234) and +0.159 (seed 1235) at
// iteration 200, while the FP32-state runs of the two seeds differ by 0.254: the BF16 moments' gap is within
// seed-to-seed noise; 200 iterations of seed 1234 (iterations 181-200): FP32 state 6.9707, BF16 moments
// 6.7560, BF16 moments and main grads 6.6855 (gap -0.285).
TEST(PrecisionAwareOptimizer, Bf16MomentsStayWithinTheStatedLossGapOnLlamaSmall) {
  const std::vector<std::string> base = {"--model", kSmall, "--device", "cpu", "--threads", "2", "--train-iters", "60",
                                         "--global-batch-size", "4", "--micro-batch-size", "4", "--seq-length", "64",
                                         "--disable-fp4", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup-iters", "10",
                                         "--log-interval", "20"};
  const double fp32 = last_lm_loss(optimizer_run_ok(base).out);
  const ProcessResult r = optimizer_run_ok(plus(base, kBf16Moments));
  const double bf16 = last_lm_loss(r.out);
  const double grads = last_lm_loss(optimizer_run_ok(plus(plus(base, kBf16Moments), {"--main-grads-dtype", "bf16"})).out);
  std::printf("llama_small, 60 iterations: lm loss (iterations 41-60) fp32 state %.6f, bf16 moments %.6f (gap %.6f), "
              "bf16 moments and main grads %.6f (gap %.6f)\n",
              fp32, bf16, bf16 - fp32, grads, grads - fp32);
  ASSERT_GT(fp32, 0.0);
  EXPECT_LT(fp32, 9.0);  // it learned (from ~10.4)
  EXPECT_LT(std::abs(bf16 - fp32), 0.25);
  EXPECT_NE(bf16, fp32);  // the BF16 moments are in effect
  EXPECT_LT(std::abs(grads - fp32), 0.25);
  EXPECT_NE(grads, bf16);  // the BF16 main grads are in effect
}

// Checkpoints keep each moment in its dtype (adam_m_bf16.bin, the manifest's dtype bf16), a BF16-moment
// run resumes bit-identically, and a run with FP32 state loads it with a line saying it converts.
TEST(PrecisionAwareOptimizer, Bf16MomentCheckpointsResumeBitIdenticallyAndConvertIntoFp32State) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  const auto with = [&](const std::vector<std::string>& extra) { return optimizer_tiny(plus(extra, kBf16Moments)); };
  const ProcessResult straight = optimizer_run_ok(with({}));
  optimizer_run_ok(with({"--save", d, "--save-interval", "10", "--exit-interval", "10"}));
  const std::string it = d + "/iter_0000010";
  EXPECT_TRUE(std::filesystem::exists(it + "/adam_m_bf16.bin"));
  EXPECT_TRUE(std::filesystem::exists(it + "/adam_v_bf16.bin"));
  EXPECT_FALSE(std::filesystem::exists(it + "/adam_m_fp32.bin"));
  const int64_t n = static_cast<int64_t>(std::filesystem::file_size(it + "/master_fp32.bin")) / 4;
  EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(it + "/adam_m_bf16.bin")), 2 * n);
  const std::string manifest = pl::test::read_text_file(it + "/manifest.json");
  for (const char* f : {"adam_m_bf16\\.bin", "adam_v_bf16\\.bin"}) {
    std::smatch entry;  // the manifest's entry of the file: its dtype is bf16
    ASSERT_TRUE(std::regex_search(manifest, entry, std::regex(std::string(R"(\{[^{}]*")") + f + R"("[^{}]*\})")))
        << manifest;
    EXPECT_TRUE(std::regex_search(entry.str(), std::regex(R"("dtype": *"bf16")"))) << entry.str();
  }

  const ProcessResult resumed = optimizer_run_ok(with({"--load", d}));
  const auto expected = iteration_lines(straight.out, 11);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(iteration_lines(resumed.out, 1), expected);
  EXPECT_EQ(resumed.out.find("converted on load"), std::string::npos);

  const ProcessResult into_fp32 = optimizer_run_ok(optimizer_tiny({"--load", d}));
  EXPECT_NE(into_fp32.out.find("checkpoint saved with optimizer state exp_avg bf16, exp_avg_sq bf16; this run keeps "
                               "exp_avg fp32, exp_avg_sq fp32: converted on load"),
            std::string::npos)
      << into_fp32.out;
  EXPECT_EQ(iteration_lines(into_fp32.out, 1).size(), 10u);

  // convert_checkpoint still exports the FP32 master weights of a BF16-moment checkpoint.
  const std::string hf = (dir.path() / "hf").string();
  const ProcessResult c = pl::test::run_process(PL_CONVERT_CHECKPOINT_PATH, {"--load", it, "--to-hf", hf}, 120.0);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_TRUE(std::filesystem::exists(hf + "/model.safetensors")) << c.out;
}

// ---- the optimizer CPU offload (--optimizer-cpu-offload) ------------------------------------------------

const std::vector<std::string> kOffload = {"--use-precision-aware-optimizer", "--optimizer-cpu-offload"};

// Megatron's rules (arguments.py): offload needs the precision-aware optimizer; the fraction is in
// [0, 1]; a fraction other than 1 is not implemented here yet.
TEST(OptimizerCpuOffload, BadFlagCombinationsAreRefusedNamingTheFlag) {
  optimizer_one_line_failure({"--optimizer-cpu-offload"}, {"--optimizer-cpu-offload", "--use-precision-aware-optimizer"});
  optimizer_one_line_failure(plus(kOffload, {"--optimizer-offload-fraction", "0.5"}),
                             {"--optimizer-offload-fraction 0.5", "not implemented yet"});
  optimizer_one_line_failure(plus(kOffload, {"--optimizer-offload-fraction", "1.5"}),
                             {"--optimizer-offload-fraction", "[0, 1]"});
  // The overlap serves the whole optimizer offloaded on one rank: without the offload it is refused, and
  // what the offload refuses (a fraction, data parallelism) stays refused with it.
  optimizer_one_line_failure({"--use-precision-aware-optimizer", "--overlap-cpu-optimizer-d2h-h2d"},
                             {"--overlap-cpu-optimizer-d2h-h2d needs --optimizer-cpu-offload"});
  optimizer_one_line_failure(plus(kOffload, {"--overlap-cpu-optimizer-d2h-h2d", "--optimizer-offload-fraction", "0.5"}),
                             {"--optimizer-offload-fraction 0.5", "not implemented yet"});
  optimizer_one_line_failure(plus(kOffload, {"--overlap-cpu-optimizer-d2h-h2d", "--dry-run-world-size", "2"}),
                             {"--optimizer-cpu-offload with 2 data-parallel ranks"});
}

// Offload moves the state, not the math: the offloaded run prints the on-device run's iteration lines
// (FP32 and BF16 moments), says so in its banner, and its timers include the gradient copy's wait. So does
// the overlapped offload (--overlap-cpu-optimizer-d2h-h2d: the host step on a worker thread, the next
// forward waiting per layer), whose level-2 timers add the host AdamW's bandwidth.
TEST(OptimizerCpuOffload, OffloadedRunsAreBitIdenticalToOnDeviceRuns) {
  for (const std::vector<std::string>& moments :
       {std::vector<std::string>{"--use-precision-aware-optimizer"}, kBf16Moments}) {
    const ProcessResult on_device = optimizer_run_ok(optimizer_tiny(moments));
    const ProcessResult offloaded = optimizer_run_ok(optimizer_tiny(plus(moments, {"--optimizer-cpu-offload"})));
    const auto a = iteration_lines(on_device.out, 1), b = iteration_lines(offloaded.out, 1);
    ASSERT_EQ(a.size(), 20u);
    EXPECT_EQ(a, b);
    EXPECT_NE(offloaded.out.find("optimizer CPU offload (--optimizer-cpu-offload, fraction 1)"), std::string::npos)
        << offloaded.out;
    EXPECT_EQ(on_device.out.find("optimizer CPU offload"), std::string::npos);
    if (moments != kBf16Moments) continue;
    const ProcessResult overlapped = optimizer_run_ok(optimizer_tiny(plus(
        moments, {"--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--timing-log-level", "2"})));
    EXPECT_EQ(iteration_lines(overlapped.out, 1), a);
    EXPECT_NE(overlapped.out.find("optimizer overlap (--overlap-cpu-optimizer-d2h-h2d)"), std::string::npos)
        << overlapped.out;
    static const std::regex host_line(R"(host-optimizer-step \(AdamW on the host\) \.+: [0-9.]+ ms per iteration, )"
                                      R"([0-9.]+ GB moved, [0-9.]+ GB/s \(overlapped with the next forward\))");
    EXPECT_TRUE(std::regex_search(overlapped.out, host_line)) << overlapped.out;
  }
  const ProcessResult timed = optimizer_run_ok(optimizer_tiny(plus(kOffload, {"--timing-log-level", "1", "--log-interval", "10"})));
  EXPECT_NE(timed.out.find("optimizer-copy-to-main-grad"), std::string::npos) << timed.out;
}

// A checkpoint does not record where the state lived: saved offloaded, it resumes bit-identically with
// or without offload.
TEST(OptimizerCpuOffload, CheckpointsResumeBitIdenticallyWithOrWithoutOffload) {
  pl::test::TempDir dir;
  const std::string d = (dir.path() / "ckpt").string();
  const auto with = [&](const std::vector<std::string>& extra) { return optimizer_tiny(plus(extra, kBf16Moments)); };
  const ProcessResult straight = optimizer_run_ok(with({}));
  optimizer_run_ok(with({"--optimizer-cpu-offload", "--save", d, "--save-interval", "10", "--exit-interval", "10"}));
  const auto expected = iteration_lines(straight.out, 11);
  ASSERT_EQ(expected.size(), 10u);
  EXPECT_EQ(iteration_lines(optimizer_run_ok(with({"--optimizer-cpu-offload", "--load", d})).out, 1), expected);
  EXPECT_EQ(iteration_lines(optimizer_run_ok(with({"--load", d})).out, 1), expected);
}

// --dry-run books master and moments on the host: the GPU total drops by exactly those rows, the host
// total is them plus the pinned gradient copy and staging.
TEST(OptimizerCpuOffload, DryRunSplitsThePlanIntoGpuAndHost) {
  const std::vector<std::string> base = {"--model", "llama3_8b", "--micro-batch-size", "1", "--dry-run"};
  auto mb = [](const std::string& out, const std::string& row) {
    const std::regex re("memory " + row + R"( +[0-9.]+ GB +([0-9.]+) MB)");
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, re)) << row << " not in:\n" << out;
    return m.size() > 1 ? std::stod(m[1]) : -1.0;
  };
  const ProcessResult on_device = optimizer_run_ok(plus(base, kBf16Moments));
  const ProcessResult off = optimizer_run_ok(plus(plus(base, kBf16Moments), {"--optimizer-cpu-offload"}));
  const double master = mb(off.out, R"(master weights \(fp32, host\))");
  const double moments = mb(off.out, R"(optimizer \(Adam m bf16, v bf16, host\))");
  const double grads = mb(off.out, R"(gradient copy \(host, pinned\))");
  const double staging = mb(off.out, R"(weight staging \(host, pinned\))");
  EXPECT_NEAR(mb(on_device.out, "total") - mb(off.out, "total on the GPU"), master + moments, 0.02);
  EXPECT_NEAR(mb(off.out, "total on the host"), master + moments + grads + staging, 0.02);
  EXPECT_NEAR(grads, master, 0.01);  // both fp32, one element per parameter
  // The issue's acceptance 3: the 8B plan with the overlap names the streams, the order and the wait.
  const ProcessResult overlap = optimizer_run_ok({"--dry-run", "--model", "llama3_8b", "--micro-batch-size", "1", "--seq-length",
                                                  "4096", "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                                                  "--overlap-cpu-optimizer-d2h-h2d"});
  for (const char* needle : {"optimizer overlap (--overlap-cpu-optimizer-d2h-h2d)", "device-to-host stream",
                             "host-to-device stream", "embedding, layers 0..L-1, final norm, LM head", "per layer"})
    EXPECT_NE(overlap.out.find(needle), std::string::npos) << needle << " not in:\n" << overlap.out;
}

// Start-up refuses, with one line, an offload the host cannot hold (a 400-layer 8B shape: ~1.4 TB).
TEST(OptimizerCpuOffload, HostWithoutTheMemoryIsOneLine) {
  const ProcessResult r = pl::test::run_process(
      kApp, plus({"--model", "llama3_8b", "--num-layers", "400", "--device", "cpu", "--train-iters", "1",
                  "--global-batch-size", "1", "--micro-batch-size", "1", "--seq-length", "128"},
                 kOffload),
      120.0);
  ASSERT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto lines = pl::test::split_lines(r.err);
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_NE(lines[0].find("--optimizer-cpu-offload needs"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("GB of host memory"), std::string::npos) << lines[0];
}

// ---- BF16 main grads (--main-grads-dtype bf16) -----------------------------------------------------------

// BF16 main grads train (llama_tiny, 20 iterations, NVFP4 recipe): the final loss stays within 0.05 of
// the FP32-grads run's (measured: 2.8394 vs 2.8441, gap -0.005) yet differs from it (the rounding is in
// effect); offloaded, the run is bit-identical; the GPU plan's gradients row is half the FP32 one.
TEST(PrecisionAwareOptimizer, Bf16MainGradsTrainAndOffloadBitIdentically) {
  const std::vector<std::string> bf16_grads = plus(kBf16Moments, {"--main-grads-dtype", "bf16"});
  const ProcessResult fp32 = optimizer_run_ok(optimizer_tiny(kBf16Moments));
  const ProcessResult bf16 = optimizer_run_ok(optimizer_tiny(bf16_grads));
  const ProcessResult off = optimizer_run_ok(optimizer_tiny(plus(bf16_grads, {"--optimizer-cpu-offload"})));
  const auto a = iteration_lines(fp32.out, 1), b = iteration_lines(bf16.out, 1);
  ASSERT_EQ(b.size(), 20u);
  EXPECT_EQ(iteration_lines(off.out, 1), b);
  EXPECT_NE(a, b);
  const double la = last_lm_loss(fp32.out), lb = last_lm_loss(bf16.out);
  std::printf("llama_tiny, 20 iterations: lm loss fp32 main grads %.6f, bf16 main grads %.6f, gap %.6f\n", la, lb,
              lb - la);
  EXPECT_LT(std::abs(lb - la), 0.05);
  EXPECT_NE(bf16.out.find("main grads bf16, master weights fp32"), std::string::npos) << bf16.out;

  auto mb = [](const std::string& out, const std::string& row) {
    const std::regex re("memory " + row + R"( +[0-9.]+ GB +([0-9.]+) MB)");
    std::smatch m;
    EXPECT_TRUE(std::regex_search(out, m, re)) << row << " not in:\n" << out;
    return m.size() > 1 ? std::stod(m[1]) : -1.0;
  };
  // The GPU's plan (without --device cpu: the CPU keeps bf16 values in FP32 storage).
  const ProcessResult d32 = optimizer_run_ok(plus({"--model", kTiny, "--dry-run"}, kBf16Moments));
  const ProcessResult d16 = optimizer_run_ok(plus({"--model", kTiny, "--dry-run"}, bf16_grads));
  EXPECT_NEAR(mb(d16.out, R"(gradients \(bf16\))"), mb(d32.out, R"(gradients \(fp32\))") / 2, 0.01);
}

}  // namespace
