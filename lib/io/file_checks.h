#pragma once
// Checks on the files a user names, so that no input can hang a tool and no output can destroy an input:
//  - reading: a user's file is opened non-blocking and refused unless it is a regular file (a FIFO opened
//    for reading blocks until a writer appears; a directory or a device is never what was meant);
//  - overlap: every tool checks its outputs against its inputs once, before doing anything (an
//    `--overwrite` onto the checkpoint being converted would otherwise delete it).
// Every failure is one pl::Error line naming the file (and the flags).
#include <string>
#include <vector>

namespace pl {

// ---- reading -------------------------------------------------------------------------------------

// Opens `path` for reading (O_RDONLY | O_NONBLOCK | O_CLOEXEC, so that a FIFO cannot block the open),
// fstats it, refuses anything but a regular file ("<path>: is a FIFO, not a regular file"), then clears
// O_NONBLOCK. Returns the descriptor; the caller closes it. A missing file: "<path>: cannot open: no
// such file".
int open_regular_file(const std::string& path);

// The same check for readers that open the file themselves (a std::ifstream that streams it): opens,
// checks and closes.
void check_regular_file(const std::string& path);

// The whole of a regular file (open_regular_file, then read(2) to its end).
std::string read_regular_file(const std::string& path);
std::vector<unsigned char> read_regular_file_bytes(const std::string& path);

// "a FIFO", "a directory", "a socket", ... for a stat mode (the type's name in error messages).
std::string file_type_name(unsigned mode);

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

}  // namespace pl
