// safetensors: a file whose every byte the test spells out is read correctly (BF16, F16 including a
// subnormal, F32); a sharded index resolves tensors to their shards; corrupt files and indexes are
// refused with one line naming the file (and tensor); the writer pads the header to 8 bytes, rounds
// BF16 to nearest even, shards like huggingface_hub and never leaves a half-written file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/safetensors.h"
#include "numerics/bf16.h"
#include "test_util.h"

namespace pl {
namespace {

using test::expect_one_line_error;
using test::TempDir;

// 8-byte little-endian header length, the header, the data section.
std::string st_bytes(const std::string& header, const std::string& data, uint64_t header_len) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  return out + header + data;
}
std::string st_bytes(const std::string& header, const std::string& data) { return st_bytes(header, data, header.size()); }

// BF16 [2] = {1.0 (0x3F80), -2.0 (0xC000)}; F16 [3] = {0.5 (0x3800), 65504 (0x7BFF, the largest
// half), 2^-24 (0x0001, the smallest subnormal)}; F32 [1, 1] = {3.25 (0x40500000)}.
const std::string kHeader =
    R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
    R"("b":{"dtype":"F16","shape":[3],"data_offsets":[4,10]},)"
    R"("c":{"dtype":"F32","shape":[1,1],"data_offsets":[10,14]},)"
    R"("__metadata__":{"format":"pt"}})";
const std::string kData = std::string("\x80\x3F\x00\xC0", 4) + std::string("\x00\x38\xFF\x7B\x01\x00", 6) +
                          std::string("\x00\x00\x50\x40", 4);

TEST(Safetensors, ReadsAHandWrittenFile) {
  TempDir dir;
  const std::string p = dir.write("t.safetensors", st_bytes(kHeader, kData));
  const SafetensorsFile f(p);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // data-section order
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.info("b").dtype, "F16");
  EXPECT_EQ(f.info("c").shape, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(f.read_float("a"), (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(f.read_float("b"), (std::vector<float>{0.5f, 65504.0f, std::ldexp(1.0f, -24)}));
  EXPECT_EQ(f.read_float("c"), (std::vector<float>{3.25f}));
  EXPECT_EQ(f.bytes("a").size(), 4u);
  EXPECT_EQ(f.bytes("a")[0], 0x80);
  expect_one_line_error([&] { (void)f.read_float("zz"); }, {p, "zz"});
}

TEST(Safetensors, ReadsTensorsListedInAnyHeaderOrderAndEmptyTensors) {
  // The reference reader sorts entries by offset; a zero-sized tensor occupies [4, 4).
  TempDir dir;
  const std::string h = R"({"z":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"y":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  const std::string p = dir.write("t.safetensors", st_bytes(h, std::string("\x00\x00\x80\x3F\x40\x40", 6)));
  const SafetensorsFile f(p);
  EXPECT_EQ(f.read_float("y"), (std::vector<float>{1.0f}));
  EXPECT_EQ(f.read_float("z"), (std::vector<float>{3.0f}));
  EXPECT_TRUE(f.read_float("e").empty());
}

TEST(Safetensors, F16SpecialValues) {
  TempDir dir;
  // -0, +inf, nan, 1 + 2^-10 (0x3C01), -2^-14 (0xC000 is -2; 0x8400 is -2^-14, the smallest normal)
  const std::string h = R"({"h":{"dtype":"F16","shape":[5],"data_offsets":[0,10]}})";
  const std::string p = dir.write("t.safetensors", st_bytes(h, std::string("\x00\x80\x00\x7C\x00\x7E\x01\x3C\x00\x84", 10)));
  const std::vector<float> v = SafetensorsFile(p).read_float("h");
  EXPECT_TRUE(v[0] == 0.0f && std::signbit(v[0]));
  EXPECT_EQ(v[1], std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_EQ(v[3], 1.0f + std::ldexp(1.0f, -10));
  EXPECT_EQ(v[4], -std::ldexp(1.0f, -14));
}

TEST(Safetensors, ReadsAShardedIndex) {
  TempDir dir;
  dir.write("model-00001-of-00002.safetensors",
            st_bytes(R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", std::string("\x80\x3F\x00\x40", 4)));
  dir.write("model-00002-of-00002.safetensors",
            st_bytes(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string("\x00\x00\x50\x40", 4)));
  dir.write("model.safetensors.index.json",
            R"({"metadata": {"total_size": 8}, "weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}})");
  const SafetensorsCheckpoint c(dir.path().string());
  EXPECT_TRUE(c.sharded());
  EXPECT_EQ(c.num_files(), 2u);
  EXPECT_EQ(c.names(), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(c.read_float("x"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(c.read_float("y"), (std::vector<float>{3.25f}));
  EXPECT_EQ(c.data_bytes(), 8u);
  EXPECT_EQ(std::filesystem::path(c.file_of("y").path()).filename(), "model-00002-of-00002.safetensors");
}

void expect_file_refused(const std::string& bytes, const std::vector<std::string>& needles) {
  TempDir dir;
  const std::string p = dir.write("bad.safetensors", bytes);
  std::vector<std::string> n = needles;
  n.push_back(p);
  expect_one_line_error([&] { SafetensorsFile f(p); }, n);
}

TEST(Safetensors, RefusesCorruptFiles) {
  const std::string one = R"({"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})";
  const std::string four(4, '\0');
  {
    SCOPED_TRACE("shorter than the length field");
    expect_file_refused("abc", {"too short"});
  }
  {
    SCOPED_TRACE("header length beyond the file");
    expect_file_refused(st_bytes(one, four, 1000), {"header length 1000", "past the end"});
  }
  {
    SCOPED_TRACE("absurd header length");
    expect_file_refused(st_bytes(one, four, uint64_t{1} << 40), {"exceeds"});
  }
  {
    SCOPED_TRACE("bad JSON");
    expect_file_refused(st_bytes(R"({"w": {"dtype": "BF16",)", four), {"not valid JSON"});
  }
  {
    SCOPED_TRACE("not an object");
    expect_file_refused(st_bytes("[1, 2]", ""), {"JSON object"});
  }
  {
    SCOPED_TRACE("duplicate key");
    expect_file_refused(st_bytes(R"({"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})",
                                 std::string(2, '\0')),
                        {"'w' twice"});
  }
  {
    SCOPED_TRACE("offsets past the end of the data (truncated)");
    expect_file_refused(st_bytes(R"({"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}})", four), {"'w'", "past the end"});
  }
  {
    SCOPED_TRACE("overlapping tensors");
    expect_file_refused(st_bytes(R"({"p":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"q":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
                                 std::string(6, '\0')),
                        {"'q'", "overlap", "'p'"});
  }
  {
    SCOPED_TRACE("gap between tensors");
    expect_file_refused(st_bytes(R"({"p":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"q":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]}})",
                                 std::string(6, '\0')),
                        {"'q'", "gap"});
  }
  {
    SCOPED_TRACE("dtype and shape do not match the offsets");
    expect_file_refused(st_bytes(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,4]}})", four),
                        {"'w'", "needs 6 bytes", "hold 4"});
  }
  {
    SCOPED_TRACE("unknown dtype");
    expect_file_refused(st_bytes(R"({"w":{"dtype":"Q4","shape":[8],"data_offsets":[0,4]}})", four), {"'w'", "'Q4'"});
  }
  {
    SCOPED_TRACE("negative dimension");
    expect_file_refused(st_bytes(R"({"w":{"dtype":"U8","shape":[-4],"data_offsets":[0,4]}})", four), {"'w'", "shape"});
  }
  {
    SCOPED_TRACE("unindexed bytes after the last tensor");
    expect_file_refused(st_bytes(one, four + "xx"), {"2 unindexed bytes"});
  }
  {
    SCOPED_TRACE("metadata that is not string to string");
    expect_file_refused(st_bytes(R"({"__metadata__":{"n":1}})", ""), {"__metadata__", "'n'"});
  }
}

