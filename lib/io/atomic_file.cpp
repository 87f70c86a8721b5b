#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2 (glibc, _GNU_SOURCE)
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_text.h"

namespace pl {
namespace fs = std::filesystem;

namespace {

std::string parent_of(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

void remove_stale_temporaries(const std::string& path);  // below, with the file set

}  // namespace

std::string process_tmp_suffix() { return ".tmp-" + std::to_string(::getpid()); }

void rename_path(const std::string& from, const std::string& to) {
  PL_CHECK(::rename(from.c_str(), to.c_str()) == 0, "{}: cannot rename {} onto it: {}", to, from, std::strerror(errno));
}

AtomicFile::AtomicFile(std::string path, std::string tmp_suffix)
    : path_(std::move(path)), tmp_(path_ + tmp_suffix), fd_(open_fd(tmp_, O_WRONLY | O_CREAT | O_TRUNC)) {}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  PL_CHECK(fd_.valid(), "{}: write after finish", tmp_);
  write_all(fd_, data, bytes);
  written_ += bytes;
}

void AtomicFile::write_at(uint64_t offset, const void* data, size_t bytes) {
  PL_CHECK(fd_.valid(), "{}: write after finish", tmp_);
  pwrite_all(fd_, data, bytes, offset);
  written_ += bytes;
}

void AtomicFile::finish() {
  if (!fd_.valid()) return;
  fsync_fd(fd_);
  fd_.close();
}

void AtomicFile::commit() {
  finish();
  rename_path(tmp_, path_);
  committed_ = true;
  fsync_directory(parent_of(path_));
}

void write_file_atomically(const std::string& path, const std::function<void(AtomicFile&)>& fill,
                           const std::string& tmp_suffix) {
  AtomicFile f(path, tmp_suffix);
  fill(f);
  f.commit();
}

void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& tmp_suffix) {
  write_file_atomically(path, [&](AtomicFile& f) { f.write(bytes); }, tmp_suffix);
}

