#include "data/tokenizer_record.h"

#include <fmt/format.h>

#include <array>
#include <charconv>
#include <filesystem>
#include <optional>
#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/error.h"
#include "io/json_text.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"

namespace pl::data {

constexpr int kRecordVersion = 1;

std::string tokenizer_record_path(const std::string& prefix) { return prefix + ".tokenizer.json"; }

std::string fnv1a64_file_hex(const std::string& path, int64_t* size) {
  RegularFileStream in(path);  // (io/file_checks.h: a FIFO or a directory is one line, not a hang)
  uint64_t h = kFnv1aBasis;
  int64_t total = 0;
  std::array<char, 1 << 16> buf{};
  while (in) {
    in.read(buf.data(), buf.size());
    const std::streamsize got = in.gcount();
    h = fnv1a64(buf.data(), static_cast<size_t>(got), h);
    total += got;
  }
  PL_CHECK(!in.bad(), "{}: read error", path);
  if (size != nullptr) *size = total;
  return fmt::format("{:016x}", h);
}

std::string tokenizer_record_text(const TokenizerRecord& r) {
  nlohmann::ordered_json j;
  j["version"] = kRecordVersion;
  j["type"] = r.type;
  j["model_path"] = r.model_path;
  j["model_size"] = r.model_size;
  j["model_fnv1a64"] = r.model_fnv1a64;
  j["vocab_size"] = r.vocab_size;
  j["eod"] = r.eod;
  j["bos"] = r.bos;
  j["append_eod"] = r.append_eod;
  j["prepend_bos"] = r.prepend_bos;
  if (r.data_bin_bytes >= 0) j["data_bin_bytes"] = r.data_bin_bytes;
  if (!r.data_idx_checksum64.empty()) j["data_idx_checksum64"] = r.data_idx_checksum64;
  return j.dump(2) + "\n";
}

void write_tokenizer_record(const std::string& prefix, const TokenizerRecord& record) {
  write_file_atomically(tokenizer_record_path(prefix), tokenizer_record_text(record));
}

std::optional<TokenizerRecord> read_tokenizer_record(const std::string& prefix) {
  return read_tokenizer_record_file(tokenizer_record_path(prefix));
}

std::string data_prefix_of_command_line(const std::vector<std::string>& argv) {
  for (size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] != "--data-path") continue;
    // "--data-path P" or "--data-path W1 P1 ...": the first value that is not a number.
    for (size_t k = i + 1; k < argv.size() && argv[k].rfind("--", 0) != 0; ++k) {
      double w = 0;
      const auto [end, ec] = std::from_chars(argv[k].data(), argv[k].data() + argv[k].size(), w);
      if (ec != std::errc() || end != argv[k].data() + argv[k].size()) return argv[k];
    }
  }
  return "";
}

std::optional<TokenizerRecord> read_tokenizer_record_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  const std::string text = read_regular_file(path);  // (a FIFO: one line, not a hang)
  const nlohmann::json j = parse_json_text(text, path);
  PL_CHECK(j.is_object(), "{}: expected a JSON object", path);
  const int version = json_field<int>(j, "version", path);
  PL_CHECK(version == kRecordVersion, "{}: version {} is not supported (expected {})", path, version, kRecordVersion);
  TokenizerRecord r;
  r.type = json_field<std::string>(j, "type", path);
  r.model_path = json_field<std::string>(j, "model_path", path);
  r.model_size = json_field<int64_t>(j, "model_size", path);
  r.model_fnv1a64 = json_field<std::string>(j, "model_fnv1a64", path);
  r.vocab_size = json_field<int64_t>(j, "vocab_size", path);
  r.eod = json_field<int32_t>(j, "eod", path);
  r.bos = json_field<int32_t>(j, "bos", path);
  r.append_eod = json_field<bool>(j, "append_eod", path);
  r.prepend_bos = json_field<bool>(j, "prepend_bos", path);
  if (j.contains("data_bin_bytes")) {
    r.data_bin_bytes = json_field<int64_t>(j, "data_bin_bytes", path);
    PL_CHECK(r.data_bin_bytes >= 0, "{}: data_bin_bytes {} must not be negative", path, r.data_bin_bytes);
  }
  if (j.contains("data_idx_checksum64")) {
    r.data_idx_checksum64 = json_field<std::string>(j, "data_idx_checksum64", path);
    PL_CHECK(r.data_idx_checksum64.size() == 16 &&
                 r.data_idx_checksum64.find_first_not_of("0123456789abcdef") == std::string::npos,
             "{}: data_idx_checksum64 must be 16 lowercase hex digits", path);
  }
  PL_CHECK(r.vocab_size > 0, "{}: vocab_size {} must be positive", path, r.vocab_size);
  PL_CHECK(r.eod >= 0 && r.eod < r.vocab_size, "{}: eod {} outside the vocabulary [0, {})", path, r.eod, r.vocab_size);
  PL_CHECK(r.bos >= 0 && r.bos < r.vocab_size, "{}: bos {} outside the vocabulary [0, {})", path, r.bos, r.vocab_size);
  return r;
}

}  // namespace pl::data
