#include "train/rank_timers.h"

#include <bit>
#include <cstdint>

namespace pl {

// (timer id, ms bits) pairs gathered from every rank, then regrouped by timer.
std::vector<log::TimerOverRanks> gather_timers(const parallel::World& world, std::span<const TimerReading> mine) {
  std::vector<uint64_t> pairs;
  for (const TimerReading& t : mine) pairs.insert(pairs.end(), {static_cast<uint64_t>(t.id), std::bit_cast<uint64_t>(t.ms)});
  const std::vector<uint64_t> counts = world.gather(std::vector<uint64_t>{pairs.size()}, world.size() - 1);
  const std::vector<uint64_t> all = world.gather(pairs, world.size() - 1);
  std::vector<log::TimerOverRanks> by_id(kTimerCount);
  size_t at = 0;
  for (size_t rank = 0; rank < counts.size(); ++rank)
    for (uint64_t k = 0; k < counts[rank]; k += 2, at += 2)
      by_id[static_cast<size_t>(all[at])].rank_ms.emplace_back(static_cast<int>(rank), std::bit_cast<double>(all[at + 1]));
  std::vector<log::TimerOverRanks> out;
  for (size_t id = 0; id < kTimerCount; ++id)
    if (!by_id[id].rank_ms.empty()) out.push_back({timer_name(static_cast<TimerId>(id)), std::move(by_id[id].rank_ms)});
  return out;
}

}  // namespace pl