void write_directory_atomically(const std::string& path_in, const std::function<void(const std::string&)>& fill,
                                const std::string& tmp_suffix) {
  fs::path p(path_in);
  if (p.filename().empty()) p = p.parent_path();  // "out/" names "out"
  const std::string path = p.string();
  const std::string tmp = path + (tmp_suffix.empty() ? process_tmp_suffix() : tmp_suffix);
  // The one cleaner, as for files: the "<path>.tmp-N" directories of killed writers (N a pid that no longer
  // exists, or ours from an earlier process) would otherwise stay forever beside the output.
  remove_stale_temporaries(path);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  PL_CHECK(!ec, "{}: cannot create the directory: {}", tmp, ec.message());
  try {
    fill(tmp);
    fsync_directory(tmp);
    if (!fs::exists(path, ec)) {
      rename_path(tmp, path);
    } else {
      // Both names stay valid throughout; `tmp` then holds the previous directory.
      PL_CHECK(::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0,
               "{}: cannot replace it atomically with {}: {}", path, tmp, std::strerror(errno));
    }
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  fs::remove_all(tmp, ec);
  fsync_directory(parent_of(path));
}

// ---------------------------------------------------------------------------------------------
// FileSet

namespace {

constexpr int kJournalVersion = 1;

// The inode of `path` (not following a symlink), or 0 when it does not exist.
uint64_t inode_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

void unlink_if_present(const std::string& path) {
  PL_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT, "{}: cannot remove: {}", path, std::strerror(errno));
}

// Removes "<path>.tmp-N" and "<path>.bak-N" of processes that no longer exist (N == our pid: a
// dead process's, as we have not created ours yet).
void remove_stale_temporaries(const std::string& path) {
  const std::string base = fs::path(path).filename().string();
  remove_dead_temporaries(parent_of(path), [&](const std::string& name) {
    const long tmp = pid_after(name, base + ".tmp-");
    return tmp >= 0 ? tmp : pid_after(name, base + ".bak-");
  });
}

struct JournalEntry {
  std::string path, tmp, backup;  // backup "": there was no old file
  uint64_t ino = 0;               // the new file's inode (0 for a removal)
  bool remove = false;
};

struct Journal {
  long pid = 0;
  std::vector<std::string> names;
  std::vector<JournalEntry> entries;
};

// Paths in the journal are relative to its directory, so that a recovery works from any working
// directory and after the directory was moved or mounted elsewhere.
fs::path journal_base(const std::string& journal) { return fs::absolute(parent_of(journal)).lexically_normal(); }

std::string relative_to(const fs::path& base, const std::string& path) {
  return fs::absolute(path).lexically_normal().lexically_relative(base).string();
}

std::string resolve(const fs::path& base, const std::string& rel) { return (base / rel).lexically_normal().string(); }

std::string journal_text(const Journal& j) {
  const fs::path base = journal_base(j.names.front());
  auto rel = [&](const std::string& p) { return p.empty() ? p : relative_to(base, p); };
  nlohmann::ordered_json out;
  out["version"] = kJournalVersion;
  out["pid"] = j.pid;
  std::vector<std::string> names;
  for (const std::string& n : j.names) names.push_back(rel(n));
  out["journals"] = names;
  nlohmann::ordered_json members = nlohmann::ordered_json::array();
  for (const JournalEntry& e : j.entries)
    members.push_back(
        {{"path", rel(e.path)}, {"tmp", rel(e.tmp)}, {"backup", rel(e.backup)}, {"ino", e.ino}, {"remove", e.remove}});
  out["members"] = std::move(members);
  return out.dump(1) + "\n";
}

Journal read_journal(const std::string& path) {
  const UniqueFd fd = try_open_fd(path, O_RDONLY);
  PL_CHECK(fd.valid(), "{}: cannot open the publish journal: {}", path, std::strerror(errno));
  const nlohmann::json j = parse_json_text(read_rest(fd), path);
  try {
    PL_CHECK(j.is_object() && j.at("version").get<int>() == kJournalVersion,
             "{}: not a version {} publish journal", path, kJournalVersion);
    Journal out;
    const fs::path base = journal_base(path);
    auto at = [&](const std::string& rel) { return rel.empty() ? rel : resolve(base, rel); };
    out.pid = j.at("pid").get<long>();
    for (const std::string& n : j.at("journals").get<std::vector<std::string>>()) out.names.push_back(at(n));
    for (const nlohmann::json& m : j.at("members")) {
      JournalEntry e;
      e.path = at(m.at("path").get<std::string>());
      e.tmp = at(m.at("tmp").get<std::string>());
      e.backup = at(m.at("backup").get<std::string>());
      e.ino = m.at("ino").get<uint64_t>();
      e.remove = m.at("remove").get<bool>();
      PL_CHECK(!e.path.empty() && (e.remove || !e.tmp.empty()), "{}: a member without a path or temporary", path);
      out.entries.push_back(std::move(e));
    }
    const std::string self = fs::absolute(path).lexically_normal().string();
    if (std::find(out.names.begin(), out.names.end(), self) == out.names.end()) out.names.push_back(self);
    return out;
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed publish journal (remove it after checking the files it would name): {}", path, e.what());
  }
}

// Every directory holding a member or a journal name, each once.
void fsync_journal_dirs(const Journal& j) {
  std::set<std::string> dirs;
  for (const JournalEntry& e : j.entries) dirs.insert(parent_of(e.path));
  for (const std::string& n : j.names) dirs.insert(parent_of(n));
  for (const std::string& d : dirs) fsync_directory(d);
}

void drop_journal(const Journal& j) {
  for (const std::string& n : j.names) unlink_if_present(n);
  fsync_journal_dirs(j);
}

// Step 6 but the journal: the new set is complete, the old files' second names go.
void drop_backups(const Journal& j) {
  for (const JournalEntry& e : j.entries)
    if (!e.backup.empty()) unlink_if_present(e.backup);
  fsync_journal_dirs(j);
}

// Every new member is still there: as its temporary, or renamed onto its path.
bool can_roll_forward(const Journal& j) {
  for (const JournalEntry& e : j.entries)
    if (!e.remove && inode_of(e.tmp) != e.ino && inode_of(e.path) != e.ino) return false;
  return true;
}

// Step 5, which also rolls a dead process's publish forward: each new file renamed onto its final
// name (unless it already is there), each member to remove unlinked; `after(k)` follows the k-th.
void replace_members(const Journal& j, const std::function<void(int k)>& after = {}) {
  for (size_t k = 0; k < j.entries.size(); ++k) {
    const JournalEntry& e = j.entries[k];
    if (e.remove)
      unlink_if_present(e.path);
    else if (inode_of(e.path) != e.ino)
      rename_path(e.tmp, e.path);
    if (after) after(static_cast<int>(k) + 1);
  }
  fsync_journal_dirs(j);
}

void roll_forward(const Journal& j) {
  replace_members(j);
  drop_backups(j);
  drop_journal(j);
}

void roll_back(const Journal& j) {
  for (const JournalEntry& e : j.entries) {
    const uint64_t bak = e.backup.empty() ? 0 : inode_of(e.backup);
    if (bak != 0) {
      if (inode_of(e.path) == bak)
        unlink_if_present(e.backup);  // not replaced yet (rename between two links of one file does nothing)
      else
        rename_path(e.backup, e.path);
    } else if (!e.remove && e.backup.empty() && e.ino != 0 && inode_of(e.path) == e.ino) {
      unlink_if_present(e.path);  // a new file that had no predecessor
    }
    if (!e.remove) unlink_if_present(e.tmp);
  }
  fsync_journal_dirs(j);
  drop_journal(j);
}

std::function<void(int point)>& publish_test_hook() {
  static std::function<void(int point)> hook;  // function-local: set_publish_test_hook runs in static initializers
  return hook;
}

void at_test_point(int point) {
  if (const auto& hook = publish_test_hook()) hook(point);
}

// Step 2 for one member: its journal entry, with a backup name when its final name exists.
JournalEntry planned_entry(const std::string& path, const AtomicFile* file, long pid) {
  JournalEntry e;
  e.path = path;
  e.remove = file == nullptr;
  if (file != nullptr) {
    e.tmp = file->tmp_path();
    e.ino = inode_of(e.tmp);
    PL_CHECK(e.ino != 0, "{}: the finished temporary is gone: {}", e.tmp, std::strerror(errno));
  }
  struct stat st {};
  if (::lstat(e.path.c_str(), &st) == 0) {
    PL_CHECK(S_ISREG(st.st_mode) || S_ISLNK(st.st_mode), "{}: exists and is not a regular file; not replacing it",
             e.path);
    e.backup = e.path + ".bak-" + std::to_string(pid);
  } else {
    PL_CHECK(errno == ENOENT, "{}: cannot stat: {}", e.path, std::strerror(errno));
  }
  return e;
}

// Step 3: the journal, written atomically under its first name and hard-linked under the others.
void write_journal(const Journal& j) {
  write_file_atomically(j.names.front(), journal_text(j), process_tmp_suffix());
  for (size_t k = 1; k < j.names.size(); ++k) {
    unlink_if_present(j.names[k]);
    PL_CHECK(::link(j.names.front().c_str(), j.names[k].c_str()) == 0, "{}: cannot link the journal {} to it: {}",
             j.names[k], j.names.front(), std::strerror(errno));
  }
  fsync_journal_dirs(j);
}

// Step 4: each old file gains its backup name and keeps its final one.
void make_backups(const Journal& j) {
  for (const JournalEntry& e : j.entries) {
    if (e.backup.empty()) continue;
    unlink_if_present(e.backup);
    PL_CHECK(::link(e.path.c_str(), e.backup.c_str()) == 0, "{}: cannot hard-link it to the backup {}: {}", e.path,
             e.backup, std::strerror(errno));
  }
  fsync_journal_dirs(j);
}

// An error in steps 3-5: undone in-process; if that fails too, the journal is left for the next run.
[[noreturn]] void fail_rolled_back(const Journal& j, const Error& err) {
  std::string undo = "rolled back: the previous files are in place";
  try {
    roll_back(j);
  } catch (const Error& again) {
    undo = fmt::format("rolling back failed too ({}); the next run recovers from the journal {}", again.what(),
                       j.names.front());
  }
  fail("{} ({})", err.what(), undo);
}

// The journal at `path`, or nullopt when there is none.
std::optional<Journal> journal_at(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return read_journal(path);
}

}  // namespace

