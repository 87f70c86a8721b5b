// log/tensorboard: CRC-32C against RFC 3720's vectors, the TFRecord framing, an events file written by the
// writer thread and read back (every CRC checked, every field decoded), a corrupted byte found, a directory
// that cannot be made refused naming the flag, no scalar lost uncounted when the queue overflows, and which
// of Megatron's tags TensorBoardLog writes at which step. (TensorBoard's own reader reads a real run's file
// in tests/scripts/test_tensorboard.py.)
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "log/tensorboard.h"
#include "log/tensorboard_reader.h"
#include "observe/tensorboard_log.h"
#include "test_util.h"

namespace {

using pl::log::crc32c;
using pl::test::DecodedEvent;
namespace fs = std::filesystem;

std::string bytes(std::initializer_list<int> values) {
  std::string s;
  for (int v : values) s.push_back(static_cast<char>(v));
  return s;
}

// RFC 3720 (iSCSI), appendix B.4: CRC-32C of four 32-byte patterns and of a SCSI read command PDU; and
// the catalogue check value of "123456789".
TEST(TensorBoardCrc32c, Rfc3720Vectors) {
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  const std::string read_pdu = bytes({0x01, 0xC0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,           // bytes 0-15
                                      0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,  // 16-31
                                      0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0});      // 32-47
  ASSERT_EQ(read_pdu.size(), 48u);
  EXPECT_EQ(crc32c(read_pdu), 0xD9963A56u);
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  // Continuing a CRC over a second piece gives the CRC of the whole.
  EXPECT_EQ(crc32c("56789", crc32c("1234")), 0xE3069283u);
}

// The record: uint64 length, its masked CRC, the data, the data's masked CRC (all little-endian); the mask
// of 0xE3069283 worked by hand: rotate right by 15 -> 0x25C7C60D, + 0xA282EAD8 -> 0xC78AB0E5.
TEST(TensorBoardRecord, FramingAndMask) {
  EXPECT_EQ(pl::log::masked_crc32c("123456789"), 0xC78AB0E5u);
  const std::string r = pl::log::tfrecord("123456789");
  ASSERT_EQ(r.size(), 8u + 4u + 9u + 4u);
  EXPECT_EQ(r.substr(0, 8), bytes({9, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r.substr(8, 4), bytes({static_cast<int>(pl::log::masked_crc32c(r.substr(0, 8)) & 0xFF),
                                   static_cast<int>((pl::log::masked_crc32c(r.substr(0, 8)) >> 8) & 0xFF),
                                   static_cast<int>((pl::log::masked_crc32c(r.substr(0, 8)) >> 16) & 0xFF),
                                   static_cast<int>(pl::log::masked_crc32c(r.substr(0, 8)) >> 24)}));
  EXPECT_EQ(r.substr(12, 9), "123456789");
  EXPECT_EQ(r.substr(21), bytes({0xE5, 0xB0, 0x8A, 0xC7}));
}

std::vector<std::string> event_files(const std::filesystem::path& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(TensorBoardWriter, RoundTripThroughTheWriterThread) {
  pl::test::TempDir tmp;
  const std::string dir = (tmp.path() / "made" / "here").string();  // created, parents too
  std::vector<std::string> notes;
  {
    pl::log::EventFileWriter w(dir, 16, [&](const std::string& n) { notes.push_back(n); });
    EXPECT_TRUE(std::regex_match(std::filesystem::path(w.path()).filename().string(),
                                 std::regex(R"(events\.out\.tfevents\.\d{10}\..+\.\d+\.\d+)")))
        << w.path();
    w.add_scalar("lm loss", 4.25, 1);
    w.add_scalar("lm loss vs samples", 4.25, 64);
    w.flush();
    w.add_scalar("learning-rate", 3e-4, 2);
    w.close();
    EXPECT_EQ(w.written(), 4);
    EXPECT_EQ(w.dropped(), 0);
  }
  EXPECT_TRUE(notes.empty());
  const std::vector<std::string> files = event_files(dir);
  ASSERT_EQ(files.size(), 1u);
  const std::vector<DecodedEvent> ev = pl::test::read_event_file(files[0]);
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[0].file_version, "brain.Event:2");
  EXPECT_TRUE(ev[0].values.empty());
  const std::vector<std::tuple<std::string, float, int64_t>> want{
      {"lm loss", 4.25f, 1}, {"lm loss vs samples", 4.25f, 64}, {"learning-rate", 3e-4f, 2}};
  for (size_t i = 0; i < want.size(); ++i) {
    const DecodedEvent& e = ev[i + 1];
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_EQ(e.values[0].first, std::get<0>(want[i]));
    EXPECT_EQ(e.values[0].second, std::get<1>(want[i]));
    EXPECT_EQ(e.step, std::get<2>(want[i]));
    EXPECT_TRUE(e.file_version.empty());
    EXPECT_GE(e.wall_time, ev[0].wall_time);
    EXPECT_GT(e.wall_time, 1.6e9);  // seconds since 1970
  }
  // A second writer in the same directory (a resumed run) starts a file of its own.
  { pl::log::EventFileWriter again(dir, 16, {}); }
  EXPECT_EQ(event_files(dir).size(), 2u);
}

TEST(TensorBoardWriter, CorruptedByteIsFoundAndNamed) {
  pl::test::TempDir tmp;
  std::string file;
  {
    pl::log::EventFileWriter w(tmp.path().string(), 4, {});
    w.add_scalar("grad-norm", 1.5, 7);
    file = w.path();
  }
  std::string content = pl::test::read_text_file(file);
  content[content.size() - 6] ^= 0x01;  // inside the last record's data
  const std::string bad = tmp.write("events.out.tfevents.bad", content);
  try {
    (void)pl::test::read_event_file(bad);
    FAIL() << "a flipped bit was not found";
  } catch (const pl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the data's CRC does not match"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
}

TEST(TensorBoardWriter, DirectoryThatCannotBeMadeNamesTheFlag) {
  pl::test::TempDir tmp;
  const std::string file = tmp.write("plain_file", "x");
  try {
    pl::log::EventFileWriter w(file + "/tb", 4, {});
    FAIL() << "a directory under a regular file was accepted";
  } catch (const pl::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_NE(what.find("--tensorboard-dir " + file + "/tb: cannot create the directory"), std::string::npos) << what;
  }
}

// However the writer thread and the pushes interleave, each scalar is either written or counted as dropped,
// and a full queue says so once.
TEST(TensorBoardWriter, OverflowDropsAndCountsEveryScalar) {
  pl::test::TempDir tmp;
  int notes = 0;
  constexpr int kScalars = 20000;
  pl::log::EventFileWriter w(tmp.path().string(), 2, [&](const std::string& n) {
    ++notes;
    EXPECT_NE(n.find("--tensorboard-queue-size"), std::string::npos) << n;
  });
  for (int i = 0; i < kScalars; ++i) w.add_scalar("x", i, i);
  w.close();
  EXPECT_EQ(w.written() - 1 + w.dropped(), kScalars);
  EXPECT_EQ(notes, w.dropped() > 0 ? 1 : 0);
  EXPECT_EQ(static_cast<int64_t>(pl::test::read_event_file(w.path()).size()), w.written());
}

// Which tags at which steps: per-iteration ones every --tensorboard-log-interval (and "vs samples" at the
// consumed samples), the interval's at each call, the optional ones only when asked for.
TEST(TensorBoardLog, MegatronTagsAndSteps) {
  pl::test::TempDir tmp;
  pl::observe::TensorBoardConfig cfg;
  cfg.dir = tmp.path().string();
  cfg.log_interval = 2;
  cfg.log_timers = true;
  cfg.log_memory = true;
  std::string path;
  {
    pl::observe::TensorBoardLog tb(cfg, {});
    path = tb.path();
    for (int64_t it = 1; it <= 4; ++it) {
      pl::log::IterationRecord s;
      s.iteration = it;
      s.consumed_samples = 8 * it;
      s.lm_loss = 5.0 - static_cast<double>(it);
      s.grad_norm = it == 4 ? std::nan("") : 1.0;  // iteration 4 skipped: no grad-norm
      s.memory.allocated = 1000;
      tb.on_iteration(s);
    }
    pl::log::IntervalRecord interval;
    interval.iteration = 4;
    interval.seconds_per_iteration = 0.5;
    interval.tflops_per_gpu = 12.0;
    interval.tokens_per_second = 1024.0;
    interval.timers = {{"forward-backward", {{0, 250.0}, {1, 500.0}}}};
    tb.on_interval(interval);
    tb.on_eval(pl::log::EvalRecord{4, 32, false, false, 2.0});
    EXPECT_NE(tb.close().find("scalars written to " + path), std::string::npos);
  }
  std::map<std::string, std::vector<std::pair<int64_t, float>>> by_tag;
  for (const DecodedEvent& e : pl::test::read_event_file(path))
    for (const auto& [tag, value] : e.values) by_tag[tag].emplace_back(e.step, value);
  using Points = std::vector<std::pair<int64_t, float>>;
  EXPECT_EQ(by_tag["lm loss"], (Points{{2, 3.0f}, {4, 1.0f}}));
  EXPECT_EQ(by_tag["lm loss vs samples"], (Points{{16, 3.0f}, {32, 1.0f}}));
  EXPECT_EQ(by_tag["grad-norm"], (Points{{2, 1.0f}}));
  EXPECT_EQ(by_tag["loss-scale"].size(), 2u);            // on by default (Megatron's)
  EXPECT_EQ(by_tag["mem-allocated-bytes"], (Points{{2, 1000.0f}, {4, 1000.0f}}));
  EXPECT_EQ(by_tag["forward-backward-time"], (Points{{4, 0.5f}}));  // max over ranks, seconds
  EXPECT_EQ(by_tag["iteration-time"], (Points{{4, 0.5f}}));
  EXPECT_EQ(by_tag["throughput"], (Points{{4, 12.0f}}));
  EXPECT_EQ(by_tag["throughput/tokens_per_sec"], (Points{{4, 1024.0f}}));
  EXPECT_EQ(by_tag["lm loss validation"], (Points{{4, 2.0f}}));
  EXPECT_EQ(by_tag["lm loss validation vs samples"], (Points{{32, 2.0f}}));
  EXPECT_EQ(by_tag.count("lm loss validation ppl"), 0u);  // only with --log-validation-ppl-to-tensorboard
  EXPECT_EQ(by_tag.count("world-size"), 0u);
}

// A full disk (a file size limit in a forked child, SIGXFSZ ignored): the events file ends in its last whole
// record, which every reader takes whole, and the writer says so once; the records it kept are counted written.
TEST(TensorBoardWriter, AFullDiskLeavesOnlyWholeRecords) {
  pl::test::TempDir tmp;
  const std::string report = (tmp.path() / "report").string();
  const int code = pl::test::run_forked([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit r{};
    ::getrlimit(RLIMIT_FSIZE, &r);
    const rlim_t unlimited = r.rlim_cur;
    r.rlim_cur = 1000;  // the soft limit: lifted again for the report
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(9);
    std::vector<std::string> notes;
    pl::log::EventFileWriter w((tmp.path() / "tb").string(), 1000, [&](const std::string& n) { notes.push_back(n); });
    for (int i = 0; i < 200; ++i) {
      w.add_scalar("lm loss", 1.0 / (i + 1), i);
      if (i % 10 == 9) w.flush();
    }
    w.close();
    r.rlim_cur = unlimited;
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(8);
    std::ofstream out(report);
    out << w.path() << "\n" << w.written() << "\n" << w.dropped() << "\n";
    for (const std::string& n : notes) out << n << "\n";
  });
  ASSERT_EQ(code, 0);
  const std::vector<std::string> lines = pl::test::split_lines(pl::test::read_text_file(report));
  ASSERT_GE(lines.size(), 4u);
  const std::vector<DecodedEvent> ev = pl::test::read_event_file(lines[0]);  // throws on a torn record
  EXPECT_EQ(static_cast<int64_t>(ev.size()), std::stoll(lines[1]));
  EXPECT_GT(ev.size(), 5u);
  EXPECT_EQ(std::stoll(lines[1]) - 1 + std::stoll(lines[2]), 200);
  EXPECT_LE(std::filesystem::file_size(lines[0]), 1000u);
  EXPECT_EQ(std::count_if(lines.begin() + 3, lines.end(),
                          [](const std::string& l) { return l.find("the file ends after its last whole record") !=
                                                            std::string::npos; }),
            1);
}

// The first record failing leaves no empty file, nor the directories made for it; and a TensorBoardLog whose
// run never reached a record (a failed start) removes its file, while one that did keeps it.
TEST(TensorBoardWriter, AFailedStartLeavesNothingBehind) {
  pl::test::TempDir tmp;
  const fs::path made = tmp.path() / "made";
  const int code = pl::test::run_forked([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{10, 10};  // smaller than the file_version record (nothing is written after it)
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(9);
    pl::log::EventFileWriter w((made / "tb").string(), 4, {});
  });
  EXPECT_EQ(code, 1);  // the constructor's one-line pl::Error
  EXPECT_FALSE(fs::exists(made));
  pl::observe::TensorBoardConfig cfg;
  cfg.dir = (made / "tb").string();
  { pl::observe::TensorBoardLog never_started(cfg, {}); }
  EXPECT_FALSE(fs::exists(made));
  std::string kept;
  {
    pl::observe::TensorBoardLog ran(cfg, {});
    kept = ran.path();
    ran.on_end(pl::log::RunEnd{});
  }
  EXPECT_TRUE(fs::exists(kept));
}

}  // namespace
