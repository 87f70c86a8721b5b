// .npy reading and writing: round trips of every supported dtype, the exact header numpy writes
// (64-byte alignment, trailing comma of 1-D shapes), tolerant reading of other valid headers
// (version 2.0, double quotes, no trailing comma), every error as one line naming the file, and
// atomic writes that leave nothing behind on failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io/npy.h"
#include "test_util.h"

namespace pl {
namespace {

using test::TempDir;

std::string str_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// A version 1.0 file with the given header dict text (padded like numpy) and raw data.
std::string npy_file(const std::string& dict, const std::string& data, int major = 1, int minor = 0) {
  std::string header = dict;
  const size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string f = "\x93NUMPY";
  f += static_cast<char>(major);
  f += static_cast<char>(minor);
  const size_t n = header.size();
  f += static_cast<char>(n & 0xFF);
  f += static_cast<char>((n >> 8) & 0xFF);
  if (major != 1) {
    f += static_cast<char>((n >> 16) & 0xFF);
    f += static_cast<char>((n >> 24) & 0xFF);
  }
  return f + header + data;
}

std::string zeros(size_t n) { return std::string(n, '\0'); }

void expect_read_error(const std::string& path, const std::vector<std::string>& needles) {
  std::vector<std::string> all = needles;
  all.push_back(path);
  test::expect_one_line_error([&] { read_npy(path); }, all);
}

TEST(NpyIo, RoundTripF32TwoD) {
  TempDir dir;
  const std::string p = (dir.path() / "a.npy").string();
  std::vector<float> v(6);
  for (int i = 0; i < 6; ++i) v[i] = 0.5f * static_cast<float>(i) - 1.25f;
  write_npy(p, "<f4", {2, 3}, v.data(), v.size() * sizeof(float));
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.dtype, "<f4");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.numel(), 6);
  ASSERT_EQ(a.bytes.size(), 24u);
  EXPECT_EQ(std::memcmp(a.bytes.data(), v.data(), 24), 0);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST(NpyIo, RoundTripU2OneD) {
  TempDir dir;
  const std::string p = (dir.path() / "b.npy").string();
  const std::vector<uint16_t> v = {0x3F80, 0xBF80, 0x7FFF, 0x0001, 0xFFFF};
  write_npy(p, "<u2", {5}, v.data(), v.size() * 2);
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.dtype, "<u2");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{5}));
  ASSERT_EQ(a.bytes.size(), 10u);
  EXPECT_EQ(std::memcmp(a.bytes.data(), v.data(), 10), 0);
}

TEST(NpyIo, RoundTripU1AndEmpty) {
  TempDir dir;
  const std::string p = (dir.path() / "c.npy").string();
  std::vector<uint8_t> v(3 * 7);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 37);
  write_npy(p, "|u1", {3, 7}, v.data(), v.size());
  NpyArray a = read_npy(p);
  EXPECT_EQ(a.dtype, "|u1");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(a.bytes, v);

  write_npy(p, "<f4", {0}, nullptr, 0);
  a = read_npy(p);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{0}));
  EXPECT_TRUE(a.bytes.empty());
}

// The header is byte-for-byte what numpy.save writes (format 1.0).
TEST(NpyIo, HeaderMatchesNumpy) {
  const float x[6] = {};
  const std::vector<uint8_t> f = encode_npy("<f4", {2, 3}, x, sizeof x);
  std::string expect_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  std::string header = expect_dict + std::string(128 - 10 - expect_dict.size() - 1, ' ') + "\n";
  ASSERT_EQ(f.size(), 128u + 24u);
  EXPECT_EQ(str_of(f).substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(f[6], 1);
  EXPECT_EQ(f[7], 0);
  EXPECT_EQ(f[8] | (f[9] << 8), 118);
  EXPECT_EQ(str_of(f).substr(10, 118), header);

  const uint8_t b[5] = {};
  const std::string one_d = str_of(encode_npy("|u1", {5}, b, 5));
  EXPECT_NE(one_d.find("'shape': (5,), }"), std::string::npos);
  EXPECT_NE(one_d.find("'descr': '|u1'"), std::string::npos);
  EXPECT_EQ((one_d.size() - 5) % 64, 0u);
  EXPECT_EQ(one_d[one_d.size() - 6], '\n');
}

// Every header length lands the data on a multiple of 64 with a newline just before it.
TEST(NpyIo, HeaderAlwaysAligned) {
  for (int64_t rows : {1LL, 9LL, 99LL, 12345LL, 1234567890123LL}) {
    const std::vector<uint8_t> f = encode_npy("<u2", {rows, 0}, nullptr, 0);
    EXPECT_EQ(f.size() % 64, 0u) << rows;
    EXPECT_EQ(f.back(), '\n') << rows;
    EXPECT_EQ(static_cast<size_t>(f[8] | (f[9] << 8)) + 10, f.size()) << rows;
  }
}

TEST(NpyIo, ReadsOtherValidHeaders) {
  TempDir dir;
  const std::string data = std::string("\x01\x00\x02\x00\x03\x00\x04\x00", 8);
  // Version 2.0, double quotes, no trailing comma, key order changed, '<u1' spelled out.
  const std::string v2 = dir.write(
      "v2.npy", npy_file("{\"shape\": (2,2), \"fortran_order\": False, \"descr\": \"<u2\"}", data, 2, 0));
  NpyArray a = read_npy(v2);
  EXPECT_EQ(a.dtype, "<u2");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(str_of(a.bytes), data);

  const std::string u1 =
      dir.write("u1.npy", npy_file("{'descr': '<u1', 'fortran_order': False, 'shape': (8,), }", data));
  a = read_npy(u1);
  EXPECT_EQ(a.dtype, "|u1");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{8}));
}