void set_publish_test_hook(std::function<void(int point)> hook) { publish_test_hook() = std::move(hook); }

std::optional<JournalState> file_set_journal_state(const std::string& journal) {
  const std::optional<Journal> j = journal_at(journal);
  if (!j) return std::nullopt;
  return JournalState{j->pid, j->pid != static_cast<long>(::getpid()) && pid_alive(j->pid)};
}

std::string recover_file_set(const std::string& journal) {
  const std::optional<Journal> found = journal_at(journal);
  if (!found) return "";
  const Journal& j = *found;
  PL_CHECK(j.pid == static_cast<long>(::getpid()) || !pid_alive(j.pid),
           "{}: process {} is publishing these files now; wait for it to finish", journal, j.pid);
  if (can_roll_forward(j)) {
    roll_forward(j);
    return fmt::format("{}: completed the interrupted publish of process {} (rolled forward: the new set of {} files "
                       "is in place)",
                       journal, j.pid, j.entries.size());
  }
  roll_back(j);
  return fmt::format("{}: undid the interrupted publish of process {} (rolled back: the previous files are in place)",
                     journal, j.pid);
}

struct FileSet::Member {
  std::string path;
  std::unique_ptr<AtomicFile> file;  // null: a removal
};

FileSet::FileSet(std::vector<std::string> journals, std::function<void(const std::string&)> say)
    : journals_(std::move(journals)) {
  PL_CHECK(!journals_.empty(), "FileSet: no journal name");
  if (!say) say = [](const std::string& msg) { std::fprintf(stderr, "%s\n", msg.c_str()); };
  for (const std::string& j : journals_) {
    remove_stale_temporaries(j);
    if (const std::string msg = recover_file_set(j); !msg.empty()) say(msg);
  }
}

