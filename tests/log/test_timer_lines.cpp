// Megatron's timers.log block (--timing-log-level) to the character: the header of each
// --timing-log-option and the name padded with '.' to 48 characters, as Megatron-LM's
// megatron/core/timers.py writes them ('{}'.format((name + ' ').ljust(48, '.')), '{:.2f}').
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "core/timers.h"
#include "log/megatron_log.h"

namespace {

using pl::TimerId;
using pl::TimerReading;

std::vector<TimerReading> two() {
  return {{TimerId::ForwardBackward, "forward-backward", 1234.5678},
          {TimerId::OptimizerCopyMainToModelParams, "optimizer-copy-main-to-model-params", 0.004}};
}

TEST(LogTimers, MinMaxIsMegatronsDefaultLayout) {
  const std::vector<std::string> lines = pl::log::timer_lines(two(), "minmax");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "(min, max) time across ranks (ms):");
  // 'forward-backward ' is 17 characters: 31 dots make 48.
  EXPECT_EQ(lines[1], "    forward-backward " + std::string(31, '.') + ": (1234.57, 1234.57)");
  EXPECT_EQ(lines[2], "    optimizer-copy-main-to-model-params " + std::string(12, '.') + ": (0.00, 0.00)");
}

TEST(LogTimers, MaxAndAllOptions) {
  const std::vector<std::string> max = pl::log::timer_lines(two(), "max");
  ASSERT_EQ(max.size(), 3u);
  EXPECT_EQ(max[0], "max time across ranks (ms):");
  EXPECT_EQ(max[1], "    forward-backward " + std::string(31, '.') + ": 1234.57");
  const std::vector<std::string> all = pl::log::timer_lines(two(), "all");
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0], "times across ranks (ms):");
  EXPECT_EQ(all[1], "  forward-backward:");
  EXPECT_EQ(all[2], "     rank  0: 1234.57");
  EXPECT_EQ(all[3], "  optimizer-copy-main-to-model-params:");
  EXPECT_EQ(all[4], "     rank  0: 0.00");
}

TEST(LogTimers, NoTimerNoBlock) {
  // Megatron's timers.log prints nothing when no timer has a value.
  EXPECT_TRUE(pl::log::timer_lines(std::span<const pl::TimerReading>{}, "minmax").empty());
}

TEST(LogTimers, EveryTimerNameFitsMegatronsPaddingAndRegex) {
  // Every name this program has, padded as Megatron pads it, matches the line grammar the
  // trainer and CLI tests parse with.
  const std::regex line(R"(^    ([a-z0-9-]+) \.*: \((\d+\.\d\d), (\d+\.\d\d)\)$)");
  for (size_t i = 0; i < pl::kTimerCount; ++i) {
    const auto id = static_cast<TimerId>(i);
    const std::vector<TimerReading> one = {{id, pl::timer_name(id), 1.0}};
    const std::vector<std::string> lines = pl::log::timer_lines(one, "minmax");
    ASSERT_EQ(lines.size(), 2u);
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[1], m, line)) << lines[1];
    EXPECT_EQ(m[1].str(), pl::timer_name(id));
    EXPECT_EQ(lines[1].find(": ("), 4u + 48u) << lines[1];  // 4 spaces + 48 padded characters
  }
}

}  // namespace

// Data-parallel ranks: min and max over the ranks that ran each timer; "all" lists them in rank order.
TEST(TimerLines, OverRanksMinMaxAndAll) {
  const std::vector<pl::log::TimerOverRanks> t = {{"forward-backward", {{0, 10.0}, {1, 12.5}, {2, 11.0}}},
                                                  {"all-grads-sync", {{0, 3.0}, {1, 1.25}}}};
  const auto mm = pl::log::timer_lines(std::span<const pl::log::TimerOverRanks>(t), "minmax");
  ASSERT_EQ(mm.size(), 3u);
  EXPECT_EQ(mm[1], "    forward-backward ...............................: (10.00, 12.50)");
  EXPECT_EQ(mm[2], "    all-grads-sync .................................: (1.25, 3.00)");
  const auto mx = pl::log::timer_lines(std::span<const pl::log::TimerOverRanks>(t), "max");
  EXPECT_EQ(mx[2], "    all-grads-sync .................................: 3.00");
  const auto all = pl::log::timer_lines(std::span<const pl::log::TimerOverRanks>(t), "all");
  ASSERT_EQ(all.size(), 1u + 4u + 3u);
  EXPECT_EQ(all[4], "     rank  2: 11.00");
  EXPECT_EQ(all[7], "     rank  1: 1.25");
}
