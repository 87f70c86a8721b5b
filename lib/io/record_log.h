#pragma once
// A log file that only ever holds whole records: the TensorBoard events file and the --log-jsonl log (issue 38).
// append() writes at the end of the last whole record; a write that fails part way (a full disk, a file size
// limit) is cut back to the end of the last record it completed, so a reader never meets a torn record at the
// end — TensorBoard's reader would skip it, but compare_logs.py and jq would refuse the whole file.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "io/fd.h"

namespace pl {

class RecordLog {
 public:
  RecordLog() = default;
  explicit RecordLog(UniqueFd fd);  // appends after the file's current end (an --append log keeps its lines)

  bool valid() const { return fd_.valid(); }
  uint64_t whole_bytes() const { return whole_; }
  // Appends `bytes`, the records ending at `record_ends` (ascending, the last == bytes.size()). Returns "" or
  // the error, saying how much of `bytes` was kept; the file then ends after the last whole record.
  std::string append(std::string_view bytes, std::span<const size_t> record_ends);
  // One record.
  std::string append(std::string_view record) {
    const size_t end = record.size();
    return append(record, std::span<const size_t>(&end, 1));
  }
  void close() { fd_.close(); }
  void reset() { fd_.reset(); }

 private:
  UniqueFd fd_;
  uint64_t whole_ = 0;  // the file's length: the end of its last whole record
};

}  // namespace pl