TEST(Safetensors, RefusesNonFloatReadsAndMissingFiles) {
  TempDir dir;
  const std::string p = dir.write("t.safetensors", st_bytes(R"({"i":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0')));
  const SafetensorsFile f(p);
  expect_one_line_error([&] { (void)f.read_float("i"); }, {p, "'i'", "I32"});
  expect_one_line_error([&] { SafetensorsFile g((dir.path() / "nope.safetensors").string()); }, {"nope.safetensors", "no such file"});
  expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"model.safetensors.index.json"});
}

TEST(Safetensors, RefusesInconsistentIndexes) {
  const std::string shard = st_bytes(R"({"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", std::string(2, '\0'));
  {
    SCOPED_TRACE("index names a tensor its shard does not hold");
    TempDir dir;
    dir.write("s1.safetensors", shard);
    dir.write("model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors", "ghost": "s1.safetensors"}})");
    expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"'ghost'", "s1.safetensors", "does not hold"});
  }
  {
    SCOPED_TRACE("shard holds a tensor the index does not list");
    TempDir dir;
    dir.write("s1.safetensors",
              st_bytes(R"({"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"extra":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}})",
                       std::string(4, '\0')));
    dir.write("model.safetensors.index.json", R"({"weight_map": {"x": "s1.safetensors"}})");
    expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"'extra'", "s1.safetensors", "does not list"});
  }
  {
    SCOPED_TRACE("missing shard file");
    TempDir dir;
    dir.write("model.safetensors.index.json", R"({"weight_map": {"x": "gone.safetensors"}})");
    expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"gone.safetensors", "missing"});
  }
  {
    SCOPED_TRACE("shard outside the directory");
    TempDir dir;
    dir.write("model.safetensors.index.json", R"({"weight_map": {"x": "../x.safetensors"}})");
    expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"'x'", "file name"});
  }
  {
    SCOPED_TRACE("index without a weight_map");
    TempDir dir;
    dir.write("model.safetensors.index.json", R"({"metadata": {}})");
    expect_one_line_error([&] { SafetensorsCheckpoint c(dir.path().string()); }, {"weight_map"});
  }
}

