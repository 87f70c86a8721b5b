// The descriptor helper (io/fd.h): whole reads and writes, the one-line errors naming the path, the
// owning descriptor's move and close, and the one cleaner of dead processes' temporaries.
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "io/fd.h"
#include "test_util.h"

namespace pl {
namespace {

namespace fs = std::filesystem;

bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

std::string pattern(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>((i * 7919) % 256));  // NULs included
  return s;
}

TEST(Fd, WriteAllThenReadUpToGivesEveryByteBack) {
  test::TempDir dir;
  const std::string p = (dir.path() / "data").string();
  const std::string content = pattern(300000);
  UniqueFd out = open_fd(p, O_WRONLY | O_CREAT | O_TRUNC);
  write_all(out, content.data(), content.size());
  pwrite_all(out, "XY", 2, 10);
  out.close();
  EXPECT_FALSE(out.valid());

  std::string expected = content;
  expected.replace(10, 2, "XY");
  const UniqueFd in = open_fd(p, O_RDONLY);
  EXPECT_EQ(file_size(in), content.size());
  std::string got(content.size() + 100, '\0');
  EXPECT_EQ(read_up_to(in, got.data(), got.size()), content.size());  // fewer only at the end of the file
  got.resize(content.size());
  EXPECT_EQ(got, expected);
  char byte = 0;
  EXPECT_EQ(read_up_to(in, &byte, 1), 0u);
  char two[2] = {};
  pread_exact(in, two, 2, 10);
  EXPECT_EQ(std::string(two, 2), "XY");

  const UniqueFd again = open_fd(p, O_RDONLY);
  std::string head(1000, '\0');
  read_up_to(again, head.data(), head.size());
  EXPECT_EQ(read_rest(again), expected.substr(1000));  // from the current position
}

TEST(Fd, PreadExactPastTheEndIsOneTruncatedLineNamingThePath) {
  test::TempDir dir;
  const std::string p = dir.write("short", "0123456789");
  const UniqueFd fd = open_fd(p, O_RDONLY);
  char buf[32];
  test::expect_one_line_error([&] { pread_exact(fd, buf, 20, 0); }, {p, "truncated", "20 bytes at offset 0", "10 there"});
  test::expect_one_line_error([&] { pread_exact(fd, buf, 4, 8); }, {p, "truncated", "offset 8", "2 there"});
  pread_exact(fd, buf, 10, 0);  // exactly to the end is not truncated
  EXPECT_EQ(std::string(buf, 10), "0123456789");
}

TEST(Fd, FailuresAreOneLineNamingThePath) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "missing").string();
  test::expect_one_line_error([&] { open_fd(missing, O_RDONLY); }, {missing, "cannot open", "No such file"});
  const std::string nowhere = (dir.path() / "no" / "dir").string();
  test::expect_one_line_error([&] { open_fd(nowhere, O_WRONLY | O_CREAT); }, {nowhere, "for writing"});
  const UniqueFd none = try_open_fd(missing, O_RDONLY);
  const int err = errno;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(err, ENOENT);
  const std::string p = dir.write("read-only", "abc");
  const UniqueFd ro = open_fd(p, O_RDONLY);
  test::expect_one_line_error([&] { write_all(ro, "x"); }, {p, "write failed after 0 of 1 bytes"});
  test::expect_one_line_error([&] { fsync_directory(missing); }, {missing, "fsync"});
}

TEST(Fd, UniqueFdOwnsOneDescriptorThroughMovesAndClosesItOnce) {
  test::TempDir dir;
  const std::string p = dir.write("f", "abc");
  int raw = -1;
  {
    UniqueFd a = open_fd(p, O_RDONLY);
    raw = a.get();
    EXPECT_NE(::fcntl(raw, F_GETFD) & FD_CLOEXEC, 0);
    UniqueFd b(std::move(a));
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(b.get(), raw);
    EXPECT_EQ(b.path(), p);
    UniqueFd c;
    c = std::move(b);
    EXPECT_FALSE(b.valid());
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));  // the destructor closed it

  UniqueFd x = open_fd(p, O_RDONLY), y = open_fd(p, O_RDONLY);
  const int old_x = x.get(), old_y = y.get();
  x = std::move(y);  // x's own descriptor is closed, y's taken over
  EXPECT_FALSE(is_open(old_x));
  EXPECT_EQ(x.get(), old_y);
  x.close();
  EXPECT_FALSE(is_open(old_y));
  x.close();  // a second close does nothing

  UniqueFd r = open_fd(p, O_RDONLY);
  const int released = r.release();
  EXPECT_FALSE(r.valid());
  EXPECT_TRUE(is_open(released));  // release() hands it over unclosed
  ::close(released);
  UniqueFd stale(released, p);  // already closed: close() reports it
  test::expect_one_line_error([&] { stale.close(); }, {p, "cannot close"});
}

TEST(Fd, PidAfterReadsOnlyAllDigitNames) {
  EXPECT_EQ(pid_after("x.tmp-123", "x.tmp-"), 123);
  EXPECT_EQ(pid_after("x.tmp-", "x.tmp-"), -1);
  EXPECT_EQ(pid_after("x.tmp-12a", "x.tmp-"), -1);
  EXPECT_EQ(pid_after("x.tmp-1234567890", "x.tmp-"), -1);  // more than 9 digits
  EXPECT_EQ(pid_after("y.tmp-123", "x.tmp-"), -1);
  EXPECT_TRUE(pid_alive(::getpid()));
  EXPECT_FALSE(pid_alive(0));
  EXPECT_FALSE(pid_alive(test::dead_pid()));
}

TEST(Fd, RemoveDeadTemporariesTakesDeadAndOwnKeepsLiveAndOthers) {
  test::TempDir dir;
  const auto name = [](long pid) { return "tmp-" + std::to_string(pid); };
  const long dead = test::dead_pid();
  fs::create_directories(dir.path() / name(dead) / "sub");
  dir.write(name(dead) + "/sub/file", "half written");  // removed recursively
  dir.write(name(::getpid()), "this process's: stale by now");
  dir.write(name(::getppid()), "a live process's");
  dir.write(name(1), "init's");
  dir.write("no-pid.tmp", "a temporary without a pid");
  dir.write("tmp-12x", "not a temporary");
  dir.write("data.bin", "not a temporary");
  remove_dead_temporaries(dir.path().string(), [](const std::string& n) {
    return n == "no-pid.tmp" ? 0L : pid_after(n, "tmp-");
  });
  EXPECT_FALSE(fs::exists(dir.path() / name(dead)));
  EXPECT_FALSE(fs::exists(dir.path() / name(::getpid())));
  EXPECT_FALSE(fs::exists(dir.path() / "no-pid.tmp"));
  for (const std::string& kept : {name(::getppid()), name(1), std::string("tmp-12x"), std::string("data.bin")})
    EXPECT_TRUE(fs::exists(dir.path() / kept)) << kept;
  remove_dead_temporaries((dir.path() / "missing").string(), [](const std::string&) { return 0L; });  // no throw
}

}  // namespace
}  // namespace pl
