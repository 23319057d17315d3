// Programmatic dependent launch (PDL) for the forward's kernel chain. Each kernel of forward() is launched with
// the programmatic-stream-serialization attribute and starts with kernels::pdl_wait_then_allow_next(): the next
// kernel's blocks may then be scheduled, and run their prologue (barrier init, descriptor prefetch), while the
// previous kernel drains, instead of after it has completed and the launch latency has passed. The wait blocks
// until the previous kernel has completed and its memory is visible, and every kernel calls it before its
// first global memory access, so no read or write can overlap the previous kernel (graph capture turns the
// attribute into a programmatic graph edge with the same meaning). Exceptions, each stated where it happens:
// reads of constants and of what a kernel two or more launches back wrote (it completed before the previous
// kernel passed its own wait, which is before that kernel let this one start): the warp-streaming GEMM2's prologue (prologue_before_pdl_wait) and combine_kernel's slots.
// That argument, and the chain of waits as a whole, needs every launch to wait in at least one block before it
// can complete, also when it has no work: a kernel whose blocks may skip the wait (the warp-streaming kernel with
// prologue_before_pdl_wait, where a warp without a piece exits early) keeps one block's warp waiting then.
// Without the attribute (NVFP4MOE_PDL=0) the wait and the trigger are no-ops.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace nvfp4moe::cuda {

// NVFP4MOE_PDL unset, empty or "1": on; "0": off (plain stream order). Read once.
bool pdl_enabled();

// Launches kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when pdl_enabled().
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

namespace kernels {
// Waits for the previous kernel of the stream (complete, memory visible); then lets the next one be scheduled.
__device__ __forceinline__ void pdl_wait_then_allow_next() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
}  // namespace kernels

}  // namespace nvfp4moe::cuda
