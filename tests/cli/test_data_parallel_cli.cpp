// pretrain_llama over MPI ranks (CPU backend, `mpirun -np 2 --oversubscribe`, --threads 1 each): the
// 2-rank run prints the 1-rank run's loss column (BF16 and NVFP4; with and without the distributed
// optimizer and --overlap-grad-reduce), prints each line once, resumes a 2-rank checkpoint in 1 rank and
// the reverse, ends both ranks with the failing rank's line when only rank 1 fails, and refuses a global
// batch that the ranks cannot split with one line before any work. And --dry-run-world-size's plan.
// Built without MPI (PL_MPIRUN empty) the MPI tests skip saying so.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cmath>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;

const std::string kMpirun = PL_MPIRUN;

using pl::test::mpirun_flags;

// Global batch 4 = 2 ranks x 1 micro-batch of 2: each rank adds one micro-batch's gradients and the sum
// over the two ranks is the one-rank run's a + b, so the runs agree at every iteration (with more
// micro-batches per rank the FP32 summation order differs and they separate slowly: tools/dp_train_check.cpp).
std::vector<std::string> data_parallel_tiny(int iters, std::vector<std::string> extra) {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "1", "--train-iters",
                                std::to_string(iters), "--global-batch-size", "4", "--micro-batch-size", "2",
                                "--seq-length", "32", "--warmup-iters", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Each rank's stdout goes to a file of its own (rank.N in a fresh directory), read back in rank order into
// `out` ahead of mpirun's own stdout. Open MPI forwards a rank's stdout to mpirun through a pseudo-terminal,
// and once in CI (the sanitizer suite, two tests at a time on 2 cores, 2026-12-03) a 2-rank log came back
// without three lines from its middle and without its report's last lines, though the run had written them
// (its JSON report was whole). Read from the files, the lines are what the ranks wrote; stderr still comes
// through mpirun (a pipe), as a user sees it.
ProcessResult run_ranks(int np, const std::vector<std::string>& args, double timeout = 300.0) {
  pl::test::TempDir logs;
  const std::string to_file = "exec \"$0\" \"$@\" > '" + (logs.path() / "rank.").string() +
                              "'\"${OMPI_COMM_WORLD_RANK:-$PMI_RANK}\"";
  std::vector<std::string> a = mpirun_flags();
  a.insert(a.end(), {"-x", "OMP_NUM_THREADS=1", "-np", std::to_string(np), "/bin/sh", "-c", to_file, kApp});
  a.insert(a.end(), args.begin(), args.end());
  ProcessResult r = pl::test::run_process(kMpirun, a, timeout);
  std::string ranks;
  for (int i = 0; i < np; ++i) {
    const std::filesystem::path p = logs.path() / ("rank." + std::to_string(i));
    if (std::filesystem::exists(p)) ranks += pl::test::read_text_file(p.string());
  }
  r.out = ranks + r.out;
  return r;
}

#define SKIP_WITHOUT_MPI() \
  if (kMpirun.empty()) GTEST_SKIP() << "built without MPI (scripts/setup.sh installs OpenMPI; reconfigure)"

struct IterFields {
  int64_t iteration;
  double loss, lr;
  std::string grad_norm;  // as printed ({:.3f})
};

std::vector<IterFields> iterations(const std::string& out) {
  static const std::regex line(R"(iteration +(\d+)/ *\d+ \|.*learning rate: ([0-9.E+-]+) \|.*lm loss: ([0-9.E+-]+) \|.*grad norm: ([0-9.]+) \|)");
  std::vector<IterFields> v;
  for (const std::string& l : pl::test::split_lines(out)) {
    std::smatch m;
    if (std::regex_search(l, m, line)) v.push_back({std::stoll(m[1]), std::stod(m[3]), std::stod(m[2]), m[4]});
  }
  return v;
}

void expect_same_columns(const std::vector<IterFields>& a, const std::vector<IterFields>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].iteration, b[i].iteration) << what;
    EXPECT_LE(std::fabs(a[i].loss - b[i].loss), 1e-6 * std::fabs(b[i].loss)) << what << " iteration " << a[i].iteration
                                                                            << ": " << a[i].loss << " vs " << b[i].loss;
    EXPECT_EQ(a[i].lr, b[i].lr) << what;
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << what << " iteration " << a[i].iteration;
  }
}

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(DataParallelCli, TwoRanksPrintTheOneRankLossColumnOnce) {
  SKIP_WITHOUT_MPI();
  // BF16: the same bits for 12 iterations, plain and with the distributed optimizer (its gradient norm
  // adds the shards' chunk partials with the one-rank tree). NVFP4: the same printed columns for 4; later
  // a scaled GEMM accumulating into the gradients (alpha = the global scales) rounds once in one rank
  // (BLAS: alpha x acc + C) and twice over two (alpha x acc on rank 1, then the sum): measured first
  // difference at iteration 20 (seq 64).
  for (const char* recipe : {"bf16_mixed", "bf16_with_nvfp4_mixed"}) {
    const bool bf16 = std::string(recipe) == "bf16_mixed";
    const int iters = bf16 ? 12 : 4;
    const ProcessResult one = pl::test::run_process(kApp, data_parallel_tiny(iters, {"--recipe", recipe}), 300.0);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const std::vector<IterFields> ref = iterations(one.out);
    for (const std::vector<std::string>& flags :
         {std::vector<std::string>{}, std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce",
                                                               "--overlap-param-gather", "--ddp-bucket-size", "1"}}) {
      std::vector<std::string> extra = {"--recipe", recipe};
      extra.insert(extra.end(), flags.begin(), flags.end());
      const ProcessResult two = run_ranks(2, data_parallel_tiny(iters, extra));
      const std::string what = std::string(recipe) + (flags.empty() ? " plain" : " distributed + overlap");
      ASSERT_EQ(two.exit_code, 0) << what << "\n" << two.out << two.err;
      expect_same_columns(iterations(two.out), ref, what);
      if (bf16) {
        EXPECT_EQ(pl::test::iteration_lines(two.out, 1), pl::test::iteration_lines(one.out, 1)) << what;
      }
      // Each line once: the iteration lines by the last rank, the start-up lines by rank 0.
      EXPECT_EQ(count(two.out, "iteration        4/"), 1u) << two.out;
      EXPECT_EQ(count(two.out, "pretrain_llama | model llama_tiny"), 1u) << two.out;
      EXPECT_EQ(count(two.out, "pretrain_llama | summary:"), 1u) << two.out;
      EXPECT_EQ(count(two.out, "[Rank 0] (after 1 iterations) memory"), 1u) << two.out;
      EXPECT_NE(two.out.find("data-parallel size 2"), std::string::npos) << two.out;
      EXPECT_NE(two.out.find("1 micro-batches per rank"), std::string::npos) << two.out;
      if (!flags.empty()) {
        EXPECT_NE(two.out.find("distributed optimizer: each rank owns"), std::string::npos) << two.out;
      }
    }
  }
}

