// GPU conformance of the NCCL communicator over one rank (issue 13): the same code path as 8 GPUs
// (ncclCommInitRank with the id "broadcast" through the World, the communication stream waiting on the
// compute stream's event, in-place reduce-scatter and all-gather at the rank's slice, wait() making the
// compute stream wait), where every collective over one rank is the identity: the result must equal
// the one-rank communicator's, bit for bit, on F32 and BF16 device tensors. Compiled always; skips
// without a device (or without NCCL in the build).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "parallel/communicator.h"
#include "parallel/world.h"

namespace pl::test {
namespace {

#define PL_REQUIRE_NCCL()                                                                   \
  do {                                                                                      \
    if (parallel::nccl_version() == "not built") GTEST_SKIP() << "this build has no NCCL (see the CMake banner)"; \
  } while (0)

// Runs every collective (blocking and async, then one wait) on a device copy of `host` and compares
// the result with the one-rank communicator's on another copy.
void expect_identity(parallel::Communicator& nccl, const std::vector<float>& host, DType dtype) {
  const int64_t n = static_cast<int64_t>(host.size());
  DeviceTensor a = to_device(host, {n}, dtype), b = to_device(host, {n}, dtype);
  auto one = parallel::make_communicator(parallel::World::single(), cuda_ctx(), /*nccl_for_one_rank=*/false);
  ASSERT_EQ(one->name(), "one rank");
  for (parallel::Communicator* c : {&nccl, one.get()}) {
    const Tensor& t = c == &nccl ? a.t : b.t;
    for (bool async : {false, true}) {
      c->all_reduce_sum(t, async);
      c->reduce_scatter_sum(t, async);
      c->reduce_sum(t, 0, async);
      c->all_gather(t, async);
      c->broadcast(t, 0, async);
    }
    c->wait();
  }
  const std::vector<float> got = to_host_floats(a.t), want = to_host_floats(b.t);
  expect_bits_equal(got, want, std::string("NCCL over one rank vs the identity, ") + dtype_name(dtype));
  // ... and the identity is the input (the BF16 copy was rounded on upload; so was the one-rank copy).
  expect_bits_equal(want, to_host_floats(to_device(host, {n}, dtype).t), "one-rank communicator keeps its input");
}

TEST(CudaNcclOneRank, EveryCollectiveIsTheIdentityF32AndBf16) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_REQUIRE_NCCL();
  PL_SEEDED_RNG(rng);
  const parallel::World world = parallel::World::single();
  auto nccl = parallel::make_communicator(world, cuda_ctx(), /*nccl_for_one_rank=*/true);
  EXPECT_EQ(nccl->name().rfind("NCCL ", 0), 0u) << nccl->name();
  EXPECT_EQ(nccl->rank(), 0);
  EXPECT_EQ(nccl->size(), 1);
  // Odd lengths: no alignment NCCL could rely on; a large one so NCCL's pipelined path runs too.
  for (int64_t n : {int64_t{1}, int64_t{1031}, int64_t{3} << 20}) {
    SCOPED_TRACE("n " + std::to_string(n));
    expect_identity(*nccl, uniform_f32(static_cast<size_t>(n), rng, -4.0f, 4.0f), DType::F32);
    expect_identity(*nccl, uniform_bf16(static_cast<size_t>(n), rng, -4.0f, 4.0f), DType::BF16);
  }
}

// The ordering promise: the collective is queued after what the compute stream already has (here a
// fill_zero over 16 MiB), and what the compute stream does after wait() sees its result. Over one rank
// the collective moves nothing, so the buffer must read back as the zeros, not the values before.
TEST(CudaNcclOneRank, OrderedAfterComputeAndBeforeWhatFollowsWait) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_REQUIRE_NCCL();
  PL_SEEDED_RNG(rng);
  const parallel::World world = parallel::World::single();
  auto nccl = parallel::make_communicator(world, cuda_ctx(), true);
  const int64_t n = int64_t{1} << 22;
  DeviceTensor buf = to_device(uniform_f32(static_cast<size_t>(n), rng, 1.0f, 2.0f), {n}, DType::F32);
  fill_zero(cuda_ctx(), buf.t);
  nccl->all_gather(buf.t, true);
  nccl->reduce_scatter_sum(buf.t, true);
  nccl->wait();
  expect_bits_equal(to_host_floats(buf.t), std::vector<float>(static_cast<size_t>(n), 0.0f),
                    "the collectives ran after the compute stream's fill_zero");
}

TEST(CudaNcclOneRank, RejectsWhatTheOneRankCommunicatorRejects) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_REQUIRE_NCCL();
  const parallel::World world = parallel::World::single();
  auto nccl = parallel::make_communicator(world, cuda_ctx(), true);
  DeviceTensor d = to_device(std::vector<float>(16, 1.0f), {16}, DType::F32);
  expect_error_containing([&] { nccl->reduce_sum(d.t, 1, false); }, {"reduce_sum", "root 1 is not a rank of 1"});
  std::vector<float> host(16);
  const Tensor cpu(host.data(), {16}, DType::F32, Device::CPU);
  expect_error_containing([&] { nccl->all_reduce_sum(cpu, false); }, {"all_reduce_sum", "is on the cpu"});
}

}  // namespace
}  // namespace pl::test
