#pragma once
// Errors the user sees: one line that names the op, file or field, and what was wrong.
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace pl {

// A user-facing error (bad flag, bad config, bad shape). apps print e.what() on one line and exit 1.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> fmt, Args&&... args) {
  throw Error(fmt::format(fmt, std::forward<Args>(args)...));
}

#define PL_CHECK(cond, ...)              \
  do {                                   \
    if (!(cond)) ::pl::fail(__VA_ARGS__); \
  } while (0)

}  // namespace pl