// LoRA over two ranks (issue 41): the base replicated, the adapters' gradients all-reduced (also bucket by bucket
// under the backward, --overlap-grad-reduce: the model announces the adapters of each layer as final) or
// reduce-scattered to the distributed optimizer's shards of the adapters, the dropout masks drawn from each
// micro-batch's run-wide counter: the one-rank run's columns.
TEST(DataParallelCli, TwoRanksOfLoraEqualOneRank) {
  SKIP_WITHOUT_MPI();
  const std::vector<std::string> lora = {"--disable-fp4", "--peft", "lora", "--lora-dim", "8", "--lora-dropout", "0.1",
                                         "--lr", "3e-3"};
  const ProcessResult one = pl::test::run_process(kApp, data_parallel_tiny(8, lora), 300.0);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{}, std::vector<std::string>{"--overlap-grad-reduce", "--ddp-bucket-size", "1"},
        std::vector<std::string>{"--use-distributed-optimizer", "--overlap-grad-reduce"}}) {
    std::vector<std::string> extra = lora;
    extra.insert(extra.end(), flags.begin(), flags.end());
    const ProcessResult two = run_ranks(2, data_parallel_tiny(8, extra));
    std::string what = "lora";
    for (const std::string& f : flags) what += " " + f;
    ASSERT_EQ(two.exit_code, 0) << what << "\n" << two.out << two.err;
    expect_same_columns(iterations(two.out), iterations(one.out), what);
  }
}

