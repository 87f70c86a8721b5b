#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc, _GNU_SOURCE)
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace pl {
namespace fs = std::filesystem;

namespace {

std::string parent_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

std::string process_tmp_suffix() { return ".tmp-" + std::to_string(::getpid()); }

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  PL_CHECK(fd >= 0, "{}: cannot open the directory to fsync it: {}", dir, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  PL_CHECK(rc == 0, "{}: cannot fsync the directory: {}", dir, std::strerror(err));
}

void rename_path(const std::string& from, const std::string& to) {
  PL_CHECK(::rename(from.c_str(), to.c_str()) == 0, "{}: cannot rename {} onto it: {}", to, from, std::strerror(errno));
}

AtomicFile::AtomicFile(std::string path, std::string tmp_suffix) : path_(std::move(path)), tmp_(path_ + tmp_suffix) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  PL_CHECK(fd_ >= 0, "{}: cannot create: {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  PL_CHECK(fd_ >= 0, "{}: write after finish", tmp_);
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    PL_CHECK(w > 0, "{}: write failed after {} bytes: {}", tmp_, written_, std::strerror(w < 0 ? errno : ENOSPC));
    p += w;
    bytes -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
}

void AtomicFile::finish() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("{}: cannot fsync ({} bytes written): {}", tmp_, written_, std::strerror(err));
  }
  PL_CHECK(::close(fd) == 0, "{}: cannot close ({} bytes written): {}", tmp_, written_, std::strerror(errno));
}

void AtomicFile::commit() {
  finish();
  rename_path(tmp_, path_);
  committed_ = true;
  fsync_directory(parent_of(path_));
}

void write_file_atomically(const std::string& path, const std::function<void(AtomicFile&)>& fill,
                           const std::string& tmp_suffix) {
  AtomicFile f(path, tmp_suffix);
  fill(f);
  f.commit();
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& tmp_suffix) {
  write_file_atomically(path, [&](AtomicFile& f) { f.write(bytes); }, tmp_suffix);
}

void write_directory_atomically(const std::string& path_in, const std::function<void(const std::string&)>& fill,
                                const std::string& tmp_suffix) {
  fs::path p(path_in);
  if (p.filename().empty()) p = p.parent_path();  // "out/" names "out"
  const std::string path = p.string();
  const std::string tmp = path + (tmp_suffix.empty() ? process_tmp_suffix() : tmp_suffix);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  PL_CHECK(!ec, "{}: cannot create the directory: {}", tmp, ec.message());
  try {
    fill(tmp);
    fsync_directory(tmp);
    if (!fs::exists(path, ec)) {
      rename_path(tmp, path);
    } else {
      // Both names stay valid throughout; `tmp` then holds the previous directory.
      PL_CHECK(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0,
               "{}: cannot replace it atomically with {}: {}", path, tmp, std::strerror(errno));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(tmp, ec);
  fsync_directory(parent_of(path));
}

}  // namespace pl
