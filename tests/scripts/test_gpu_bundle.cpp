// scripts/gpu_bundle.sh and scripts/gpu_check.sh on the build machine (no GPU needed):
//   - the bundle, assembled with --no-build from this test binary's own build directory, holds the
//     programs a GPU run uses (pretrain_llama, bench_kernels, pl_tests), the data tools, configs and gpu_check.sh, is under 48 MiB, and every bundled binary's `ldd`
//     under the bundle's library path resolves every library inside the bundle, except NVIDIA's and
//     glibc's;
//   - gpu_check.sh without a GPU prints one line and exits 3; with a GPU that a fake nvidia-smi
//     claims, it prints its time estimate, runs the library smoke test, which finds no device, and stops
//     there with the ✗ line; told to go on (GPU_CHECK_PAST_SMOKE=1), it runs the bundle's conformance
//     suite, which skips, and fails saying so;
//   - the training table's GEMMs column reads the "gemms" of the start line pretrain_llama's --log-jsonl writes.
#include <sys/stat.h>

#include <algorithm>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "test_util.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/gemm.h"
#include "backend/device_info.h"
#include "observe/jsonl_log.h"
#endif

namespace {

namespace fs = std::filesystem;
using pl::test::ProcessResult;
using pl::test::run_process;
using pl::test::split_lines;
using pl::test::TempDir;

const fs::path kSourceDir = fs::path(PL_CONFIG_DIR).parent_path();
const fs::path kBuildDir = fs::path(PL_APP_PATH).parent_path().parent_path();  // <build>/apps/pretrain_llama

// Runs a bash command line in the source directory.
ProcessResult bash(const std::string& cmd, double timeout_s = 300.0) {
  return run_process("/bin/bash", {"-c", "cd '" + kSourceDir.string() + "' && " + cmd}, timeout_s);
}

bool have_tool(const std::string& name) { return bash("command -v " + name + " >/dev/null").exit_code == 0; }

bool gpu_present() {
  return bash("nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]' || compgen -G '/dev/nvidia[0-9]*' >/dev/null")
             .exit_code == 0;
}

uint64_t tree_bytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && !e.is_symlink()) n += e.file_size();
  return n;
}

// The bytes of oneDNN's library in the bundle's lib/ (gzipped or not): present when the bundled build links
// oneDNN, which gpu_bundle.sh's own build does not (-DPL_ONEDNN=OFF).
uint64_t onednn_bytes(const fs::path& bundle) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(bundle / "lib"))
    if (e.is_regular_file() && !e.is_symlink() && e.path().filename().string().rfind("libdnnl", 0) == 0)
      n += e.file_size();
  return n;
}

// NVIDIA's libraries come from the GPU machine; glibc's from its system. Everything else must be in
// the bundle. (The same lists as scripts/gpu_bundle.sh, written out again so that a change there
// must be a change here too.)
const std::regex kNvidia(
    R"(^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvrtc[a-z_-]*|libnvJitLink|libnvidia-[a-z-]+|libcufft|libcurand|libcusolver|libcusparse|libcupti|libnvToolsExt)\.so.*)");
const std::regex kGlibc(R"(^(linux-vdso|ld-linux[a-z0-9_-]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libmvec)\.so.*)");

// One bundle for the whole suite: assembling it strips pl_tests (tens of MB), which takes a while.
class GpuBundle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
#if !defined(PL_WITH_CUDA)
    skip_reason_ = "this build has no CUDA backend: there is nothing to bundle";
    return;
#endif
    for (const char* tool : {"ldd", "strip", "du", "awk", "gzip", "gunzip", "readelf", "find", "xargs"})
      if (!have_tool(tool)) {
        skip_reason_ = std::string("no '") + tool + "' on this machine";
        return;
      }
    dir_ = new TempDir();
    bundle_ = dir_->path() / "bundle";
    // --max-mib 1024: the test checks the size itself, and says what it measured.
    result_ = new ProcessResult(bash("scripts/gpu_bundle.sh --no-build --build-dir '" + kBuildDir.string() +
                                     "' --out '" + bundle_.string() + "' --max-mib 1024"));
  }
  static void TearDownTestSuite() {
    delete result_;
    delete dir_;
    result_ = nullptr;
    dir_ = nullptr;
  }
  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    ASSERT_EQ(result_->exit_code, 0) << result_->out << result_->err;
  }

  static inline std::string skip_reason_;
  static inline TempDir* dir_ = nullptr;
  static inline fs::path bundle_;
  static inline ProcessResult* result_ = nullptr;
};

