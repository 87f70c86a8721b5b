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
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "core/device_memory.h"
#include "log/megatron_log.h"

namespace pl {
struct TrainConfig;
}

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

// What a reader finds in a file (the tests' round trip): every record's framing and CRCs checked, each
// Event decoded to the fields above (other fields skipped). A bad record is a one-line pl::Error naming
// the file and the byte offset.
struct DecodedEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;                          // "" unless a file_version event
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value) of its summary
};
std::vector<DecodedEvent> read_event_file(const std::string& path);

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
  int64_t dropped() const;
  int64_t written() const;  // records handed to the OS so far (the file_version record included)

 private:
  struct Shared;  // the queue and counters, shared with the writer thread (it may outlive a timed-out close)
  void note_new_trouble();
  std::string path_;
  size_t capacity_;
  NoteFn note_;
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
  bool closed_ = false;
  bool drop_noted_ = false, error_noted_ = false;
};

// ---- what a training run writes (Megatron's tags) --------------------------------------------------

// One iteration's values, read after its step (the values the log line of that iteration prints).
struct IterationScalars {
  int64_t iteration = 0;
  int64_t consumed_samples = 0;
  int64_t batch_size = 0;
  int64_t world_size = 1;
  double lm_loss = 0.0;        // the iteration's own (NaN when it was skipped)
  double learning_rate = 0.0;  // the rate the next step uses (the log's)
  double loss_scale = 1.0;
  double grad_norm = 0.0;      // NaN when the step was skipped
  MemoryStats memory;          // this rank's, after the step
};
// One log interval's, as its Step Time, iteration and timer lines print them.
struct IntervalScalars {
  int64_t iteration = 0;
  double seconds_per_iteration = 0.0;
  double tflops_per_gpu = 0.0;
  double tokens_per_second = 0.0;           // the whole run's (every rank's tokens)
  std::span<const TimerOverRanks> timers;  // ms per iteration on each rank (empty at --timing-log-level 0)
};

// Megatron-LM's TensorBoard scalars (megatron/training/training.py: training_log and
// evaluate_and_print_results; megatron/core/timers.py: Timers.write), one writer on the last rank as
// Megatron's global_vars._set_tensorboard_writer. The step is the iteration; each "X vs samples" is X at
// step = consumed training samples.
//  Every --tensorboard-log-interval iterations: learning-rate, batch-size, lm loss (the iteration's own, as
//    Megatron's loss_dict, written for a skipped step too: with --log-interval > 1 the log line prints the
//    interval's mean of the steps taken instead),
//    loss-scale (unless --no-log-loss-scale-to-tensorboard), world-size (--log-world-size-to-tensorboard),
//    grad-norm (not for a skipped step: Megatron's optimizer returns None there), each with its "vs samples";
//    with --log-memory-to-tensorboard mem-reserved-bytes, mem-allocated-bytes, mem-max-allocated-bytes,
//    mem-allocated-count (the writer rank's).
//  Every --log-interval (with the log line): iteration-time (s), throughput (TFLOP/s/GPU, the Step Time
//    line's) and throughput/tokens_per_sec (Megatron-Bridge's tag, train_utils.py report_throughput; Megatron
//    has no tokens/s scalar). Megatron writes the first two only with --log-timers-to-tensorboard (and
//    --log-throughput); here always, since the log always prints them. With --log-timers-to-tensorboard,
//    each timer of --timing-log-level as "<name>-time": the max over ranks, in seconds per iteration
//    (Timers.write; the log prints ms).
//  Each evaluation: lm loss validation (+ vs samples), and lm loss validation ppl (+ vs samples) with
//    --log-validation-ppl-to-tensorboard; PPL = exp(min(20, loss)) as the log. The test split after
//    training goes to "lm loss test" (and ppl): Megatron writes it under the validation tag, which would put
//    the test loss on the validation curve.
// The file is flushed after each log interval and each evaluation, and closed (bounded wait) at the end.
class TensorBoardLog {
 public:
  // Creates cfg.tensorboard_dir and the events file (one-line error naming --tensorboard-dir).
  TensorBoardLog(const TrainConfig& cfg, NoteFn note);
  const std::string& path() const { return writer_.path(); }
  void iteration(const IterationScalars& s);
  void interval(const IntervalScalars& s);
  void evaluation(int64_t iteration, int64_t consumed_samples, double lm_loss, bool test_split);
  // Closes the file and returns a summary line ("N scalars written to FILE[, M dropped]").
  std::string close(double timeout_s = 10.0);

 private:
  void pair(const std::string& tag, double value, int64_t iteration, int64_t consumed_samples);
  int64_t log_interval_;
  bool loss_scale_, world_size_, memory_, timers_, validation_ppl_;
  EventFileWriter writer_;
};

}  // namespace pl::log