FileSet::~FileSet() = default;  // each unpublished AtomicFile removes its temporary

AtomicFile& FileSet::add(const std::string& path) {
  PL_CHECK(!published_, "{}: added to a file set already published", path);
  remove_stale_temporaries(path);
  members_.push_back({path, std::make_unique<AtomicFile>(path, process_tmp_suffix())});
  return *members_.back().file;
}

void FileSet::remove_on_publish(const std::string& path) {
  PL_CHECK(!published_, "{}: removal added to a file set already published", path);
  remove_stale_temporaries(path);
  members_.push_back({path, nullptr});
}

void FileSet::publish() {
  PL_CHECK(!published_, "{}: file set published twice", journals_.front());
  // 1. Every new file complete and durable under its temporary name.
  for (auto& m : members_)
    if (m.file) m.file->finish();
  // 2. The backups, decided before anything final is touched.
  Journal j{static_cast<long>(::getpid()), journals_, {}};
  for (auto& m : members_) j.entries.push_back(planned_entry(m.path, m.file.get(), j.pid));
  try {
    write_journal(j);  // 3
    make_backups(j);   // 4
    at_test_point(0);
    replace_members(j, at_test_point);  // 5
  } catch (const Error& err) {
    fail_rolled_back(j, err);
  }
  published_ = true;
  for (auto& m : members_)
    if (m.file) m.file->committed_ = true;  // renamed: no temporary left to remove
  // 6. The new set is complete: drop the backups, then the journal.
  try {
    drop_backups(j);
    at_test_point(static_cast<int>(j.entries.size()) + 1);
    drop_journal(j);
  } catch (const Error& err) {
    fail("{} (the new files are in place; the journal {} remains and the next run removes it)", err.what(),
         journals_.front());
  }
}

}  // namespace pl
