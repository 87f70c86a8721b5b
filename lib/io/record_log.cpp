#include "io/record_log.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace pl {

RecordLog::RecordLog(UniqueFd fd) : fd_(std::move(fd)) { whole_ = file_size(fd_); }

std::string RecordLog::append(std::string_view bytes, std::span<const size_t> record_ends) {
  if (!fd_.valid()) return "the file is not open";
  size_t done = 0;
  while (done < bytes.size()) {
    // pwrite at our own offset: after a cut, the next append starts at the cut, whatever the fd's offset says.
    const ssize_t n = ::pwrite(fd_.get(), bytes.data() + done, bytes.size() - done, static_cast<off_t>(whole_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n < 0 ? errno : ENOSPC;
    // The records wholly written stay; the torn one is cut off.
    const auto kept_end = std::upper_bound(record_ends.begin(), record_ends.end(), done);
    const size_t kept = kept_end == record_ends.begin() ? 0 : *(kept_end - 1);
    const bool cut = ::ftruncate(fd_.get(), static_cast<off_t>(whole_ + kept)) == 0;
    std::string why = fmt::format("{}: write failed after {} of {} bytes: {}; ", fd_.path(), done, bytes.size(),
                                  std::strerror(err));
    why += cut ? fmt::format("the file ends after its last whole record ({} bytes)", whole_ + kept)
               : fmt::format("cutting it back to its last whole record failed too: {}", std::strerror(errno));
    if (cut) whole_ += kept;
    return why;
  }
  whole_ += bytes.size();
  return {};
}

}  // namespace pl
