#pragma once
// Small helpers shared by the config, plan, log and CLI tests: a self-deleting temporary directory,
// running a command with its stdout/stderr/exit code captured, line counting, the one-line-error
// expectation and an index-array fingerprint.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/checksum.h"
#include "core/error.h"

namespace pl::test {

#ifdef PL_MPIRUN_FLAGS
// The suite's mpirun flags (tests/CMakeLists.txt joins the CMake list with '|'); empty without MPI.
inline std::vector<std::string> mpirun_flags() {
  std::vector<std::string> flags;
  std::stringstream in(PL_MPIRUN_FLAGS);
  for (std::string f; std::getline(in, f, '|');)
    if (!f.empty()) flags.push_back(f);
  return flags;
}
#endif

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pl_tests_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // Writes `content` to <dir>/<name> and returns the full path.
  std::string write(const std::string& name, const std::string& content) const {
    const std::filesystem::path p = path_ / name;
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw std::runtime_error("cannot write " + p.string());
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct ProcessResult {
  int exit_code = -1;  // the exit status, or 128 + signal number when killed by a signal
  bool timed_out = false;
  std::string out;
  std::string err;
};

// Waits for the child `pid`, killing it (SIGKILL) after `timeout_s` seconds (timed_out set); returns its
// exit status, or 128 + the signal number when a signal ended it.
inline int wait_child(pid_t pid, double timeout_s, bool& timed_out) {
  int status = 0;
  timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0) throw std::runtime_error("waitpid failed");
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : (WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1);
}

// Runs fn() in a forked child and waits for it: the child exits 0 when fn returns, 1 when it throws
// pl::Error, 2 for another exception (fn may also _exit or be killed). Returns wait_child's code (the exit
// status, or 128 + the signal); a child still running after `timeout_s` is killed and the call throws, so
// a hang fails its test instead of stalling ctest and is never mistaken for a kill the test expects.
// `child_pid`, when given, receives the child's pid.
inline int run_forked(const std::function<void()>& fn, double timeout_s = 60.0, pid_t* child_pid = nullptr) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("run_forked: fork failed");
  if (pid == 0) {
    try {
      fn();
    } catch (const pl::Error&) {
      ::_exit(1);
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  if (child_pid != nullptr) *child_pid = pid;
  bool timed_out = false;
  const int code = wait_child(pid, timeout_s, timed_out);
  if (timed_out) throw std::runtime_error("run_forked: the child was still running after " +
                                          std::to_string(timeout_s) + " s and was killed");
  return code;
}

// Runs `exe` with `args` (no shell), stdout and stderr captured through files (no pipe deadlock).
// The child is killed after `timeout_s` seconds.
inline ProcessResult run_process(const std::string& exe, const std::vector<std::string>& args,
                                 double timeout_s = 60.0) {
  TempDir dir;
  const std::string out_path = (dir.path() / "stdout").string();
  const std::string err_path = (dir.path() / "stderr").string();
  std::vector<std::string> argv_s;
  argv_s.push_back(exe);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int fo = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fe = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int fi = ::open("/dev/null", O_RDONLY);
    if (fo < 0 || fe < 0 || fi < 0) ::_exit(126);
    ::dup2(fi, 0);
    ::dup2(fo, 1);
    ::dup2(fe, 2);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  ProcessResult r;
  r.exit_code = wait_child(pid, timeout_s, r.timed_out);
  r.out = read_text_file(out_path);
  r.err = read_text_file(err_path);
  return r;
}

// The lines of `s` ('\n'-separated; a trailing newline does not start an extra line).
inline std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// The iteration lines of a pretrain_llama log from iteration `first` on, with the timestamp and the
// timing field removed: what must be identical between two runs of the same numbers (loss, grad
// norm, lr, consumed samples).
inline std::vector<std::string> iteration_lines(const std::string& out, int first) {
  static const std::regex iter(R"(^ \[[^\]]*\] iteration +(\d+)/)");
  static const std::regex timing(R"(elapsed time per iteration \(ms\): [0-9.]+ \|)");
  std::vector<std::string> lines;
  for (const std::string& l : split_lines(out)) {
    std::smatch m;
    if (!std::regex_search(l, m, iter) || std::stoi(m[1]) < first) continue;
    lines.push_back(std::regex_replace(l.substr(l.find(']') + 1), timing, ""));
  }
  return lines;
}

// fn() must throw a pl::Error whose message is one non-empty line containing every needle.
inline void expect_one_line_error(const std::function<void()>& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a pl::Error";
  } catch (const pl::Error& e) {
    const std::string msg = e.what();
    EXPECT_FALSE(msg.empty());
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
    EXPECT_EQ(msg.find('\r'), std::string::npos) << "not one line: " << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a pl::Error, got another exception: " << e.what();
  }
}

// FNV-1a over the low 32 bits of each element: a compact fingerprint of an index array, as the
// golden-value script computes it.
template <class T>
uint64_t fnv1a(const std::vector<T>& v) {
  uint64_t h = kFnv1aBasis;
  for (const T x : v) h = fnv1a_step(h, static_cast<uint32_t>(static_cast<int64_t>(x)));
  return h;
}

// An environment variable set for the children started in this scope.
struct ScopedEnv {
  ScopedEnv(const char* name, const std::string& value) : name_(name) { ::setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  const char* name_;
};

// A "full disk" for the children started in this scope: RLIMIT_FSIZE (inherited), SIGXFSZ ignored
// (an ignored disposition survives exec), so a write past the limit fails with EFBIG.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    old_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    const rlimit lim{bytes, saved_.rlim_max};
    ::setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    ::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

// A pid that existed a moment ago and does not now (a forked child that has exited and been reaped).
inline long dead_pid() {
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("dead_pid: fork failed");
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return static_cast<long>(pid);
}

}  // namespace pl::test
