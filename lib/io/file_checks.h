#pragma once
// Checks on the files a user names, so that no input can hang a tool and no output can destroy an input:
//  - reading: a user's file is opened non-blocking and refused unless it is a regular file (a FIFO opened
//    for reading blocks until a writer appears; a directory or a device is never what was meant);
//  - overlap: every tool checks its outputs against its inputs once, before doing anything (an
//    `--overwrite` onto the checkpoint being converted would otherwise delete it).
// Every failure is one pl::Error line naming the file (and the flags).
#include <array>
#include <functional>
#include <istream>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "io/fd.h"

namespace pl {

// ---- reading -------------------------------------------------------------------------------------

// Opens `path` for reading (O_RDONLY | O_NONBLOCK | O_CLOEXEC, so that a FIFO cannot block the open),
// fstats it, refuses anything but a regular file ("<path>: is a FIFO, not a regular file"), then clears
// O_NONBLOCK. Returns the descriptor (io/fd.h). A missing file: "<path>: cannot open: no such file".
UniqueFd open_regular_file(const std::string& path);

// The same check alone (opens, checks and closes), for a tool's up-front validation of the files it will
// read later; the reading itself goes through open_regular_file, RegularFileStream or read_regular_file.
void check_regular_file(const std::string& path);

// A std::istream over one open_regular_file descriptor, for readers that stream a file (line by line, or
// too large to hold). The check and the reads share the descriptor, so nothing can be swapped in under
// the name between them (as it can between check_regular_file and a second open by name). A read error
// sets badbit, as with std::ifstream (a std::istreambuf_iterator, which bypasses the stream, gets
// read_up_to's one-line pl::Error instead); the descriptor is closed with the stream.
class RegularFileStream : public std::istream {
 public:
  explicit RegularFileStream(const std::string& path);
  RegularFileStream(const RegularFileStream&) = delete;
  RegularFileStream& operator=(const RegularFileStream&) = delete;

 private:
  class Buffer : public std::streambuf {
   public:
    explicit Buffer(UniqueFd fd) : fd_(std::move(fd)) {}

   protected:
    int_type underflow() override;

   private:
    UniqueFd fd_;
    std::array<char, 1 << 16> data_{};
  };
  Buffer buffer_;
};

// The whole of a regular file (open_regular_file, then read(2) to its end).
std::string read_regular_file(const std::string& path);
std::vector<unsigned char> read_regular_file_bytes(const std::string& path);

// ---- outputs apart from inputs -------------------------------------------------------------------

// How two paths relate once symlinks and `..` are resolved (for a path that does not exist yet: its
// nearest existing parent, resolved, and the rest as written) and, where both exist, by device and
// inode (hard links, bind mounts).
enum class PathOverlap { none, same, first_contains_second, second_contains_first };
PathOverlap path_overlap(const std::string& a, const std::string& b);

// A path and the flag (or positional name) it came from, for error messages.
struct FlagPath {
  std::string flag;  // "--to-hf", "INPUT", ...
  std::string path;
};

// Fails with one line naming both flags and paths when an output is, contains or lies inside an input
// (empty paths are skipped): "--to-hf ck/hf lies inside --load ck: an output must not overlap an input".
void check_outputs_apart_from_inputs(const std::vector<FlagPath>& inputs, const std::vector<FlagPath>& outputs);

// ---- outputs that replace what is there ---------------------------------------------------------

// The one rule for an output written over an existing path (issue 38): it replaces only this program's own
// earlier output of that kind, never a file given by mistake (a model config, a user's notes). Nothing at
// `path`: nothing to check. Else `why_not_ours(path)` returns "" when what is there is ours, or why not, and
// the check fails with one line before anything is written:
// "<flag> <path>: not <kind> of this program (<why>); it would be replaced: give another path".
using OwnOutputCheck = std::function<std::string(const std::string& path)>;
void check_replaceable_output(const std::string& flag, const std::string& path, const std::string& kind,
                              const OwnOutputCheck& why_not_ours);

// Checks for JSON outputs: "" when the regular file is a JSON object holding every one of `fields` (the whole
// file; or only its first line, for a JSON-lines log), else why not.
std::string json_file_lacks(const std::string& path, const std::vector<std::string>& fields);
std::string json_lines_file_lacks(const std::string& path, const std::vector<std::string>& fields);

}  // namespace pl
