// The Megatron-Bridge log lines to the character (SPEC-MEGATRON §1a), and the Python float
// formatting that the memory line relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "log/megatron_log.h"

namespace {

using pl::log::IntervalRecord;

// The spec's illustrative iteration-1 line of the playbook run.
IntervalRecord spec_example() {
  IntervalRecord f;
  f.iteration = 1;
  f.train_iters = 50;
  f.consumed_samples = 64;
  f.seconds_per_iteration = 12.3456;
  f.learning_rate = 1.5e-4;
  f.global_batch_size = 64;
  f.lm_loss = 11.76543;
  f.loss_scale = 1.0;
  f.grad_norm = 12.345;
  f.skipped_iterations = 0;
  f.nan_iterations = 0;
  return f;
}

const char* const kSpecExampleAfterTimestamp =
    " iteration        1/      50 | consumed samples:           64 | elapsed time per iteration (ms): 12345.6 |"
    " learning rate: 1.500000E-04 | global batch size:    64 | lm loss: 1.176543E+01 | loss scale: 1.0 |"
    " grad norm: 12.345 | number of skipped iterations:   0 | number of nan iterations:   0 |";

TEST(LogIteration, SpecExampleToTheCharacter) {
  const std::string line = pl::log::iteration_line(spec_example(), "2026-05-26 18:00:00");
  EXPECT_EQ(line, std::string(" [2026-05-26 18:00:00]") + kSpecExampleAfterTimestamp);
}

TEST(LogIteration, StartsWithBracketedTimestamp) {
  const std::string ts = pl::log::now_timestamp();
  EXPECT_TRUE(std::regex_match(ts, std::regex(R"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})"))) << ts;
  const std::string line = pl::log::iteration_line(spec_example(), ts);
  EXPECT_TRUE(std::regex_search(line, std::regex(R"(^ \[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] iteration )")))
      << line;
  // Everything after the timestamp is the spec's text.
  const std::string tail = line.substr(line.find(']') + 1);
  EXPECT_EQ(tail, kSpecExampleAfterTimestamp);
}

TEST(LogIteration, AbsentLossOmitsTheField) {
  IntervalRecord f = spec_example();
  f.lm_loss.reset();
  f.skipped_iterations = 1;
  const std::string line = pl::log::iteration_line(f, "2026-05-26 18:00:00");
  EXPECT_EQ(line.find("lm loss"), std::string::npos) << line;
  EXPECT_NE(line.find(" global batch size:    64 | loss scale: 1.0 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" number of skipped iterations:   1 |"), std::string::npos) << line;
}

// A skipped step has no gradient norm: the record holds NaN, printed as Python's format prints a nan.
TEST(LogIteration, SkippedStepPrintsItsNanGradNorm) {
  IntervalRecord f = spec_example();
  f.grad_norm = std::nan("");
  const std::string line = pl::log::iteration_line(f, "2026-05-26 18:00:00");
  EXPECT_NE(line.find(" loss scale: 1.0 | grad norm: nan | number of skipped iterations:   0 |"), std::string::npos)
      << line;
}

TEST(LogIteration, WideFieldsAndLaterIterations) {
  IntervalRecord f = spec_example();
  f.iteration = 50;
  f.consumed_samples = 3200;
  f.seconds_per_iteration = 5.39004;
  f.learning_rate = 3e-5;
  f.lm_loss = 0.0123456789;
  f.grad_norm = 0.5;
  f.nan_iterations = 12;
  const std::string line = pl::log::iteration_line(f, "2026-05-26 18:00:00");
  EXPECT_NE(line.find(" iteration       50/      50 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" consumed samples:         3200 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" elapsed time per iteration (ms): 5390.0 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" learning rate: 3.000000E-05 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" lm loss: 1.234568E-02 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" grad norm: 0.500 |"), std::string::npos) << line;
  EXPECT_NE(line.find(" number of nan iterations:  12 |"), std::string::npos) << line;
}

TEST(LogStepTime, PlaybookExample) {
  EXPECT_EQ(pl::log::step_time_line(5.39, 2346.6), "Step Time : 5.39s GPU utilization: 2346.6MODEL_TFLOP/s/GPU");
  EXPECT_EQ(pl::log::step_time_line(9.054, 1397.64), "Step Time : 9.05s GPU utilization: 1397.6MODEL_TFLOP/s/GPU");
}

TEST(LogPythonRepr, MatchesPythonFloatRepr) {
  using pl::log::python_float_repr;
  EXPECT_EQ(python_float_repr(45.123), "45.123");
  EXPECT_EQ(python_float_repr(12.0), "12.0");
  EXPECT_EQ(python_float_repr(0.0), "0.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(1e-05), "1e-05");
  EXPECT_EQ(python_float_repr(1.5e-07), "1.5e-07");
  EXPECT_EQ(python_float_repr(123456789.0), "123456789.0");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(0.1 + 0.2), "0.30000000000000004");
  // More of Python's layout switches.
  EXPECT_EQ(python_float_repr(1e15), "1000000000000000.0");
  EXPECT_EQ(python_float_repr(1.2345e16), "1.2345e+16");
  EXPECT_EQ(python_float_repr(0.00012), "0.00012");
  EXPECT_EQ(python_float_repr(-2.5), "-2.5");
  EXPECT_EQ(python_float_repr(1e100), "1e+100");
  EXPECT_EQ(python_float_repr(-0.0), "-0.0");
}

TEST(LogPythonRepr, Round5MatchesPython) {
  using pl::log::python_round5_repr;
  EXPECT_EQ(python_round5_repr(45.1234567), "45.123");
  EXPECT_EQ(python_round5_repr(0.0295594), "0.029559");
  EXPECT_EQ(python_round5_repr(1234567.0), "1234600.0");
  EXPECT_EQ(python_round5_repr(12.0), "12.0");
  EXPECT_EQ(python_round5_repr(0.0), "0.0");
}

// Splits "[Rank 0] (after 1 iterations) memory (GB) | k: v | k: v" into its keys and values.
std::vector<std::pair<std::string, std::string>> memory_fields(const std::string& line) {
  std::vector<std::pair<std::string, std::string>> kv;
  size_t pos = line.find(" | ");
  while (pos != std::string::npos) {
    const size_t next = line.find(" | ", pos + 3);
    const std::string field = line.substr(pos + 3, next == std::string::npos ? std::string::npos : next - pos - 3);
    const size_t colon = field.find(": ");
    kv.emplace_back(field.substr(0, colon), colon == std::string::npos ? "" : field.substr(colon + 2));
    pos = next;
  }
  return kv;
}

TEST(LogMemory, KeysInBridgeOrder) {
  pl::MemoryStats s;
  s.allocated = 45'123'456'789;
  s.max_allocated = 50'000'000'000;
  s.reserved = 45'123'456'789;
  s.max_reserved = 51'234'567'890;
  s.alloc_count = 321;
  const std::string line = pl::log::memory_line(0, 1, s);
  EXPECT_EQ(line.rfind("[Rank 0] (after 1 iterations) memory (GB) | ", 0), 0u) << line;
  const std::vector<std::string> kMemoryKeys = {
      "mem-allocated-gigabytes",     "mem-active-gigabytes",     "mem-inactive-gigabytes",
      "mem-reserved-gigabytes",      "mem-max-allocated-gigabytes", "mem-max-active-gigabytes",
      "mem-max-inactive-gigabytes",  "mem-max-reserved-gigabytes", "mem-alloc-retires",
      "mem-allocated-count"};
  const auto kv = memory_fields(line);
  ASSERT_EQ(kv.size(), kMemoryKeys.size()) << line;
  for (size_t i = 0; i < kv.size(); ++i) EXPECT_EQ(kv[i].first, kMemoryKeys[i]) << line;
  EXPECT_EQ(kv[0].second, "45.123");        // bytes / 1e9, 5 significant digits, Python repr
  EXPECT_EQ(kv[4].second, "50.0");
  EXPECT_EQ(kv[7].second, "51.235");
  EXPECT_EQ(kv[9].second, "321");
}

TEST(LogMemory, FinalLine) {
  pl::MemoryStats s;
  s.reserved = 207'812'345'678;
  s.max_reserved = 208'000'000'000;
  s.max_allocated = 199'999'600'000;
  EXPECT_EQ(pl::log::final_memory_line(s),
            "FINAL mem-reserved-gigabytes: 207.812 | mem-max-reserved-gigabytes: 208.000 | "
            "mem-max-allocated-gigabytes: 200.000");
}

}  // namespace

// Megatron's checkpoint lines (checkpointing.py), padded iteration fields and the appended figures.
TEST(MegatronLog, CheckpointLines) {
  namespace lg = pl::log;
  EXPECT_EQ(lg::saving_checkpoint_line(10, "ck"), "saving checkpoint at iteration      10 to ck in pl_flat format");
  EXPECT_EQ(lg::saved_checkpoint_line(1234567, "ck", "ck/iter_1234567", 2.5e9, 2.0),
            "  successfully saved checkpoint from iteration 1234567 to ck (ck/iter_1234567: 2.500 GB in 2.00 s, 1.25 GB/s)");
  EXPECT_EQ(lg::loading_checkpoint_line("ck", 10), " loading checkpoint from ck at iteration 10");
  EXPECT_EQ(lg::loaded_checkpoint_line("ck", 10, "ck/iter_0000010", 1e9, 0.0),
            "  successfully loaded checkpoint from ck [ t 1/1, p 1/1 ] at iteration 10 (ck/iter_0000010: 1.000 GB "
            "verified and read in 0.00 s, 1000000000.00 GB/s)");
  const auto none = lg::no_checkpoint_lines("ck", "latest_checkpointed_iteration.txt");
  EXPECT_EQ(none[0], "WARNING: could not find the metadata file ck/latest_checkpointed_iteration.txt");
  EXPECT_EQ(none[1], "    will not load any checkpoints and will start from random");
}
