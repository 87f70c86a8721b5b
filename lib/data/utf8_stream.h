#pragma once
// Token bytes -> complete UTF-8 text, for printing a generation as it goes (issue 38): a byte-level or BPE
// tokenizer emits pieces that may end inside a multi-byte character, so a piece is held back until its
// character is whole, and a sequence that can never be valid becomes U+FFFD. The replacement follows the
// WHATWG Encoding Standard's UTF-8 decoder (one U+FFFD per "maximal subpart", as Unicode §3.9 recommends and
// as Python's bytes.decode("utf-8", "replace") does), so the output is always valid UTF-8.
#include <cstdint>
#include <string>
#include <string_view>

namespace pl::data {

class Utf8Stream {
 public:
  // The text that `bytes` completes: whole characters only, invalid sequences replaced.
  std::string push(std::string_view bytes);
  // At the end: U+FFFD for a character left incomplete, else "".
  std::string finish();

 private:
  void reset();
  // One byte into `out`; false when the byte ends an invalid sequence and must be read again on its own.
  bool take(unsigned char b, std::string& out);

  std::string pending_;  // the bytes of the character being read
  int needed_ = 0;       // continuation bytes it still needs
  unsigned char lower_ = 0x80, upper_ = 0xBF;  // the range the next continuation byte must lie in
};

}  // namespace pl::data