// FP8 delayed scaling over two ranks: the amaxes are MAX-reduced before each history update (Transformer
// Engine's reduce_amax), so two ranks of one micro-batch of 2 samples roll the histories of one rank's one
// micro-batch of the same 4 samples: the same amaxes, scales and quantized operands, hence the same loss
// column (to the FP32 summation order of the weight gradients). Unreduced, each rank would scale by its own
// half's amaxes and the ranks would quantize with different scales.
TEST(DataParallelCli, FP8DelayedScalingReducesTheAmaxesOverTheRanks) {
  SKIP_WITHOUT_MPI();
  const std::vector<std::string> recipe = {"--recipe", "bf16_with_fp8_delayed_scaling_mixed",
                                           "--num-layers-at-start-in-bf16", "0", "--num-layers-at-end-in-bf16", "0"};
  std::vector<std::string> one_args = data_parallel_tiny(6, recipe);
  for (size_t i = 0; i + 1 < one_args.size(); ++i)  // one micro-batch of 4: one update per iteration
    if (one_args[i] == "--micro-batch-size") one_args[i + 1].replace(0, std::string::npos, 1, '4');
  const ProcessResult one = pl::test::run_process(kApp, one_args, 300.0);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const ProcessResult two = run_ranks(2, data_parallel_tiny(6, recipe));
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  const std::vector<IterFields> a = iterations(two.out), b = iterations(one.out);
  ASSERT_EQ(a.size(), 6u) << two.out;
  ASSERT_EQ(b.size(), 6u) << one.out;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::fabs(a[i].loss - b[i].loss), 1e-5 * std::fabs(b[i].loss))
        << "iteration " << a[i].iteration << ": " << a[i].loss << " vs " << b[i].loss;
}

// --roofline over two ranks: rank 0 alone probes and prints the table (once), and the gradient reduction
// is a row of its own: an all-reduce, or with the distributed optimizer a reduce-scatter and the weights'
// all-gather, each with NCCL-tests' bus bytes for 2 ranks (one buffer's worth per pass).
TEST(DataParallelCli, RooflineHasTheCollectivesAsRows) {
  SKIP_WITHOUT_MPI();
  pl::test::TempDir dir;
  for (const bool distributed : {false, true}) {
    std::vector<std::string> extra = {"--roofline", (dir.path() / "r.json").string(), "--machine-ceilings",
                                      (dir.path() / "c.json").string()};
    if (distributed) extra.push_back("--use-distributed-optimizer");
    const ProcessResult two = run_ranks(2, data_parallel_tiny(3, extra));
    ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
    EXPECT_EQ(count(two.out, "of speed of light"), 1u) << two.out;
    const std::string json = pl::test::read_text_file((dir.path() / "r.json").string());
    if (distributed) {
      EXPECT_NE(json.find("\"op\": \"reduce_scatter\""), std::string::npos) << json;
      EXPECT_NE(json.find("\"op\": \"all_gather\""), std::string::npos) << json;
    } else {
      EXPECT_NE(json.find("\"op\": \"all_reduce\""), std::string::npos) << json;
    }
    EXPECT_NE(json.find("\"kind\": \"comm\""), std::string::npos) << json;
  }
}

