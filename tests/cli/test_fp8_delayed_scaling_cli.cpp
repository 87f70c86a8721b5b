// --recipe bf16_with_fp8_delayed_scaling_mixed end to end on llama_tiny (CPU): a resume continues the
// same amax histories and scales bit for bit (the checkpoints' fp8_delayed_scaling_fp32.bin and the
// loss lines agree with the straight run's), and Megatron's --fp8-amax-history-len /
// --fp8-amax-compute-algo / --fp8-margin are accepted over the recipe or refused with one line.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "test_util.h"
#include "cli/programs.h"

namespace {

using pl::test::ProcessResult;

const std::string kDelayed = "bf16_with_fp8_delayed_scaling_mixed";

std::vector<std::string> delayed_tiny(const std::vector<std::string>& extra, const std::string& iters = "6") {
  std::vector<std::string> a = {"--model", kTiny, "--device", "cpu", "--threads", "2", "--train-iters", iters,
                                "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "64",
                                "--recipe", kDelayed, "--fp8-amax-history-len", "4"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}


// The one error line of a refused run.
void delayed_refused(const std::vector<std::string>& args, const std::string& message) {
  const ProcessResult r = run_app(args);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
}

// History 4 over 6 iterations of 2 micro-batches: the histories have rolled past their length when the
// checkpoint of iteration 3 is taken and again before the end.
TEST(Fp8DelayedScalingCli, ResumeContinuesTheSameScalesBitForBit) {
  pl::test::TempDir dir;
  const std::string straight_dir = (dir.path() / "straight").string(), resumed_dir = (dir.path() / "resumed").string();
  const ProcessResult straight = run_app(delayed_tiny({"--save", straight_dir, "--save-interval", "6"}));
  ASSERT_EQ(straight.exit_code, 0) << straight.err;
  const ProcessResult part1 = run_app(delayed_tiny({"--save", resumed_dir, "--save-interval", "3", "--exit-interval", "3"}));
  ASSERT_EQ(part1.exit_code, 0) << part1.err;
  const ProcessResult part2 = run_app(delayed_tiny({"--load", resumed_dir, "--save", resumed_dir, "--save-interval", "6"}));
  ASSERT_EQ(part2.exit_code, 0) << part2.err;
  const auto expected = pl::test::iteration_lines(straight.out, 4);
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(pl::test::iteration_lines(part2.out, 1), expected);
  const std::string file = "/iter_0000006/fp8_delayed_scaling_fp32.bin";
  const std::string a = pl::test::read_text_file(straight_dir + file), b = pl::test::read_text_file(resumed_dir + file);
  EXPECT_EQ(a.size(), (4u + 1u) * 3u * 8u * 4u);  // (history 4 + scale) x 3 tensors x 8 linears, f32
  EXPECT_TRUE(a == b) << "the resumed run's amax histories and scales differ from the straight run's";
  // A resume with another history length is refused, naming the file and the flag.
  std::vector<std::string> other = delayed_tiny({"--load", resumed_dir});
  other[other.size() - 3] = "8";  // --fp8-amax-history-len 8
  delayed_refused(other, "another --fp8-amax-history-len");
}

TEST(Fp8DelayedScalingCli, FlagsOverrideTheRecipeOrAreRefused) {
  const ProcessResult r = run_app(delayed_tiny({"--fp8-amax-compute-algo", "most_recent", "--fp8-margin", "1", "--dry-run"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fp8 delayed scaling (E4M3 forward, E5M2 gradients; amax history 4, most_recent, margin 1)"),
            std::string::npos)
      << r.out;
  delayed_refused(delayed_tiny({"--fp8-margin", "-1", "--dry-run"}), "--fp8-margin must be in [0, 64], got -1");
  delayed_refused(delayed_tiny({"--fp8-amax-compute-algo", "mean", "--dry-run"}),
                  "--fp8-amax-compute-algo must be max or most_recent, got 'mean'");
  std::vector<std::string> zero = delayed_tiny({});
  zero.back() = "0";  // --fp8-amax-history-len 0
  zero.push_back("--dry-run");
  delayed_refused(zero, "--fp8-amax-history-len must be in [1, 16777216], got 0");
  delayed_refused(
      {"--model", kTiny, "--recipe", "bf16_with_fp8_current_scaling_mixed", "--fp8-margin", "1", "--dry-run"},
      "--fp8-margin applies to FP8 delayed scaling only; recipe 'bf16_with_fp8_current_scaling_mixed' is not");
}

// A checkpoint's manifest.json with `edit` applied to its file list, and a changed file's checksum put right:
// the checkpoint stays self-consistent, so only the rule under test can refuse it.
void edit_manifest(const std::string& iter_dir, const std::function<void(nlohmann::json& files)>& edit) {
  const std::string path = iter_dir + "/manifest.json";
  nlohmann::json m = nlohmann::json::parse(pl::test::read_text_file(path));
  edit(m["files"]);
  std::ofstream(path) << m.dump(2) << "\n";
}

void put_float(const std::string& iter_dir, const std::string& name, int64_t index, float v) {
  const std::string path = iter_dir + "/" + name;
  std::string bytes = pl::test::read_text_file(path);
  std::memcpy(bytes.data() + index * 4, &v, 4);
  std::ofstream(path, std::ios::binary) << bytes;
  edit_manifest(iter_dir, [&](nlohmann::json& files) {
    for (auto& f : files)
      if (f["name"] == name) f["checksum"] = fmt::format("0x{:016x}", pl::checksum64(bytes.data(), bytes.size()));
  });
}

// Loaded state is checked where the run would use it (issue 38): a NaN amax or scale is refused with the file
// and the element (it made every later step NaN), and a delayed-scaling checkpoint that lists no FP8 state is
// refused (it resumed from zeroed histories without a word).
TEST(Fp8DelayedScalingCli, APoisonedOrMissingStateIsRefused) {
  pl::test::TempDir dir;
  const std::string save = (dir.path() / "ck").string(), it = save + "/iter_0000002";
  ASSERT_EQ(run_app(delayed_tiny({"--save", save, "--save-interval", "2"}, "2")).exit_code, 0);
  const std::string file = "fp8_delayed_scaling_fp32.bin";
  const int64_t history = 4 * 3 * 8;  // history 4 x 3 tensors x 8 linears, then the 24 scales
  put_float(it, file, history + 5, std::nanf(""));
  delayed_refused(delayed_tiny({"--load", save}, "3"), file + ": element 101 (scale 5) is nan");
  put_float(it, file, history + 5, 1.0f);
  put_float(it, file, 7, -1.0f);
  delayed_refused(delayed_tiny({"--load", save}, "3"), "element 7 (amax history entry 7) is -1");
  put_float(it, file, 7, 0.0f);
  ASSERT_EQ(run_app(delayed_tiny({"--load", save}, "3")).exit_code, 0);  // put right, it loads
  edit_manifest(it, [&](nlohmann::json& files) {
    for (auto f = files.begin(); f != files.end(); ++f)
      if ((*f)["name"] == file) {
        files.erase(f);
        break;
      }
  });
  delayed_refused(delayed_tiny({"--load", save}, "3"), "saved by an FP8 delayed-scaling recipe (" + kDelayed +
                                                          "), but lists no " + file);
}

}  // namespace
