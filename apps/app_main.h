#pragma once
// The outermost layer every app shares, so that all of them fail the same way: one stderr line
// "<app>: error: <message>" (newlines flattened) and exit 1 for a user error (pl::Error), a file system
// error (std::filesystem) or host memory exhausted (std::bad_alloc); "<app>: internal error: ..." and
// exit 3 for anything else; "(see --help)" and exit 2 for a bad command line.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <new>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "parallel/world.h"

namespace pl::app {

inline void print_error_line(const char* app, const char* kind, std::string msg, const char* suffix = "") {
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::fflush(stdout);
  std::fprintf(stderr, "%s: %s: %s%s\n", app, kind, msg.c_str(), suffix);
}

// The range rules every app's number flags share (issue 38). CLI11 2.1 reads an integer with strtoll /
// strtoull in base 0 and a float with strtold: "-1" wraps in an unsigned option, a value beyond 64 bits is
// clamped without a word, "010" is octal, and "inf" / "nan" / "1e400" are taken. Every INT or UINT option
// must be a decimal integer that fits 64 bits ('+' and leading zeros allowed: the text is rewritten in
// canonical form, so 010 is ten as in Megatron's argparse), with no '-' when unsigned; the narrower types'
// range stays CLI11's own check. Every FLOAT option must be finite. Returns the refusal, or "" when valid.
inline std::string check_integer_text(std::string& v, bool is_unsigned) {
  const bool negative = !v.empty() && v[0] == '-';
  if (negative && is_unsigned) return "must be >= 0, got " + v;
  const size_t start = !v.empty() && (v[0] == '-' || v[0] == '+') ? 1 : 0;
  if (start == v.size() || v.find_first_not_of("0123456789", start) != std::string::npos)
    return "must be a decimal integer, got " + v;
  const size_t first = std::min(v.find_first_not_of('0', start), v.size() - 1);  // "000" -> "0"
  const std::string digits = v.substr(first);
  // 2^63 - 1, 2^64 - 1 and 2^63: the magnitudes a 64-bit option holds.
  const std::string_view limit = is_unsigned ? "18446744073709551615" : (negative ? "9223372036854775808" : "9223372036854775807");
  if (digits.size() > limit.size() || (digits.size() == limit.size() && digits > limit))
    return "out of range: " + v + " does not fit a 64-bit " + (is_unsigned ? "unsigned " : "") + "integer";
  v = (negative && digits != "0" ? "-" : "") + digits;
  return {};
}

inline std::string check_float_text(const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size()) return "must be a number, got " + v;
  if (!std::isfinite(x)) return "must be a finite number, got " + v;
  return {};
}

// Gives every number option of `app` the checks above; parse_command_line calls it, so no app can miss it.
inline void check_number_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base == "INT" || base == "UINT") {
      const bool is_unsigned = base == "UINT";
      opt->check(CLI::Validator([is_unsigned](std::string& v) { return check_integer_text(v, is_unsigned); }, ""));
    } else if (base == "FLOAT") {
      opt->check(CLI::Validator([](std::string& v) { return check_float_text(v); }, ""));
    }
  }
}

// An output prefix (--out, --output-prefix) whose directory must exist already.
inline void check_output_directory(const char* flag, const std::string& prefix) {
  const std::filesystem::path dir = std::filesystem::path(prefix).parent_path();
  std::error_code ec;
  PL_CHECK(dir.empty() || std::filesystem::is_directory(dir, ec), "{} {}: directory {} does not exist", flag, prefix,
           dir.string());
}

// Parses argv into `cli`: nullopt to go on, or the exit code (0 after --help, 2 after a parse error).
inline std::optional<int> parse_command_line(CLI::App& cli, int argc, char** argv, const char* app) {
  check_number_options(cli);
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

// `run()` on every rank of `world`: one rank as guarded_main makes it (its one line and exit code); under MPI an
// error on one rank prints its line naming the rank ("<app> (rank 1 of 2): error: ...") and ends every rank
// (World::abort: MPI_Abort after the registered hooks), so no rank waits forever in a collective.
template <class Run>
int on_every_rank(const char* app, const parallel::World& world, Run&& run) {
  if (world.size() == 1) return run();
  const std::string who =
      std::string(app) + " (rank " + std::to_string(world.rank()) + " of " + std::to_string(world.size()) + ")";
  try {
    return run();
  } catch (const pl::Error& e) {
    print_error_line(who.c_str(), "error", e.what());
    world.abort(1);
  } catch (const std::exception& e) {
    print_error_line(who.c_str(), "internal error", e.what());
    world.abort(3);
  }
}

}  // namespace pl::app
