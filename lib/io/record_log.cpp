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
  // At our own offset: after a cut, the next append starts at the cut, whatever the descriptor's offset says.
  const PartialIo w = pwrite_until_error(fd_, bytes.data(), bytes.size(), whole_);
  if (w.error == 0) {
    whole_ += bytes.size();
    return {};
  }
  // The records wholly written stay; the torn one is cut off.
  const auto kept_end = std::upper_bound(record_ends.begin(), record_ends.end(), w.done);
  const size_t kept = kept_end == record_ends.begin() ? 0 : *(kept_end - 1);
  const bool cut = ::ftruncate(fd_.get(), static_cast<off_t>(whole_ + kept)) == 0;
  std::string why = fmt::format("{}: write failed after {} of {} bytes: {}; ", fd_.path(), w.done, bytes.size(),
                                std::strerror(w.error));
  why += cut ? fmt::format("the file ends after its last whole record ({} bytes)", whole_ + kept)
             : fmt::format("cutting it back to its last whole record failed too: {}", std::strerror(errno));
  if (cut) whole_ += kept;
  return why;
}

}  // namespace pl
