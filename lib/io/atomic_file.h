#pragma once
// The one way this program publishes a file or a directory: write a temporary beside the target,
// fsync it, rename it over the target, fsync the parent directory. A reader (or a crash at any
// moment) sees the old target or the complete new one, never a part. Every failing call is a
// one-line pl::Error naming the path and strerror; the temporary is then removed and the previous
// target is untouched.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

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
  // fsync and close the temporary; commit() does it when not done yet. Files published together
  // (all or none) are each finished before the first is committed.
  void finish();
  // Renames the temporary onto the path and fsyncs the parent directory.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }
  uint64_t bytes_written() const { return written_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
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

// fsync of a directory (its entries: a rename in it, a file created in it).
void fsync_directory(const std::string& dir);
// `from` renamed onto `to` (rename(2)), one line on failure.
void rename_path(const std::string& from, const std::string& to);
// ".tmp-<pid>": the suffix of a temporary only this process may own.
std::string process_tmp_suffix();

}  // namespace pl
