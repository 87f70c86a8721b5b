// The machine probe (roofline/machine_ceilings.h) on the CPU: finite positive roofs for every GEMM format
// and memory level, the cache reused without measuring, a bad, foreign or unwritable cache answered with
// one line, a file that is not a cache never replaced, level_for, the sweep and level plans, the datasheet table and the JSON round trip.
// Tests never judge speed: only that what was measured is a finite positive number.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "roofline/machine_ceilings.h"
#include "roofline/probe_internal.h"

namespace pl::roofline {
namespace {

namespace fs = std::filesystem;

OpContext cpu() { return OpContext{}; }

// llama_tiny's GEMMs for a micro-batch of 64 tokens (h 256, ffn 256, 8 heads of 32, 2 kv groups,
// vocab 128): qkv [64, 384, 256], fc1 [64, 512, 256] and the LM head [64, 128, 256], fprop only.
std::vector<GemmShape> tiny_shapes() { return {{64, 384, 256}, {64, 512, 256}, {64, 128, 256}, {64, 384, 256}}; }

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("pl_machine_ceilings_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Lines of `out` that judge a cache (the probe's own progress lines start with "probe:").
int cache_lines(const std::vector<std::string>& out) {
  int n = 0;
  for (const std::string& l : out) n += l.rfind("machine ceilings", 0) == 0 ? 1 : 0;
  return n;
}

void expect_finite_positive_roofs(const MachineCeilings& c) {
  for (const char* f : {"bf16", "fp8", "mxfp8", "nvfp4"}) {
    const GemmCeiling* g = c.gemm_for(f);
    ASSERT_NE(g, nullptr) << f;
    EXPECT_TRUE(std::isfinite(g->tflops) && g->tflops > 0.0) << f << " " << g->tflops;
    EXPECT_GT(g->best_shape.m * g->best_shape.n * g->best_shape.k, 0) << f;
    EXPECT_EQ(g->datasheet_tflops, 0.0) << "a CPU has no datasheet peak";
    // The emulated formats also give the whole op's rate, expansion included: slower than the GEMM alone.
    if (std::string(f) != "bf16") {
      EXPECT_TRUE(g->path_tflops > 0.0 && g->path_tflops <= g->tflops) << f;
    }
  }
  ASSERT_GE(c.memory.size(), 2u);  // at least one cache level and DRAM
  for (size_t i = 0; i < c.memory.size(); ++i) {
    EXPECT_TRUE(std::isfinite(c.memory[i].gbps) && c.memory[i].gbps > 0.0) << c.memory[i].level;
    if (i + 1 < c.memory.size()) {
      EXPECT_GT(c.memory[i].capacity_bytes, 0.0) << c.memory[i].level;
      if (i > 0) {
        EXPECT_GT(c.memory[i].capacity_bytes, c.memory[i - 1].capacity_bytes) << c.memory[i].level;
      }
    }
  }
  EXPECT_EQ(c.memory.back().level, "DRAM");
  EXPECT_EQ(c.memory.back().capacity_bytes, 0.0);
}

// A measured-looking result without measuring: for the cache tests that only need a valid file.
MachineCeilings fake_ceilings(const MachineCeilings& identity) {
  MachineCeilings c = identity;
  for (const char* f : {"bf16", "fp8", "mxfp8", "nvfp4"}) c.gemm.push_back({f, "test", 1.5, {8, 16, 32}, 0.0, 1.0});
  c.memory = {{"L2", 2097152.0, 100.0}, {"L3", 33554432.0, 50.0}, {"DRAM", 0.0, 10.0}};
  return c;
}

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(MachineCeilings, ProbeGivesFinitePositiveRoofsAndTheCacheIsReusedWithoutMeasuring) {
  TempDir dir;
  const std::string path = (dir.path / "sub" / "ceilings.json").string();  // the directory is created
  std::vector<std::string> out;
  const int64_t before = probes_measured();
  const MachineCeilings first = load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before + 1);
  expect_finite_positive_roofs(first);
  EXPECT_EQ(cache_lines(out), 0) << "no cache yet: nothing to refuse";
  EXPECT_GE(out.size(), 4u + first.memory.size()) << "one progress line per roof";
  EXPECT_TRUE(first.same_identity(machine_identity(cpu())));
  EXPECT_GT(first.threads, 0);
  EXPECT_FALSE(first.name.empty());
  ASSERT_TRUE(fs::exists(path));

  out.clear();
  const MachineCeilings second = load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before + 1) << "the cache was measured again";
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(to_json(second), to_json(first));
  const std::vector<std::string> lines = ceilings_lines(second);
  ASSERT_EQ(lines.size(), 1 + second.gemm.size() + second.memory.size());
  EXPECT_EQ(lines[0].rfind("machine: cpu | ", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("gemm bf16  : ", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find("GFLOP/s measured (best at "), std::string::npos) << lines[1];
  EXPECT_EQ(lines.back().rfind("memory DRAM : ", 0), 0u) << lines.back();
}

// A cache of this program's (its field "pretrain_llama_machine_ceilings") with a bad field is measured again
// with one line and replaced; a file that is not one (not JSON, or JSON without that field) is never
// replaced: an error naming the file, nothing measured, the file byte-identical (issue 38).
TEST(MachineCeilings, ABadCacheIsMeasuredAgainAndAForeignFileIsNeverReplaced) {
  TempDir dir;
  const std::string path = (dir.path / "ceilings.json").string();
  for (const std::string& text : {std::string("{not json"), std::string(R"({"name": "a model config"})")}) {
    write_text(path, text);
    const int64_t before = probes_measured();
    try {
      load_or_probe(cpu(), path, tiny_shapes(), {});
      ADD_FAILURE() << "replaced: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path + ": not a machine ceilings cache of this program"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(probes_measured(), before);
    EXPECT_EQ(read_file(path), text);
  }
  write_text(path, R"({"pretrain_llama_machine_ceilings": 1})");
  std::vector<std::string> out;
  const int64_t before = probes_measured();
  load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before + 1);
  ASSERT_EQ(cache_lines(out), 1);
  EXPECT_EQ(out[0].rfind("machine ceilings cache " + path + " is unreadable (", 0), 0u) << out[0];
  EXPECT_NE(out[0].find("); measuring again"), std::string::npos) << out[0];
  // Replaced with the new measurement, which the next run reuses.
  EXPECT_TRUE(ceilings_from_json(nlohmann::json::parse(std::ifstream(path))).same_identity(machine_identity(cpu())));
  // A cache of this machine with a rate no machine has (1e-300 TFLOP/s) is measured again, not used.
  MachineCeilings absurd = fake_ceilings(machine_identity(cpu()));
  absurd.gemm[0].tflops = 1e-300;
  write_text(path, to_json(absurd).dump());
  out.clear();
  load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before + 2);
  ASSERT_EQ(cache_lines(out), 1);
  EXPECT_NE(out[0].find("a GEMM's tflops = 1e-300 is outside [1e-06, 100000]"), std::string::npos) << out[0];
}

TEST(MachineCeilings, ForeignCacheIsMeasuredAgainWithOneLineNamingTheField) {
  TempDir dir;
  const std::string path = (dir.path / "ceilings.json").string();
  MachineCeilings foreign = fake_ceilings(machine_identity(cpu()));
  const std::string now = foreign.name;
  foreign.name = "Some Other CPU";
  write_text(path, to_json(foreign).dump());
  std::vector<std::string> out;
  const int64_t before = probes_measured();
  const MachineCeilings c = load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before + 1);
  ASSERT_EQ(cache_lines(out), 1);
  EXPECT_EQ(out[0], "machine ceilings cache " + path + " was measured for name: Some Other CPU (this run: " + now +
                        "); measuring again");
  EXPECT_EQ(c.name, now);
}

TEST(MachineCeilings, SameMachineCacheIsReusedAndAnotherProbeVersionIsForeign) {
  TempDir dir;
  const std::string path = (dir.path / "ceilings.json").string();
  MachineCeilings cached = fake_ceilings(machine_identity(cpu()));
  write_text(path, to_json(cached).dump());
  const int64_t before = probes_measured();
  std::vector<std::string> out;
  const MachineCeilings c = load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(probes_measured(), before);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(c.gemm_for("nvfp4")->tflops, 1.5);
  // Another probe version is another identity.
  cached.probe_version = kProbeVersion + 1;
  EXPECT_FALSE(cached.same_identity(machine_identity(cpu())));
}

// bench_kernels' two calls: the cache read without measuring (this machine's: true; another's, or none: false,
// with the line load_or_probe would print, or ""), and the last level's bandwidth measured alone.
TEST(MachineCeilings, ReadCachedCeilingsOnlyReadsAndTheBandwidthProbeMeasuresTheLastLevel) {
  TempDir dir;
  const std::string path = (dir.path / "ceilings.json").string();
  MachineCeilings got;
  std::string why = "stale";
  const int64_t before = probes_measured();
  EXPECT_FALSE(read_cached_ceilings(cpu(), path, got, &why));
  EXPECT_EQ(why, "");
  EXPECT_FALSE(read_cached_ceilings(cpu(), "", got, &why));
  MachineCeilings cached = fake_ceilings(machine_identity(cpu()));
  write_text(path, to_json(cached).dump());
  ASSERT_TRUE(read_cached_ceilings(cpu(), path, got, &why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_EQ(got.memory.back().level, "DRAM");
  EXPECT_EQ(got.memory.back().gbps, 10.0);
  cached.name = "Some Other CPU";
  write_text(path, to_json(cached).dump());
  EXPECT_FALSE(read_cached_ceilings(cpu(), path, got, &why));
  EXPECT_NE(why.find("was measured for name: Some Other CPU"), std::string::npos) << why;
  EXPECT_EQ(probes_measured(), before);
  EXPECT_EQ(read_file(path), to_json(cached).dump());  // never rewritten
  std::vector<std::string> out;
  const MemoryCeiling m = probe_memory_bandwidth(cpu(), [&](const std::string& l) { out.push_back(l); });
  EXPECT_EQ(m.level, "DRAM");
  EXPECT_EQ(m.capacity_bytes, 0.0);
  EXPECT_TRUE(std::isfinite(m.gbps) && m.gbps > 0.0) << m.gbps;
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].rfind("probe: memory DRAM ", 0), 0u) << out[0];
}

TEST(MachineCeilings, UnwritableCacheIsOneLineAndTheCeilingsStillCome) {
  TempDir dir;
  write_text(dir.path / "a_file", "x");
  const std::string path = (dir.path / "a_file" / "ceilings.json").string();  // its "directory" is a file
  std::vector<std::string> out;
  const MachineCeilings c = load_or_probe(cpu(), path, tiny_shapes(), [&](const std::string& l) { out.push_back(l); });
  ASSERT_EQ(cache_lines(out), 1);
  EXPECT_EQ(out.back().rfind("machine ceilings not cached (", 0), 0u) << out.back();
  EXPECT_NE(c.gemm_for("bf16"), nullptr);
}

TEST(MachineCeilings, LevelForPicksTheSmallestLevelThatHolds) {
  const MachineCeilings c = fake_ceilings(machine_identity(cpu()));
  EXPECT_EQ(c.level_for(0.0).level, "L2");
  EXPECT_EQ(c.level_for(2097152.0).level, "L2");
  EXPECT_EQ(c.level_for(2097153.0).level, "L3");
  EXPECT_EQ(c.level_for(33554432.0).level, "L3");
  EXPECT_EQ(c.level_for(1e12).level, "DRAM");
  EXPECT_EQ(c.gemm_for("fp4"), nullptr);
  EXPECT_EQ(c.gemm_for("mxfp8")->format, "mxfp8");
}

TEST(MachineCeilings, JsonRoundTripAndOneLineErrors) {
  MachineCeilings c = fake_ceilings(machine_identity(cpu()));
  c.driver = "550.54.15";
  c.gemm[0].datasheet_tflops = 989.4;
  c.gemm[2].best_shape = {512, 32000, 256};
  const nlohmann::json j = to_json(c);
  EXPECT_EQ(j.at("pretrain_llama_machine_ceilings"), 1);
  const MachineCeilings back = ceilings_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(to_json(back), j);
  EXPECT_TRUE(back.same_identity(c));
  EXPECT_EQ(back.gemm[2].best_shape, (GemmShape{512, 32000, 256}));

  nlohmann::json bad = j;
  bad["machine"].erase("threads");
  EXPECT_THROW(ceilings_from_json(bad), Error);
  try {
    ceilings_from_json(bad);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("threads"), std::string::npos) << e.what();
  }
  bad = j;
  bad["memory"][0]["gbps"] = -1.0;
  EXPECT_THROW(ceilings_from_json(bad), Error);
  for (const double absurd : {1e-300, 1e300}) {
    bad = j;
    bad["memory"][0]["gbps"] = absurd;
    EXPECT_THROW(ceilings_from_json(bad), Error);
    bad = j;
    bad["gemm"][1]["tflops"] = absurd;
    EXPECT_THROW(ceilings_from_json(bad), Error);
  }
  bad = j;
  bad["pretrain_llama_machine_ceilings"] = 2;
  EXPECT_THROW(ceilings_from_json(bad), Error);
}

