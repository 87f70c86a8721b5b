#include "parallel/world.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "core/error.h"
#include "parallel/mpi_check.h"

namespace pl::parallel {
namespace {

// The one-World-per-process guard (the only global of parallel/): MPI_Init may run once per process.
std::atomic<bool> g_world_alive{false};

// The first launcher variable found, as "NAME=value", or "" when the process was not started by one.
// OMPI_COMM_WORLD_SIZE: OpenMPI's mpirun; PMIX_RANK: any PMIx launcher (srun --mpi=pmix, prterun);
// PMI_SIZE: PMI-1/2 launchers (srun --mpi=pmi2, MPICH's hydra).
std::string launcher_variable() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (const char* v = std::getenv(name)) return std::string(name) + "=" + v;
  return {};
}

#if !defined(PL_WITH_MPI)
// Whether the launcher variables say there is more than one rank (PMIX_RANK > 0 means another rank 0
// exists; PMIX_RANK=0 alone does not tell the size).
bool launcher_says_many() {
  auto num = [](const char* name) {
    const char* v = std::getenv(name);
    return v ? std::atol(v) : 0L;
  };
  return num("OMPI_COMM_WORLD_SIZE") > 1 || num("PMI_SIZE") > 1 || num("PMIX_RANK") > 0;
}
#endif

}  // namespace

bool built_with_mpi() {
#if defined(PL_WITH_MPI)
  return true;
#else
  return false;
#endif
}

std::string mpi_library_version() {
#if defined(PL_WITH_MPI)
  // MPI_Get_library_version may be called before MPI_Init (MPI 3.1 §8.1.1).
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS || len <= 0) return "MPI (version unknown)";
  std::string s(text, static_cast<size_t>(len));
  s = s.substr(0, s.find('\n'));
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
#else
  return "none";
#endif
}

World World::single() { return World(); }

World::World(int& argc, char**& argv) {
  if (g_world_alive.exchange(true)) fail("internal error: a second World in one process (make it once, in main)");
  counted_ = true;
  try {
    bootstrap(argc, argv);
  } catch (...) {
    g_world_alive = false;  // no destructor runs for an object whose constructor threw
    throw;
  }
}

void World::bootstrap([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv) {
  const std::string seen = launcher_variable();
  if (seen.empty()) return;  // not started by a launcher: one rank, no MPI call at all
#if defined(PL_WITH_MPI)
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) fail("internal error: MPI was initialised before the World was made");
  int provided = 0;
  // Only the main thread calls MPI (the OpenMP threads of the CPU backend never do).
  int rc = MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  if (rc != MPI_SUCCESS) fail("MPI_Init_thread failed (error {}; started by a launcher: {})", rc, seen);
  owner_ = true;
  mpi_ = true;
  // Errors come back as codes (checked with the op's name) instead of MPI's default abort.
  mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "World", 0, 0);
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank", "World", 0, 0);
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size", "World", rank_, 0);
  if (provided < MPI_THREAD_FUNNELED)
    fail("MPI_Init_thread on rank {}: the MPI library provides thread level {}, MPI_THREAD_FUNNELED ({}) is needed",
         rank_, provided, MPI_THREAD_FUNNELED);
  // The ranks sharing this node's memory: their order is the GPU each takes (select_local_device).
  MPI_Comm local = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
            "MPI_Comm_split_type", "World: ranks of this node", rank_, 0);
  mpi_check(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank", "World: ranks of this node", rank_, 0);
  mpi_check(MPI_Comm_size(local, &local_size_), "MPI_Comm_size", "World: ranks of this node", rank_, 0);
  mpi_check(MPI_Comm_free(&local), "MPI_Comm_free", "World: ranks of this node", rank_, 0);
#else
  if (launcher_says_many())
    fail("started by an MPI launcher with more than one rank ({}), but this build has no MPI: install OpenMPI "
         "(scripts/setup.sh) and rebuild (the CMake banner says whether MPI was found)",
         seen);
#endif
}

World::World(World&& o) noexcept
    : rank_(o.rank_), size_(o.size_), local_rank_(o.local_rank_), local_size_(o.local_size_), mpi_(o.mpi_),
      owner_(std::exchange(o.owner_, false)), counted_(std::exchange(o.counted_, false)),
      hooks_(std::move(o.hooks_)), next_hook_id_(o.next_hook_id_) {}

World::~World() {
#if defined(PL_WITH_MPI)
  if (owner_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();  // status ignored: nothing can be reported from a destructor
  }
#endif
  if (counted_) g_world_alive = false;
}

std::string World::describe() const {
  return fmt::format("rank {} of {} (node rank {} of {}, {})", rank_, size_, local_rank_, local_size_,
                     mpi_ ? "MPI" : "no MPI");
}

