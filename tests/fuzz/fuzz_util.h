#pragma once
// Shared by the libFuzzer targets (tests/fuzz/fuzz_*.cpp, scripts/fuzz.sh). Each target hands the
// input bytes to one of the project's real parsers. A pl::Error is an accepted outcome (the parser
// refused the input with its one-line message); anything else -- another exception, a crash, a
// sanitizer report, a timeout, an allocation over -malloc_limit_mb -- is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>
#include <typeinfo>

#include "core/error.h"

namespace pl::fuzz {

// A private directory (under $TMPDIR, else /tmp) for the files a target writes: the input where the
// parser takes a path, and the fixed files beside it. Made once per process, removed at exit (the string
// is never destroyed: the exit handler that removes the directory runs after static destructors would).
inline const std::string& work_dir() {
  static const std::string& dir = *new std::string([] {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/pl_fuzz_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("pl_fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(work_dir(), ec);
    });
    return tmpl;
  }());
  return dir;
}

// Writes `bytes` to `path` (replacing it); a failure here is the harness's, so it aborts.
inline void write_file(const std::string& path, const void* data, size_t bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (bytes > 0 && std::fwrite(data, 1, bytes, f) != bytes) || std::fclose(f) != 0) {
    std::perror(("pl_fuzz: cannot write " + path).c_str());
    std::abort();
  }
}
inline void write_file(const std::string& path, std::string_view text) { write_file(path, text.data(), text.size()); }

// What the last run_parser call saw (for fuzz_replay's counts): accepted, or refused with this message.
inline bool last_accepted = false;
inline std::string last_error;

// Runs `parse`: a pl::Error is fine; any other exception is reported and aborts (a finding).
template <class F>
int run_parser(F&& parse) {
  last_accepted = false;
  last_error.clear();
  try {
    parse();
    last_accepted = true;
  } catch (const pl::Error& e) {
    last_error = e.what();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pl_fuzz: FINDING: exception %s that is not a pl::Error: %s\n", typeid(e).name(), e.what());
    std::abort();
  }
  return 0;
}

}  // namespace pl::fuzz
