#include "log/tensorboard_reader.h"

#include <fmt/format.h>

#include <bit>
#include <string_view>

#include "core/error.h"
#include "io/file_checks.h"
#include "log/tensorboard.h"

namespace pl::test {

namespace {

uint64_t get_le(std::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(in[at + i])) << (8 * i);
  return v;
}

// A protobuf message being read: its fields one by one, each checked against the bytes left.
struct ProtoReader {
  std::string_view in;
  size_t at = 0;
  const std::string& where;  // "FILE, record at byte N", for errors

  bool done() const { return at >= in.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      PL_CHECK(at < in.size(), "{}: truncated varint", where);
      const auto b = static_cast<unsigned char>(in[at++]);
      v |= static_cast<uint64_t>(b & 0x7Fu) << shift;
      if ((b & 0x80u) == 0) return v;
    }
    fail("{}: varint longer than 10 bytes", where);
  }
  uint64_t fixed(int bytes) {
    PL_CHECK(in.size() - at >= static_cast<size_t>(bytes), "{}: truncated {}-byte field", where, bytes);
    const uint64_t v = get_le(in, at, bytes);
    at += static_cast<size_t>(bytes);
    return v;
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    PL_CHECK(n <= in.size() - at, "{}: a field of {} bytes overruns its message", where, n);
    const std::string_view s = in.substr(at, n);
    at += n;
    return s;
  }
  void skip(uint32_t wire_type) {
    switch (wire_type) {
      case 0: (void)varint(); return;
      case 1: (void)fixed(8); return;
      case 2: (void)bytes(); return;
      case 5: (void)fixed(4); return;
      default: fail("{}: unsupported wire type {}", where, wire_type);
    }
  }
};

void decode_summary(std::string_view summary, const std::string& where, DecodedEvent& e) {
  ProtoReader s{summary, 0, where};
  while (!s.done()) {
    const uint64_t key = s.varint();
    if (key != ((1u << 3) | 2u)) {
      s.skip(static_cast<uint32_t>(key & 7u));
      continue;
    }
    ProtoReader v{s.bytes(), 0, where};
    std::pair<std::string, float> tv;
    while (!v.done()) {
      const uint64_t vkey = v.varint();
      if (vkey == ((1u << 3) | 2u)) tv.first = std::string(v.bytes());
      else if (vkey == ((2u << 3) | 5u)) tv.second = std::bit_cast<float>(static_cast<uint32_t>(v.fixed(4)));
      else v.skip(static_cast<uint32_t>(vkey & 7u));
    }
    e.values.push_back(std::move(tv));
  }
}

DecodedEvent decode_event(std::string_view data, const std::string& where) {
  DecodedEvent e;
  ProtoReader r{data, 0, where};
  while (!r.done()) {
    const uint64_t key = r.varint();
    switch (key) {
      case (1u << 3) | 1u: e.wall_time = std::bit_cast<double>(r.fixed(8)); break;
      case (2u << 3) | 0u: e.step = static_cast<int64_t>(r.varint()); break;
      case (3u << 3) | 2u: e.file_version = std::string(r.bytes()); break;
      case (5u << 3) | 2u: decode_summary(r.bytes(), where, e); break;
      default: r.skip(static_cast<uint32_t>(key & 7u));
    }
  }
  return e;
}

}  // namespace

std::vector<DecodedEvent> read_event_file(const std::string& path) {
  const std::string file = read_regular_file(path);
  std::vector<DecodedEvent> events;
  size_t at = 0;
  while (at < file.size()) {
    const std::string where = fmt::format("{}, record at byte {}", path, at);
    PL_CHECK(file.size() - at >= 12, "{}: truncated header", where);
    const std::string_view header(file.data() + at, 8);
    PL_CHECK(get_le(file, at + 8, 4) == log::masked_crc32c(header), "{}: the length's CRC does not match", where);
    const uint64_t n = get_le(file, at, 8);
    PL_CHECK(n <= file.size() - at - 12 && file.size() - at - 12 - n >= 4, "{}: a record of {} bytes overruns the file",
             where, n);
    const std::string_view data(file.data() + at + 12, n);
    PL_CHECK(get_le(file, at + 12 + n, 4) == log::masked_crc32c(data), "{}: the data's CRC does not match", where);
    events.push_back(decode_event(data, where));
    at += 16 + n;
  }
  return events;
}

}  // namespace pl::test