// What the bundle holds, what its programs load, and its size. The size limit (48 MiB: what the device
// tool carries beside the working tree) is for the bundle gpu_bundle.sh makes by default, for sm_90a
// only. The bundle checked here is assembled from this test's own build, with whatever architectures
// it was configured for (CI: the default list, six architectures and PTX), so it holds the same files
// with more device code: under 48 MiB here means under 48 MiB for sm_90a alone. The test names the
// architectures it measured. gpu_bundle.sh's own build leaves oneDNN out (-DPL_ONEDNN=OFF: libdnnl is 11 MB
// gzipped); a test build that links it (CI's) bundles libdnnl so that its programs still load, and the limit
// is checked without that library.
TEST_F(GpuBundle, HoldsEverythingItsProgramsLoadExceptNvidiasLibrariesAndIsUnder48MiB) {
  for (const char* f : {"bin/pretrain_llama", "bin/pl_tests", "bin/inspect_data", "bin/preprocess_data",
                        "bin/bench_kernels"})
    EXPECT_TRUE(fs::is_regular_file(bundle_ / f) || fs::is_regular_file(bundle_ / (std::string(f) + ".gz")))
        << f << " (or " << f << ".gz) missing";
  for (const char* f : {"scripts/gpu_check.sh", "scripts/gpu_8b_fit.sh", "configs/models/llama3_8b.json",
                        "configs/recipes/bf16_with_nvfp4_mixed.json"})
    EXPECT_TRUE(fs::is_regular_file(bundle_ / f)) << f;
  const std::string info = pl::test::read_text_file((bundle_ / "BUILD_INFO").string());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(info, m, std::regex("cuda_architectures: (.*)"))) << info;
  const std::string archs = m[1];
  EXPECT_NE(info.find("test_config_dir: " + (kSourceDir / "configs").string()), std::string::npos) << info;

  // Size: what the script printed is what is on disk, and it is under the limit.
  const double mib = static_cast<double>(tree_bytes(bundle_)) / 1048576.0;
  ASSERT_TRUE(std::regex_search(result_->out, m, std::regex(R"(: ([0-9.]+) MiB \(CUDA architectures ([^)]*)\))")))
      << result_->out;
  // The script prints `du -sb` (file bytes plus a few KiB of directory entries) rounded to 0.1 MiB;
  // tree_bytes counts file bytes only.
  EXPECT_NEAR(std::stod(m[1]), mib, 0.15);
  EXPECT_EQ(m[2], archs);
  const double onednn_mib = static_cast<double>(onednn_bytes(bundle_)) / 1048576.0;
  EXPECT_LT(mib - onednn_mib, 48.0) << "the bundle of this build (CUDA architectures " << archs << ") is " << mib
                                    << " MiB, " << onednn_mib << " MiB of it oneDNN";
  std::printf("bundle of this build (CUDA architectures %s): %.1f MiB (oneDNN %.1f MiB of it)\n", archs.c_str(), mib,
              onednn_mib);

  // Unpacked (gpu_check.sh --unpack: no GPU needed), every program resolves every library inside the
  // bundle, NVIDIA's (from the GPU machine) and glibc's (its system) aside, with nothing but the
  // bundle's folders on LD_LIBRARY_PATH.
  TempDir rt_dir;
  const fs::path rt = rt_dir.path() / "rt";
  const ProcessResult u = bash("scripts/gpu_check.sh --bundle '" + bundle_.string() + "' --unpack '" + rt.string() + "'", 120);
  ASSERT_EQ(u.exit_code, 0) << u.out << u.err;
  EXPECT_TRUE(fs::is_regular_file(rt / "env.sh"));
  const std::string libpath = (rt / "lib").string() + ":" + (rt / "lib" / "compat").string();
  int in_bundle = 0, binaries = 0;
  for (const auto& e : fs::directory_iterator(rt / "bin")) {
    ++binaries;
    // Stripped: no symbol table left.
    const ProcessResult sym = bash("LC_ALL=C readelf -SW '" + e.path().string() + "' | grep -c '\\.symtab'");
    EXPECT_EQ(sym.out, "0\n") << e.path().filename() << " still has a .symtab";
    const ProcessResult r = bash("LD_LIBRARY_PATH='" + libpath + "' ldd '" + e.path().string() + "'", 60);
    ASSERT_EQ(r.exit_code, 0) << e.path() << ": " << r.err;
    for (const std::string& line : split_lines(r.out)) {
      static const std::regex kLine(R"(^\s*(\S+)\s+=>\s+(.*?)(\s+\(0x[0-9a-f]+\))?\s*$)");
      if (!std::regex_match(line, m, kLine)) continue;  // linux-vdso, the loader itself
      const std::string name = m[1], where = m[2];
      if (std::regex_match(name, kNvidia)) continue;  // found or not: the GPU machine provides it
      ASSERT_NE(where, "not found") << e.path().filename() << " needs " << name << ", which is not in the bundle";
      if (std::regex_match(name, kGlibc)) continue;
      EXPECT_TRUE(where.starts_with((rt / "lib").string() + "/"))
          << e.path().filename() << ": " << name << " resolves to " << where << ", outside the bundle";
      ++in_bundle;
    }
  }
  EXPECT_EQ(binaries, 5);  // pretrain_llama, bench_kernels, inspect_data, preprocess_data, pl_tests
  // spdlog, fmt, OpenBLAS, gfortran, gomp, libstdc++, ... for five programs: the check above saw them.
  EXPECT_GE(in_bundle, 5 * 3);
}

