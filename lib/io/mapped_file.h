#pragma once
// Memory-mapped input files and SIGBUS. A read from a mapping past the end of its file -- the file was
// truncated under the running job (a preprocess run rewriting the data in place, a full disk, an NFS
// hiccup) -- raises SIGBUS, which would kill the process with no word about which file. Every mapping of
// a user's file is registered here; the first registration installs a SIGBUS handler that finds the
// mapping holding the faulting address and ends the process with one line on stderr,
//   "<program>: error: <file> changed under the running job (truncated?): read past its end at byte N"
// and exit status 1. A SIGBUS at any other address goes to the handler that was there before (the
// default: the process is killed by the signal).
// The registry is a fixed table written with atomics, so that the handler reads it async-signal-safely.
#include <cstddef>
#include <string>
#include <utility>

#include "io/fd.h"

namespace pl {

// `bytes` of an open file from its byte 0, mapped read-only and registered below while the object lives
// (the destructor deregisters and unmaps). Zero bytes map nothing: data() is nullptr.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const UniqueFd& fd, size_t bytes);  // "<path>: cannot map N bytes: <strerror>" on failure
  ~MappedFile() { reset(); }
  MappedFile(MappedFile&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return bytes_; }
  // Drops this process's pages of [offset, offset + bytes) (the whole pages inside it; madvise MADV_DONTNEED):
  // read once, a tensor's pages would otherwise stay in the process's resident set until the file is closed,
  // so reading a 140 GB checkpoint tensor by tensor would grow it to 140 GB. A later read faults them back in.
  void release(size_t offset, size_t bytes) const noexcept;

 private:
  void reset() noexcept;
  const unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
};

// [addr, addr + bytes) maps `file` from its byte 0. A full table (kMaxMappedRanges live mappings) leaves
// the range unregistered: a fault in it is then the default SIGBUS.
void register_mapped_range(const void* addr, size_t bytes, const std::string& file);
// Before munmap: the range starting at `addr` is no longer reported.
void deregister_mapped_range(const void* addr);

inline constexpr size_t kMaxMappedRanges = 1024;

}  // namespace pl
