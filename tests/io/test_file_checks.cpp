// io/file_checks and io/mapped_file (issue 14, classes 4, 6 and 9): a FIFO (or a directory, a device, a
// socket) given as any input file is one line naming it, never a hang; outputs are told apart from inputs
// after symlinks, `..` and hard links; a mapped file truncated under the process is one line and exit 1,
// not a death by SIGBUS. Whatever could hang or kill runs in a forked child with a deadline.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "config/json_reader.h"
#include "core/error.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "io/file_checks.h"
#include "io/mapped_file.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "train/checkpoint.h"

#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using pl::test::TempDir;

struct ChildResult {
  int exit_code = -1;  // 128 + signal when killed
  bool timed_out = false;
  std::string message;  // the pl::Error's text (exit 1), or the child's stderr when `stderr_path` is given
};

// Runs fn() in a forked child, killed after `timeout_s`: exit 0 when it returns, 1 with the message when
// it throws pl::Error, 2 for another exception. With `capture_stderr`, the message is what the child
// wrote to stderr instead (a signal handler's line).
ChildResult in_child(const std::function<void()>& fn, bool capture_stderr = false, double timeout_s = 20.0) {
  TempDir dir;
  const std::string msg_path = (dir.path() / "message").string();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    if (capture_stderr) {
      const int fd = ::open(msg_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0) ::_exit(126);
      ::dup2(fd, 2);
    }
    int code = 0;
    std::string msg;
    try {
      fn();
    } catch (const pl::Error& e) {
      code = 1;
      msg = e.what();
    } catch (...) {
      code = 2;
    }
    if (!capture_stderr) {
      const int fd = ::open(msg_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        if (::write(fd, msg.data(), msg.size()) < 0) code = 125;
        ::close(fd);
      }
    }
    ::_exit(code);
  }
  ChildResult r;
  r.exit_code = pl::test::wait_child(pid, timeout_s, r.timed_out);
  r.message = pl::test::read_text_file(msg_path);
  return r;
}

std::string file_checks_make_fifo(const TempDir& dir, const std::string& name) {
  const std::string p = (dir.path() / name).string();
  fs::create_directories(fs::path(p).parent_path());
  if (::mkfifo(p.c_str(), 0644) != 0) throw std::runtime_error("mkfifo failed: " + p);
  return p;
}

// fn (reading `path`) must end quickly with one line naming the path and its type.
void file_checks_expect_refused(const std::string& what, const std::function<void()>& fn, const std::string& path,
                                const std::string& type = "is a FIFO") {
  SCOPED_TRACE(what);
  const ChildResult r = in_child(fn);
  ASSERT_FALSE(r.timed_out) << what << " hung on " << path;
  EXPECT_EQ(r.exit_code, 1) << r.message;
  EXPECT_EQ(r.message.find('\n'), std::string::npos) << r.message;
  EXPECT_NE(r.message.find(path), std::string::npos) << r.message;
  EXPECT_NE(r.message.find(type), std::string::npos) << r.message;
}

TEST(FileChecks, EachNonRegularTypeIsRefusedByName) {
  TempDir dir;
  const std::string fifo = file_checks_make_fifo(dir, "pipe");
  file_checks_expect_refused("fifo", [&] { pl::open_regular_file(fifo); }, fifo, "is a FIFO, not a regular file");
  const std::string sub = (dir.path() / "sub").string();
  fs::create_directory(sub);
  file_checks_expect_refused("directory", [&] { pl::read_regular_file(sub); }, sub, "is a directory, not a regular file");
  file_checks_expect_refused("character device", [&] { pl::check_regular_file("/dev/null"); }, "/dev/null",
                             "is a character device");
  const std::string link = (dir.path() / "link").string();
  fs::create_symlink(fifo, link);
  file_checks_expect_refused("symlink to a fifo", [&] { pl::read_regular_file(link); }, link, "is a FIFO");
  // A socket cannot even be opened (ENXIO): still named by its type.
  const std::string sock = (dir.path() / "sock").string();
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  file_checks_expect_refused("socket", [&] { pl::read_regular_file(sock); }, sock, "is a socket");
  ::close(s);
  const std::string missing = (dir.path() / "missing").string();
  file_checks_expect_refused("missing", [&] { pl::read_regular_file(missing); }, missing, "cannot open: no such file");
}

