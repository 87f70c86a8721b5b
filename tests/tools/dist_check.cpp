// Every collective of parallel/ over real MPI ranks on CPU tensors, against values worked out by hand:
// each rank knows every rank's data (a function of the rank and the index), so each can compute the
// expected sums itself. Run under mpirun with 2 or more ranks (ctest Dist.mpi_np2, Dist.mpi_np3,
// Dist.two_hosts). Each mismatch prints one line "dist_check: rank R: FAILED <check>: ..."; every rank
// exits 1 when any rank found one, 0 otherwise (rank 0 prints the count of checks passed).
//   dist_check                        the checks
//   dist_check --abort-on-rank R      rank R prints a line and calls World::abort(3) while the others
//                                     wait in a barrier (ctest Dist.abort_ends_all_ranks)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/error.h"
#include "core/tensor.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "rank_check.h"

namespace {

using pl::parallel::Communicator;
using pl::parallel::World;

pl::test::RankChecks g_tally{"dist_check"};
void expect(bool ok, const std::string& what) { g_tally.expect(ok, what); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Rank r's element i: integers below 2^24, so every sum over ranks is exact in any order.
float int_value(int r, int64_t i) { return static_cast<float>((r + 1) * 1000 + (i % 997)); }
float int_sum(int size, int64_t i) {
  float s = 0.0f;
  for (int r = 0; r < size; ++r) s += int_value(r, i);
  return s;
}
// Rank r's random floats (inexact sums): the same on every rank for the same r.
std::vector<float> random_values(int r, size_t n) {
  std::mt19937 rng(1234u + static_cast<unsigned>(r));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

pl::Tensor cpu_tensor(std::vector<float>& v) {
  return pl::Tensor(v.data(), {static_cast<int64_t>(v.size())}, pl::DType::F32, pl::Device::CPU);
}

// The first index where got differs from want in bits, or -1.
int64_t first_mismatch(const std::vector<float>& got, const std::vector<float>& want, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i)
    if (bits(got[static_cast<size_t>(i)]) != bits(want[static_cast<size_t>(i)])) return i;
  return -1;
}

void expect_range(const std::vector<float>& got, const std::vector<float>& want, int64_t begin, int64_t end,
                  const std::string& what) {
  const int64_t i = first_mismatch(got, want, begin, end);
  expect(i < 0, what + (i < 0 ? "" : ": element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                                         ", expected " + std::to_string(want[i])));
}

// The same bits on every rank: each rank's 64-bit digest gathered to rank 0 and compared there.
void expect_same_on_every_rank(const World& world, const std::vector<float>& v, const std::string& what) {
  uint64_t h = 1469598103934665603ull;
  for (float f : v) h = (h ^ bits(f)) * 1099511628211ull;
  const std::vector<uint64_t> all = world.gather(std::span<const uint64_t>(&h, 1), 0);
  if (world.rank() != 0) return;
  for (size_t r = 1; r < all.size(); ++r)
    expect(all[r] == all[0], what + ": rank " + std::to_string(r) + "'s result differs from rank 0's");
}

void check_all_reduce(const World& world, Communicator& comm, bool async) {
  const std::string tag = async ? " (async)" : "";
  const int S = world.size(), r = world.rank();
  const int64_t n = 3001;  // odd, not a multiple of the rank count
  std::vector<float> v(n), want(n);
  for (int64_t i = 0; i < n; ++i) v[i] = int_value(r, i), want[i] = int_sum(S, i);
  comm.all_reduce_sum(cpu_tensor(v), async);
  comm.wait();
  expect_range(v, want, 0, n, "all_reduce_sum of integers" + tag);

  // Inexact sums: the same bits on every rank; with 2 ranks exactly a + b, as one rank would add them.
  std::vector<float> x = random_values(r, 4099);
  comm.all_reduce_sum(cpu_tensor(x), async);
  comm.wait();
  expect_same_on_every_rank(world, x, "all_reduce_sum of random floats" + tag);
  if (S == 2) {
    const std::vector<float> a = random_values(0, x.size()), b = random_values(1, x.size());
    std::vector<float> ab(x.size());
    for (size_t i = 0; i < x.size(); ++i) ab[i] = a[i] + b[i];
    expect_range(x, ab, 0, static_cast<int64_t>(x.size()), "all_reduce_sum of random floats == a + b" + tag);
  } else {
    std::vector<std::vector<float>> each;
    for (int q = 0; q < S; ++q) each.push_back(random_values(q, x.size()));
    double worst = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      double s = 0.0;
      for (int q = 0; q < S; ++q) s += each[q][i];
      worst = std::max(worst, std::abs(s - x[i]));
    }
    expect(worst < 1e-5, "all_reduce_sum of random floats within 1e-5 of the double sum" + tag + ": off by " +
                             std::to_string(worst));
  }
}

void check_reduce_scatter(const World& world, Communicator& comm, bool async) {
  const std::string tag = async ? " (async)" : "";
  const int S = world.size(), r = world.rank();
  const int64_t k = 517;
  // Two buffers in flight at once (async): each completes into its own rank slice.
  std::vector<float> a(S * k), b(S * k), want_a(S * k), want_b(S * k);
  for (int64_t i = 0; i < S * k; ++i) {
    a[i] = int_value(r, i), want_a[i] = int_sum(S, i);
    b[i] = int_value(r, i + 5), want_b[i] = int_sum(S, i + 5);
  }
  comm.reduce_scatter_sum(cpu_tensor(a), async);
  comm.reduce_scatter_sum(cpu_tensor(b), async);
  comm.wait();
  const std::string slice = " slice [" + std::to_string(r * k) + ", " + std::to_string((r + 1) * k) + ")";
  expect_range(a, want_a, r * k, (r + 1) * k, "reduce_scatter_sum in place at this rank's" + slice + tag);
  expect_range(b, want_b, r * k, (r + 1) * k, "second reduce_scatter_sum in place at this rank's" + slice + tag);
  // A wrong length is one error line before any MPI call (every rank makes the same mistake).
  std::vector<float> odd(static_cast<size_t>(S * k + 1));
  bool threw = false;
  try {
    comm.reduce_scatter_sum(cpu_tensor(odd), async);
  } catch (const pl::Error& e) {
    threw = std::strstr(e.what(), "not a multiple") != nullptr;
  }
  expect(threw, "reduce_scatter_sum of a buffer not a multiple of the ranks is an error" + tag);
}

void check_reduce(const World& world, Communicator& comm, bool async) {
  const std::string tag = async ? " (async)" : "";
  const int S = world.size(), r = world.rank();
  for (int root : {0, S - 1}) {
    const int64_t n = 777;
    std::vector<float> v(n), want(n);
    for (int64_t i = 0; i < n; ++i) v[i] = int_value(r, i * 3), want[i] = int_sum(S, i * 3);
    comm.reduce_sum(cpu_tensor(v), root, async);
    comm.wait();
    if (r == root) expect_range(v, want, 0, n, "reduce_sum on root " + std::to_string(root) + tag);
  }
}

void check_all_gather(const World& world, Communicator& comm, bool async) {
  const std::string tag = async ? " (async)" : "";
  const int S = world.size(), r = world.rank();
  const int64_t k = 301;
  std::vector<float> v(S * k, std::nanf("")), want(S * k);
  for (int64_t i = 0; i < S * k; ++i) want[i] = int_value(static_cast<int>(i / k), i);
  for (int64_t i = r * k; i < (r + 1) * k; ++i) v[i] = want[i];  // only this rank's slice is set
  comm.all_gather(cpu_tensor(v), async);
  comm.wait();
  expect_range(v, want, 0, S * k, "all_gather: every slice from its rank" + tag);
}

void check_broadcast(const World& world, Communicator& comm, bool async) {
  const std::string tag = async ? " (async)" : "";
  const int S = world.size(), r = world.rank();
  const int root = S - 1;
  const int64_t n = 1025;
  std::vector<float> v(n), want(n);
  for (int64_t i = 0; i < n; ++i) v[i] = int_value(r, i), want[i] = int_value(root, i);
  comm.broadcast(cpu_tensor(v), root, async);
  comm.wait();
  expect_range(v, want, 0, n, "broadcast from rank " + std::to_string(root) + tag);
}

// Everything at once: started without waiting in between, completed by one wait().
void check_many_in_flight(const World& world, Communicator& comm) {
  const int S = world.size(), r = world.rank();
  const int64_t k = 129;
  std::vector<float> rs(S * k), ag(S * k, -1.0f), ar(k), want_rs(S * k), want_ag(S * k), want_ar(k);
  for (int64_t i = 0; i < S * k; ++i) {
    rs[i] = int_value(r, i + 11), want_rs[i] = int_sum(S, i + 11);
    want_ag[i] = static_cast<float>(i / k * 10);
  }
  for (int64_t i = r * k; i < (r + 1) * k; ++i) ag[i] = want_ag[i];
  for (int64_t i = 0; i < k; ++i) ar[i] = int_value(r, i + 7), want_ar[i] = int_sum(S, i + 7);
  comm.reduce_scatter_sum(cpu_tensor(rs), true);
  comm.all_gather(cpu_tensor(ag), true);
  comm.all_reduce_sum(cpu_tensor(ar), true);
  comm.wait();
  expect_range(rs, want_rs, r * k, (r + 1) * k, "reduce_scatter_sum with two other collectives in flight");
  expect_range(ag, want_ag, 0, S * k, "all_gather with two other collectives in flight");
  expect_range(ar, want_ar, 0, k, "all_reduce_sum with two other collectives in flight");
}

void check_world(const World& world) {
  const int S = world.size(), r = world.rank();
  expect(world.uses_mpi() && world.describe().find("MPI)") != std::string::npos,
         "World started by mpirun says MPI: " + world.describe());
  expect(world.local_rank() >= 0 && world.local_rank() < world.local_size() && world.local_size() <= S,
         "local rank within the local size: " + world.describe());

  // all_reduce_sum: rank order ((v0 + v1) + v2) ..., the same bits on every rank.
  std::vector<double> v(5);
  auto value = [](int q, size_t i) { return 0.1 * (q + 1) + 1e-17 * static_cast<double>(i) + 1.0 / (3.0 + q + i); };
  for (size_t i = 0; i < v.size(); ++i) v[i] = value(r, i);
  world.all_reduce_sum(v);
  for (size_t i = 0; i < v.size(); ++i) {
    double want = value(0, i);
    for (int q = 1; q < S; ++q) want = want + value(q, i);
    expect(v[i] == want, "World::all_reduce_sum element " + std::to_string(i) + " equals the rank-order sum");
  }
  expect(world.all_reduce_sum(static_cast<double>(r + 1)) == S * (S + 1) / 2.0, "World::all_reduce_sum(double)");

  std::vector<double> m = {static_cast<double>(r), -static_cast<double>(r)};
  world.all_reduce_max(m);
  expect(m[0] == S - 1 && m[1] == 0.0, "World::all_reduce_max");

  expect(world.any(r == S - 1), "World::any: true on the last rank only -> true");
  expect(!world.any(false), "World::any: false everywhere -> false");

  // broadcast from rank 1: bytes that differ per rank before.
  char text[32] = {};
  std::snprintf(text, sizeof text, "from rank %d", r);
  world.broadcast(text, sizeof text, 1);
  expect(std::string(text) == "from rank 1", "World::broadcast from rank 1: got '" + std::string(text) + "'");

  // gather with unequal lengths: rank q sends q + 1 values q*100 + j (rank 0 sends one, ...).
  std::vector<uint64_t> mine;
  for (int j = 0; j <= r; ++j) mine.push_back(static_cast<uint64_t>(r * 100 + j));
  const int root = S - 1;
  const std::vector<uint64_t> got = world.gather(mine, root);
  if (r == root) {
    std::vector<uint64_t> want;
    for (int q = 0; q < S; ++q)
      for (int j = 0; j <= q; ++j) want.push_back(static_cast<uint64_t>(q * 100 + j));
    expect(got == want, "World::gather of unequal lengths on rank " + std::to_string(root));
  } else {
    expect(got.empty(), "World::gather returns nothing off the root");
  }
  world.barrier();
}

void check_bf16_is_an_error(Communicator& comm) {
  std::vector<uint16_t> raw(8);
  const pl::Tensor t(raw.data(), {8}, pl::DType::BF16, pl::Device::CPU);
  bool named = false;
  try {
    comm.all_reduce_sum(t, false);
  } catch (const pl::Error& e) {
    named = std::strstr(e.what(), "bf16") != nullptr && std::strstr(e.what(), "all_reduce_sum") != nullptr;
  }
  expect(named, "a BF16 tensor on the CPU is an error naming the dtype and the op");
}

}  // namespace

int main(int argc, char** argv) {
  // A World that cannot be made is this process's error alone (printed; nothing to end elsewhere).
  std::unique_ptr<World> world_owner;
  try {
    world_owner = std::make_unique<World>(argc, argv);
  } catch (const std::exception& e) {
    std::printf("dist_check: error: %s\n", e.what());
    return 1;
  }
  const World& world = *world_owner;
  g_tally.rank = world.rank();
  int abort_rank = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--abort-on-rank") abort_rank = std::atoi(argv[i + 1]);
  if (abort_rank >= 0) {
    if (world.rank() == abort_rank) {
      std::fprintf(stderr, "dist_check: rank %d: deliberate error, ending every rank\n", world.rank());
      world.abort(3);
    }
    world.barrier();  // never completes: rank abort_rank is gone; the launcher must end this rank
    std::printf("dist_check: rank %d passed a barrier that rank %d never entered\n", world.rank(), abort_rank);
    return 0;
  }
  if (world.size() < 2) {
    std::fprintf(stderr, "dist_check: needs at least 2 ranks (mpirun -np 2 ...); this is %s\n",
                 world.describe().c_str());
    return 2;
  }
  try {
    std::printf("dist_check: %s (%s)\n", world.describe().c_str(), pl::parallel::mpi_library_version().c_str());
    check_world(world);
    pl::OpContext ctx;  // the CPU backend
    auto comm = pl::parallel::make_communicator(world, ctx);
    expect(comm->name() == "MPI (CPU ranks)" && comm->rank() == world.rank() && comm->size() == world.size(),
           "make_communicator gives the MPI communicator: " + comm->name());
    for (bool async : {false, true}) {
      check_all_reduce(world, *comm, async);
      check_reduce_scatter(world, *comm, async);
      check_reduce(world, *comm, async);
      check_all_gather(world, *comm, async);
      check_broadcast(world, *comm, async);
    }
    check_many_in_flight(world, *comm);
    check_bf16_is_an_error(*comm);
  } catch (const std::exception& e) {
    // The other ranks may be inside a collective this rank will never join: end them all.
    std::printf("dist_check: rank %d: error: %s\n", g_tally.rank, e.what());
    world.abort(1);
  }
  const bool any_failed = world.any(g_tally.failures > 0);
  if (world.rank() == 0)
    std::printf("dist_check: %s: %d checks on rank 0, %d ranks\n", any_failed ? "FAILED" : "passed", g_tally.checks,
                world.size());
  return any_failed ? 1 : 0;
}
