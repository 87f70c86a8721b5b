#include "log/tensorboard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/error.h"
#include "io/fd.h"
#include "io/record_log.h"

namespace pl::log {

// ---- CRC-32C and the TFRecord framing ----------------------------------------------------------------

namespace {

// The byte-wise table of the reflected Castagnoli polynomial (RFC 3720 B.4 computes the same CRC bit by
// bit): entry i is the CRC register after shifting byte i through eight steps.
constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// Little-endian bytes whatever the host's order (the TFRecord header and protobuf's fixed-width fields).
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

// Protobuf's wire format: wire types 0 (varint), 1 (64-bit), 2 (length-delimited), 5 (32-bit).
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7Fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, uint32_t wire_type) { put_varint(out, (field << 3) | wire_type); }
void put_length_delimited(std::string& out, uint32_t field, std::string_view payload) {
  put_key(out, field, 2);
  put_varint(out, payload.size());
  out.append(payload);
}

// Event.wall_time = 1 and Event.step = 2, the fields every event starts with.
std::string event_head(double wall_time, int64_t step) {
  std::string e;
  put_key(e, 1, 1);
  put_le(e, std::bit_cast<uint64_t>(wall_time), 8);
  if (step != 0) {  // (proto3: a zero scalar is not written)
    put_key(e, 2, 0);
    put_varint(e, static_cast<uint64_t>(step));
  }
  return e;
}

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (const char ch : data) crc = kCrc32cTable[(crc ^ static_cast<unsigned char>(ch)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(std::string_view data) {
  const uint32_t c = crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord(std::string_view data) {
  std::string r;
  r.reserve(data.size() + 16);
  put_le(r, data.size(), 8);
  put_le(r, masked_crc32c(r), 4);
  r.append(data);
  put_le(r, masked_crc32c(data), 4);
  return r;
}

std::string file_version_event(double wall_time) {
  std::string e = event_head(wall_time, 0);
  put_length_delimited(e, 3, "brain.Event:2");
  return e;
}

std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  std::string v;  // Summary.Value
  put_length_delimited(v, 1, tag);
  put_key(v, 2, 5);
  put_le(v, std::bit_cast<uint32_t>(value), 4);
  std::string summary;
  put_length_delimited(summary, 1, v);
  std::string e = event_head(wall_time, step);
  put_length_delimited(e, 5, summary);
  return e;
}

// ---- the writer --------------------------------------------------------------------------------------

namespace {

struct PendingScalar {
  std::string tag;
  float value;
  int64_t step;
  double wall_time;
};

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// tensorboard's event_file_writer.py: "events.out.tfevents.%010d.%s.%s.%s" % (time, host, pid, counter).
std::string events_file_name() {
  static std::atomic<int> counter{0};
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) std::strcpy(host.data(), "localhost");
  std::string h(host.data());
  std::replace(h.begin(), h.end(), '/', '_');
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(wall_seconds()), h, ::getpid(),
                     counter.fetch_add(1));
}

}  // namespace

struct EventFileWriter::Shared {
  std::mutex mutex;
  std::condition_variable wake, finished_cv;
  std::vector<PendingScalar> queue;  // guarded by mutex
  size_t wake_at = 1;                // the writer thread is woken when the queue holds this many
  bool flush_requested = false, closing = false, finished = false;  // guarded by mutex
  std::string error;                 // the first write error (guarded by mutex)
  std::atomic<int64_t> dropped{0}, written{0};
  RecordLog file;  // owned by the writer thread once it runs; whole records only (a failed write is cut back)