TEST(MachineCeilings, DatasheetDensePeaks) {
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA H100 80GB HBM3", "bf16"), 989.4);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA H100 80GB HBM3", "fp8"), 1978.9);
  EXPECT_EQ(datasheet_dense_tflops("NVIDIA H100 80GB HBM3", "mxfp8"), 0.0);  // Hopper: no MXFP8 tensor cores
  EXPECT_EQ(datasheet_dense_tflops("NVIDIA H100 80GB HBM3", "nvfp4"), 0.0);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA H100 PCIe", "bf16"), 756.5);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA H200", "fp8"), 1978.9);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA B200", "nvfp4"), 9000.0);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA GB200", "nvfp4"), 10000.0);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA GB300", "nvfp4"), 15000.0);
  EXPECT_DOUBLE_EQ(datasheet_dense_tflops("NVIDIA GeForce RTX 5090", "bf16"), 419.2);
  EXPECT_EQ(datasheet_dense_tflops("NVIDIA A100-SXM4-80GB", "bf16"), 0.0);  // unknown GPU
  EXPECT_EQ(datasheet_dense_tflops("NVIDIA H100 80GB HBM3", "fp16"), 0.0);  // unknown format
}

TEST(MachineCeilings, SweepKeepsTheLargestDistinctShapes) {
  const std::vector<GemmShape> cpu_sweep = detail::sweep_shapes(Device::CPU, tiny_shapes());
  ASSERT_EQ(cpu_sweep.size(), 6u);  // 3 squares + 3 distinct model shapes
  EXPECT_EQ(cpu_sweep[0], (GemmShape{1024, 1024, 1024}));
  std::vector<GemmShape> many;
  for (int64_t i = 1; i <= 20; ++i) many.push_back({64 * i, 256, 256});
  many.push_back({0, 256, 256});  // empty: dropped
  const std::vector<GemmShape> capped = detail::sweep_shapes(Device::CUDA, many);
  ASSERT_EQ(capped.size(), kProbeMaxShapes);
  for (size_t i = 1; i < capped.size(); ++i)
    EXPECT_GE(capped[i - 1].m * capped[i - 1].n * capped[i - 1].k, capped[i].m * capped[i].n * capped[i].k);
  EXPECT_EQ(capped[0], (GemmShape{8192, 8192, 8192}));
  // The CPU never measures a side above kCpuProbeMaxSide: the 8B defaults' LM head (16384 x 128256 x 4096) and
  // MLP shapes are capped before anything is allocated.
  const std::vector<GemmShape> eight_b = {{16384, 128256, 4096}, {16384, 14336, 4096}, {16384, 4096, 14336}};
  const std::vector<GemmShape> cpu_capped = detail::sweep_shapes(Device::CPU, eight_b);
  EXPECT_EQ(cpu_capped[0], (GemmShape{kCpuProbeMaxSide, kCpuProbeMaxSide, kCpuProbeMaxSide}));
  for (const GemmShape& g : cpu_capped) EXPECT_LE(std::max({g.m, g.n, g.k}), kCpuProbeMaxSide);
}

