#pragma once
// Megatron's timers over the data-parallel ranks: each rank's readings of an interval gathered at the last rank,
// which prints them (Megatron's Timers.log: the min and max, or every rank's value, per timer).
#include <span>
#include <vector>

#include "core/timers.h"
#include "log/run_records.h"
#include "parallel/world.h"

namespace pl {

// Every rank's readings at the last rank, in TimerId order, as one rank prints them; the other ranks get none.
// A collective: every rank calls it.
std::vector<log::TimerOverRanks> gather_timers(const parallel::World& world, std::span<const TimerReading> mine);

}  // namespace pl
