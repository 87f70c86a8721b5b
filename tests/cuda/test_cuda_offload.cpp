// --overlap-cpu-optimizer-d2h-h2d on a GPU, the order checked with events: after an offloaded, overlapped
// step, the next forward's layer 0 starts on the device (an event recorded on the compute stream inside
// layer 0's gate completes) while the host step still holds back the LM head's last chunk, so that
// chunk's upload has not even been queued (tests/train/offload_gate_probe.h). Compiled always; skipped
// without a device. Not a timing: what is checked is an order the program guarantees.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/cuda_test_util.h"
#include "train/offload_gate_probe.h"

#if defined(PL_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace pl {
namespace {

TEST(CudaOffload, ForwardOfLayerZeroStartsBeforeTheLastUploadIsQueued) {
  PL_REQUIRE_CUDA_DEVICE();
#if defined(PL_WITH_CUDA)
  bool reached = false;
  const test::GateProbe r = test::probe_overlapped_forward(test::cuda_ctx(), [&] {
    // The compute stream has passed every wait layer 0 needs: an event recorded now completes once the
    // device has done the embedding and is about to run layer 0's kernels.
    cudaEvent_t at_layer0 = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&at_layer0, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(at_layer0, /*legacy default stream=*/0), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(at_layer0), cudaSuccess);
    reached = true;
    ASSERT_EQ(cudaEventDestroy(at_layer0), cudaSuccess);
  });
  EXPECT_TRUE(reached);
  EXPECT_TRUE(r.layer0_before_last_chunk);
  EXPECT_FALSE(r.hook_timed_out);
  EXPECT_TRUE(r.last_chunk_queued);
  EXPECT_TRUE(std::isfinite(r.loss));
#endif
}

}  // namespace
}  // namespace pl
