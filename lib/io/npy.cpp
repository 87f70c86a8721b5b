#include "io/npy.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"

namespace pl {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;

std::string shape_tuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// A minimal parser of the header: a Python dict literal with string keys and values that are
// strings, True/False or tuples of non-negative integers (all numpy ever writes there).
class HeaderParser {
 public:
  HeaderParser(const std::string& path, const std::string& text) : path_(path), s_(text) {}

  struct Value {
    enum Kind { Str, Bool, Tuple } kind = Str;
    std::string str;
    bool b = false;
    std::vector<int64_t> tuple;
  };

  // Calls on_item(key, value) for each entry.
  template <class F>
  void parse(F&& on_item) {
    skip_ws();
    expect('{');
    parse_list('}', "expected ',' or '}'", [&] {
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      const Value v = parse_value();
      on_item(key, v);
    });
    skip_ws();
    if (i_ != s_.size()) bad("unexpected text after the dict");
  }

 private:
  // The items of a dict or tuple up to `close` (after its opening character), separated by commas, a
  // trailing comma allowed; `item` reads one item.
  template <class F>
  void parse_list(char close, const char* expected, F&& item) {
    for (;;) {
      skip_ws();
      if (peek() == close) break;
      item();
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != close) bad(expected);
    }
    ++i_;
  }
  [[noreturn]] void bad(const char* what) const {
    fail("{}: malformed .npy header ({} at character {}): {}", path_, what, i_, printable());
  }
  std::string printable() const {
    std::string out;
    for (char c : s_) out += (c == '\n' || c == '\r' || !std::isprint(static_cast<unsigned char>(c))) ? ' ' : c;
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out;
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    if (peek() != c) bad(fmt::format("expected '{}'", c).c_str());
    ++i_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    ++i_;
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) out += s_[i_++];
    if (i_ >= s_.size()) bad("unterminated string");
    ++i_;
    return out;
  }
  Value parse_value() {
    Value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::Str;
      v.str = parse_string();
    } else if (s_.compare(i_, 4, "True") == 0 || s_.compare(i_, 5, "False") == 0) {
      v.kind = Value::Bool;
      v.b = c == 'T';
      i_ += v.b ? 4 : 5;
    } else if (c == '(') {
      v.kind = Value::Tuple;
      ++i_;
      parse_list(')', "expected ',' or ')' in the shape", [&] {
        if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("expected a dimension");
        int64_t d = 0;
        while (std::isdigit(static_cast<unsigned char>(peek()))) {
          const int digit = peek() - '0';
          if (d > (std::numeric_limits<int64_t>::max() - digit) / 10) bad("dimension too large");
          d = d * 10 + digit;
          ++i_;
        }
        if (peek() == 'L') ++i_;  // Python 2 longs
        v.tuple.push_back(d);
      });
    } else {
      bad("unsupported value");
    }
    return v;
  }

  const std::string& path_;
  const std::string& s_;
  size_t i_ = 0;
};

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// What a .npy file's header says: the dict's three entries and where the data starts.
struct NpyHeader {
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  size_t data_start = 0;
};

// The magic, the version and the header dict of the whole file `file` (each entry present, of its type).
NpyHeader parse_npy_header(const std::string& path, const std::vector<uint8_t>& file) {
  if (file.size() < kMagicLen + 2 || std::memcmp(file.data(), kMagic, kMagicLen) != 0)
    fail("{}: not a .npy file (bad magic; expected \\x93NUMPY)", path);
  const int major = file[6], minor = file[7];
  if ((major != 1 && major != 2) || minor != 0)
    fail("{}: unsupported .npy format version {}.{} (supported: 1.0, 2.0)", path, major, minor);
  // The header length: 2 bytes in version 1.0, 4 in 2.0 (little-endian).
  const size_t header_start = major == 1 ? 10 : 12;
  if (file.size() < header_start) fail("{}: truncated .npy header", path);
  const size_t header_len =
      major == 1 ? static_cast<size_t>(file[8]) | static_cast<size_t>(file[9]) << 8 : le32(file.data() + 8);
  if (file.size() < header_start + header_len)
    fail("{}: truncated .npy header ({} header bytes announced, {} present)", path, header_len,
         file.size() - header_start);
  const std::string text(reinterpret_cast<const char*>(file.data() + header_start), header_len);

  NpyHeader h;
  h.data_start = header_start + header_len;
  std::set<std::string> seen;
  HeaderParser(path, text).parse([&](const std::string& key, const HeaderParser::Value& v) {
    if (key == "descr") {
      if (v.kind != HeaderParser::Value::Str) fail("{}: malformed .npy header: 'descr' is not a string", path);
      h.descr = v.str;
    } else if (key == "fortran_order") {
      if (v.kind != HeaderParser::Value::Bool)
        fail("{}: malformed .npy header: 'fortran_order' is not True/False", path);
      h.fortran = v.b;
    } else if (key == "shape") {
      if (v.kind != HeaderParser::Value::Tuple) fail("{}: malformed .npy header: 'shape' is not a tuple", path);
      h.shape = v.tuple;
    }
    seen.insert(key);
  });
  for (const char* key : {"descr", "fortran_order", "shape"})
    if (!seen.count(key)) fail("{}: malformed .npy header: missing '{}'", path, key);
  return h;
}

}  // namespace

