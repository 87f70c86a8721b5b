// data::Utf8Stream: the text generate prints from token bytes is whole, valid UTF-8 however the bytes are cut.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "data/tokenizer.h"
#include "data/utf8_stream.h"

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string decode_all_at_once(const std::string& bytes) {
  pl::data::Utf8Stream s;
  std::string out = s.push(bytes);
  return out + s.finish();
}

std::string decode_byte_by_byte(const std::string& bytes) {
  pl::data::Utf8Stream s;
  std::string out;
  for (const char c : bytes) out += s.push(std::string(1, c));
  return out + s.finish();
}

// Expected values are Python's bytes.decode("utf-8", "replace") (one U+FFFD per maximal subpart).
TEST(Utf8Stream, ReplacesEachMaximalSubpartAsPythonDoes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"\xE2\x82\xAC\xC3\xA9", "\xE2\x82\xAC\xC3\xA9"},       // valid: passed through
      {"a\xFF" "b", "a" + kFffd + "b"},                         // a byte that never starts a character
      {"\xE0\x80", kFffd + kFffd},                              // overlong lead: E0 needs A0..BF next
      {"\xED\xA0\x80", kFffd + kFffd + kFffd},                  // a surrogate
      {"\xF4\x90\x80\x80", kFffd + kFffd + kFffd + kFffd},      // above U+10FFFF
      {"\xC0\xAF", kFffd + kFffd},                              // overlong '/'
      {"\xF0\x9F\x98" "x", kFffd + "x"},                        // cut short by an ASCII byte
      {"\xF0\x9F\x98", kFffd},                                  // cut short by the end
      {"\xF0\x9F\x98\x80", "\xF0\x9F\x98\x80"},                 // U+1F600 whole
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(decode_all_at_once(in), want);
    EXPECT_EQ(decode_byte_by_byte(in), want);
  }
}

TEST(Utf8Stream, HoldsBackAnIncompleteCharacterUntilItIsWhole) {
  pl::data::Utf8Stream s;
  EXPECT_EQ(s.push("ab\xF0\x9F"), "ab");
  EXPECT_EQ(s.push("\x98"), "");
  EXPECT_EQ(s.push("\x80!"), "\xF0\x9F\x98\x80!");
  EXPECT_EQ(s.finish(), "");
}

TEST(Utf8Stream, AnyBytesGiveValidTextHoweverTheyAreCut) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string bytes(rng() % 24, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() % 128 : 0x80 + rng() % 128);
    const std::string text = decode_all_at_once(bytes);
    EXPECT_EQ(pl::data::find_invalid_utf8(text), std::string::npos);
    EXPECT_EQ(decode_byte_by_byte(bytes), text);
    if (pl::data::find_invalid_utf8(bytes) == std::string::npos) {
      EXPECT_EQ(text, bytes);
    }
  }
}

}  // namespace
