#include "io/file_checks.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "io/json_text.h"

namespace pl {

namespace fs = std::filesystem;

namespace {

std::string errno_message(int err) {
  if (err == ENOENT) return "no such file";
  return std::generic_category().message(err);
}

// "a FIFO", "a directory", "a socket", ... for a stat mode (the type's name in error messages).
std::string file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFLNK: return "a symbolic link";
    default: return "not a regular file";
  }
}

}  // namespace

UniqueFd open_regular_file(const std::string& path) {
  // O_NONBLOCK: open(2) of a FIFO for reading otherwise waits for a writer, forever.
  UniqueFd fd = try_open_fd(path, O_RDONLY | O_NONBLOCK);
  if (!fd.valid()) {
    const int err = errno;
    struct stat st {};
    // A socket cannot be opened at all (ENXIO): name its type rather than "no such device or address".
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
      fail("{}: is {}, not a regular file", path, file_type_name(st.st_mode));
    fail("{}: cannot open: {}", path, errno_message(err));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail("{}: cannot stat: {}", path, errno_message(errno));
  if (!S_ISREG(st.st_mode)) fail("{}: is {}, not a regular file", path, file_type_name(st.st_mode));
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0)
    fail("{}: cannot clear O_NONBLOCK: {}", path, errno_message(errno));
  return fd;
}

void check_regular_file(const std::string& path) { open_regular_file(path); }

RegularFileStream::RegularFileStream(const std::string& path) : std::istream(nullptr), buffer_(open_regular_file(path)) {
  rdbuf(&buffer_);
}

RegularFileStream::Buffer::int_type RegularFileStream::Buffer::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  // A throw from a streambuf sets the istream's badbit (and is not rethrown): the reader's "read error".
  const size_t got = read_up_to(fd_, data_.data(), data_.size());
  if (got == 0) return traits_type::eof();
  setg(data_.data(), data_.data(), data_.data() + got);
  return traits_type::to_int_type(*gptr());
}

namespace {

// Reads to the end of the file (not just its stat size: a file may grow while read) into `out`.
template <class Bytes>
Bytes read_all(const std::string& path) {
  const UniqueFd fd = open_regular_file(path);
  // One byte more than the stat size, so that the read that finds the end needs no reallocation.
  Bytes out(file_size(fd) + 1, 0);
  size_t have = 0;
  while ((have += read_up_to(fd, out.data() + have, out.size() - have)) == out.size())
    out.resize(out.size() + (size_t{1} << 16));
  out.resize(have);
  return out;
}

}  // namespace

std::string read_regular_file(const std::string& path) { return read_all<std::string>(path); }

std::vector<unsigned char> read_regular_file_bytes(const std::string& path) {
  return read_all<std::vector<unsigned char>>(path);
}

// ---- outputs apart from inputs -------------------------------------------------------------------

namespace {

// Symlinks and `..` resolved in the longest existing prefix, the rest normalized as written.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = fs::path(p);
  fs::path r = fs::weakly_canonical(abs, ec);
  if (ec) r = abs.lexically_normal();
  // "dir/" and "dir" are the same directory.
  if (!r.has_filename() && r.has_parent_path() && r != r.root_path()) r = r.parent_path();
  return r;
}

// Is `inner` `outer` or below it, comparing whole components ("/a/bc" is not below "/a/b")?
bool lexically_within(const fs::path& outer, const fs::path& inner) {
  auto o = outer.begin(), i = inner.begin();
  for (; o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *o != *i) return false;
  }
  return true;
}

bool stat_of(const fs::path& p, struct stat& st) { return ::stat(p.c_str(), &st) == 0; }

bool same_inode(const struct stat& a, const struct stat& b) { return a.st_dev == b.st_dev && a.st_ino == b.st_ino; }

// Is the existing directory `dir` (its stat) an ancestor of (or the same as) the resolved path `p`? Walks
// p's existing ancestors comparing device and inode: a bind mount or a second name for `dir`.
bool inode_within(const struct stat& dir, const fs::path& p) {
  for (fs::path q = p;; q = q.parent_path()) {
    struct stat st {};
    if (stat_of(q, st) && same_inode(st, dir)) return true;
    if (!q.has_relative_path()) return false;  // the root
  }
}

}  // namespace

PathOverlap path_overlap(const std::string& a, const std::string& b) {
  const fs::path ra = resolved(a), rb = resolved(b);
  if (ra == rb) return PathOverlap::same;
  struct stat sa {}, sb {};
  const bool ea = stat_of(ra, sa), eb = stat_of(rb, sb);
  if (ea && eb && same_inode(sa, sb)) return PathOverlap::same;
  if (lexically_within(ra, rb)) return PathOverlap::first_contains_second;
  if (lexically_within(rb, ra)) return PathOverlap::second_contains_first;
  if (ea && S_ISDIR(sa.st_mode) && inode_within(sa, rb)) return PathOverlap::first_contains_second;
  if (eb && S_ISDIR(sb.st_mode) && inode_within(sb, ra)) return PathOverlap::second_contains_first;
  return PathOverlap::none;
}

void check_outputs_apart_from_inputs(const std::vector<FlagPath>& inputs, const std::vector<FlagPath>& outputs) {
  for (const FlagPath& out : outputs) {
    if (out.path.empty()) continue;
    for (const FlagPath& in : inputs) {
      if (in.path.empty()) continue;
      const char* how = nullptr;
      switch (path_overlap(out.path, in.path)) {
        case PathOverlap::none: continue;
        case PathOverlap::same: how = "is the same as"; break;
        case PathOverlap::first_contains_second: how = "contains"; break;
        case PathOverlap::second_contains_first: how = "lies inside"; break;
      }
      fail("{} {} {} {} {}: an output must not overlap an input", out.flag, out.path, how, in.flag, in.path);
    }
  }
}

namespace {

// "" when `text` is a JSON object holding every one of `fields`, else why not.
std::string json_text_lacks(const std::string& text, const std::string& what, const std::vector<std::string>& fields) {
  nlohmann::json j;
  try {
    j = parse_json_text(text, what);
  } catch (const Error& e) {
    return e.what();
  }
  if (!j.is_object()) return "not a JSON object";
  for (const std::string& f : fields)
    if (!j.contains(f)) return "no field '" + f + "'";
  return "";
}

}  // namespace

std::string json_file_lacks(const std::string& path, const std::vector<std::string>& fields) {
  return json_text_lacks(read_regular_file(path), path, fields);
}

std::string json_lines_file_lacks(const std::string& path, const std::vector<std::string>& fields) {
  // The first line only, read from at most the first MiB (a large file given by mistake is not read whole).
  std::string head(1 << 20, '\0');
  head.resize(read_up_to(open_regular_file(path), head.data(), head.size()));
  return json_text_lacks(head.substr(0, head.find('\n')), path + ":1", fields);
}

void check_replaceable_output(const std::string& flag, const std::string& path, const std::string& kind,
                              const OwnOutputCheck& why_not_ours) {
  std::error_code ec;
  // (Missing, or its directory missing or unreadable: nothing to replace; writing it says what is wrong.)
  if (path.empty() || !std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return;
  std::string why;
  try {
    why = why_not_ours(path);
  } catch (const Error& e) {  // unreadable, or not a regular file: not ours either
    why = e.what();
  }
  PL_CHECK(why.empty(), "{} {}: not {} of this program ({}); it would be replaced: give another path", flag, path,
           kind, why);
}

}  // namespace pl