TEST(Safetensors, WriterPadsTheHeaderRoundsBf16AndReadsBack) {
  TempDir dir;
  const std::string p = (dir.path() / "w.safetensors").string();
  // 1 + 2^-8 is halfway between two BF16 values: ties to even -> 1.0; 1 + 3*2^-8 -> 1 + 2^-6.
  const std::vector<float> a = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8), -0.1f};
  const std::vector<float> b = {0.1f, 2.0f, 3.0f, 4.0f};
  write_safetensors(p, {{"a", "BF16", {3}, a.data()}, {"b", "F32", {2, 2}, b.data()}});
  const std::string bytes = test::read_text_file(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3 * 2 + 4 * 4);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos) << "padding must be spaces";
  EXPECT_NE(header.find(R"("__metadata__":{"format":"pt"})"), std::string::npos) << header;
  const SafetensorsFile f(p);
  EXPECT_EQ(f.read_float("a"), (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -6), num::round_bf16(-0.1f)}));
  EXPECT_EQ(f.read_float("b"), b);
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST(Safetensors, FailedWriteLeavesNothingBehind) {
  TempDir dir;
  // The final name is taken by a directory: the data is written, the rename fails, the .tmp goes.
  const std::filesystem::path p = dir.path() / "taken.safetensors";
  std::filesystem::create_directory(p);
  const std::vector<float> x = {1.0f, 2.0f};
  expect_one_line_error([&] { write_safetensors(p.string(), {{"x", "F32", {2}, x.data()}}); }, {"taken.safetensors", "rename"});
  EXPECT_FALSE(std::filesystem::exists(p.string() + ".tmp"));
  EXPECT_TRUE(std::filesystem::is_directory(p));
  expect_one_line_error([&] { write_safetensors((dir.path() / "d.safetensors").string(), {{"x", "F64", {2}, x.data()}}); },
                        {"'x'", "F64"});
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "d.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "d.safetensors.tmp"));
}

TEST(Safetensors, ShardPlanFollowsHuggingFaceHub) {
  std::vector<float> buf(64);
  auto t = [&](const char* name, int64_t n) { return SafetensorsTensorOut{name, "F32", {n}, buf.data()}; };
  // limit 40 bytes = 10 floats: [a 4][b 4] | [c 8] | huge alone (appended when met) | [d 2 ...]
  const std::vector<SafetensorsTensorOut> ts = {t("a", 4), t("b", 4), t("c", 8), t("huge", 16), t("d", 2)};
  EXPECT_EQ(plan_safetensors_shards(ts, 40), (std::vector<size_t>{0, 0, 2, 1, 2}));
  EXPECT_EQ(plan_safetensors_shards(ts, 1000), (std::vector<size_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(safetensors_shard_names(1), (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(safetensors_shard_names(2)[1], "model-00002-of-00002.safetensors");
}

TEST(Safetensors, ShardedCheckpointReadsBackAndReplacesAnEarlierExport) {
  TempDir dir;
  const std::string d = (dir.path() / "out").string();
  std::vector<std::vector<float>> data;
  std::vector<SafetensorsTensorOut> ts;
  for (int i = 0; i < 5; ++i) {
    data.emplace_back(100);
    for (int k = 0; k < 100; ++k) data.back()[k] = static_cast<float>(i * 1000 + k) / 7.0f;
  }
  for (int i = 0; i < 5; ++i) ts.push_back({fmt::format("t{}", i), "BF16", {10, 10}, data[i].data()});
  // 200 bytes each, limit 450: shards {t0, t1}, {t2, t3}, {t4}.
  const std::vector<std::string> files = write_safetensors_checkpoint(d, ts, 450);
  EXPECT_EQ(files, (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                             "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  const std::string index = test::read_text_file(d + "/model.safetensors.index.json");
  EXPECT_NE(index.find(R"("total_size": 1000)"), std::string::npos) << index;
  {
    const SafetensorsCheckpoint c(d);
    EXPECT_TRUE(c.sharded());
    EXPECT_EQ(c.num_files(), 3u);
    for (int i = 0; i < 5; ++i) {
      const std::vector<float> back = c.read_float(fmt::format("t{}", i));
      for (int k = 0; k < 100; ++k) ASSERT_EQ(back[k], num::round_bf16(data[i][k]));
    }
    EXPECT_EQ(std::filesystem::path(c.file_of("t4").path()).filename(), "model-00003-of-00003.safetensors");
  }
  // A later single-file export into the same directory removes the shards and the index.
  write_safetensors_checkpoint(d, ts, 1'000'000);
  EXPECT_TRUE(std::filesystem::exists(d + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(d + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(d + "/model-00001-of-00003.safetensors"));
  EXPECT_FALSE(SafetensorsCheckpoint(d).sharded());
}

}  // namespace
}  // namespace pl
