// parallel/ with one rank, in process: World::single() and the World of a process not started by a launcher
// are rank 0 of 1 and every host op gives back its input; the one-rank communicator leaves every buffer
// as it was (bit for bit) and rejects the same calls the MPI and NCCL ones reject; abort() runs the
// hooks last-registered first, then ends the process with the code. (The same ops over 2 and 3 MPI
// ranks: tests/tools/dist_check.cpp, ctest Dist.*.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/tensor.h"
#include "parallel/communicator.h"
#include "parallel/world.h"

namespace pl::parallel {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  v[1] = -0.0f;
  v[2] = std::numeric_limits<float>::quiet_NaN();
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Tensor view(std::vector<float>& v) { return Tensor(v.data(), {static_cast<int64_t>(v.size())}, DType::F32); }

// Death tests re-run the binary for the one test (fork alone is unsafe with the OpenMP threads a
// previous test may have started).
struct ThreadsafeDeathTests {
  ThreadsafeDeathTests() { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

template <class F>
std::string one_rank_error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DistWorld, SingleIsRankZeroOfOneWithoutMpi) {
  const World w = World::single();
  EXPECT_EQ(w.rank(), 0);
  EXPECT_EQ(w.size(), 1);
  EXPECT_EQ(w.local_rank(), 0);
  EXPECT_EQ(w.local_size(), 1);
  EXPECT_FALSE(w.uses_mpi());
  EXPECT_EQ(w.describe(), "rank 0 of 1 (node rank 0 of 1, no MPI)");
}

TEST(DistWorld, HostOpsOverOneRankGiveBackTheirInput) {
  const World w = World::single();
  std::vector<double> v = {1.5, -0.0, 1e300, 3.25};
  const std::vector<double> before = v;
  w.all_reduce_sum(v);
  EXPECT_EQ(std::memcmp(v.data(), before.data(), v.size() * sizeof(double)), 0);
  w.all_reduce_max(v);
  EXPECT_EQ(std::memcmp(v.data(), before.data(), v.size() * sizeof(double)), 0);
  EXPECT_EQ(w.all_reduce_sum(0.1), 0.1);
  EXPECT_TRUE(w.any(true));
  EXPECT_FALSE(w.any(false));
  char bytes[6] = "abcde";
  w.broadcast(bytes, sizeof bytes, 0);
  EXPECT_STREQ(bytes, "abcde");
  const std::vector<uint64_t> mine = {7, 8, 9};
  EXPECT_EQ(w.gather(mine, 0), mine);
  w.barrier();
  // A root that is not a rank is the caller's mistake, whatever the world size.
  EXPECT_NE(one_rank_error_of([&] { w.gather(mine, 1); }).find("root 1 is not a rank of 1"), std::string::npos);
  EXPECT_NE(one_rank_error_of([&] { w.broadcast(bytes, 1, -1); }).find("root -1"), std::string::npos);
}

// Not started by a launcher (no OMPI_COMM_WORLD_SIZE / PMIX_RANK / PMI_SIZE): one rank and no MPI
// call, in either build; a second bootstrapped World while the first lives is an internal error. In a
// child process (the environment is changed; MPI may be initialised only once per process).
// The bodies of the death tests below (run in the child process).
World bootstrapped_world() {
  static char name[] = "test";
  static char* args[] = {name, nullptr};
  int argc = 1;
  char** argv = args;
  return World(argc, argv);
}

[[noreturn]] void one_rank_and_only_one_world() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"}) unsetenv(v);
  const World w = bootstrapped_world();
  if (w.size() != 1 || w.rank() != 0 || w.uses_mpi()) std::_Exit(10);
  std::string second;
  try {
    const World again = bootstrapped_world();
  } catch (const Error& e) {
    second = e.what();
  }
  std::_Exit(second.find("a second World") == std::string::npos ? 11 : 0);
}

TEST(DistWorld, WithoutLauncherOneRankAndOnlyOneWorld) {
  ThreadsafeDeathTests threadsafe;
  EXPECT_EXIT(one_rank_and_only_one_world(), ::testing::ExitedWithCode(0), "");
}

#if !defined(PL_WITH_MPI)
[[noreturn]] void launcher_without_mpi() {
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  try {
    const World w = bootstrapped_world();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(5);
  }
  std::_Exit(0);
}

// Built without MPI but started by a launcher with more ranks: one line naming the variable seen.
TEST(DistWorld, LauncherWithoutMpiIsAnError) {
  ThreadsafeDeathTests threadsafe;
  EXPECT_EXIT(launcher_without_mpi(), ::testing::ExitedWithCode(5), "OMPI_COMM_WORLD_SIZE=2.*rebuild");
}
#endif

[[noreturn]] void abort_with_hooks() {
  const World w = World::single();
  w.add_abort_hook([] { std::fprintf(stderr, "hook one\n"); });
  const int gone = w.add_abort_hook([] { std::fprintf(stderr, "removed hook\n"); });
  w.add_abort_hook([] { throw Error("a hook that fails"); });  // must not stop the others
  w.add_abort_hook([] { std::fprintf(stderr, "hook three\n"); });
  w.remove_abort_hook(gone);
  w.abort(7);
}

TEST(DistWorld, AbortRunsHooksLastFirstThenExitsWithTheCode) {
  ThreadsafeDeathTests threadsafe;
  EXPECT_EXIT(abort_with_hooks(), ::testing::ExitedWithCode(7), "hook three\nhook one\n$");
}

TEST(DistOneRank, EveryCollectiveIsTheIdentity) {
  const World w = World::single();
  const OpContext cpu;
  auto comm = make_communicator(w, cpu);
  EXPECT_EQ(comm->name(), "one rank");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "blocking");
    const std::vector<float> before = random_floats(1031, async ? 2u : 1u);
    std::vector<float> v = before;
    comm->all_reduce_sum(view(v), async);
    comm->reduce_scatter_sum(view(v), async);
    comm->reduce_sum(view(v), 0, async);
    comm->all_gather(view(v), async);
    comm->broadcast(view(v), 0, async);
    comm->wait();
    EXPECT_TRUE(same_bits(v, before));
  }
  comm->wait();  // nothing pending: nothing to do
}

