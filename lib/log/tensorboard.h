#pragma once
// TensorBoard event files (--tensorboard-dir), written by hand: the few bytes TensorBoard reads, no
// TensorFlow or protobuf library.
//
// The format, from its public definitions:
//  - the file: a sequence of TFRecords (tensorflow/core/lib/io/record_writer.cc; tensorboard's
//    tensorboard/summary/writer/record_writer.py): uint64 length (little-endian), uint32 masked CRC-32C of
//    those 8 bytes, the data, uint32 masked CRC-32C of the data. The mask (tensorflow/core/lib/hash/crc32c.h,
//    Mask): ((crc >> 15) | (crc << 17)) + 0xa282ead8. CRC-32C is the Castagnoli polynomial 0x1EDC6F41
//    (reflected: 0x82F63B78), initial value and final XOR 0xFFFFFFFF (RFC 3720 section 12.1 and B.4).
//  - each record: one serialized tensorflow.Event (tensorflow/core/util/event.proto): wall_time = 1
//    (double), step = 2 (int64), and one of file_version = 3 (string; the first event of a file says
//    "brain.Event:2") or summary = 5 (Summary, tensorflow/core/framework/summary.proto: repeated Value value
//    = 1; Value: tag = 1 (string), simple_value = 2 (float)). Protobuf's wire format
//    (protobuf.dev/programming-guides/encoding): a key varint (field << 3 | wire type), then a varint (0),
//    8 little-endian bytes (1), a length-prefixed payload (2) or 4 little-endian bytes (5).
//  - the name: events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<counter> (tensorboard's
//    event_file_writer.py); TensorBoard reads every file of a directory whose name holds "tfevents", in
//    name order, as one run: a resumed run's new file continues the curves.
// A scalar is written as simple_value, as torch.utils.tensorboard's SummaryWriter.add_scalar (Megatron's
// writer) does.
//
// The writer never blocks training on the disk: add_scalar() puts a record into a bounded queue (a
// mutex held for a push, never during I/O) and a writer thread encodes and writes it; flush() asks that
// thread to hand what it has to the OS now (it also does so when the queue is half full and every 30 s).
// A full queue (the disk slower than the run for --tensorboard-queue-size records) drops the new record and
// counts it, with one warning. close() waits a bounded time for the thread, then gives up on what it has
// not written and says so.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace pl::log {

// ---- the format -------------------------------------------------------------------------------------

// CRC-32C of `data`, continuing from `crc` (the CRC of the bytes before; 0 to start).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: header, data, footer.
std::string tfrecord(std::string_view data);
// Serialized tensorflow.Event messages.
std::string file_version_event(double wall_time);
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);

// ---- the writer -------------------------------------------------------------------------------------

// Where a writer's remarks go (a warning when it starts dropping, what close() gave up on).
using NoteFn = std::function<void(const std::string&)>;

// One events file in `dir` (created if missing), its first record (the file_version event) written
// before the constructor returns, so a directory that cannot be created or written is a one-line error
// now: "--tensorboard-dir DIR: cannot create the directory: ..." / "...: cannot create FILE: ...".
class EventFileWriter {
 public:
  EventFileWriter(const std::string& dir, size_t queue_capacity, NoteFn note);
  ~EventFileWriter();  // close() with its default timeout
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  const std::string& path() const { return path_; }
  // Queues one scalar (its wall time taken now); dropped and counted when the queue is full.
  void add_scalar(std::string_view tag, double value, int64_t step);
  // Asks the writer thread to write what it holds (returns at once).
  void flush();
  // Writes what is queued and closes the file, waiting at most `timeout_s` for the writer thread; after
  // that the thread is left to finish on its own (a stuck disk) and a note says how many records may be
  // missing. Idempotent.
  void close(double timeout_s = 10.0);
  // For a run that fails before its first iteration: closes, then removes the events file and the directories
  // this writer created (when empty), so a failed start leaves nothing new behind.
  void discard();
  int64_t dropped() const;
  int64_t written() const;  // records handed to the OS so far (the file_version record included)

 private:
  struct Shared;  // the queue and counters, shared with the writer thread (it may outlive a timed-out close)
  void note_new_trouble();
  void remove_what_was_made(bool file_is_ours = true);
  std::string path_;
  std::filesystem::path created_top_;  // the outermost directory the constructor created, or empty
  size_t capacity_;
  NoteFn note_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  bool closed_ = false;
  bool drop_noted_ = false, error_noted_ = false;
};

}  // namespace pl::log
