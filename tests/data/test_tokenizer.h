#pragma once
// A tiny tiktoken rank file for the tokenizer and preprocess_data tests: ranks 0..255 are the single
// bytes (rank b = byte b), then a few multi-byte tokens chosen so that the merge order matters.
#include <string>
#include <utility>
#include <vector>

namespace pl::test {

inline std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest == 1) {
    const unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (rest == 2) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

// The multi-byte tokens of the tiny vocabulary, in rank order from 256.
inline const std::vector<std::string>& tiny_merges() {
  static const std::vector<std::string> m = {
      "bc",   // 256: lower rank than "ab", so "abc" merges b+c first
      "ab",   // 257
      "xyz",  // 258: reachable only as a whole piece (neither "xy" nor "yz" is a token)
      "  ",   // 259: two spaces
      " b",   // 260
      "he",   // 261
      "ll",   // 262
      "hell", // 263: he + ll
  };
  return m;
}
inline constexpr int kTinyBase = 256 + 8;           // ranks in the file
inline constexpr int kTinyVocab = kTinyBase + 256;  // + Llama 3.1 specials

// The rank file text: "base64 rank" per line.
inline std::string tiny_rank_file() {
  std::string text;
  for (int b = 0; b < 256; ++b) text += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  const auto& m = tiny_merges();
  for (size_t i = 0; i < m.size(); ++i) text += base64(m[i]) + " " + std::to_string(256 + i) + "\n";
  return text;
}

}  // namespace pl::test
