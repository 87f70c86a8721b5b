// Deviceless planning of every cuDNN attention graph the program builds (backend/cuda/attention.cpp),
// for every GPU architecture it trains on, on a machine without a GPU (CI): the forward, the backward
// (cuDNN's default algorithm and --deterministic-mode's), on strided views of the qkv rows and on packed
// Q/K/V copies, for the model shapes of configs/models (head dims 32, 64 and 128), each through cuDNN's
// validate(), build_operation_graph(), engine heuristics and check_support() for an H100, a B200, a
// GB300 and an RTX 5090 described by their device properties (attention_targets.cpp); and the
// document-aware (THD) graphs of every class of document bucket (issue 27, PlansEveryDocumentBucket).
//
// A NECESSARY check, NOT a proof that the engine runs: check_support() accepted FP32 IO and head dim
// 512 too (SPEC-GPU §1.7), and build_plans() (kernel loading) and execution need the GPU. What it does
// catch, on every CI run, for GPUs nobody here has: frontend and backend refusals of the graphs'
// tensors, strides, masks, GQA and head dims (a wiring mistake, a head dim an architecture's SDPA
// engines do not take), with cuDNN's own message naming the step.
//
// Its own executable (pl_deviceless_tests, tests/CMakeLists.txt): the runtime-compiled engines need a
// libcuda.so.1 to load, and ctest gives this process alone the CUDA toolkit's stub through
// LD_LIBRARY_PATH (never pl_tests: on a GPU host the stub would hide the real driver).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/ops.h"

#if defined(PL_WITH_CUDA)
#include <filesystem>

#include "backend/cuda/attention_graph.h"
#endif

