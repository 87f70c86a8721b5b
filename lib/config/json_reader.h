#pragma once
// Strict reading of a JSON config object: every error is one line naming the file and the field,
// unknown keys are errors (a typo must not silently fall back to a default).
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

namespace pl {

// Parses the file; a missing file or a syntax error is a one-line pl::Error naming the file.
nlohmann::json read_json_file(const std::string& path);

class JsonReader {
 public:
  JsonReader(const nlohmann::json& obj, std::string file, std::string prefix = "");

  int64_t integer(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback);
  double number(const std::string& key);
  double number(const std::string& key, double fallback);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key);
  std::string string(const std::string& key, const std::string& fallback);
  // A string or null; returns nullopt for null or absent.
  std::optional<std::string> nullable_string(const std::string& key);
  // A nested object (empty object when absent).
  JsonReader object(const std::string& key);
  bool has(const std::string& key) const { return obj_.contains(key); }

  // Fails on the first key that was never read.
  void reject_unknown_keys() const;
  [[noreturn]] void fail_field(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& get(const std::string& key);
  const nlohmann::json& obj_;
  std::string file_;
  std::string prefix_;
  std::set<std::string> read_;
  static const nlohmann::json kEmptyObject;
};

}  // namespace pl
