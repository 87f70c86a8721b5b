#pragma once
// The CPU backend's Communicator over MPI (parallel/communicator.h): F32 host buffers, blocking or
// nonblocking collectives on a duplicate of MPI_COMM_WORLD. Only in builds with MPI (PL_WITH_MPI).
#include <memory>

#include "parallel/communicator.h"

namespace pl::parallel {

// world.uses_mpi() must hold (checked). Collective: every rank makes it at the same point.
std::unique_ptr<Communicator> make_mpi_communicator(const World& world);

}  // namespace pl::parallel