// A fake nvidia-smi in a fresh directory: `mode` none prints "No devices were found" and fails (a
// driver without a GPU); gpu claims one H100.
std::string fake_nvidia_smi(const TempDir& dir, const std::string& mode) {
  const std::string path = dir.write(
      "nvidia-smi", mode == "none" ? "#!/bin/sh\necho 'No devices were found'\nexit 6\n"
                                   : "#!/bin/sh\ncase \"$*\" in\n"
                                     "  *-L*) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fake)' ;;\n"
                                     "  *--query-gpu=compute_cap\\ *) echo 9.0 ;;\n"
                                     "  *) echo 'NVIDIA H100 80GB HBM3, 9.0, 580.00.00, 81559 MiB' ;;\n"
                                     "esac\n");
  ::chmod(path.c_str(), 0755);
  return dir.path().string();
}

TEST(GpuCheck, WithoutAGpuPrintsOneLineAndExits3) {
  if (gpu_present()) GTEST_SKIP() << "this machine has a GPU: gpu_check.sh would run for real";
  // Neither nvidia-smi nor /dev/nvidia*: PATH without any nvidia-smi.
  TempDir empty;
  ProcessResult r = bash("PATH='" + empty.path().string() + ":/usr/bin:/bin' scripts/gpu_check.sh", 60);
  std::vector<std::string> lines = split_lines(r.out + r.err);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
  EXPECT_EQ(lines[0], "gpu_check: no GPU is present (nvidia-smi not found, no /dev/nvidia*): nothing to check");
  // A driver without a device: nvidia-smi fails with "No devices were found".
  TempDir bin;
  r = bash("PATH='" + fake_nvidia_smi(bin, "none") + ":/usr/bin:/bin' scripts/gpu_check.sh --sync", 60);
  lines = split_lines(r.out + r.err);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  ASSERT_EQ(lines.size(), 1u) << r.out << r.err;
  EXPECT_EQ(lines[0], "gpu_check: no GPU is present (nvidia-smi lists none: No devices were found): nothing to check");
  // Bad arguments come first, with exit status 2.
  r = bash("scripts/gpu_check.sh --frobnicate", 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

// With a GPU that is not there (a fake nvidia-smi), the bundle's gpu_check.sh prints its time estimate,
// resolves the libraries as one set, and runs the library smoke test, which finds no device: it stops
// there, exit 1, with the ✗ line. Told to go on (GPU_CHECK_PAST_SMOKE=1), it gets as far as the
// conformance suite: one line per Cuda* test (all skipped: no device), and a failure saying that no test
// ran on the GPU; the report and the logs land in $OUT.
TEST_F(GpuBundle, GpuCheckFromTheBundleRunsTheConformanceSuiteAndFailsWhenEveryTestSkips) {
  if (gpu_present()) GTEST_SKIP() << "this machine has a GPU: gpu_check.sh would run for real";
  TempDir bin, out;
  const std::string check = "PATH='" + fake_nvidia_smi(bin, "gpu") + ":/usr/bin:/bin' OUT='" + out.path().string() +
                            "' '" + (bundle_ / "scripts/gpu_check.sh").string() + "' --only conformance";
  const ProcessResult stop = bash(check, 120);
  const std::string stopped = stop.out + stop.err;
  EXPECT_EQ(stop.exit_code, 1) << stopped;
  EXPECT_NE(stopped.find("== time estimate (as measured on an H200, 2026-11-28"), std::string::npos) << stopped;
  EXPECT_TRUE(std::regex_search(stopped, std::regex(R"(--only conformance ~\d+ s, --only training ~\d+ s)"))) << stopped;
  EXPECT_NE(stopped.find("library set: "), std::string::npos) << stopped;
  EXPECT_NE(stopped.find("  ✗ no CUDA device ("), std::string::npos) << stopped;
  EXPECT_NE(stopped.find("FAILED: library smoke test: ✗ no CUDA device ("), std::string::npos) << stopped;
  EXPECT_EQ(stopped.find("== conformance"), std::string::npos) << "went on after a failed smoke test:\n" << stopped;

  const ProcessResult r = bash("GPU_CHECK_PAST_SMOKE=1 " + check, 240);
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 1) << all;
  EXPECT_NE(all.find("GPU: NVIDIA H100 80GB HBM3, 9.0"), std::string::npos) << all;
  EXPECT_NE(all.find("bundle: " + bundle_.string()), std::string::npos) << all;
  EXPECT_NE(all.find("cuBLASLt 13."), std::string::npos) << "library versions missing:\n" << all;
  EXPECT_NE(all.find("cuDNN 9."), std::string::npos) << all;
  EXPECT_NE(all.find("Cuda/Optimizer.AdamWMatchesHandComputedStep/0"), std::string::npos) << all;
  EXPECT_NE(all.find("devices: none"), std::string::npos) << all;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all, m, std::regex(R"(FAILED: conformance: (\d+) conformance tests did not run on the GPU: no CUDA device)")))
      << all;
  EXPECT_GE(std::stoi(m[1]), 20);
  ASSERT_TRUE(std::regex_search(all, m, std::regex(R"(total: .*\b(\d+) SKIPPED)"))) << all;
  EXPECT_GE(std::stoi(m[1]), 20);
  EXPECT_NE(all.find("SKIPPED  (no CUDA device: "), std::string::npos) << all;
  const std::string report = pl::test::read_text_file((out.path() / "gpu_check.txt").string());
  EXPECT_NE(report.find("conformance tests did not run on the GPU"), std::string::npos) << report;
  EXPECT_TRUE(fs::is_regular_file(out.path() / "gpu_check_logs.tar.gz"));
}

