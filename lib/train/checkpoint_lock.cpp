// SaveDirectoryLock (train/checkpoint.h): --save claimed at start-up, a flock held for the run's life.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "io/fd.h"
#include "train/checkpoint.h"

namespace pl {
namespace fs = std::filesystem;

SaveDirectoryLock::SaveDirectoryLock(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  PL_CHECK(!fs::exists(st) || fs::is_directory(st), "--save {}: exists and is not a directory", dir);
  fs::create_directories(dir, ec);
  PL_CHECK(!ec, "--save {}: cannot create the directory: {}", dir, ec.message());
  const std::string lock = (fs::path(dir) / kLockFile).string();
  fd_ = try_open_fd(lock, O_RDWR | O_CREAT);
  PL_CHECK(fd_.valid(), "--save {}: cannot create files in it ({}: {})", dir, lock, std::strerror(errno));
  if (::flock(fd_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string who(255, '\0');
    who.resize(read_up_to(fd_, who.data(), who.size()));
    if (who.empty()) who = "unknown";
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (err == EWOULDBLOCK)
      fail("--save {}: another run is saving into this directory ({}, holding {}); two runs must not share a --save "
           "directory",
           dir, who, lock);
    fail("--save {}: cannot lock {}: {}", dir, lock, std::strerror(err));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = fmt::format("pid {} on {}\n", ::getpid(), host);
  PL_CHECK(::ftruncate(fd_.get(), 0) == 0, "--save {}: cannot write {}: {}", dir, lock, std::strerror(errno));
  pwrite_all(fd_, me.data(), me.size(), 0);
}

void SaveDirectoryLock::check_free_space(uint64_t bytes) const {
  struct statvfs fs_info {};
  PL_CHECK(::statvfs(dir_.c_str(), &fs_info) == 0, "--save {}: cannot read its file system's free space: {}", dir_,
           std::strerror(errno));
  const double free_bytes = static_cast<double>(fs_info.f_bavail) * static_cast<double>(fs_info.f_frsize);
  PL_CHECK(free_bytes >= static_cast<double>(bytes),
           "--save {}: {:.2f} GB free, one checkpoint needs {:.2f} GB (a save writes the new checkpoint before "
           "--keep-last removes old ones)",
           dir_, free_bytes / 1e9, static_cast<double>(bytes) / 1e9);
}

}  // namespace pl
