#include "config/json_reader.h"

#include <cmath>

#include "core/error.h"
#include "io/file_checks.h"
#include "io/json_text.h"

namespace pl {

const nlohmann::json JsonReader::kEmptyObject = nlohmann::json::object();

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path);  // (a FIFO or a directory: one line, no hang)
  // (io/json_text.h: a nesting limit, and every nlohmann exception as one line naming the file)
  nlohmann::json j = parse_json_text(text, path);
  PL_CHECK(j.is_object(), "{}: top level must be a JSON object", path);
  return j;
}

JsonReader::JsonReader(const nlohmann::json& obj, std::string file, std::string prefix)
    : obj_(obj), file_(std::move(file)), prefix_(std::move(prefix)) {
  PL_CHECK(obj_.is_object(), "{}: field '{}' must be an object", file_, prefix_);
}

void JsonReader::fail_field(const std::string& key, const std::string& what) const {
  fail("{}: field '{}{}' {}", file_, prefix_, key, what);
}

const nlohmann::json& JsonReader::get(const std::string& key) {
  read_.insert(key);
  if (!obj_.contains(key)) fail_field(key, "is missing");
  return obj_.at(key);
}

int64_t JsonReader::integer(const std::string& key) {
  const auto& v = get(key);
  if (const std::optional<int64_t> i = json_exact_integer<int64_t>(v)) return *i;
  fail_field(key, "must be an integer, got " + describe_json(v));
}

int64_t JsonReader::integer(const std::string& key, int64_t fallback) {
  return obj_.contains(key) ? integer(key) : fallback;
}

double JsonReader::number(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_number()) fail_field(key, "must be a number, got " + describe_json(v));
  // (A JSON number beyond double's range is a parse error already; this keeps a finite double finite.)
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail_field(key, "must be a finite number, got " + describe_json(v));
  return d;
}

double JsonReader::number(const std::string& key, double fallback) {
  return obj_.contains(key) ? number(key) : fallback;
}

bool JsonReader::boolean(const std::string& key, bool fallback) {
  if (!obj_.contains(key)) return fallback;
  const auto& v = get(key);
  if (!v.is_boolean()) fail_field(key, "must be true or false, got " + describe_json(v));
  return v.get<bool>();
}

std::string JsonReader::string(const std::string& key) {
  const auto& v = get(key);
  if (!v.is_string()) fail_field(key, "must be a string, got " + describe_json(v));
  return v.get<std::string>();
}

std::string JsonReader::string(const std::string& key, const std::string& fallback) {
  return obj_.contains(key) ? string(key) : fallback;
}

std::optional<std::string> JsonReader::nullable_string(const std::string& key) {
  read_.insert(key);
  if (!obj_.contains(key) || obj_.at(key).is_null()) return std::nullopt;
  const auto& v = obj_.at(key);
  if (!v.is_string()) fail_field(key, "must be a string or null, got " + describe_json(v));
  return v.get<std::string>();
}

JsonReader JsonReader::object(const std::string& key) {
  if (!obj_.contains(key)) return JsonReader(kEmptyObject, file_, prefix_ + key + ".");
  const auto& v = get(key);
  if (!v.is_object()) fail_field(key, "must be an object, got " + describe_json(v));
  return JsonReader(v, file_, prefix_ + key + ".");
}

void JsonReader::reject_unknown_keys() const {
  for (const auto& [k, v] : obj_.items())
    if (!read_.count(k)) fail("{}: unknown field '{}{}'", file_, prefix_, k);
}

}  // namespace pl
