#pragma once
// The tally of the multi-rank test tools (dist_check, dp_train_check): each failed check prints one
// line naming the tool and the rank; main() ends with any() over the ranks.
#include <cstdio>
#include <string>

namespace pl::test {

struct RankChecks {
  const char* tool = "";
  int rank = 0, failures = 0, checks = 0;
  void expect(bool ok, const std::string& what) {
    ++checks;
    if (ok) return;
    ++failures;
    std::printf("%s: rank %d: FAILED %s\n", tool, rank, what.c_str());
    std::fflush(stdout);
  }
};

}  // namespace pl::test
