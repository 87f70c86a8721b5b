#include "io/mapped_file.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "core/error.h"

namespace pl {

namespace {

constexpr size_t kNameBytes = 1008;

// One mapping. `state` publishes the slot: free -> claimed (being written by one registering thread) ->
// live; the handler reads only live slots, and the fields before `state` are written before it turns live
// (release) and read after it is seen live (acquire).
struct Slot {
  std::atomic<int> state{0};
  std::atomic<uintptr_t> begin{0};
  std::atomic<size_t> bytes{0};
  char name[kNameBytes];
};
constexpr int kFree = 0, kClaimed = 1, kLive = 2;
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<uintptr_t>::is_always_lock_free &&
              std::atomic<size_t>::is_always_lock_free);

Slot g_slots[kMaxMappedRanges];
struct sigaction g_previous {};
std::once_flag g_install_once;

// Async-signal-safe pieces of the message line.
struct Line {
  char text[kNameBytes + 256];
  size_t n = 0;
  void add(const char* s) {
    while (*s != '\0' && n < sizeof text - 1) text[n++] = *s++;
  }
  void add(uint64_t v) {
    char digits[24];
    size_t k = 0;
    do {
      digits[k++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (k > 0 && n < sizeof text - 1) text[n++] = digits[--k];
  }
};

// (Not io/fd.h's write_all, which formats and throws: this runs in a signal handler.)
void write_stderr(const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  // A fault from the kernel (si_code > 0) at an address in a live mapping: the file got shorter.
  if (info->si_code > 0) {
    for (Slot& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != kLive) continue;
      const uintptr_t b = s.begin.load(std::memory_order_relaxed);
      const size_t len = s.bytes.load(std::memory_order_relaxed);
      if (addr < b || addr - b >= len) continue;
      Line line;
      line.add(program_invocation_short_name);
      line.add(": error: ");
      line.add(s.name);
      line.add(" changed under the running job (truncated?): read past its end at byte ");
      line.add(static_cast<uint64_t>(addr - b));
      line.add(" (");
      line.add(static_cast<uint64_t>(len));
      line.add(" bytes were mapped)\n");
      write_stderr(line.text, line.n);
      ::_exit(1);
    }
  }
  // Not ours: whatever handled SIGBUS before us (the default kills the process with the signal).
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  ::sigaction(SIGBUS, &g_previous, nullptr);
  // A fault re-raises itself when the instruction runs again; a sent signal (kill, raise) does not.
  if (info->si_code <= 0) ::raise(SIGBUS);
}

void install_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  ::sigaction(SIGBUS, &sa, &g_previous);
}

}  // namespace

MappedFile::MappedFile(const UniqueFd& fd, size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  PL_CHECK(m != MAP_FAILED, "{}: cannot map {} bytes: {}", fd.path(), bytes, std::strerror(errno));
  data_ = static_cast<const unsigned char*>(m);
  register_mapped_range(data_, bytes, fd.path());  // a truncation under the job: one line, not a SIGBUS death
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = o.bytes_;
  }
  return *this;
}

void MappedFile::release(size_t offset, size_t bytes) const noexcept {
  if (data_ == nullptr || offset >= bytes_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(data_) + offset;
  const uintptr_t end = reinterpret_cast<uintptr_t>(data_) + std::min(bytes_, offset + bytes);
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);  // advice: no error to act on
}

void MappedFile::reset() noexcept {
  if (data_ == nullptr) return;
  deregister_mapped_range(data_);
  ::munmap(const_cast<unsigned char*>(data_), bytes_);
  data_ = nullptr;
}

void register_mapped_range(const void* addr, size_t bytes, const std::string& file) {
  if (addr == nullptr || bytes == 0) return;
  std::call_once(g_install_once, install_handler);
  for (Slot& s : g_slots) {
    int expected = kFree;
    if (!s.state.compare_exchange_strong(expected, kClaimed, std::memory_order_acquire)) continue;
    s.begin.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_relaxed);
    s.bytes.store(bytes, std::memory_order_relaxed);
    // A name too long for the slot keeps its end (the file name), marked with "...".
    if (file.size() < kNameBytes) {
      std::memcpy(s.name, file.c_str(), file.size() + 1);
    } else {
      const size_t keep = kNameBytes - 4;
      std::memcpy(s.name, "...", 3);
      std::memcpy(s.name + 3, file.c_str() + (file.size() - keep), keep + 1);
    }
    s.state.store(kLive, std::memory_order_release);
    return;
  }
}

void deregister_mapped_range(const void* addr) {
  const auto b = reinterpret_cast<uintptr_t>(addr);
  for (Slot& s : g_slots) {
    if (s.state.load(std::memory_order_acquire) == kLive && s.begin.load(std::memory_order_relaxed) == b) {
      s.state.store(kFree, std::memory_order_release);
      return;
    }
  }
}

}  // namespace pl