// The bundle's gpu_8b_fit.sh with a fake H100: the fit table's flags for it (the CPU optimizer offload)
// and the plan's totals reach the report; the 8B run itself then fails (no device), exit 1, one line.
TEST_F(GpuBundle, Gpu8bFitPicksTheFitTablesFlagsForTheGpuAndReportsTheRun) {
  if (gpu_present()) GTEST_SKIP() << "this machine has a GPU: gpu_8b_fit.sh would run for real";
  TempDir bin, out;
  const ProcessResult r = bash("PATH='" + fake_nvidia_smi(bin, "gpu") + ":/usr/bin:/bin' OUT='" + out.path().string() +
                                   "' '" + (bundle_ / "scripts/gpu_8b_fit.sh").string() + "' --iters 2",
                               240);
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.exit_code, 1) << all;
  const std::string report = pl::test::read_text_file((out.path() / "gpu_8b_fit.txt").string());
  EXPECT_NE(report.find("(fit table: h100)"), std::string::npos) << report;
  EXPECT_NE(report.find("cheapest flags for H100 80GB"), std::string::npos) << report;
  EXPECT_NE(report.find("run: pretrain_llama --device cuda --model llama3_8b --micro-batch-size 1 --seq-length 4096 --global-batch-size 8  "
                        "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16 "
                        "--optimizer-cpu-offload --train-iters 2"),
            std::string::npos)
      << report;
  EXPECT_TRUE(std::regex_search(report, std::regex(R"(plan: total on the GPU +[0-9.]+ GB)"))) << report;
  EXPECT_TRUE(std::regex_search(report, std::regex(R"(plan: total on the host +[0-9.]+ GB)"))) << report;
  EXPECT_NE(report.find("FAILED (rc "), std::string::npos) << report;
  EXPECT_TRUE(fs::is_regular_file(out.path() / "gpu_8b_fit.log"));
  // Without any GPU: one line, exit 3.
  TempDir empty;
  const ProcessResult none = bash("PATH='" + fake_nvidia_smi(empty, "none") + ":/usr/bin:/bin' '" +
                                  (bundle_ / "scripts/gpu_8b_fit.sh").string() + "'", 60);
  EXPECT_EQ(none.exit_code, 3) << none.out << none.err;
  EXPECT_EQ(split_lines(none.out + none.err).size(), 1u) << none.out << none.err;
}

