// FileSet (io/atomic_file.h): several files published as one set. A failure before or during the
// publish leaves the previous set byte-identical; a kill -9 at every point of the publish is recovered
// to the old or the new set; temporaries of dead processes are cleaned up, those of live ones kept; a
// live writer's journal stops another writer.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "test_util.h"

namespace pl {
namespace {

namespace fs = std::filesystem;
using test::dead_pid;
using test::run_forked;
using Files = std::map<std::string, std::string>;  // name -> contents

// Every entry of `dir` with its contents ("<dir>" for a directory).
Files file_set_snapshot(const fs::path& dir) {
  Files out;
  for (const auto& e : fs::directory_iterator(dir))
    out[e.path().filename().string()] = e.is_directory() ? "<dir>" : test::read_text_file(e.path().string());
  return out;
}

std::string at(const test::TempDir& d, const std::string& name) { return (d.path() / name).string(); }

const Files kOld = {{"a", "old a"}, {"b", "old bbbb"}, {"gone", "only in the old set"}};
// The new set: a and b replaced, c new, gone removed.
const Files kNew = {{"a", "new a, longer"}, {"b", "new b"}, {"c", "new c"}};

void write_old(const test::TempDir& d) {
  for (const auto& [name, text] : kOld) d.write(name, text);
}

// FileSet's test hook (io/atomic_file.h): this process killed at `point` of every publish.
void kill_at(int point) {
  set_publish_test_hook([point](int at) {
    if (at == point) ::raise(SIGKILL);
  });
}

// Publishes kNew (journal "set.publish-journal"); `before_publish` runs after the files are written.
void publish_new(const test::TempDir& d, const std::function<void()>& before_publish = {}) {
  FileSet set({at(d, "set.publish-journal")});
  for (const char* name : {"a", "b", "c"}) set.add(at(d, name)).write(kNew.at(name));
  set.remove_on_publish(at(d, "gone"));
  if (before_publish) before_publish();
  set.publish();
}

TEST(FileSet, PublishesTheNewSetAndLeavesNothingElse) {
  test::TempDir d;
  write_old(d);
  publish_new(d);
  EXPECT_EQ(file_set_snapshot(d.path()), kNew);
}

TEST(FileSet, AFailureBeforePublishLeavesTheOldSetAndRemovesOnlyThisRunsTemporaries) {
  test::TempDir d;
  write_old(d);
  const std::string live_tmp = at(d, "a.tmp-" + std::to_string(::getppid()));  // another live process's
  d.write(live_tmp.substr(live_tmp.rfind('/') + 1), "theirs");
  Files expected = kOld;
  expected["a.tmp-" + std::to_string(::getppid())] = "theirs";
  EXPECT_THROW(publish_new(d, [] { throw Error("no"); }), Error);
  EXPECT_EQ(file_set_snapshot(d.path()), expected);
}

TEST(FileSet, AFullDiskLeavesTheOldSetByteIdentical) {
  test::TempDir d;
  write_old(d);
  const int code = run_forked([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    int result = 8;
    {
      FileSet set({at(d, "set.publish-journal")});
      set.add(at(d, "a")).write("small");
      AtomicFile& b = set.add(at(d, "b"));
      const std::string big(1 << 20, 'x');
      try {
        b.write(big);
      } catch (const Error& e) {
        const std::string m = e.what();
        result = m.find("File too large") != std::string::npos && m.find(b.tmp_path()) != std::string::npos ? 7 : 9;
      }
    }  // the set, unpublished, removes its temporaries
    ::_exit(result);
  });
  EXPECT_EQ(code, 7);
  EXPECT_EQ(file_set_snapshot(d.path()), kOld);
}

TEST(FileSet, AFailureBetweenRenamesRollsBackInProcess) {
  test::TempDir d;
  for (int point = 0; point <= 4; ++point) {
    SCOPED_TRACE(point);
    write_old(d);
    set_publish_test_hook([point](int at) { PL_CHECK(at != point, "forced failure at point {}", at); });
    test::expect_one_line_error([&] { publish_new(d); }, {"forced failure", "rolled back"});
    set_publish_test_hook({});
    EXPECT_EQ(file_set_snapshot(d.path()), kOld);
  }
}

TEST(FileSet, AKillAtAnyPointIsRecoveredToTheNewSet) {
  // Points 0 (backups made) .. 4 (all renamed and removed) .. 5 (backups dropped, journal left).
  for (int point = 0; point <= 5; ++point) {
    SCOPED_TRACE(point);
    test::TempDir d;
    write_old(d);
    const int code = run_forked([&] {
      kill_at(point);
      publish_new(d);
    });
    ASSERT_EQ(code, 128 + SIGKILL);
    const std::string journal = at(d, "set.publish-journal");
    const std::optional<JournalState> st = file_set_journal_state(journal);
    ASSERT_TRUE(st.has_value());
    EXPECT_FALSE(st->alive);
    EXPECT_NE(file_set_snapshot(d.path()), kNew);
    // The next FileSet on this journal completes the publish and says so in one line.
    std::vector<std::string> said;
    { FileSet next({journal}, [&](const std::string& m) { said.push_back(m); }); }
    ASSERT_EQ(said.size(), 1u);
    EXPECT_NE(said[0].find("rolled forward"), std::string::npos) << said[0];
    EXPECT_NE(said[0].find(std::to_string(st->pid)), std::string::npos) << said[0];
    EXPECT_EQ(file_set_snapshot(d.path()), kNew);
  }
}

TEST(FileSet, AKillBeforeTheRenamesWithANewFileLostIsRolledBack) {
  for (int point : {0, 1}) {
    SCOPED_TRACE(point);
    test::TempDir d;
    write_old(d);
    long child = 0;
    const int code = run_forked([&] {
      kill_at(point);
      publish_new(d);
    });
    ASSERT_EQ(code, 128 + SIGKILL);
    const std::string journal = at(d, "set.publish-journal");
    child = file_set_journal_state(journal)->pid;
    // b's new file (not yet renamed) is lost: the new set cannot be completed, the old one is restored.
    fs::remove(at(d, "b.tmp-" + std::to_string(child)));
    const std::string said = recover_file_set(journal);
    EXPECT_NE(said.find("rolled back"), std::string::npos) << said;
    EXPECT_EQ(file_set_snapshot(d.path()), kOld);
    EXPECT_EQ(recover_file_set(journal), "");
  }
}

TEST(FileSet, AJournalIsRecoveredFromAnotherDirectoryAfterTheSetWasMoved) {
  test::TempDir d;
  fs::create_directory(d.path() / "s");
  for (const auto& [name, text] : kOld) d.write("s/" + name, text);
  const int code = run_forked([&] {
    // Relative names, from inside the set's directory.
    if (::chdir((d.path() / "s").c_str()) != 0) ::_exit(3);
    kill_at(2);
    FileSet set({"set.publish-journal"});
    for (const char* name : {"a", "b", "c"}) set.add(name).write(kNew.at(name));
    set.remove_on_publish("gone");
    set.publish();
  });
  ASSERT_EQ(code, 128 + SIGKILL);
  fs::rename(d.path() / "s", d.path() / "moved");
  const std::string said = recover_file_set(at(d, "moved/set.publish-journal"));
  EXPECT_NE(said.find("rolled forward"), std::string::npos) << said;
  EXPECT_EQ(file_set_snapshot(d.path() / "moved"), kNew);
}

TEST(FileSet, StaleTemporariesOfDeadProcessesAreRemovedThoseOfLiveOnesKept) {
  test::TempDir d;
  write_old(d);
  const std::string dead = std::to_string(dead_pid());
  const std::string live = std::to_string(::getppid());
  fs::create_directory(at(d, "a.tmp-" + dead));  // even a directory
  d.write("a.tmp-" + dead + "/inside", "x");
  d.write("b.bak-" + dead, "stale backup");
  d.write("c.tmp-" + live, "a live process's");
  d.write("a.tmp", "a plain .tmp: whose, we cannot tell");
  d.write("set.publish-journal.tmp-" + dead, "{");
  publish_new(d);
  Files expected = kNew;
  expected["c.tmp-" + live] = "a live process's";
  expected["a.tmp"] = "a plain .tmp: whose, we cannot tell";
  EXPECT_EQ(file_set_snapshot(d.path()), expected);
}

TEST(FileSet, ALiveWritersJournalStopsASecondWriter) {
  test::TempDir d;
  write_old(d);
  const std::string journal = at(d, "set.publish-journal");
  const std::string parent = std::to_string(::getppid());
  d.write("set.publish-journal", "{\"version\": 1, \"pid\": " + parent + ", \"journals\": [], \"members\": []}");
  ASSERT_TRUE(file_set_journal_state(journal).has_value());
  EXPECT_TRUE(file_set_journal_state(journal)->alive);
  test::expect_one_line_error([&] { publish_new(d); }, {journal, "process " + parent, "publishing"});
  Files expected = kOld;
  expected["set.publish-journal"] = test::read_text_file(journal);
  EXPECT_EQ(file_set_snapshot(d.path()), expected);
  // A malformed journal is one line naming it, not a crash.
  d.write("set.publish-journal", "[[[[");
  test::expect_one_line_error([&] { (void)file_set_journal_state(journal); }, {journal});
}

TEST(FileSet, AnExistingDirectoryAtAFinalNameIsRefusedBeforeAnythingChanges) {
  test::TempDir d;
  write_old(d);
  fs::create_directory(at(d, "c"));
  test::expect_one_line_error([&] { publish_new(d); }, {at(d, "c"), "not a regular file"});
  Files expected = kOld;
  expected["c"] = "<dir>";
  EXPECT_EQ(file_set_snapshot(d.path()), expected);
}

}  // namespace
}  // namespace pl
