#include "io/json_text.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace pl {
namespace {
// An exception's message, cut (nlohmann's quote the offending token, which may be megabytes of digits).
std::string cut(std::string s, size_t max) {
  if (s.size() > max) s = s.substr(0, max) + "...";
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}
}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& what, const JsonParseCallback& also) {
  auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= kMaxJsonDepth)
      fail("{}: JSON nested deeper than {} levels (refused)", what, kMaxJsonDepth);
    return also ? also(depth, ev, parsed) : true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number beyond double's range ("number overflow parsing '1e400'")
    fail("{}: not valid JSON: {}", what, cut(e.what(), 200));
  }
}

std::string describe_json(const nlohmann::json& v) {
  // A short flat array of scalars is shown as written (e.g. a shape [1, -2]); its dump recurses one level.
  if (v.is_array() && v.size() <= 16 && std::all_of(v.begin(), v.end(), [](const nlohmann::json& x) { return x.is_primitive(); })) {
    const std::string s = v.dump();
    if (s.size() <= 80) return s;
  }
  if (v.is_array()) return fmt::format("an array of {} elements", v.size());
  if (v.is_object()) return fmt::format("an object of {} keys", v.size());
  return cut(v.dump(), 60);  // a scalar: no recursion
}

void throw_json_field_error(const std::string& file, const char* key, const std::string& what) {
  fail("{}: field '{}' {}", file, key, what);
}

}  // namespace pl
