#pragma once
// The outermost layer every app shares, so that all of them fail the same way: one stderr line
// "<app>: error: <message>" (newlines flattened) and exit 1 for a user error (pl::Error), a file system
// error (std::filesystem) or host memory exhausted (std::bad_alloc); "<app>: internal error: ..." and
// exit 3 for anything else; "(see --help)" and exit 2 for a bad command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <string>

#include "core/error.h"

namespace pl::app {

inline void print_error_line(const char* app, const char* kind, std::string msg, const char* suffix = "") {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s: %s%s\n", app, kind, msg.c_str(), suffix);
}

// For options stored in an unsigned type: CLI11 converts "-1" into 2^64 - 1 without a word. A leading
// '-' is refused here with a one-line message instead.
inline const CLI::Validator kNonNegativeInteger(
    [](std::string& v) { return v.find('-') == std::string::npos ? std::string() : "must be >= 0, got " + v; },
    "INT>=0");

// An output prefix (--out, --output-prefix) whose directory must exist already.
inline void check_output_directory(const char* flag, const std::string& prefix) {
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  PL_CHECK(dir.empty() || std::filesystem::is_directory(dir, ec), "{} {}: directory {} does not exist", flag, prefix,
           dir.string());
}

// Parses argv into `cli`: nullopt to go on, or the exit code (0 after --help, 2 after a parse error).
inline std::optional<int> parse_command_line(CLI::App& cli, int argc, char** argv, const char* app) {
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(cli.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& e) {
    print_error_line(app, "error", e.what(), " (see --help)");
    return 2;
  }
  return std::nullopt;
}

// Runs run(argc, argv) and turns an escaping exception into the one-line error and exit code above.
template <class Run>
int guarded_main(const char* app, Run&& run, int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const pl::Error& e) {
    print_error_line(app, "error", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {
    // The environment, not a bug: a path vanished, a permission or a full disk (the message names the
    // path and the OS error).
    print_error_line(app, "error", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    print_error_line(app, "error", "out of host memory (std::bad_alloc): lower the sizes given (batch, "
                     "sequence, iterations) or free memory");
    return 1;
  } catch (const std::exception& e) {
    print_error_line(app, "internal error", e.what());
    return 3;
  }
}

}  // namespace pl::app