TEST(MachineCeilings, MemoryLevelsAscendAndAreSizedForTheLevel) {
  DeviceIdentity id;
  id.threads = 2;
  id.l2_bytes = 1048576.0;
  id.l3_bytes = 33554432.0;
  const std::vector<detail::LevelPlan> cpu_levels = detail::memory_levels(Device::CPU, id);
  ASSERT_EQ(cpu_levels.size(), 3u);
  EXPECT_EQ(cpu_levels[0].level, "L2");
  EXPECT_EQ(cpu_levels[0].capacity_bytes, 2097152.0);
  EXPECT_EQ(cpu_levels[0].array_bytes, 1048576.0);
  EXPECT_EQ(cpu_levels[1].capacity_bytes, 33554432.0);
  EXPECT_EQ(cpu_levels[2].level, "DRAM");
  EXPECT_EQ(cpu_levels[2].array_bytes, 4.0 * 33554432.0);
  id.l3_bytes = 1e10;  // a huge L3 (sysconf on a VM may give the whole package's): DRAM stays at 256 MiB
  EXPECT_EQ(detail::memory_levels(Device::CPU, id).back().array_bytes, 256.0 * 1048576.0);
  id.l3_bytes = 0.0;  // unknown L3: no L3 level, DRAM at least 64 MiB
  const std::vector<detail::LevelPlan> no_l3 = detail::memory_levels(Device::CPU, id);
  ASSERT_EQ(no_l3.size(), 2u);
  EXPECT_EQ(no_l3.back().array_bytes, 64.0 * 1048576.0);
  id.l2_bytes = 52428800.0;  // an H100's 50 MiB L2
  const std::vector<detail::LevelPlan> gpu = detail::memory_levels(Device::CUDA, id);
  ASSERT_EQ(gpu.size(), 2u);
  EXPECT_EQ(gpu[0].level, "L2");
  EXPECT_EQ(gpu[0].array_bytes, 26214400.0);
  EXPECT_EQ(gpu[1].level, "HBM");
  EXPECT_EQ(gpu[1].array_bytes, 8.0 * 52428800.0);
}

TEST(MachineCeilings, DefaultCachePathFollowsXdg) {
  const std::string p = default_ceilings_cache_path();
  if (!p.empty()) {
    EXPECT_NE(p.find("pretrain_llama/machine_ceilings.json"), std::string::npos) << p;
  }
}

}  // namespace
}  // namespace pl::roofline