TEST(FileChecks, ReadRegularFileReadsEveryByteAndTheDescriptorBlocks) {
  TempDir dir;
  std::string content;
  for (int i = 0; i < 200000; ++i) content.push_back(static_cast<char>((i * 7919) % 256));  // NULs included
  const std::string p = dir.write("data", content);
  EXPECT_EQ(pl::read_regular_file(p), content);
  const std::vector<unsigned char> bytes = pl::read_regular_file_bytes(p);
  EXPECT_TRUE(bytes.size() == content.size() && std::memcmp(bytes.data(), content.data(), bytes.size()) == 0);
  EXPECT_EQ(pl::read_regular_file(dir.write("empty", "")), "");
  const pl::UniqueFd fd = pl::open_regular_file(p);
  EXPECT_EQ(::fcntl(fd.get(), F_GETFL) & O_NONBLOCK, 0);  // cleared after the check
  EXPECT_NE(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, 0);
}

// RegularFileStream reads the descriptor it checked: a FIFO renamed over the name after the open is never
// read (a check by name and a second open could be raced that way), and the lines are the file's own.
TEST(FileChecks, RegularFileStreamReadsTheFileItCheckedNotWhatLaterTakesItsName) {
  TempDir dir;
  std::string content;
  for (int i = 0; i < 20000; ++i) content += "line " + std::to_string(i) + "\n";  // several 64 KB buffers
  const std::string p = dir.write("text", content);
  std::string lines, line;
  {
    pl::RegularFileStream in(p);
    const std::string fifo = file_checks_make_fifo(dir, "swap");
    fs::rename(fifo, p);  // the name is a FIFO now
    while (std::getline(in, line)) lines += line + "\n";
    EXPECT_FALSE(in.bad());
  }
  EXPECT_EQ(lines, content);
  file_checks_expect_refused("stream on the fifo now named text", [&] { pl::RegularFileStream in(p); }, p, "is a FIFO");
  pl::RegularFileStream empty(dir.write("empty", ""));
  EXPECT_FALSE(std::getline(empty, line));
  EXPECT_FALSE(empty.bad());
}

// Every reader of a user's file, handed a FIFO: one line naming it, never a hang (each waited for at
// most 20 s; before the fix the FIFO cases blocked in open(2) forever).
TEST(FileChecks, EveryReaderRefusesAFifoWithOneLine) {
  TempDir dir;
  const std::string json = file_checks_make_fifo(dir, "model.json");
  file_checks_expect_refused("model/recipe config", [&] { pl::read_json_file(json); }, json);
  const std::string npy = file_checks_make_fifo(dir, "x.npy");
  file_checks_expect_refused(".npy", [&] { pl::read_npy(npy); }, npy);
  const std::string st = file_checks_make_fifo(dir, "w.safetensors");
  file_checks_expect_refused("safetensors", [&] { pl::SafetensorsFile f(st); }, st);
  const std::string index = file_checks_make_fifo(dir, "hf/model.safetensors.index.json");
  // (the directory's check names it: it holds no regular index file)
  file_checks_expect_refused("safetensors index", [&] { pl::SafetensorsCheckpoint c((dir.path() / "hf").string()); },
                             (dir.path() / "hf").string(), "holds neither");
  (void)index;
  const std::string rank_file = file_checks_make_fifo(dir, "tokenizer.model");
  file_checks_expect_refused("tokenizer.model", [&] { pl::data::make_tokenizer("tiktoken", rank_file); }, rank_file);
  file_checks_expect_refused("tokenizer fingerprint", [&] { pl::data::fnv1a64_file_hex(rank_file, nullptr); }, rank_file);
  const std::string sidecar = file_checks_make_fifo(dir, "side_text_document.tokenizer.json");
  file_checks_expect_refused(
      "tokenizer sidecar", [&] { pl::data::read_tokenizer_record((dir.path() / "side_text_document").string()); },
      sidecar);
  const std::string manifest = file_checks_make_fifo(dir, "ck/iter_0000001/manifest.json");
  file_checks_expect_refused("checkpoint manifest", [&] { pl::verify_checkpoint((dir.path() / "ck/iter_0000001").string()); },
                             manifest);

  // The .idx, then the .bin of an otherwise valid dataset.
  const std::string prefix = (dir.path() / "corpus").string();
  {
    pl::data::IndexedDatasetWriter w(prefix, 1000);
    const std::vector<int32_t> doc = {1, 2, 3, 4};
    w.add_document(doc);
    w.finalize();
  }
  fs::rename(prefix + ".idx", prefix + ".idx.real");
  const std::string idx = file_checks_make_fifo(dir, "corpus.idx");
  file_checks_expect_refused(".idx", [&] { pl::data::IndexedDataset ds(prefix); }, idx);
  fs::remove(idx);
  fs::rename(prefix + ".idx.real", prefix + ".idx");
  fs::remove(prefix + ".bin");
  const std::string bin = file_checks_make_fifo(dir, "corpus.bin");
  file_checks_expect_refused(".bin", [&] { pl::data::IndexedDataset ds(prefix); }, bin);
}