  // The writer thread: whenever it wakes it takes the queue's records, encodes them and hands them to the
  // OS. It wakes at each flush request, when the queue is half full, at the close, and every 30 s with
  // anything queued (so a long --log-interval still reaches the disk; torch's SummaryWriter has flush_secs,
  // 120 s, for the same). It never holds the mutex during I/O.
  static void run(const std::shared_ptr<Shared>& s) {
    std::vector<PendingScalar> batch;
    std::string buffer;
    std::vector<size_t> ends;  // where each record of `buffer` ends
    for (;;) {
      bool closing = false, failed = false;
      {
        std::unique_lock lock(s->mutex);
        s->wake.wait_for(lock, std::chrono::seconds(30),
                         [&] { return s->queue.size() >= s->wake_at || s->flush_requested || s->closing; });
        batch.swap(s->queue);
        s->flush_requested = false;
        closing = s->closing;
        failed = !s->error.empty();
      }
      if (!batch.empty() && failed) s->dropped += static_cast<int64_t>(batch.size());  // (after a write error)
      if (!batch.empty() && !failed) {
        buffer.clear();
        ends.clear();
        for (const PendingScalar& p : batch) {
          buffer += tfrecord(scalar_event(p.wall_time, p.step, p.tag, p.value));
          ends.push_back(buffer.size());
        }
        const uint64_t before = s->file.whole_bytes();
        const std::string error = s->file.append(buffer, ends);
        // The records wholly written count as written (a failed write keeps them), the rest as dropped.
        const auto kept = std::upper_bound(ends.begin(), ends.end(), s->file.whole_bytes() - before) - ends.begin();
        s->written += kept;
        s->dropped += static_cast<int64_t>(batch.size()) - kept;
        if (!error.empty()) {
          const std::lock_guard lock(s->mutex);
          s->error = error;
        }
      }
      batch.clear();
      if (closing) break;
    }
    s->file.reset();
    const std::lock_guard lock(s->mutex);
    s->finished = true;
    s->finished_cv.notify_all();
  }
};

EventFileWriter::EventFileWriter(const std::string& dir, size_t queue_capacity, NoteFn note)
    : capacity_(std::max<size_t>(1, queue_capacity)), note_(std::move(note)), shared_(std::make_shared<Shared>()) {
  namespace fs = std::filesystem;
  PL_CHECK(!dir.empty(), "--tensorboard-dir needs a DIR");
  std::error_code ec;
  // The outermost directory this writer creates, removed again (if still empty) when the start fails.
  for (fs::path p = fs::absolute(dir, ec); !p.empty() && p != p.parent_path() && !fs::exists(p, ec); p = p.parent_path())
    created_top_ = p;
  fs::create_directories(dir, ec);
  PL_CHECK(!ec, "--tensorboard-dir {}: cannot create the directory: {}", dir, ec.message());
  PL_CHECK(fs::is_directory(dir, ec), "--tensorboard-dir {}: exists and is not a directory", dir);
  path_ = (fs::path(dir) / events_file_name()).string();
  UniqueFd fd = try_open_fd(path_, O_WRONLY | O_CREAT | O_EXCL);
  if (!fd.valid()) {
    const int err = errno;
    remove_what_was_made(false);  // (not the file: O_EXCL failed, so whatever has that name is not ours)
    fail("--tensorboard-dir {}: cannot create {}: {}", dir, path_, std::strerror(err));
  }
  shared_->file = RecordLog(std::move(fd));
  // The first record now, from this thread: a directory that takes a file but no data fails here too, and
  // leaves no empty file behind.
  const std::string error = shared_->file.append(tfrecord(file_version_event(wall_seconds())));
  if (!error.empty()) {
    shared_->file.reset();
    remove_what_was_made();
    fail("--tensorboard-dir {}: cannot write {}: {}", dir, path_, error);
  }
  shared_->written = 1;
  shared_->queue.reserve(capacity_);
  shared_->wake_at = std::max<size_t>(1, capacity_ / 2);
  thread_ = std::thread([s = shared_] { Shared::run(s); });
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (...) {  // (a note that throws must not end the program from a destructor)
  }
}

void EventFileWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  if (closed_) return;
  bool wake = false, full = false;
  {
    const std::lock_guard lock(shared_->mutex);
    full = shared_->queue.size() >= capacity_;
    if (!full) {
      shared_->queue.push_back({std::string(tag), static_cast<float>(value), step, wall_seconds()});
      wake = shared_->queue.size() == shared_->wake_at;
    }
  }
  if (wake) shared_->wake.notify_one();
  if (full) {
    ++shared_->dropped;
    note_new_trouble();
  }
}

void EventFileWriter::flush() {
  if (closed_) return;
  {
    const std::lock_guard lock(shared_->mutex);
    shared_->flush_requested = true;
  }
  shared_->wake.notify_one();
  note_new_trouble();
}

void EventFileWriter::close(double timeout_s) {
  if (closed_) return;
  closed_ = true;
  bool finished = false;
  {
    std::unique_lock lock(shared_->mutex);
    shared_->closing = true;
    shared_->wake.notify_one();
    finished = shared_->finished_cv.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                             [&] { return shared_->finished; });
  }
  if (finished) {
    thread_.join();
  } else {
    // A disk that has not taken the data in that time may never: the thread keeps the shared state alive
    // and ends on its own if it can; the run does not wait for it.
    thread_.detach();
    if (note_)
      note_(fmt::format("WARNING: --tensorboard-dir: {} still not written after {:.0f} s (a stuck disk?): exiting "
                        "without it; the file may lack the last scalars",
                        path_, timeout_s));
  }
  note_new_trouble();
}

// The events file (when this writer created it, O_EXCL) and the directories this writer created, those left
// empty; errors ignored (best effort on the way out of a failed start).
void EventFileWriter::remove_what_was_made(bool file_is_ours) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (file_is_ours) fs::remove(path_, ec);
  if (created_top_.empty()) return;
  for (fs::path p = fs::absolute(path_, ec).parent_path(); fs::is_directory(p, ec) && fs::is_empty(p, ec);
       p = p.parent_path()) {
    fs::remove(p, ec);
    if (p == created_top_ || ec) break;
  }
}

void EventFileWriter::discard() {
  close();
  remove_what_was_made();
}

int64_t EventFileWriter::dropped() const { return shared_->dropped.load(); }
int64_t EventFileWriter::written() const { return shared_->written.load(); }

// One warning per kind of trouble, from the training thread (the writer thread never prints).
void EventFileWriter::note_new_trouble() {
  if (!note_) return;
  if (!drop_noted_ && shared_->dropped.load() > 0) {
    drop_noted_ = true;
    std::string error;
    {
      const std::lock_guard lock(shared_->mutex);
      error = shared_->error;
    }
    if (error.empty())
      note_(fmt::format("WARNING: --tensorboard-dir: the event writer is behind the run (its queue of {} scalars, "
                        "--tensorboard-queue-size, is full: a slow disk?): new scalars are dropped rather than waited "
                        "for; the count is printed at the end",
                        capacity_));
  }
  if (!error_noted_) {
    std::string error;
    {
      const std::lock_guard lock(shared_->mutex);
      error = shared_->error;
    }
    if (!error.empty()) {
      error_noted_ = drop_noted_ = true;
      note_(fmt::format("WARNING: --tensorboard-dir: writing {} failed ({}): the run goes on, its scalars are "
                        "dropped",
                        path_, error));
    }
  }
}

}  // namespace pl::log
