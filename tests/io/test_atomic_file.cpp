// The one atomic writer (io/atomic_file.h): the target is replaced only on success; a failure part
// way leaves the previous target and no temporary; a directory is published whole; the parent
// directory's fsync reports its errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "test_util.h"

namespace pl {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(AtomicFile, ReplacesTheTargetOnlyOnSuccess) {
  test::TempDir dir;
  const std::string p = (dir.path() / "f.txt").string();
  write_file_atomically(p, "old contents");
  EXPECT_EQ(test::read_text_file(p), "old contents");
  // Part way through, the temporary holds the new bytes and the target still the old ones.
  write_file_atomically(p, [&](AtomicFile& f) {
    f.write("new ");
    EXPECT_EQ(f.tmp_path(), p + ".tmp");
    EXPECT_EQ(test::read_text_file(p), "old contents");
    EXPECT_TRUE(fs::exists(f.tmp_path()));
    f.write("contents, longer");
    EXPECT_EQ(f.bytes_written(), 20u);
  });
  EXPECT_EQ(test::read_text_file(p), "new contents, longer");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"f.txt"});
}

TEST(AtomicFile, AFailingWriterLeavesTheOldTargetAndNoTemporary) {
  test::TempDir dir;
  const std::string p = (dir.path() / "f.bin").string();
  write_file_atomically(p, "previous");
  EXPECT_THROW(write_file_atomically(p,
                                     [&](AtomicFile& f) {
                                       f.write(std::string(1 << 20, 'x'));
                                       throw std::runtime_error("writer failed mid-way");
                                     }),
               std::runtime_error);
  EXPECT_EQ(test::read_text_file(p), "previous");
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"f.bin"});
  // The same with a suffix of its own (checkpoints' ".tmp-<pid>") and no previous target.
  const std::string q = (dir.path() / "g.bin").string();
  EXPECT_THROW(write_file_atomically(q, [&](AtomicFile&) { throw Error("no"); }, process_tmp_suffix()), Error);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"f.bin"});
}

TEST(AtomicFile, ErrorsAreOneLineNamingThePathAndTheReason) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "no_such_dir" / "f").string();
  test::expect_one_line_error([&] { write_file_atomically(missing, "x"); }, {missing + ".tmp", "No such file or directory"});
  // The rename fails (the target is a non-empty directory): the temporary is removed.
  const fs::path taken = dir.path() / "taken";
  fs::create_directories(taken / "inside");
  test::expect_one_line_error([&] { write_file_atomically(taken.string(), "x"); }, {taken.string(), "rename"});
  EXPECT_TRUE(fs::is_directory(taken / "inside"));
  EXPECT_FALSE(fs::exists(taken.string() + ".tmp"));
  // The parent fsync: a directory that is not there, or a file that is not a directory.
  test::expect_one_line_error([&] { fsync_directory(missing); }, {missing, "No such file or directory"});
  const std::string file = dir.write("plain", "x");
  test::expect_one_line_error([&] { fsync_directory(file); }, {file, "Not a directory"});
  fsync_directory(dir.path().string());
  // A relative path's parent is the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir.path());
  write_file_atomically("relative.txt", "r");
  fs::current_path(cwd);
  EXPECT_EQ(test::read_text_file((dir.path() / "relative.txt").string()), "r");
}

TEST(AtomicFile, FilesPublishedTogetherAreAllFinishedFirst) {
  test::TempDir dir;
  AtomicFile a((dir.path() / "a").string()), b((dir.path() / "b").string());
  a.write("A");
  b.write("B");
  a.finish();
  b.finish();
  EXPECT_THROW(a.write("late"), Error);  // finished: closed
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"a.tmp", "b.tmp"}));
  a.commit();
  b.commit();
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(test::read_text_file((dir.path() / "b").string()), "B");
}

TEST(AtomicDirectory, PublishesAWholeDirectoryAndReplacesAnOldOne) {
  test::TempDir dir;
  const std::string out = (dir.path() / "out").string();
  write_directory_atomically(out, [&](const std::string& tmp) {
    EXPECT_EQ(tmp, out + process_tmp_suffix());
    EXPECT_FALSE(fs::exists(out));
    write_file_atomically(tmp + "/one", "1");
    write_file_atomically(tmp + "/two", "2");
  });
  EXPECT_EQ(entries(out), (std::vector<std::string>{"one", "two"}));
  // A second publish replaces the directory as a whole (no file of the old one survives); a trailing
  // slash names the same directory.
  write_directory_atomically(out + "/", [&](const std::string& tmp) {
    EXPECT_EQ(entries(out), (std::vector<std::string>{"one", "two"}));
    write_file_atomically(tmp + "/three", "3");
  });
  EXPECT_EQ(entries(out), std::vector<std::string>{"three"});
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"out"});
}

TEST(AtomicDirectory, AFailingFillLeavesTheOldDirectoryAndNoTemporary) {
  test::TempDir dir;
  const std::string out = (dir.path() / "out").string();
  write_directory_atomically(out, [&](const std::string& tmp) { write_file_atomically(tmp + "/kept", "k"); });
  // A crash of an earlier process with this pid left a temporary: it is cleared first.
  fs::create_directories(out + process_tmp_suffix() + "/stale");
  EXPECT_THROW(write_directory_atomically(out,
                                          [&](const std::string& tmp) {
                                            EXPECT_FALSE(fs::exists(tmp + "/stale"));
                                            write_file_atomically(tmp + "/half", "h");
                                            throw std::runtime_error("fill failed mid-way");
                                          }),
               std::runtime_error);
  EXPECT_EQ(entries(out), std::vector<std::string>{"kept"});
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"out"});
}

// Killed writers' "<out>.tmp-N" directories (convert_checkpoint --overwrite killed part way) are removed by the
// next publish when N is no longer a process; a live process's is left alone (issue 38).
TEST(AtomicDirectory, ThePublishRemovesTheTemporariesOfDeadWriters) {
  test::TempDir dir;
  const std::string out = (dir.path() / "out").string();
  const std::string dead = out + ".tmp-" + std::to_string(test::dead_pid());
  const std::string live = out + ".tmp-1";  // init: always alive
  fs::create_directories(dead + "/model-00001-of-00002.safetensors.tmp-9");
  fs::create_directories(live);
  write_directory_atomically(out, [&](const std::string& tmp) { write_file_atomically(tmp + "/one", "1"); });
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(entries(out), std::vector<std::string>{"one"});
}

}  // namespace
}  // namespace pl