TEST(DistOneRank, RejectsWhatEveryCommunicatorRejects) {
  const World w = World::single();
  const OpContext cpu;
  auto comm = make_communicator(w, cpu);
  std::vector<float> v(8);
  const std::string root = one_rank_error_of([&] { comm->reduce_sum(view(v), 1, false); });
  EXPECT_NE(root.find("reduce_sum on rank 0: root 1 is not a rank of 1"), std::string::npos) << root;
  EXPECT_NE(one_rank_error_of([&] { comm->broadcast(view(v), -1, true); }).find("root -1"), std::string::npos);
  // The CPU backend stores bf16 values as F32: a BF16 tensor on the CPU is a mistake, named.
  std::vector<uint16_t> raw(8);
  const Tensor bf16(raw.data(), {8}, DType::BF16, Device::CPU);
  const std::string dtype = one_rank_error_of([&] { comm->all_reduce_sum(bf16, false); });
  EXPECT_NE(dtype.find("all_reduce_sum"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("bf16"), std::string::npos) << dtype;
  std::vector<int32_t> ints(4);
  const Tensor i32(ints.data(), {4}, DType::I32, Device::CPU);
  EXPECT_NE(one_rank_error_of([&] { comm->all_gather(i32, false); }).find("dtype i32"), std::string::npos);
  // A buffer on another device than the communicator's.
  const Tensor gpu(v.data(), {8}, DType::F32, Device::CUDA);
  EXPECT_NE(one_rank_error_of([&] { comm->broadcast(gpu, 0, false); }).find("is on the cuda"), std::string::npos);
}

TEST(DistOneRank, VersionsForTheBanner) {
  EXPECT_EQ(built_with_mpi(), mpi_library_version() != "none");
#if defined(PL_WITH_MPI)
  EXPECT_FALSE(mpi_library_version().empty());
  EXPECT_EQ(mpi_library_version().find('\n'), std::string::npos);
#endif
#if defined(PL_WITH_NCCL)
  EXPECT_EQ(nccl_version().rfind("NCCL 2.", 0), 0u) << nccl_version();
#else
  EXPECT_EQ(nccl_version(), "not built");
#endif
  select_local_device(World::single());  // one rank: nothing to select, no CUDA call
}

}  // namespace
}  // namespace pl::parallel
