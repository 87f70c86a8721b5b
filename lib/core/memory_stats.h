#pragma once
// Allocation figures of one device, in the spirit of torch.cuda.memory_stats(): what the memory log line
// and the run records report. A plain value; the device layer's allocator (backend/device_memory.h) keeps
// and returns them.
#include <cstddef>

namespace pl {

struct MemoryStats {
  size_t allocated = 0;
  size_t max_allocated = 0;
  size_t reserved = 0;
  size_t max_reserved = 0;
  size_t alloc_count = 0;   // live allocations
  size_t total_allocs = 0;  // allocations ever made; the trainer checks it does not move in the loop
};

}  // namespace pl
