#include "io/fd.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace pl {
namespace fs = std::filesystem;

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
    path_ = std::move(o.path_);
  }
  return *this;
}

void UniqueFd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void UniqueFd::close() {
  if (fd_ < 0) return;
  const int fd = release();
  PL_CHECK(::close(fd) == 0, "{}: cannot close: {}", path_, std::strerror(errno));
}

UniqueFd try_open_fd(const std::string& path, int flags, mode_t mode) {
  int fd;
  do fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  while (fd < 0 && errno == EINTR);
  return UniqueFd(fd, path);
}

UniqueFd open_fd(const std::string& path, int flags, mode_t mode) {
  UniqueFd fd = try_open_fd(path, flags, mode);
  PL_CHECK(fd.valid(), "{}: cannot {}: {}", path, (flags & (O_WRONLY | O_RDWR)) != 0 ? "create or open for writing" : "open",
           std::strerror(errno));
  return fd;
}

namespace {
// Calls io(done, n) until `bytes` went through or it fails; io returns what read/write/pread/pwrite return.
// A zero-byte write is ENOSPC; a zero-byte read ends the transfer at the end of the file when stop_at_eof.
template <typename Io>
PartialIo transfer_until_error(size_t bytes, bool stop_at_eof, Io io) {
  PartialIo r;
  while (r.done < bytes) {
    const ssize_t n = io(r.done, bytes - r.done);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 && stop_at_eof) break;
    if (n <= 0) {
      r.error = n < 0 ? errno : ENOSPC;
      break;
    }
    r.done += static_cast<size_t>(n);
  }
  return r;
}

// The same, a failure as one line naming the path and how far it got.
template <typename Io>
size_t transfer(const UniqueFd& fd, size_t bytes, const char* what, bool stop_at_eof, Io io) {
  const PartialIo r = transfer_until_error(bytes, stop_at_eof, io);
  PL_CHECK(r.error == 0, "{}: {} failed after {} of {} bytes: {}", fd.path(), what, r.done, bytes,
           std::strerror(r.error));
  return r.done;
}
}  // namespace

void write_all(const UniqueFd& fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  transfer(fd, bytes, "write", false, [&](size_t at, size_t n) { return ::write(fd.get(), p + at, n); });
}

void pwrite_all(const UniqueFd& fd, const void* data, size_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  transfer(fd, bytes, "write", false,
           [&](size_t at, size_t n) { return ::pwrite(fd.get(), p + at, n, static_cast<off_t>(offset + at)); });
}

PartialIo pwrite_until_error(const UniqueFd& fd, const void* data, size_t bytes, uint64_t offset) {
  const char* p = static_cast<const char*>(data);
  return transfer_until_error(
      bytes, false, [&](size_t at, size_t n) { return ::pwrite(fd.get(), p + at, n, static_cast<off_t>(offset + at)); });
}

size_t read_up_to(const UniqueFd& fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  return transfer(fd, bytes, "read", true, [&](size_t at, size_t n) { return ::read(fd.get(), p + at, n); });
}

void pread_exact(const UniqueFd& fd, void* data, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(data);
  const size_t got = transfer(fd, bytes, "read", true, [&](size_t at, size_t n) {
    return ::pread(fd.get(), p + at, n, static_cast<off_t>(offset + at));
  });
  PL_CHECK(got == bytes, "{}: truncated: {} bytes at offset {} wanted, {} there", fd.path(), bytes, offset, got);
}

std::string read_rest(const UniqueFd& fd) {
  std::string out;
  char chunk[1 << 16];
  for (size_t n; (n = read_up_to(fd, chunk, sizeof chunk)) > 0;) out.append(chunk, n);
  return out;
}

uint64_t file_size(const UniqueFd& fd) {
  struct stat st {};
  PL_CHECK(::fstat(fd.get(), &st) == 0, "{}: cannot stat: {}", fd.path(), std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void fsync_fd(const UniqueFd& fd) {
  int rc;
  do rc = ::fsync(fd.get());
  while (rc != 0 && errno == EINTR);
  PL_CHECK(rc == 0, "{}: cannot fsync: {}", fd.path(), std::strerror(errno));
}

void fsync_directory(const std::string& dir) {
  const UniqueFd fd = try_open_fd(dir, O_RDONLY | O_DIRECTORY);
  PL_CHECK(fd.valid(), "{}: cannot open the directory to fsync it: {}", dir, std::strerror(errno));
  PL_CHECK(::fsync(fd.get()) == 0, "{}: cannot fsync the directory: {}", dir, std::strerror(errno));
}

bool pid_alive(long pid) {
  if (pid <= 0) return false;
  if (pid == static_cast<long>(::getpid())) return true;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

long pid_after(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  const std::string_view digits = name.substr(prefix.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stol(std::string(digits));
}

void remove_dead_temporaries(const std::string& dir, const std::function<long(const std::string& name)>& writer) {
  std::error_code ec;
  fs::directory_iterator it(dir.empty() ? "." : dir, ec), end;
  if (ec) return;  // a later create or open reports a missing or unreadable directory
  std::vector<fs::path> stale;
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    const long pid = writer(it->path().filename().string());
    if (pid >= 0 && (pid == static_cast<long>(::getpid()) || !pid_alive(pid))) stale.push_back(it->path());
  }
  for (const fs::path& s : stale) {
    fs::remove_all(s, ec);
    PL_CHECK(!ec, "{}: cannot remove this stale temporary of a dead process: {}", s.string(), ec.message());
  }
}

}  // namespace pl
