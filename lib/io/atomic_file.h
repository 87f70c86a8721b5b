#pragma once
// The one way this program publishes a file or a directory: write a temporary beside the target,
// fsync it, rename it over the target, fsync the parent directory. A reader (or a crash at any
// moment) sees the old target or the complete new one, never a part. Every failing call is a
// one-line pl::Error naming the path and strerror; the temporary is then removed and the previous
// target is untouched.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/fd.h"  // UniqueFd, fsync_directory

namespace pl {

// A file being written under `path + tmp_suffix` (created or truncated). Destroyed without commit()
// (an exception while filling it), it closes and removes the temporary.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path, std::string tmp_suffix = ".tmp");
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);  // all of it, or an error
  void write(std::string_view text) { write(text.data(), text.size()); }
  // At byte `offset` of the file (pwrite), which grows to cover it: a file filled out of order.
  void write_at(uint64_t offset, const void* data, size_t bytes);
  // fsync and close the temporary; commit() does it when not done yet. Files published together
  // (all or none) are each finished before the first is committed.
  void finish();
  // Renames the temporary onto the path and fsyncs the parent directory.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  friend class FileSet;
  std::string path_, tmp_;
  UniqueFd fd_;
  uint64_t written_ = 0;
  bool committed_ = false;
};

// AtomicFile with `fill` writing its contents: the target is replaced only when fill returns.
void write_file_atomically(const std::string& path, const std::function<void(AtomicFile&)>& fill,
                           const std::string& tmp_suffix = ".tmp");
void write_file_atomically(const std::string& path, std::string_view bytes, const std::string& tmp_suffix = ".tmp");

// A directory: `fill` writes the contents of the fresh directory `path + tmp_suffix` (removed first
// if a crash left it); then every file in it is durable (AtomicFile commits or the caller's own
// fsync), the temporary directory is fsynced and put at `path` in one rename — an existing `path`
// is swapped out in the same step (renameat2 RENAME_EXCHANGE) and then removed — and the parent is
// fsynced. On an exception from fill the temporary directory is removed.
// The default suffix ".tmp-<pid>" keeps two processes apart.
void write_directory_atomically(const std::string& path, const std::function<void(const std::string& tmp_dir)>& fill,
                                const std::string& tmp_suffix = {});

// `from` renamed onto `to` (rename(2)), one line on failure.
void rename_path(const std::string& from, const std::string& to);
// ".tmp-<pid>": the suffix of a temporary only this process may own.
std::string process_tmp_suffix();

// ---------------------------------------------------------------------------------------------
// FileSet: several files published as one set (a dataset's .bin/.idx/sidecar, quantize_tensor's
// .npy files). A reader — or a crash at any moment, kill -9 included — finds the old set or the
// new one, never a mix, once the journal below has been dealt with; the old set is never deleted
// before the new one is complete.
//
// The protocol (P = this process's pid):
//  1. add(path) creates "<path>.tmp-P"; the caller fills it. publish() first fsyncs and closes
//     every temporary. Until step 3 nothing final is touched: an error (or a destroyed FileSet)
//     removes this run's temporaries only.
//  2. Every member whose final name exists gets a backup name "<path>.bak-P" (decided now).
//  3. The journal — JSON: version, pid, the journal's names, and per member its path, temporary,
//     backup ("" when there was no old file), the temporary's inode and whether the member is to
//     be removed rather than replaced; paths relative to the journal's directory, so that recovery
//     works from any working directory or mount point — is written atomically under the first name and
//     hard-linked under the others (one per group a reader looks up: "<dataset prefix>.publish-
//     journal"); directories fsynced.
//  4. Each old file is hard-linked to its backup name (the final name stays valid); fsync.
//  5. Each temporary is renamed onto its final name; a member to remove is unlinked; fsync.
//  6. The backups are unlinked, then the journal names; fsync.
// An error in steps 3-5 rolls back in-process (backups renamed onto their final names, new files
// that had no predecessor unlinked), then removes journal and temporaries; the error says so.
// Recovery: a FileSet (and recover_file_set) that finds a journal of a dead process rolls forward
// when every new member is still there (as its temporary, or already renamed: its inode matches the
// journal), else back from the backups, removes the journal and says so in one line. A journal of a
// live process stops the run with a one-line error naming that pid. Temporaries and backups of dead
// processes ("<member>.tmp-N", "<member>.bak-N", N a pid that does not exist) are removed when a
// member is added; those of live processes (and a plain "<member>.tmp") are left alone.
// Test points of publish(), where a test kills the process or throws (set_publish_test_hook): 0
// after the backups (step 4), 1..n after the k-th rename or removal of step 5, n+1 after the backups
// are removed (step 6, the journal still there).
class FileSet {
 public:
  // `journals`: the journal's names (at least one). Recovers any interrupted publish found under
  // them first, reporting it through `say` (one line each; default: stderr).
  explicit FileSet(std::vector<std::string> journals, std::function<void(const std::string&)> say = {});
  ~FileSet();  // unpublished: removes this run's temporaries
  FileSet(const FileSet&) = delete;
  FileSet& operator=(const FileSet&) = delete;

  // A new member, written by the caller under "<path>.tmp-<pid>". The reference stays valid for
  // the FileSet's lifetime.
  AtomicFile& add(const std::string& path);
  // An old file that the new set does not have: removed (backed up first) when publishing.
  void remove_on_publish(const std::string& path);
  // Steps 1-6 above. Once only.
  void publish();
  bool published() const { return published_; }

 private:
  struct Member;
  std::vector<std::string> journals_;
  std::vector<Member> members_;
  bool published_ = false;
};

// TEST ONLY, never called by production code: `hook(point)` runs at each test point of every
// FileSet::publish of this process (empty: none); a pl::Error it throws fails that step. The test
// builds of the tools install one from the environment (tests/tools/publish_test_hooks.cpp).
void set_publish_test_hook(std::function<void(int point)> hook);

// A journal found at `journal`: its writer's pid and whether that process still exists.
struct JournalState {
  long pid = 0;
  bool alive = false;
};
// nullopt when there is no journal at `journal`; a journal that cannot be parsed is a one-line error.
std::optional<JournalState> file_set_journal_state(const std::string& journal);
// Rolls an interrupted publish of a dead process forward or back (see FileSet). Returns the one
// line saying what was done, or "" when there was no journal; a live writer is an error.
std::string recover_file_set(const std::string& journal);

}  // namespace pl