size_t NpyArray::npy_itemsize(const std::string& dtype) {
  for (const auto& [name, size] : {std::pair{"<f4", 4}, {"<u2", 2}, {"<i4", 4}, {"<i8", 8}, {"|u1", 1}})
    if (dtype == name) return size;
  return 0;
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("{}: no such file", path);
  if (std::filesystem::is_directory(path, ec)) fail("{}: is a directory, not a .npy file", path);
  // (io/file_checks.h: a FIFO or a device is one line, not a hang)
  const std::vector<uint8_t> file = read_regular_file_bytes(path);
  const NpyHeader h = parse_npy_header(path, file);
  const std::string& descr = h.descr;

  // dtype: little-endian f4/u2/i4/i8 and single-byte u1 only.
  NpyArray a;
  a.dtype = descr == "<u1" || descr == "=u1" || descr == ">u1" ? "|u1" : descr;
  if (NpyArray::npy_itemsize(a.dtype) == 0) {
    if (descr.size() >= 2 && descr[0] == '>' && descr != ">u1")
      fail("{}: big-endian dtype '{}' is not supported (only little-endian '<f4', '<u2', '<i4', '<i8', '|u1')", path, descr);
    fail("{}: unsupported dtype '{}' (supported: '<f4' float32, '<u2' uint16/BF16 bits, '<i4' int32, '<i8' int64, '|u1' uint8)", path,
         descr);
  }
  a.shape = h.shape;
  if (h.fortran) fail("{}: fortran_order True is not supported (save a C-order array: np.ascontiguousarray)", path);
  if (a.shape.empty()) fail("{}: 0-D (scalar) arrays are not supported (need 1-D or 2-D)", path);
  if (a.shape.size() > 2)
    fail("{}: {}-D array of shape {} is not supported (need 1-D or 2-D)", path, a.shape.size(), shape_tuple(a.shape));

  uint64_t need = a.itemsize();
  for (int64_t d : a.shape) {
    if (d != 0 && need > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d))
      fail("{}: shape {} is too large", path, shape_tuple(a.shape));
    need *= static_cast<uint64_t>(d);
  }
  const uint64_t have = file.size() - h.data_start;
  if (have < need)
    fail("{}: truncated data: shape {} of '{}' needs {} bytes, the file has {}", path, shape_tuple(a.shape), descr,
         need, have);
  if (have > need)
    fail("{}: shape/data size mismatch: shape {} of '{}' needs {} bytes, the file has {} (extra bytes after the array)",
         path, shape_tuple(a.shape), descr, need, have);
  a.bytes.assign(file.begin() + static_cast<std::ptrdiff_t>(h.data_start), file.end());
  return a;
}

std::vector<uint8_t> encode_npy(const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
                                size_t bytes) {
  const size_t item = NpyArray::npy_itemsize(dtype);
  PL_CHECK(item != 0, "write_npy: unsupported dtype '{}' (supported: '<f4', '<u2', '<i4', '<i8', '|u1')", dtype);
  PL_CHECK(!shape.empty(), "write_npy: 0-D arrays are not supported");
  uint64_t need = item;
  for (int64_t d : shape) {
    PL_CHECK(d >= 0, "write_npy: negative dimension in shape {}", shape_tuple(shape));
    need *= static_cast<uint64_t>(d);
  }
  PL_CHECK(need == bytes, "write_npy: shape {} of '{}' needs {} bytes, got {}", shape_tuple(shape), dtype, need, bytes);

  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", dtype, shape_tuple(shape));
  const size_t prefix = kMagicLen + 2 + 2;  // magic, version, 2-byte header length
  const size_t total = (prefix + header.size() + 1 + kAlign - 1) / kAlign * kAlign;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  PL_CHECK(header.size() <= 0xFFFF, "write_npy: header of {} bytes is too long for format 1.0", header.size());

  std::vector<uint8_t> out(prefix + header.size() + bytes);
  uint8_t* o = out.data();
  std::memcpy(o, kMagic, kMagicLen);
  o[6] = 1;  // version 1.0
  o[7] = 0;
  o[8] = static_cast<uint8_t>(header.size() & 0xFF);
  o[9] = static_cast<uint8_t>(header.size() >> 8);
  std::memcpy(o + prefix, header.data(), header.size());
  if (bytes > 0) std::memcpy(o + prefix + header.size(), data, bytes);
  return out;
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes) {
  const std::vector<uint8_t> file = encode_npy(dtype, shape, data, bytes);
  write_file_atomically(path, std::string_view(reinterpret_cast<const char*>(file.data()), file.size()));
}

}  // namespace pl
