#pragma once
// JSON from files a user hands us (configs, safetensors headers and indexes, tokenizer sidecars, checkpoint
// manifests, JSON-lines documents), read so that no input can crash the reader: a nesting limit checked
// while parsing (nlohmann's parser keeps its own stack, but dump() and a deep value's users recurse), every
// nlohmann exception -- parse errors, and numbers outside double's range (out_of_range 406) -- turned into
// one pl::Error line, and error messages that describe a value without serializing all of it.
#include <cmath>
#include <functional>
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

// `v` as the integer type T when it is a whole number inside T's range (a JSON integer, or a float with
// no fraction below 2^53); nullopt otherwise. nlohmann's get<T>() would truncate 1.9 to 1, wrap -1 into
// an unsigned type and clamp or wrap 1e20 -- every reader of an integer field goes through this instead.
template <class T>
std::optional<T> json_exact_integer(const nlohmann::json& v) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return std::in_range<T>(u) ? std::optional<T>(static_cast<T>(u)) : std::nullopt;
  }
  if (v.is_number_integer()) {
    const int64_t i = v.get<int64_t>();
    return std::in_range<T>(i) ? std::optional<T>(static_cast<T>(i)) : std::nullopt;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!(std::fabs(d) < 9007199254740992.0) || std::floor(d) != d) return std::nullopt;
    const int64_t i = static_cast<int64_t>(d);
    return std::in_range<T>(i) ? std::optional<T>(static_cast<T>(i)) : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace pl
