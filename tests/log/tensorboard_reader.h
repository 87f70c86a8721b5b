#pragma once
// A reader of TensorBoard event files for the tests (log/tensorboard.h writes them): every record's framing
// and both CRCs checked, each tensorflow.Event decoded to the fields the writer writes (other fields
// skipped). A bad record is a one-line pl::Error naming the file and the byte offset. (TensorBoard's own
// reader reads a real run's file in tests/scripts/test_tensorboard.py.)
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pl::test {

struct DecodedEvent {
  double wall_time = 0.0;
  int64_t step = 0;
  std::string file_version;                          // "" unless a file_version event
  std::vector<std::pair<std::string, float>> values;  // (tag, simple_value) of its summary
};
std::vector<DecodedEvent> read_event_file(const std::string& path);

}  // namespace pl::test
