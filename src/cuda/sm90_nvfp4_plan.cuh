// Plan kernels: a stable, deterministic counting sort of the T*k (token, slot) pairs into expert order.
//   1. plan_count_kernel:  one block per chunk of kPlanChunk pairs, per-expert histogram (shared atomics:
//      a count does not depend on the order the atomics land in).
//   2. plan_scan_kernel:   one block; per expert a running sum over the chunks in chunk order (-> each
//      chunk's base within its expert), then block scans over the experts (offsets, tile offsets).
//   3. plan_scatter_kernel: one block per chunk; a pair's rank among the earlier pairs of its chunk with the
//      same expert gives its row: offsets[e] + chunk base + rank. Token order within an expert, bit-stable.
// plan_small_kernel does all three in one block when T * k <= kSmallPlanPairs (decode). The block-level parts
// (scans, the one-block plans) are in sm90_nvfp4_plan_block.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/sm90_nvfp4_plan_block.cuh"

namespace nvfp4moe::cuda::kernels {

__global__ void __launch_bounds__(kPlanChunk) plan_count_kernel(const int32_t* __restrict__ ids, int pairs,
                                                                 int experts, int32_t* __restrict__ chunk_counts) {
  pdl_wait_then_allow_next();
  __shared__ int32_t hist[kMaxExperts];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const int p = blockIdx.x * kPlanChunk + threadIdx.x;
  if (p < pairs) {
    const int e = ids[p];
    if (e >= 0 && e < experts) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  int32_t* out = chunk_counts + static_cast<int64_t>(blockIdx.x) * experts;
  for (int e = threadIdx.x; e < experts; e += blockDim.x) out[e] = hist[e];
}

__global__ void __launch_bounds__(kScanThreads) plan_scan_kernel(PlanArgs a, int chunks) {
  pdl_wait_then_allow_next();
  __shared__ int2 warp_tot[32];
  const int e = threadIdx.x;
  int32_t total = 0;
  if (e < a.experts) {
    // kScanBatch chunks' counts loaded before any of their bases is stored: one at a time, each load waits for
    // the previous store (the compiler cannot tell the addresses apart). That measured 28 us at T k = 32768 under
    // ncu, whose cache flush sent every load to DRAM; in the graph, with the counts L2-hot, the batching measured
    // -0.8..+0.3% of the layer (bench/results/d50807a-scan-isolation-ab/).
    constexpr int kScanBatch = 16;  // (32 spilled under the 1024-thread block's 64 registers)
    int32_t* col = a.chunk_counts + e;
    for (int c0 = 0; c0 < chunks; c0 += kScanBatch) {
      int32_t n[kScanBatch];
#pragma unroll
      for (int j = 0; j < kScanBatch; ++j) n[j] = c0 + j < chunks ? col[static_cast<int64_t>(c0 + j) * a.experts] : 0;
#pragma unroll
      for (int j = 0; j < kScanBatch; ++j) {
        if (c0 + j < chunks) col[static_cast<int64_t>(c0 + j) * a.experts] = total;  // the chunk's base within e
        total += n[j];
      }
    }
  }
  write_expert_offsets(a, total, warp_tot);
}

__global__ void __launch_bounds__(kPlanChunk) plan_scatter_kernel(PlanArgs a, int pairs) {
  pdl_wait_then_allow_next();
  __shared__ int32_t sid[kPlanChunk];
  const int base = blockIdx.x * kPlanChunk;
  const int p = base + threadIdx.x;
  int e = -1;
  if (p < pairs) {
    e = a.topk_ids[p];
    if (e < 0 || e >= a.experts) e = -1;
  }
  sid[threadIdx.x] = e;
  __syncthreads();
  if (p >= pairs) return;
  if (e < 0) {
    a.inv[p] = -1;
    return;
  }
  int rank = 0;
  for (int i = 0; i < static_cast<int>(threadIdx.x); ++i) rank += (sid[i] == e) ? 1 : 0;
  const int row = a.offsets[e] + a.chunk_counts[static_cast<int64_t>(blockIdx.x) * a.experts + e] + rank;
  a.perm[row] = p;
  a.inv[p] = row;
}

__global__ void __launch_bounds__(kScanThreads) plan_small_kernel(PlanArgs a, int pairs) {
  pdl_wait_then_allow_next();
  plan_small_block(a, pairs, a.topk_ids);
}

}  // namespace nvfp4moe::cuda::kernels
