//===- optimizer.cu - AdamW for up to 32 tensors in one launch ------------===//
//
// The kernel of optimizer_blocks.h (its essay says why and how). The batch
// is a __grid_constant__ parameter: blocks read it in place instead of
// copying 3 KB per thread.
//===----------------------------------------------------------------------===//

#include "check.h"
#include "optimizer.h"

#include <cuda_runtime.h>

namespace planrt {
namespace cuda_optimizer {

namespace {

__global__ void __launch_bounds__(optimizer::kThreads)
    adamw_kernel(const __grid_constant__ optimizer::AdamWBatch b) {
  optimizer::adamw_block(block::this_lane(), b, (int64_t)blockIdx.x);
}

} // namespace

void adamw(cudaStream_t s, const optimizer::AdamWBatch &b) {
  const int64_t blocks = optimizer::grid(b);
  if (blocks <= 0)
    return;
  // kMaxTensors * kMaxBlocks blocks at most: well inside the grid.
  adamw_kernel<<<(unsigned)blocks, optimizer::kThreads, 0, s>>>(b);
  cuda_check::launch("the AdamW updates of a batch of tensors");
}

} // namespace cuda_optimizer
} // namespace planrt