TEST(PathOverlap, SymlinksDotDotAndHardLinksAreResolved) {
  TempDir dir;
  const fs::path d = dir.path();
  fs::create_directories(d / "a");
  fs::create_directories(d / "ab");
  const std::string f = dir.write("a/f", "x");
  fs::create_symlink(d / "a", d / "l");
  fs::create_hard_link(f, d / "h");
  using pl::PathOverlap;
  const auto ov = [](const fs::path& x, const fs::path& y) { return pl::path_overlap(x.string(), y.string()); };
  EXPECT_EQ(ov(d / "a", d / "a"), PathOverlap::same);
  EXPECT_EQ(pl::path_overlap((d / "a").string() + "/", (d / "a").string()), PathOverlap::same);
  EXPECT_EQ(ov(d / "ab" / ".." / "a", d / "a"), PathOverlap::same);
  EXPECT_EQ(ov(d / "l", d / "a"), PathOverlap::same);
  EXPECT_EQ(ov(d / "h", f), PathOverlap::same);  // another name of the same inode
  EXPECT_EQ(ov(d / "a", f), PathOverlap::first_contains_second);
  EXPECT_EQ(ov(f, d / "l"), PathOverlap::second_contains_first);
  EXPECT_EQ(ov(d / "a" / "new" / "deeper", d / "a"), PathOverlap::second_contains_first);  // need not exist
  EXPECT_EQ(ov(d / "l" / "new", f), PathOverlap::none);
  EXPECT_EQ(ov(d / "l" / "new" / ".." / "f", f), PathOverlap::same);
  EXPECT_EQ(ov(d / "ab", d / "a"), PathOverlap::none);  // a common string prefix is not containment
  EXPECT_EQ(ov(d / "ab" / "x", f), PathOverlap::none);
  EXPECT_EQ(ov(d / "nope1", d / "nope2"), PathOverlap::none);
  // A relative path against an absolute one.
  const fs::path cwd = fs::current_path();
  fs::current_path(d);
  EXPECT_EQ(pl::path_overlap("a/f", f), PathOverlap::same);
  EXPECT_EQ(pl::path_overlap(".", f), PathOverlap::first_contains_second);
  fs::current_path(cwd);
}

TEST(PathOverlap, TheErrorNamesBothFlagsAndPaths) {
  TempDir dir;
  const std::string ck = (dir.path() / "ck").string();
  fs::create_directory(ck);
  pl::test::expect_one_line_error(
      [&] { pl::check_outputs_apart_from_inputs({{"--load", ck}}, {{"--to-hf", ck + "/hf"}}); },
      {"--to-hf " + ck + "/hf", "lies inside", "--load " + ck, "must not overlap"});
  pl::test::expect_one_line_error(
      [&] { pl::check_outputs_apart_from_inputs({{"--load", ck + "/iter_0000001"}}, {{"--to-hf", ck}}); },
      {"--to-hf " + ck, "contains", "--load " + ck + "/iter_0000001"});
  pl::test::expect_one_line_error(
      [&] { pl::check_outputs_apart_from_inputs({{"INPUT", "x.npy"}, {"--b", ck}}, {{"--out", ck}}); },
      {"--out " + ck, "is the same as", "--b " + ck});
  // Apart, or not given: nothing to say.
  EXPECT_NO_THROW(pl::check_outputs_apart_from_inputs({{"--load", ck}, {"--model", ""}}, {{"--to-hf", ck + "2"}, {"--x", ""}}));
}

// ---- SIGBUS on a mapping whose file got shorter ---------------------------------------------------

std::string write_pages(const TempDir& dir, const std::string& name, size_t bytes) {
  return dir.write(name, std::string(bytes, 'p'));
}

// In a test's child: `bytes` of `path` mapped shared and registered (exit 120 when mmap fails).
void* map_and_register(const std::string& path, size_t bytes) {
  const pl::UniqueFd fd = pl::open_regular_file(path);
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) ::_exit(120);
  pl::register_mapped_range(m, bytes, path);
  return m;
}

