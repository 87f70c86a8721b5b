#pragma once
// JSON from files a user hands us (configs, safetensors headers and indexes, tokenizer sidecars, checkpoint
// manifests, JSON-lines documents), read so that no input can crash the reader: a nesting limit checked
// while parsing (nlohmann's parser keeps its own stack, but dump() and a deep value's users recurse), every
// nlohmann exception -- parse errors, and numbers outside double's range (out_of_range 406) -- turned into
// one pl::Error line, and error messages that describe a value without serializing all of it.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

namespace pl {

inline constexpr int kMaxJsonDepth = 64;

// Called for every parse event as nlohmann's callback (depth, event, value); return false to drop the value.
using JsonParseCallback = std::function<bool(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed)>;

// Parses `text`; `what` names it in errors ("configs/models/x.json", "FILE:LINE", "... header").
nlohmann::json parse_json_text(std::string_view text, const std::string& what, const JsonParseCallback& also = {});

// A value for an error message: a scalar as written (cut at 60 characters), a container by its type and
// size ("an array of 3 elements") -- never recursing, whatever the value's depth or size.
std::string describe_json(const nlohmann::json& v);

// Throws the pl::Error "<file>: field '<key>' <what>".
[[noreturn]] void throw_json_field_error(const std::string& file, const char* key, const std::string& what);

// `v` as the integer type T when it is a whole number inside T's range (a JSON integer, or a float with
// no fraction below 2^53); nullopt otherwise. nlohmann's get<T>() would truncate 1.9 to 1, wrap -1 into
// an unsigned type and clamp or wrap 1e20 -- every reader of an integer field goes through this instead.
template <class T>
std::optional<T> json_exact_integer(const nlohmann::json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  const auto in_t = [](auto x) { return std::in_range<T>(x) ? std::optional<T>(static_cast<T>(x)) : std::nullopt; };
  if (v.is_number_unsigned()) return in_t(v.get<uint64_t>());
  if (v.is_number_integer()) return in_t(v.get<int64_t>());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(std::fabs(d) < 9007199254740992.0) || std::floor(d) != d) return std::nullopt;
    return in_t(static_cast<int64_t>(d));
  }
  return std::nullopt;
}

// Field `key` of the object `j` (from `file`) as T: a missing key, the wrong JSON type or, for an integer
// type, a value that is not a whole number inside T's range is one pl::Error line naming file and field.
template <class T>
T json_field(const nlohmann::json& j, const char* key, const std::string& file) {
  if (!j.is_object() || !j.contains(key)) throw_json_field_error(file, key, "is missing");
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (const std::optional<T> i = json_exact_integer<T>(v)) return *i;
    throw_json_field_error(file, key, "must be an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                                          std::to_string(std::numeric_limits<T>::max()) + "], got " + describe_json(v));
  } else {
    try {
      return v.get<T>();
    } catch (const nlohmann::json::exception&) {
      throw_json_field_error(file, key, std::string("has the wrong type (") + v.type_name() + ")");
    }
  }
}

}  // namespace pl