namespace pl {
namespace {

#if defined(PL_WITH_CUDA)

struct ModelShape {
  const char* model;
  AttentionShape shape;
};

// The shapes the program's graphs are built for (configs/models; batch and sequence as scripts/
// gpu_check.sh trains them): the production 8B layer at the playbook's sequence and at the config's own,
// llama_small (head dim 64) and llama_tiny (head dim 32).
const ModelShape kShapes[] = {
    {"llama3_8b", AttentionShape{1, 4096, 32, 8, 128}},
    {"llama3_8b", AttentionShape{1, 8192, 32, 8, 128}},
    {"llama_small", AttentionShape{2, 512, 4, 2, 64}},
    {"llama_tiny", AttentionShape{2, 128, 8, 2, 32}},
};

struct GraphKind {
  const char* name;
  bool backward, deterministic;
};
const GraphKind kKinds[] = {{"forward", false, false},
                            {"backward", true, false},
                            {"backward deterministic", true, true}};

std::string shape_name(const ModelShape& m) {
  const AttentionShape& s = m.shape;
  return std::string(m.model) + " B=" + std::to_string(s.batch) + " S=" + std::to_string(s.seq) +
         " heads=" + std::to_string(s.q_heads) + "/" + std::to_string(s.kv_heads) + " d=" + std::to_string(s.head_dim);
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& x : v) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "-" : out;
}

// Fails (does not skip) when a CUDA build cannot plan: no frontend headers, or no stub libcuda.
void require_planning_prerequisites() {
  ASSERT_TRUE(cuda::attention_has_cudnn_frontend())
      << "this CUDA build has no cudnn-frontend headers (scripts/setup.sh installs nvidia-cudnn-frontend; "
         "reconfigure): its attention cannot be checked, nor run";
  const std::filesystem::path stub = std::filesystem::path(PL_DEVICELESS_LIBCUDA_DIR) / "libcuda.so.1";
  ASSERT_TRUE(std::filesystem::exists(stub))
      << stub << " is missing: tests/CMakeLists.txt links the CUDA toolkit's stubs/libcuda.so there at configure "
      << "time; without it every runtime-compiled engine is NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING";
}

class CudaAttentionDeviceless : public ::testing::TestWithParam<int> {};

// One test per target GPU: every shape × graph kind × layout; a table line per plan.
TEST_P(CudaAttentionDeviceless, PlansEveryGraphTheProgramBuilds) {
  require_planning_prerequisites();
  const cuda::AttentionTarget* target = nullptr;
  for (const cuda::AttentionTarget& t : cuda::attention_targets())
    if (t.sm == GetParam()) target = &t;
  ASSERT_NE(target, nullptr) << "no target row for sm_" << GetParam() << " in attention_targets.cpp";
  const auto start = std::chrono::steady_clock::now();
  int plans = 0;
  for (const ModelShape& m : kShapes)
    for (const GraphKind& k : kKinds)
      for (cuda::AttentionLayout layout : {cuda::AttentionLayout::Strided, cuda::AttentionLayout::Packed}) {
        const cuda::DevicelessPlan p =
            cuda::attention_plan_deviceless(m.shape, k.backward, k.deterministic, layout, *target);
        ++plans;
        std::printf("[ plan ] %-42s | sm_%d %-14s | %-22s | %-6s | engines %-40s | %s\n", shape_name(m).c_str(),
                    target->sm, target->gpu.c_str(), k.name,
                    layout == cuda::AttentionLayout::Strided ? "strided" : "packed", joined(p.engines).c_str(),
                    p.error.empty() ? "pass" : "REFUSED");
        EXPECT_EQ(p.error, "") << shape_name(m) << ", " << k.name << ", " << cuda::attention_layout_name(layout)
                               << ", sm_" << target->sm << " (" << target->gpu << ")";
        EXPECT_FALSE(p.engines.empty()) << shape_name(m) << ", " << k.name << ": the heuristics returned no engine";
      }
  std::printf("[ info ] %d plans for sm_%d in %.2f s\n", plans, target->sm,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

INSTANTIATE_TEST_SUITE_P(Targets, CudaAttentionDeviceless, ::testing::Values(90, 100, 103, 120),
                         [](const ::testing::TestParamInfo<int>& i) { return "sm" + std::to_string(i.param); });

// Document-aware attention (issue 27): the document buckets the program can build for each model shape
// (attention_document_bucket from 1 document to T: 32, 64, ..., 512, then multiples of 512, capped at T),
// each class of them — the powers of two, the first multiple of 512 that is not one, and T — forward and
// backward in both layouts, plus the deterministic backward at the smallest and largest bucket. Hopper and datacenter Blackwell plan them all. SM 12x (RTX 5090) plans the forward but cuDNN
// (frontend rules for cuDNN >= 9.18.1) refuses every THD backward with ragged Stats — the layout that
// keeps the lse buffer at T·nq floats (attention_graph.h) — and every deterministic THD backward: the
// test holds it to exactly that refusal, so a cuDNN that lifts it shows up here.
std::vector<int64_t> document_buckets(const AttentionShape& s) {
  std::vector<int64_t> v;
  for (int64_t count = 1; count <= s.batch * s.seq; ++count) {
    const int64_t b = cuda::attention_document_bucket(count, s.batch * s.seq);
    if (v.empty() || v.back() != b) v.push_back(b);
  }
  return v;
}
// The buckets planned: the powers of two, 1536 (the first step of 512 past them) and the largest.
std::vector<int64_t> planned_buckets(const AttentionShape& s) {
  std::vector<int64_t> v;
  const std::vector<int64_t> all = document_buckets(s);
  for (int64_t b : all)
    if ((b & (b - 1)) == 0 || b == 1536 || b == all.back()) v.push_back(b);
  return v;
}

TEST_P(CudaAttentionDeviceless, PlansEveryDocumentBucket) {
  require_planning_prerequisites();
  const cuda::AttentionTarget* target = nullptr;
  for (const cuda::AttentionTarget& t : cuda::attention_targets())
    if (t.sm == GetParam()) target = &t;
  ASSERT_NE(target, nullptr);
  const bool sm12x = target->sm / 10 == 12;
  const auto start = std::chrono::steady_clock::now();
  int plans = 0;
  for (const ModelShape& m : kShapes) {
    const std::vector<int64_t> buckets = planned_buckets(m.shape);
    for (int64_t bucket : buckets)
      for (const GraphKind& k : kKinds) {
        if (k.deterministic && bucket != buckets.front() && bucket != buckets.back()) continue;
        for (cuda::AttentionLayout layout : {cuda::AttentionLayout::Strided, cuda::AttentionLayout::Packed}) {
          AttentionShape s = m.shape;
          s.docs.count = bucket;  // the graph of a full bucket (planning reads only the count)
          const cuda::DevicelessPlan p = cuda::attention_plan_deviceless(s, k.backward, k.deterministic, layout, *target);
          ++plans;
          std::printf("[ plan ] %-42s | docs bucket %5lld | sm_%d | %-22s | %-7s | %s\n", shape_name(m).c_str(),
                      static_cast<long long>(bucket), target->sm, k.name,
                      layout == cuda::AttentionLayout::Strided ? "strided" : "packed",
                      p.error.empty() ? "pass" : p.error.c_str());
          const std::string what = shape_name(m) + ", document bucket " + std::to_string(bucket) + ", " + k.name +
                                   ", " + cuda::attention_layout_name(layout) + ", sm_" + std::to_string(target->sm);
          if (sm12x && k.backward) {
            const char* rule = k.deterministic ? "Deterministic algorithm is not supported for bprop thd on SM8X and SM12X"
                                               : "Packed/ragged LSE is not supported for bprop thd on SM8X and SM12X";
            EXPECT_NE(p.error.find(rule), std::string::npos) << what << ": " << p.error;
          } else {
            EXPECT_EQ(p.error, "") << what;
            EXPECT_FALSE(p.engines.empty()) << what << ": the heuristics returned no engine";
          }
        }
      }
  }
  std::printf("[ info ] %d document plans for sm_%d in %.2f s\n", plans, target->sm,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

TEST(CudaAttentionDevicelessDocuments, BucketsFollowTransformerEngineCappedAtTheTokens) {
  EXPECT_EQ(cuda::attention_document_bucket(1, 4096), 32);
  EXPECT_EQ(cuda::attention_document_bucket(32, 4096), 32);
  EXPECT_EQ(cuda::attention_document_bucket(33, 4096), 64);
  EXPECT_EQ(cuda::attention_document_bucket(512, 4096), 512);
  EXPECT_EQ(cuda::attention_document_bucket(513, 4096), 1024);
  EXPECT_EQ(cuda::attention_document_bucket(1025, 4096), 1536);
  EXPECT_EQ(cuda::attention_document_bucket(4096, 4096), 4096);
  EXPECT_EQ(cuda::attention_document_bucket(3, 16), 16) << "capped at T";
  EXPECT_EQ(document_buckets(AttentionShape{2, 128, 8, 2, 32}), (std::vector<int64_t>{32, 64, 128, 256}));
  EXPECT_EQ(document_buckets(AttentionShape{1, 4096, 32, 8, 128}).size(), 12u);
  EXPECT_EQ(planned_buckets(AttentionShape{1, 4096, 32, 8, 128}),
            (std::vector<int64_t>{32, 64, 128, 256, 512, 1024, 1536, 2048, 4096}));
  // 4 int64 arrays of bucket + 1 (16-byte aligned) and bucket int32 lengths.
  EXPECT_EQ(cuda::attention_document_scratch_bytes(32), 4 * 272 + 128);
  EXPECT_EQ(cuda::attention_document_scratch_bytes(0), 0);
}

// The targets' descriptions are what they claim to be, and a refusal comes back as the step and
// cuDNN's own message: head dim 256 backward is Hopper-only (cuDNN's Blackwell backward limit is 128).
TEST(CudaAttentionDevicelessRefusal, NamesTheStepAndCudnnsMessage) {
  require_planning_prerequisites();
  std::vector<int> sms;
  for (const cuda::AttentionTarget& t : cuda::attention_targets()) sms.push_back(t.sm);
  EXPECT_EQ(sms, (std::vector<int>{90, 100, 103, 120}));
  const AttentionShape d256{1, 256, 8, 2, 256};
  for (const cuda::AttentionTarget& t : cuda::attention_targets()) {
    if (t.sm != 90 && t.sm != 100) continue;
    const cuda::DevicelessPlan p =
        cuda::attention_plan_deviceless(d256, /*backward=*/true, false, cuda::AttentionLayout::Packed, t);
    if (t.sm == 90) {
      EXPECT_EQ(p.error, "") << "sm_90 takes head dim 256 in the backward";
    } else {
      EXPECT_EQ(p.error.rfind("validate: cuDNN frontend error", 0), 0u) << p.error;
      EXPECT_NE(p.error.find("128"), std::string::npos) << "cuDNN's message should give its limit: " << p.error;
    }
  }
}

#else  // !PL_WITH_CUDA

TEST(CudaAttentionDeviceless, PlansEveryGraphTheProgramBuilds) {
  GTEST_SKIP() << "this build has no CUDA backend (the deviceless cuDNN check runs in CUDA builds)";
}

#endif

}  // namespace
}  // namespace pl