TEST(MappedFile, AReadPastATruncatedEndIsOneLineAndExit1NotSigbus) {
  TempDir dir;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const std::string path = write_pages(dir, "mapped.bin", 4 * page);
  const ChildResult t = in_child(
      [&] {
        void* m = map_and_register(path, 4 * page);
        if (::truncate(path.c_str(), static_cast<off_t>(page)) != 0) ::_exit(121);
        const volatile char* p = static_cast<const char*>(m);
        if (p[page - 1] != 'p') ::_exit(122);  // still inside the file
        (void)p[2 * page + 5];                 // past its new end
        ::_exit(123);
      },
      true);
  ASSERT_FALSE(t.timed_out);
  EXPECT_EQ(t.exit_code, 1) << "(137 = 128 + SIGBUS: the handler did not run) " << t.message;
  const std::vector<std::string> lines = pl::test::split_lines(t.message);
  ASSERT_EQ(lines.size(), 1u) << t.message;
  EXPECT_NE(lines[0].find(": error: " + path + " changed under the running job (truncated?)"), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("at byte " + std::to_string(2 * page + 5)), std::string::npos) << lines[0];
  EXPECT_EQ(lines[0].rfind("pl_tests: error: ", 0), 0u) << lines[0];
}

// What SIGBUS did before the registry: the default action (killed by the signal) -- or, in an ASan build,
// ASan's own report (it installs a SIGBUS handler first, and the registry hands unclaimed faults to it).
// Asked of the process, not of this file's flags: the sanitizer build links the ASan runtime into pl_tests
// without instrumenting the suite's own sources (tests/CMakeLists.txt), so __SANITIZE_ADDRESS__ is not
// defined here while ASan's handler is installed. A weak reference is null without the runtime.
extern "C" __attribute__((weak)) void __asan_init();
bool asan_runtime() { return __asan_init != nullptr; }

void expect_default_sigbus(const ChildResult& r) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.message.find("changed under"), std::string::npos) << r.message;
  if (asan_runtime()) EXPECT_NE(r.exit_code, 123) << r.message;  // it did not go on
  else EXPECT_EQ(r.exit_code, 128 + SIGBUS) << r.message;
}

TEST(MappedFile, OtherSigbusesStaySignals) {
  TempDir dir;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const std::string path = write_pages(dir, "mapped.bin", 4 * page);
  // A mapping that was deregistered before the fault: the default SIGBUS (no line claims it).
  const ChildResult deregistered = in_child(
      [&] {
        void* m = map_and_register(path, 4 * page);
        pl::deregister_mapped_range(m);
        if (::truncate(path.c_str(), static_cast<off_t>(page)) != 0) ::_exit(121);
        (void)static_cast<const volatile char*>(m)[3 * page];
        ::_exit(123);
      },
      true);
  expect_default_sigbus(deregistered);
  // A SIGBUS sent by someone (not a fault) while a mapping is registered: still the default action.
  const ChildResult sent = in_child(
      [&] {
        static char buf[64];
        pl::register_mapped_range(buf, sizeof buf, "buf");
        ::raise(SIGBUS);
        ::_exit(123);
      },
      true);
  expect_default_sigbus(sent);
}

// The two real mappings of user files: an IndexedDataset's .bin and a safetensors file.
TEST(MappedFile, TruncatedDatasetAndSafetensorsNameTheFile) {
  TempDir dir;
  const std::string prefix = (dir.path() / "corpus").string();
  {
    pl::data::IndexedDatasetWriter w(prefix, 60000);
    std::vector<int32_t> doc(20000);
    for (size_t i = 0; i < doc.size(); ++i) doc[i] = static_cast<int32_t>(i % 60000);
    w.add_document(doc);
    w.finalize();
  }
  const ChildResult ds = in_child(
      [&] {
        pl::data::IndexedDataset d(prefix);
        std::vector<int32_t> out(10);
        d.get(0, 0, 10, out.data());
        if (out[3] != 3) ::_exit(122);
        if (::truncate(d.bin_path().c_str(), 0) != 0) ::_exit(121);
        d.get(0, 15000, 10, out.data());
        ::_exit(123);
      },
      true);
  EXPECT_EQ(ds.exit_code, 1) << ds.message;
  EXPECT_EQ(pl::test::split_lines(ds.message).size(), 1u) << ds.message;
  EXPECT_NE(ds.message.find(prefix + ".bin changed under the running job"), std::string::npos) << ds.message;

  const std::string st = (dir.path() / "w.safetensors").string();
  std::vector<float> w(16384, 1.5f);
  pl::write_safetensors(st, {{"w", "F32", {128, 128}, w.data()}});
  const ChildResult sf = in_child(
      [&] {
        pl::SafetensorsFile f(st);
        if (::truncate(st.c_str(), 64) != 0) ::_exit(121);
        const std::vector<float> got = f.read_float("w");
        ::_exit(got.empty() ? 122 : 123);
      },
      true);
  EXPECT_EQ(sf.exit_code, 1) << sf.message;
  EXPECT_EQ(pl::test::split_lines(sf.message).size(), 1u) << sf.message;
  EXPECT_NE(sf.message.find(st + " changed under the running job"), std::string::npos) << sf.message;
}

}  // namespace
