#include "parallel/mpi_check.h"

#if defined(PL_WITH_MPI)
#include <climits>

#include "core/error.h"

namespace pl::parallel {

void mpi_fail(int code, const char* op, const std::string& what, int rank, size_t bytes) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  fail("{} ({}) on rank {}: {} bytes: MPI error {}: {}", op, what, rank, bytes, code,
       len > 0 ? std::string(text, static_cast<size_t>(len)) : std::string("(no error string)"));
}

int mpi_count(size_t count, const char* op, const std::string& what, int rank) {
  PL_CHECK(count <= static_cast<size_t>(INT_MAX), "{} ({}) on rank {}: {} elements exceed MPI's int count ({})", op,
           what, rank, count, INT_MAX);
  return static_cast<int>(count);
}

}  // namespace pl::parallel
#endif
