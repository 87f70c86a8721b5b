#pragma once
// The processes of a run and how they were started (DESIGN: parallel/ sits beside backend/, below model/).
//
// MPI only bootstraps (issue 13): it says how many ranks there are, which one this is, which GPU of
// the node it takes (its local rank), and it carries the NCCL unique id and the few host values every
// rank must agree on (loss sums, gradient-norm partial sums, NaN decisions, checkpoint digests). The
// gradients and weights themselves go through a Communicator (parallel/communicator.h): NCCL on GPUs, MPI
// on CPU ranks.
//
// A World is made once, first thing in main, and lives until main returns (RAII: MPI_Finalize).
//   - Built with MPI and started by an MPI launcher (mpirun/mpiexec of OpenMPI, or srun --mpi=pmix:
//     any of OMPI_COMM_WORLD_SIZE, PMIX_RANK, PMI_SIZE in the environment): MPI_Init_thread
//     (MPI_THREAD_FUNNELED: only the main thread calls MPI), rank/size of MPI_COMM_WORLD, local
//     rank/size from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED).
//   - Otherwise one rank (rank 0 of 1), no MPI call at all. Started by a launcher with more than one
//     rank but built without MPI: a pl::Error naming the variable seen and saying to rebuild with MPI
//     (scripts/setup.sh installs OpenMPI; the CMake banner says whether MPI was found).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace pl::parallel {

// True when this build has MPI (CMake found it: PL_WITH_MPI).
bool built_with_mpi();
// "Open MPI v4.1.4, ..." (MPI_Get_library_version, first line), or "none" without MPI.
std::string mpi_library_version();

class World {
 public:
  // Bootstraps as described above. Only one bootstrapped World may exist in a process (a second is an
  // internal error: MPI is initialised once per process); World::single() is not counted.
  World(int& argc, char**& argv);
  // A one-rank world without looking at the environment (tests, tools).
  static World single();
  ~World();  // MPI_Finalize when MPI was initialised (after a normal run; abort() never returns)
  World(World&&) noexcept;
  World& operator=(World&&) = delete;
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // among the ranks of this node: the GPU it takes
  int local_size() const { return local_size_; }
  bool uses_mpi() const { return mpi_; }
  // "rank 3 of 8 (node rank 3 of 8, MPI)" / "rank 0 of 1 (no MPI)": for the start-up line and errors.
  std::string describe() const;

  // Host values, blocking; every rank calls each with the same count, in the same order. Errors name the
  // op, the rank, the bytes and MPI's error string.
  // Elementwise sum over the ranks, in place. The sum is in rank order 0, 1, ..., size-1 (computed as
  // ((v0 + v1) + v2) + ... on every rank, so every rank gets the same bits, independent of MPI's
  // reduction algorithm: an allgather, then the sum).
  void all_reduce_sum(std::span<double> values) const;
  double all_reduce_sum(double value) const;
  // Elementwise maximum / logical or over the ranks, in place.
  void all_reduce_max(std::span<double> values) const;
  bool any(bool flag) const;
  // root's bytes to every rank (same size on every rank).
  void broadcast(void* data, size_t bytes, int root) const;
  // Every rank's `values` (lengths may differ) concatenated in rank order on root; empty elsewhere.
  std::vector<uint64_t> gather(std::span<const uint64_t> values, int root) const;
  void barrier() const;

  // Ends every rank of the run now, from an error path on any one rank: runs the abort hooks (e.g. a
  // Communicator's ncclCommAbort), then MPI_Abort(MPI_COMM_WORLD, exit_code) (without MPI: std::_Exit).
  // The caller has already printed its one error line. Never returns; never hangs on the other ranks.
  [[noreturn]] void abort(int exit_code) const;
  // Registers something to run before abort() ends the process (called in reverse order of registration).
  // Returns an id for remove_abort_hook (a Communicator removes its hook in its destructor).
  int add_abort_hook(std::function<void()> hook) const;
  void remove_abort_hook(int id) const;

 private:
  World() = default;
  void bootstrap(int& argc, char**& argv);  // the constructor's work (world.cpp)
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool mpi_ = false;
  bool owner_ = false;    // this object finalizes MPI
  bool counted_ = false;  // this object holds the one-World-per-process slot (bootstrapped, not moved from)
  // The abort hooks in registration order, with their ids. Mutable: registering one changes no value a
  // caller reads (the World is handed around as const&).
  struct Hook {
    int id;
    std::function<void()> run;
  };
  mutable std::vector<Hook> hooks_;
  mutable int next_hook_id_ = 1;
};

}  // namespace pl::parallel