void World::all_reduce_sum(std::span<double> values) const {
  if (!mpi_ || size_ == 1 || values.empty()) return;
#if defined(PL_WITH_MPI)
  // Every rank's values, then the sum in rank order: the same bits on every rank whatever MPI's
  // reduction tree would have been (the loss and the gradient norm must not differ between ranks).
  const size_t n = values.size();
  std::vector<double> all(n * static_cast<size_t>(size_));
  const int count = mpi_count(n, "MPI_Allgather", "World::all_reduce_sum", rank_);
  mpi_check(MPI_Allgather(values.data(), count, MPI_DOUBLE, all.data(), count, MPI_DOUBLE, MPI_COMM_WORLD),
            "MPI_Allgather", "World::all_reduce_sum", rank_, n * sizeof(double));
  for (size_t i = 0; i < n; ++i) {
    double s = all[i];
    for (int r = 1; r < size_; ++r) s = s + all[static_cast<size_t>(r) * n + i];
    values[i] = s;
  }
#endif
}

double World::all_reduce_sum(double value) const {
  all_reduce_sum(std::span<double>(&value, 1));
  return value;
}

void World::all_reduce_max(std::span<double> values) const {
  if (!mpi_ || size_ == 1 || values.empty()) return;
#if defined(PL_WITH_MPI)
  const int count = mpi_count(values.size(), "MPI_Allreduce", "World::all_reduce_max", rank_);
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, values.data(), count, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce",
            "World::all_reduce_max", rank_, values.size() * sizeof(double));
#endif
}

bool World::any(bool flag) const {
  if (!mpi_ || size_ == 1) return flag;
  int v = flag ? 1 : 0;
#if defined(PL_WITH_MPI)
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce", "World::any",
            rank_, sizeof v);
#endif
  return v != 0;
}

void World::broadcast([[maybe_unused]] void* data, size_t bytes, int root) const {
  PL_CHECK(root >= 0 && root < size_, "World::broadcast on rank {}: root {} is not a rank of {}", rank_, root, size_);
  if (!mpi_ || size_ == 1 || bytes == 0) return;
#if defined(PL_WITH_MPI)
  // In pieces of 1 GiB: MPI counts are int.
  constexpr size_t kPiece = size_t{1} << 30;
  auto* p = static_cast<unsigned char*>(data);
  for (size_t off = 0; off < bytes; off += kPiece) {
    const size_t n = std::min(kPiece, bytes - off);
    mpi_check(MPI_Bcast(p + off, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast",
              "World::broadcast from rank " + std::to_string(root), rank_, n);
  }
#endif
}

std::vector<uint64_t> World::gather(std::span<const uint64_t> values, int root) const {
  PL_CHECK(root >= 0 && root < size_, "World::gather on rank {}: root {} is not a rank of {}", rank_, root, size_);
  if (!mpi_ || size_ == 1) return std::vector<uint64_t>(values.begin(), values.end());
#if defined(PL_WITH_MPI)
  const std::string what = "World::gather to rank " + std::to_string(root);
  int mine = mpi_count(values.size(), "MPI_Gather", what, rank_);
  std::vector<int> counts(rank_ == root ? static_cast<size_t>(size_) : 0), offsets;
  mpi_check(MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Gather",
            what + ": lengths", rank_, sizeof mine);
  std::vector<uint64_t> out;
  if (rank_ == root) {
    size_t total = 0;
    for (int c : counts) {
      offsets.push_back(mpi_count(total, "MPI_Gatherv", what, rank_));
      total += static_cast<size_t>(c);
    }
    out.resize(total);
  }
  mpi_check(MPI_Gatherv(values.data(), mine, MPI_UINT64_T, out.data(), counts.data(), offsets.data(), MPI_UINT64_T,
                        root, MPI_COMM_WORLD),
            "MPI_Gatherv", what, rank_, values.size() * sizeof(uint64_t));
  return out;
#else
  return {};
#endif
}

void World::barrier() const {
  if (!mpi_ || size_ == 1) return;
#if defined(PL_WITH_MPI)
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier", "World::barrier", rank_, 0);
#endif
}

void World::abort(int exit_code) const {
  // Hooks last-registered first (a communicator made after another is torn down before it); a hook
  // that throws must not keep the other ranks waiting, so its error is dropped.
  for (auto it = hooks_.rbegin(); it != hooks_.rend(); ++it) {
    try {
      it->run();
    } catch (...) {
    }
  }
  // The caller's error line must reach the terminal before the launcher kills the process group.
  std::fflush(stdout);
  std::fflush(stderr);
#if defined(PL_WITH_MPI)
  // The launcher ends every other rank (they may be blocked in a collective that never completes).
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
  std::_Exit(exit_code);
}

int World::add_abort_hook(std::function<void()> hook) const {
  const int id = next_hook_id_++;
  hooks_.push_back({id, std::move(hook)});
  return id;
}

void World::remove_abort_hook(int id) const {
  std::erase_if(hooks_, [id](const Hook& h) { return h.id == id; });
}

}  // namespace pl::parallel
