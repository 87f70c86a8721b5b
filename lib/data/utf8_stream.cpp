#include "data/utf8_stream.h"

namespace pl::data {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}

void Utf8Stream::reset() {
  pending_.clear();
  needed_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
}

// The lead byte fixes the length and narrows the second byte's range: E0 A0.. and F0 90.. exclude overlong
// forms, ED ..9F the surrogates, F4 ..8F the code points above U+10FFFF; C0, C1 and F5..FF never start one.
bool Utf8Stream::take(unsigned char b, std::string& out) {
  if (needed_ == 0) {
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
    } else if (b >= 0xC2 && b <= 0xDF) {
      needed_ = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      needed_ = 2;
      if (b == 0xE0) lower_ = 0xA0;
      if (b == 0xED) upper_ = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      needed_ = 3;
      if (b == 0xF0) lower_ = 0x90;
      if (b == 0xF4) upper_ = 0x8F;
    } else {
      out += kReplacement;
    }
    if (needed_ > 0) pending_.push_back(static_cast<char>(b));
    return true;
  }
  if (b < lower_ || b > upper_) {  // the sequence so far is a maximal subpart: one U+FFFD, then b afresh
    reset();
    out += kReplacement;
    return false;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  pending_.push_back(static_cast<char>(b));
  if (--needed_ == 0) {
    out += pending_;
    pending_.clear();
  }
  return true;
}

std::string Utf8Stream::push(std::string_view bytes) {
  std::string out;
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    if (!take(b, out)) take(b, out);  // a byte read again starts a sequence, so the second take succeeds
  }
  return out;
}

std::string Utf8Stream::finish() {
  const bool incomplete = needed_ > 0;
  reset();
  return incomplete ? std::string(kReplacement) : std::string();
}

}  // namespace pl::data
