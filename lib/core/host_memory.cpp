#include "core/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "core/error.h"

namespace pl {

int64_t peak_resident_bytes() {
  // VmHWM: this program's own high-water mark. getrusage's ru_maxrss would carry over the resident set of the
  // process that forked it (the kernel keeps the larger across exec), e.g. a test harness's.
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmHWM:")) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports kilobytes
}

int64_t host_memory_available_bytes() {
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kb = -1;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    std::fclose(f);
    if (kb >= 0) return static_cast<int64_t>(kb) * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : INT64_MAX;
}

void check_host_memory(int64_t bytes, std::string_view what, std::string_view advice) {
  const int64_t available = host_memory_available_bytes();
  PL_CHECK(bytes <= available, "{} needs {:.2f} GB of host memory, {:.2f} GB is available; {}", what,
           static_cast<double>(bytes) / 1e9, static_cast<double>(available) / 1e9, advice);
}

}  // namespace pl
