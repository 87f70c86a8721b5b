#pragma once
// What the host can still give this process, for checks made before a large host allocation (the
// dataset indices, issue 14 class 8): refusing with one line beats std::bad_alloc or the OOM killer.
#include <cstdint>
#include <string_view>

namespace pl {

// MemAvailable of /proc/meminfo (the kernel's estimate of memory available without swapping), or the
// free physical pages when that cannot be read.
int64_t host_memory_available_bytes();

// A one-line pl::Error when `bytes` exceed the available host memory: "<what> needs X GB of host
// memory, Y GB is available; <advice>".
void check_host_memory(int64_t bytes, std::string_view what, std::string_view advice);

// The most host memory this program has had resident so far (/proc/self/status VmHWM; getrusage's ru_maxrss where
// that cannot be read), in bytes.
int64_t peak_resident_bytes();

}  // namespace pl
