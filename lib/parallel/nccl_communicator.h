#pragma once
// The GPU backend's Communicator over NCCL (parallel/communicator.h). Only in builds with CUDA and NCCL
// (PL_WITH_NCCL): this header is included everywhere, its functions are defined only there.
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace pl::parallel {

// ncclCommInitRank over world's ranks on ctx's device (ctx.gpu: its compute stream, the communication
// stream and events of its DeviceState). Collective: every rank makes it at the same point.
std::unique_ptr<Communicator> make_nccl_communicator(const World& world, const OpContext& ctx);
// "NCCL 2.28.9" from ncclGetVersion (the library loaded, not the header compiled against).
std::string nccl_library_version();

}  // namespace pl::parallel
