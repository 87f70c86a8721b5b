#pragma once
// Checked MPI calls (only in builds with MPI: PL_WITH_MPI). MPI_COMM_WORLD and every communicator made
// from it use MPI_ERRORS_RETURN (set by the World), so a failing call returns its code here instead of
// MPI's default handler aborting the job without a word about what was being done.
#if defined(PL_WITH_MPI)
#include <mpi.h>

#include <cstddef>
#include <string>

namespace pl::parallel {

// The one-line error: "<op> (<what>) on rank 1: 64 bytes: MPI error 15: MPI_ERR_TRUNCATE: message truncated".
[[noreturn]] void mpi_fail(int code, const char* op, const std::string& what, int rank, size_t bytes);
inline void mpi_check(int code, const char* op, const std::string& what, int rank, size_t bytes) {
  if (code != MPI_SUCCESS) mpi_fail(code, op, what, rank, bytes);
}
// MPI counts are int (MPI 3.1: no large-count calls): a pl::Error naming the op when `count` does not fit.
int mpi_count(size_t count, const char* op, const std::string& what, int rank);

}  // namespace pl::parallel
#endif