TEST(NpyIo, ErrorMissingFile) {
  TempDir dir;
  expect_read_error((dir.path() / "nope.npy").string(), {"no such file"});
}

TEST(NpyIo, ErrorBadMagic) {
  TempDir dir;
  expect_read_error(dir.write("m.npy", "PK\x03\x04 this is a zip"), {"bad magic"});
  expect_read_error(dir.write("short.npy", "\x93NU"), {"bad magic"});
}

TEST(NpyIo, ErrorUnsupportedVersion) {
  TempDir dir;
  expect_read_error(dir.write("v3.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                                                 zeros(4), 3, 0)),
                    {"version 3.0"});
}

TEST(NpyIo, ErrorFortranOrder) {
  TempDir dir;
  expect_read_error(
      dir.write("f.npy", npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", zeros(16))),
      {"fortran_order"});
}

TEST(NpyIo, ErrorUnsupportedDtype) {
  TempDir dir;
  expect_read_error(
      dir.write("d.npy", npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", zeros(16))),
      {"unsupported dtype", "'<f8'"});
  expect_read_error(
      dir.write("i.npy", npy_file("{'descr': '<i2', 'fortran_order': False, 'shape': (2,), }", zeros(4))),
      {"unsupported dtype", "'<i2'"});
}

TEST(NpyIo, ErrorBigEndian) {
  TempDir dir;
  expect_read_error(
      dir.write("be.npy", npy_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", zeros(8))),
      {"big-endian", "'>f4'"});
  expect_read_error(
      dir.write("be2.npy", npy_file("{'descr': '>u2', 'fortran_order': False, 'shape': (2,), }", zeros(4))),
      {"big-endian", "'>u2'"});
}

TEST(NpyIo, ErrorTruncatedData) {
  TempDir dir;
  expect_read_error(
      dir.write("t.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 4), }", zeros(60))),
      {"truncated", "64", "60"});
}

TEST(NpyIo, ErrorTruncatedHeader) {
  TempDir dir;
  const std::string full = npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }", zeros(16));
  expect_read_error(dir.write("th.npy", full.substr(0, 40)), {"truncated"});
}

TEST(NpyIo, ErrorExtraData) {
  TempDir dir;
  expect_read_error(
      dir.write("x.npy", npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (3,), }", zeros(8))),
      {"mismatch", "6", "8"});
}

TEST(NpyIo, ErrorThreeD) {
  TempDir dir;
  expect_read_error(
      dir.write("3d.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2), }", zeros(32))),
      {"3-D", "(2, 2, 2)"});
}

TEST(NpyIo, ErrorZeroD) {
  TempDir dir;
  expect_read_error(
      dir.write("0d.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", zeros(4))), {"0-D"});
}

TEST(NpyIo, ErrorMalformedHeader) {
  TempDir dir;
  expect_read_error(dir.write("h.npy", npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': [2], }", zeros(8))),
                    {"malformed"});
  expect_read_error(dir.write("k.npy", npy_file("{'descr': '<f4', 'shape': (2,), }", zeros(8))),
                    {"malformed", "fortran_order"});
}

TEST(NpyIo, WriteIsAtomic) {
  TempDir dir;
  const std::string p = (dir.path() / "w.npy").string();
  const uint8_t old[2] = {1, 2};
  write_npy(p, "|u1", {2}, old, 2);
  // A size mismatch fails before anything is touched: the old file is intact, no .tmp.
  const float x[3] = {};
  test::expect_one_line_error([&] { write_npy(p, "<f4", {4}, x, sizeof x); }, {"needs 16 bytes", "12"});
  EXPECT_EQ(read_npy(p).bytes, (std::vector<uint8_t>{1, 2}));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
  test::expect_one_line_error([&] { write_npy(p, "<f8", {3}, x, sizeof x); }, {"unsupported dtype", "<f8"});
  // An unwritable destination: one line naming the path, nothing created.
  const std::string bad = (dir.path() / "no_such_dir" / "w.npy").string();
  test::expect_one_line_error([&] { write_npy(bad, "<f4", {3}, x, sizeof x); }, {bad});
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "no_such_dir"));
  // A successful overwrite replaces the file and leaves no .tmp.
  write_npy(p, "<f4", {3}, x, sizeof x);
  EXPECT_EQ(read_npy(p).dtype, "<f4");
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++files;
  EXPECT_EQ(files, 1u);
}

}  // namespace
}  // namespace pl