// The training table's GEMMs column (gpu_check.sh --gemm-mode, which reads the start line of the run's
// --log-jsonl) on the very "gemms" the program writes there (observe/jsonl_log.h gemms_json of
// backend/device_info.h gpu_gemm_paths), on a GPU where the quantized formats are emulated (sm_90) and one
// where they are native (sm_100): a start line worded otherwise than the column expects reads "?" and fails
// here. Needs no GPU.
TEST(GpuCheck, GemmsColumnReadsTheJsonLinesStartEvent) {
#if defined(PL_WITH_CUDA)
  TempDir dir;
  const std::vector<pl::QuantFormat> all{pl::QuantFormat::FP8_E4M3, pl::QuantFormat::MXFP8, pl::QuantFormat::NVFP4};
  for (int sm : {90, 100}) {
    const nlohmann::ordered_json start{{"event", "start"}, {"schema_version", 1},
                                       {"gemms", pl::observe::gemms_json(pl::gpu_gemm_paths(all, sm))}};
    const std::string path = dir.write("run_sm" + std::to_string(sm) + ".jsonl", start.dump() + "\n");
    const auto mode = [&](pl::QuantFormat f) {
      return pl::cuda::quantized_gemm_execution(f, sm) == pl::cuda::GemmExecution::Native ? "native\n" : "emulated\n";
    };
    const std::pair<const char*, std::string> want[] = {{"BF16", "native\n"},
                                                        {"FP8", mode(pl::QuantFormat::FP8_E4M3)},
                                                        {"MXFP8", mode(pl::QuantFormat::MXFP8)},
                                                        {"NVFP4", mode(pl::QuantFormat::NVFP4)}};
    for (const auto& [format, expected] : want) {
      const ProcessResult r = bash(std::string("scripts/gpu_check.sh --gemm-mode ") + format + " '" + path + "'", 30);
      EXPECT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(r.out, expected) << format << " on sm_" << sm << " from:\n" << start.dump();
    }
  }
  // Both words occur: sm_90 emulates MXFP8 and NVFP4 and runs FP8 natively, sm_100 runs all natively.
  EXPECT_EQ(pl::cuda::quantized_gemm_execution(pl::QuantFormat::MXFP8, 90), pl::cuda::GemmExecution::Emulated);
  EXPECT_EQ(pl::cuda::quantized_gemm_execution(pl::QuantFormat::FP8_E4M3, 90), pl::cuda::GemmExecution::Native);
  // The test switch that forces the emulated path is what the start line says too.
  for (const pl::GemmPath& p : pl::gpu_gemm_paths(all, 100, true)) EXPECT_EQ(p.native, p.format == "bf16") << p.format;
  // A start line without the format (a BF16 run) reads "?".
  const nlohmann::ordered_json bf16_run{{"event", "start"}, {"schema_version", 1},
                                        {"gemms", pl::observe::gemms_json(pl::gpu_gemm_paths({}, 90))}};
  const ProcessResult none =
      bash("scripts/gpu_check.sh --gemm-mode FP8 '" + dir.write("bf16.jsonl", bf16_run.dump() + "\n") + "'", 30);
  EXPECT_EQ(none.out, "?\n") << none.err;
#else
  GTEST_SKIP() << "this build has no CUDA backend: the GPU's GEMM paths are the CUDA backend's";
#endif
}

}  // namespace
