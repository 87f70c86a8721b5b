#pragma once
// The one small descriptor helper every file writer and reader of lib/ uses: an owning descriptor,
// whole reads and writes (EINTR retried, short counts continued), fsync of a file and of a directory,
// and the one cleaner of temporaries left by processes that no longer exist. Every failure is a
// one-line pl::Error naming the path and strerror, so no caller writes its own ::close, retry loop or
// errno message.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace pl {

// An open descriptor and the path it was opened from (for errors). Closed by the destructor (an
// error there is ignored: call close() where a failing close must be reported, e.g. after writing).
class UniqueFd {
 public:
  UniqueFd() = default;
  UniqueFd(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()), path_(std::move(o.path_)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset() noexcept;  // close, ignoring errors
  void close();           // close, one line on failure

 private:
  int fd_ = -1;
  std::string path_;
};

// open(2) with O_CLOEXEC added, EINTR retried; one line "<path>: cannot open ...: <strerror>" on failure.
UniqueFd open_fd(const std::string& path, int flags, mode_t mode = 0644);
// open(2) that reports failure by an invalid descriptor and errno instead of an error.
UniqueFd try_open_fd(const std::string& path, int flags, mode_t mode = 0644);

// All `bytes` written (EINTR retried, short writes continued; a zero-byte write is ENOSPC).
void write_all(const UniqueFd& fd, const void* data, size_t bytes);
inline void write_all(const UniqueFd& fd, std::string_view text) { write_all(fd, text.data(), text.size()); }
// All `bytes` written at `offset` (pwrite; EINTR, short writes as above).
void pwrite_all(const UniqueFd& fd, const void* data, size_t bytes, uint64_t offset);
// The same, a failure returned instead of thrown: the bytes written before it and its errno (0: all written),
// for a writer that must undo a partial write (io/record_log.h).
struct PartialIo {
  size_t done = 0;
  int error = 0;
};
PartialIo pwrite_until_error(const UniqueFd& fd, const void* data, size_t bytes, uint64_t offset);
// Up to `bytes` read from the current position; fewer only at the end of the file (EINTR retried).
size_t read_up_to(const UniqueFd& fd, void* data, size_t bytes);
// Exactly `bytes` read at `offset` (pread); "truncated" names the path, offset and sizes.
void pread_exact(const UniqueFd& fd, void* data, size_t bytes, uint64_t offset);
// The whole file from the current position.
std::string read_rest(const UniqueFd& fd);
// Its size now (fstat(2)), one line on failure.
uint64_t file_size(const UniqueFd& fd);

void fsync_fd(const UniqueFd& fd);             // fsync(2), one line on failure
void fsync_directory(const std::string& dir);  // its entries: a rename or a file created in it

// Whether process `pid` exists (this process's own pid: true; pid <= 0: false).
bool pid_alive(long pid);
// The pid N of a name "<prefix>N" (N all digits, at most 9), or -1.
long pid_after(std::string_view name, std::string_view prefix);

// The one cleaner of temporaries: removes (recursively) every entry of `dir` for which `writer(name)`
// returns a pid (>= 0) of a process that no longer exists, or this process's own pid (its temporaries
// are stale by the time a new write starts). 0 means the name carries no pid: removed too. A name for
// which `writer` returns -1 is not a temporary and is left alone, as is a live process's temporary
// (never take a file from under its writer). A missing or unreadable directory removes nothing; an
// entry that cannot be removed is one line.
void remove_dead_temporaries(const std::string& dir, const std::function<long(const std::string& name)>& writer);

}  // namespace pl