// A checkpoint's files do not depend on the rank count: 2 ranks save, 1 rank resumes (and the reverse),
// continuing as a straight run of its own rank count does (to the printed digits), and a 2-rank resume
// of a 2-rank checkpoint prints exactly the straight 2-rank lines.
TEST(DataParallelCli, CheckpointsResumeWithAnotherRankCount) {
  SKIP_WITHOUT_MPI();
  pl::test::TempDir dir;
  const std::vector<std::string> dist = {"--use-distributed-optimizer", "--recipe", "bf16_with_nvfp4_mixed"};
  auto with = [&](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const ProcessResult straight2 = run_ranks(2, data_parallel_tiny(6, dist));
  ASSERT_EQ(straight2.exit_code, 0) << straight2.err;
  const ProcessResult straight1 = pl::test::run_process(kApp, data_parallel_tiny(6, dist), 300.0);
  ASSERT_EQ(straight1.exit_code, 0) << straight1.err;

  const std::string s2 = (dir.path() / "from2").string(), s1 = (dir.path() / "from1").string();
  const ProcessResult part2 = run_ranks(2, data_parallel_tiny(6, with(dist, {"--save", s2, "--exit-interval", "3"})));
  ASSERT_EQ(part2.exit_code, 0) << part2.out << part2.err;
  const ProcessResult part1 = pl::test::run_process(kApp, data_parallel_tiny(6, with(dist, {"--save", s1, "--exit-interval", "3"})), 300.0);
  ASSERT_EQ(part1.exit_code, 0) << part1.err;

  // 2 -> 2: the same lines, bit for bit (the printed fields but the timing).
  const ProcessResult resume22 = run_ranks(2, data_parallel_tiny(6, with(dist, {"--load", s2})));
  ASSERT_EQ(resume22.exit_code, 0) << resume22.out << resume22.err;
  EXPECT_EQ(pl::test::iteration_lines(resume22.out, 4), pl::test::iteration_lines(straight2.out, 4));
  // 2 -> 1 and 1 -> 2: a note, then the straight run of that rank count's columns.
  const ProcessResult resume21 = pl::test::run_process(kApp, data_parallel_tiny(6, with(dist, {"--load", s2})), 300.0);
  ASSERT_EQ(resume21.exit_code, 0) << resume21.err;
  EXPECT_NE(resume21.out.find("checkpoint saved by 2 data-parallel ranks, resuming with 1"), std::string::npos)
      << resume21.out;
  const std::vector<IterFields> tail1 = iterations(straight1.out), tail2 = iterations(straight2.out);
  ASSERT_EQ(tail1.size(), 6u);
  ASSERT_EQ(tail2.size(), 6u);
  expect_same_columns(iterations(resume21.out), std::vector<IterFields>(tail1.begin() + 3, tail1.end()), "2 -> 1");
  const ProcessResult resume12 = run_ranks(2, data_parallel_tiny(6, with(dist, {"--load", s1})));
  ASSERT_EQ(resume12.exit_code, 0) << resume12.out << resume12.err;
  expect_same_columns(iterations(resume12.out), std::vector<IterFields>(tail2.begin() + 3, tail2.end()), "1 -> 2");
}

TEST(DataParallelCli, AnErrorOnRankOneOnlyEndsBothRanksWithItsLine) {
  SKIP_WITHOUT_MPI();
  // MPMD: rank 1 alone gets a data path that does not exist (found only when it builds its data).
  std::vector<std::string> a = mpirun_flags();
  a.insert(a.end(), {"-x", "OMP_NUM_THREADS=1", "-np", "1", kApp});
  const std::vector<std::string> common = data_parallel_tiny(3, {"--use-distributed-optimizer"});
  a.insert(a.end(), common.begin(), common.end());
  a.insert(a.end(), {":", "-np", "1", kApp});
  a.insert(a.end(), common.begin(), common.end());
  a.insert(a.end(), {"--data-path", "/nonexistent/corpus_text_document"});
  const auto t0 = std::chrono::steady_clock::now();
  const ProcessResult r = pl::test::run_process(kMpirun, a, 120.0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.timed_out) << "a rank hung:\n" << r.out << r.err;
  EXPECT_LT(secs, 60.0);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("pretrain_llama (rank 1 of 2): error:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/corpus_text_document"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("iteration        1/"), std::string::npos) << r.out;
}

TEST(DataParallelCli, AGlobalBatchTheRanksCannotSplitIsOneLineBeforeAnyWork) {
  SKIP_WITHOUT_MPI();
  std::vector<std::string> args = data_parallel_tiny(2, {});
  const std::string six = "6";  // 6 % (2 x 2) != 0 (a named string: gcc 12 warns a false -Wrestrict on = "6")
  for (size_t i = 0; i + 1 < args.size(); ++i)
    if (args[i] == "--global-batch-size") args[i + 1] = six;
  const ProcessResult r = run_ranks(2, args, 60.0);
  EXPECT_NE(r.exit_code, 0);
  size_t ours = 0;
  for (const std::string& l : pl::test::split_lines(r.err))
    if (l.rfind("pretrain_llama", 0) == 0) {
      ++ours;
      EXPECT_NE(l.find("--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 2 = 4"),
                std::string::npos)
          << l;
    }
  EXPECT_EQ(ours, 1u) << r.err;
  EXPECT_EQ(r.out.find("pretrain_llama | model"), std::string::npos) << r.out;
}

// Real data with validation on 2 ranks: rank 0 builds the GPTDataset index caches while the other waits
// (two ranks building one cache file raced on its temporary), the other loads them; training and
// validation print the 1-rank lines.
TEST(DataParallelCli, RealDataBuildsTheCacheOnceAndValidatesAsOneRank) {
  SKIP_WITHOUT_MPI();
  if (!std::filesystem::is_directory("/usr/share/common-licenses"))
    GTEST_SKIP() << "no /usr/share/common-licenses (Debian's base-files) to build the sample corpus from";
  pl::test::TempDir dir;
  const std::filesystem::path source = std::filesystem::path(PL_CONFIG_DIR).parent_path();
  ::setenv("OUT_DIR", dir.path().c_str(), 1);
  ::setenv("MAX_BYTES", "300000", 1);
  const ProcessResult corpus = pl::test::run_process(
      "/bin/bash", {(source / "scripts/make_sample_corpus.sh").string(), PL_PREPROCESS_DATA_PATH}, 300.0);
  ::unsetenv("OUT_DIR");
  ::unsetenv("MAX_BYTES");
  ASSERT_EQ(corpus.exit_code, 0) << corpus.out << corpus.err;
  const std::string prefix = (dir.path() / "license_byte_text_document").string();
  auto args = [&](const std::string& cache) {
    return std::vector<std::string>{"--model", (source / "configs/models/llama_tiny_bytes.json").string(), "--device",
                                    "cpu", "--threads", "1", "--disable-fp4", "--train-iters", "4",
                                    "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "64",
                                    "--data-path", prefix, "--data-cache-path", cache, "--eval-interval", "2",
                                    "--eval-iters", "1", "--use-distributed-optimizer"};
  };
  const ProcessResult two = run_ranks(2, args((dir.path() / "cache2").string()));
  ASSERT_EQ(two.exit_code, 0) << two.out << two.err;
  EXPECT_EQ(two.out.find("not cached"), std::string::npos) << two.out;
  EXPECT_EQ(count(two.out, "indices built, cached in"), 3u) << two.out;  // train, valid, test: once each
  const ProcessResult one = pl::test::run_process(kApp, args((dir.path() / "cache1").string()), 300.0);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(pl::test::iteration_lines(two.out, 1), pl::test::iteration_lines(one.out, 1));
  const std::regex valid(R"(validation loss at iteration \d+[^|]*\| lm loss value: \S+)");
  std::vector<std::string> v1, v2;
  for (const std::string& l : pl::test::split_lines(one.out))
    if (std::smatch m; std::regex_search(l, m, valid)) v1.push_back(m[0]);
  for (const std::string& l : pl::test::split_lines(two.out))
    if (std::smatch m; std::regex_search(l, m, valid)) v2.push_back(m[0]);
  EXPECT_EQ(v1.size(), 4u) << one.out;  // iterations 2 and 4, then the validation and test sets
  EXPECT_EQ(v2, v1);
}

TEST(DataParallelDryRun, EightRanksOfTheEightBFitAnH100AtMicroBatchOneAndSaySo) {
  const ProcessResult r = pl::test::run_process(
      kApp, {"--model", "llama3_8b", "--dry-run", "--dry-run-world-size", "8", "--use-distributed-optimizer",
             "--micro-batch-size", "1", "--recompute", "full"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dry run for 8 data-parallel ranks"), std::string::npos) << r.out;
  // The optimizer state of one GPU is 1/8 of the whole: 12 bytes per parameter / 8.
  EXPECT_NE(r.out.find("master weights (fp32)                   4.015 GB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fit on one GPU of 8 data-parallel ranks"), std::string::npos) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(\| fit    H100 80GB \(sm_90\) +[0-9.]+ +[0-9.]+  (\S+))"))) << r.out;
  EXPECT_EQ(m[1], "yes") << r.out;
  // Without the flag the ladder's first rung is the distributed optimizer.
  const ProcessResult plain = pl::test::run_process(
      kApp, {"--model", "llama3_8b", "--dry-run", "--dry-run-world-size", "8", "--micro-batch-size", "1"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("--use-distributed-optimizer"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("every GPU holds the whole model and optimizer state"), std::string::npos) << plain.out;
}

}  // namespace
