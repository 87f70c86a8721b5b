// io/record_log.h: a log file holds whole records only. A full disk is played by a file size limit
// (RLIMIT_FSIZE, SIGXFSZ ignored: write(2) then fails with EFBIG after a short count) in a forked child, so
// the limit never touches the test process.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <fcntl.h>
#include <fstream>
#include <string>
#include <vector>

#include "io/record_log.h"
#include "test_util.h"

namespace pl {
namespace {

// Runs fn in a child whose files cannot grow beyond `limit` bytes (the soft limit: lift() ends it, so the
// child can write its report).
int with_file_size_limit(rlim_t limit, const std::function<void()>& fn) {
  return test::run_forked([&] {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit r{};
    if (::getrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(9);
    r.rlim_cur = limit;
    if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(9);
    fn();
  });
}

void lift() {
  rlimit r{};
  ::getrlimit(RLIMIT_FSIZE, &r);
  r.rlim_cur = r.rlim_max;
  if (::setrlimit(RLIMIT_FSIZE, &r) != 0) ::_exit(8);
}

TEST(RecordLog, AWriteThatFailsPartWayIsCutBackToTheLastWholeRecord) {
  test::TempDir dir;
  const std::string path = (dir.path() / "log").string();
  const std::string report = (dir.path() / "report").string();
  // Batches of three 10-byte records: three batches fit (90 bytes), the fourth stops 5 bytes into its first record
  // at the limit (95), so that torn record is cut and nine whole ones remain.
  const int code = with_file_size_limit(95, [&] {
    RecordLog log(open_fd(path, O_WRONLY | O_CREAT | O_TRUNC));
    const std::string batch = "record-01\nrecord-02\nrecord-03\n";
    const std::vector<size_t> ends = {10, 20, 30};
    std::string error;
    for (int i = 0; i < 10 && error.empty(); ++i) error = log.append(batch, ends);
    lift();
    std::ofstream(report) << log.whole_bytes() << "\n" << error;
  });
  ASSERT_EQ(code, 0);
  const std::string r = test::read_text_file(report);
  EXPECT_EQ(r.substr(0, r.find('\n')), "90");
  EXPECT_NE(r.find("write failed after 5 of 30 bytes"), std::string::npos) << r;
  EXPECT_NE(r.find("the file ends after its last whole record (90 bytes)"), std::string::npos) << r;
  EXPECT_EQ(std::filesystem::file_size(path), 90u);
}

TEST(RecordLog, AppendsAfterWhatTheFileHeldAndAfterACut) {
  test::TempDir dir;
  const std::string path = dir.write("log", "old line\n");
  {
    RecordLog log(open_fd(path, O_WRONLY));
    EXPECT_EQ(log.whole_bytes(), 9u);
    EXPECT_EQ(log.append("new line\n"), "");
  }
  EXPECT_EQ(test::read_text_file(path), "old line\nnew line\n");
  // A record larger than the room left: nothing of it stays, and a smaller one still fits after the cut.
  const int code = with_file_size_limit(30, [&] {
    RecordLog log(open_fd(path, O_WRONLY));
    if (log.append(std::string(20, 'x') + "\n").empty()) ::_exit(3);
    if (log.whole_bytes() != 18) ::_exit(4);
    if (!log.append("short\n").empty()) ::_exit(5);
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(test::read_text_file(path), "old line\nnew line\nshort\n");
}

}  // namespace
}  // namespace pl
