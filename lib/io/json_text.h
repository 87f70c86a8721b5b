#pragma once
// JSON from files a user hands us (configs, safetensors headers and indexes, tokenizer sidecars, checkpoint
// manifests, JSON-lines documents), read so that no input can crash the reader: a nesting limit checked
// while parsing (nlohmann's parser keeps its own stack, but dump() and a deep value's users recurse), every
// nlohmann exception -- parse errors, and numbers outside double's range (out_of_range 406) -- turned into
// one pl::Error line, and error messages that describe a value without serializing all of it.
#include <functional>
#include <string>
#include <string_view>

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

}  // namespace pl
