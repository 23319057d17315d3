// The plan's block-level device functions (no kernels, so GPU tests can include them next to moe_kernels.cu):
// the two-value block scan, the expert offsets and the plan's tail, the one-block plan of T * k <= kSmallPlanPairs
// pairs (plan_small_block) and the one-token plan (plan_one_token_block). The kernels that use them are in
// sm90_nvfp4_plan.cuh and moe_kernels.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/moe_kernels.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kScanThreads = 1024;  // >= kMaxExperts: the most threads a scan block has

// Threads of a block that holds one expert per thread (and, fused with the routing, one warp per token):
// E rounded up to whole warps, not always kScanThreads (qwen3-30b: 128 threads, not 1024, at every barrier).
__host__ __device__ inline int plan_block_threads(int experts, int route_warps = 0) {
  int n = (experts + 31) / 32 * 32;
  if (n < 32 * route_warps) n = 32 * route_warps;
  return n < 32 ? 32 : n > kScanThreads ? kScanThreads : n;
}

// Exclusive scans of two values at once over the block (blockDim.x a multiple of 32, <= 1024): shuffles within
// each warp, then one warp over the warp totals; 3 barriers (the Hillis-Steele scan over shared memory this
// replaces took 20 per value, 40 per plan, with 1024 threads each). Integer sums: the same results in any order.
// warp_tot: 32 entries of shared memory, reusable when it returns.
__device__ __forceinline__ int2 block_exclusive_scan2(int32_t v0, int32_t v1, int2* warp_tot) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int32_t a = v0, b = v1;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t x = __shfl_up_sync(0xFFFFFFFFu, a, o), y = __shfl_up_sync(0xFFFFFFFFu, b, o);
    if (lane >= o) { a += x; b += y; }
  }
  if (lane == 31) warp_tot[warp] = make_int2(a, b);
  __syncthreads();
  if (warp == 0) {
    const int2 mine = lane < warps ? warp_tot[lane] : make_int2(0, 0);
    int32_t ta = mine.x, tb = mine.y;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int32_t x = __shfl_up_sync(0xFFFFFFFFu, ta, o), y = __shfl_up_sync(0xFFFFFFFFu, tb, o);
      if (lane >= o) { ta += x; tb += y; }
    }
    if (lane < warps) warp_tot[lane] = make_int2(ta - mine.x, tb - mine.y);  // each warp's exclusive base
  }
  __syncthreads();
  const int2 base = warp_tot[warp];
  __syncthreads();
  return make_int2(base.x + a - v0, base.y + b - v1);
}

// offsets[E] / tile_offsets[E], and what follows from them: the shared expert as expert E (offsets[E + 1]) or
// its own trivial plan {0, T}.
__device__ __forceinline__ void write_plan_tail(const PlanArgs& a, int32_t routed_rows, int32_t routed_tiles) {
  const int32_t shared_tiles = (a.tokens + kGemmBlockM - 1) / kGemmBlockM;
  a.offsets[a.experts] = routed_rows;
  a.tile_offsets[a.experts] = routed_tiles;
  if (a.append_shared) {
    a.offsets[a.experts + 1] = routed_rows + a.tokens;
    a.tile_offsets[a.experts + 1] = routed_tiles + shared_tiles;
  }
  if (a.shared_offsets) {
    a.shared_offsets[0] = 0;
    a.shared_offsets[1] = a.tokens;
    a.shared_tile_offsets[0] = 0;
    a.shared_tile_offsets[1] = shared_tiles;
  }
}

// Thread e of the block holds expert e's row count (0 past E; blockDim.x >= E): block scans give counts, offsets
// and tile offsets, and the last expert's thread writes the tail. Every thread of the block calls it; returns
// offsets[e]. write_global false: nothing is written to global memory; routed_rows (shared memory, or nullptr)
// receives offsets[E] either way (visible after the caller's next barrier).
__device__ __forceinline__ int32_t write_expert_offsets(const PlanArgs& a, int32_t total, int2* warp_tot,
                                                        bool write_global = true, int32_t* routed_rows = nullptr) {
  const int e = threadIdx.x;
  const int32_t tiles = (total + kGemmBlockM - 1) / kGemmBlockM;
  const int2 scanned = block_exclusive_scan2(total, tiles, warp_tot);
  const int32_t off = scanned.x, toff = scanned.y;
  if (write_global && e < a.experts) {
    a.counts[e] = total;
    a.offsets[e] = off;
    a.tile_offsets[e] = toff;
  }
  if (e == a.experts - 1) {
    if (write_global) write_plan_tail(a, off + total, toff + tiles);
    if (routed_rows) *routed_rows = off + total;
  }
  return off;
}

// The whole plan in one block when the pairs fit in shared memory (decode: T * k <= kSmallPlanPairs): the same
// counts, offsets, perm and inv as the three kernels above (a pair's row = offsets[e] + the number of earlier
// pairs with expert e), in one launch instead of three. A block of plan_block_threads(E) or more threads (at
// least one per expert), all of them calling. ids: the pairs' experts, a.topk_ids or (fused with the routing) a
// shared-memory copy of them, which spares a round trip to read back what the block has just written.
// write_global false: the plan stays in the block (the redundant blocks of the fused route + plan + gather);
// perm_smem / routed_rows_smem (or nullptr): shared memory that receives perm and offsets[E] either way (read
// them after a barrier).
__device__ __forceinline__ void plan_small_block(const PlanArgs& a, int pairs, const int32_t* ids,
                                                 bool write_global = true, int32_t* perm_smem = nullptr,
                                                 int32_t* routed_rows_smem = nullptr) {
  __shared__ int32_t hist[kMaxExperts];
  __shared__ int2 warp_tot[32];
  __shared__ int32_t sid[kSmallPlanPairs];
  const int tid = threadIdx.x, threads = blockDim.x;
  for (int e = tid; e < a.experts; e += threads) hist[e] = 0;
  __syncthreads();
  for (int p = tid; p < pairs; p += threads) {
    int e = ids[p];
    if (e < 0 || e >= a.experts) e = -1;
    sid[p] = e;
    if (e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  // hist[] is read above and written below: the scans' barriers lie between.
  const int32_t off =
      write_expert_offsets(a, tid < a.experts ? hist[tid] : 0, warp_tot, write_global, routed_rows_smem);
  if (tid < a.experts) hist[tid] = off;  // from here on: the expert's first row
  __syncthreads();
  // A pair's row = its expert's first row + the number of earlier pairs with that expert. One warp walks the pairs
  // 32 at a time, in order: within 32, __match_any_sync gives the lanes of the same expert (the rank is the count
  // of those below), and the group's lowest lane advances the expert's next row for the later groups. O(pairs)
  // dependent steps; each pair counting its earlier pairs (O(pairs^2)) was 8.5 us of qwen3-235b T = 64 (512 pairs,
  // 128 threads) on an H100 (bench/results/a237e0f-x16c-routing-stages-h100/).
  if (tid < 32) {
    const int lane = tid;
    for (int first_pair = 0; first_pair < pairs; first_pair += 32) {
      const int p = first_pair + lane;
      const int e = p < pairs ? sid[p] : -1;
      const uint32_t same = __match_any_sync(0xFFFFFFFFu, e);
      const int below = __popc(same & ((1u << lane) - 1u));
      const int expert_row = e >= 0 ? hist[e] : 0;
      __syncwarp();  // every lane has read hist before the group's lowest lane advances it
      if (e >= 0 && below == 0) hist[e] = expert_row + __popc(same);
      __syncwarp();  // the next 32 pairs read the advanced rows
      if (p >= pairs) continue;
      if (e < 0) {
        if (write_global) a.inv[p] = -1;
        continue;
      }
      const int row = expert_row + below;
      if (write_global) {
        a.perm[row] = p;
        a.inv[p] = row;
      }
      if (perm_smem) perm_smem[row] = p;
    }
  }
}

// One token's plan (T = 1, ids = the routing's k slots: distinct experts, or -1 / out of range for a slot without
// one): every count is 0 or 1, so expert e's first row (and first 1-row tile) is the number of chosen experts
// below e, which each expert's thread counts over the k ids itself (k <= 32 compares of shared-memory
// broadcasts), in place of plan_small_block's histogram, atomics, block scans and pair loop (3600 cycles at 128
// experts: docs/gemm.md, "Route stops"). The same counts, offsets, tile offsets, perm and inv (a slot's pair is
// p = j; perm lists the chosen experts' slots in expert order). No barrier and no shared memory of its own, so
// that the warp-streaming GEMM's T = 1 routing (sm90_nvfp4_warp_stream_gemm.cuh) calls it too; every thread of
// the block may call it (threads stride over the experts), ids visible to all; perm_smem / routed_rows_smem
// are visible after the caller's next barrier. (Until the twenty-fifth session: a ballot per warp, the words in
// static shared memory, a barrier and popcounts: the same integers.)
__device__ __forceinline__ void plan_one_token_block(const PlanArgs& a, const int32_t* ids, bool write_global,
                                                     int32_t* perm_smem, int32_t* routed_rows_smem) {
  const int K = a.top_k;
  for (int e = threadIdx.x; e < a.experts; e += blockDim.x) {
    int slot = -1;
    int32_t below = 0;
    for (int j = 0; j < K; ++j) {
      const int id = ids[j];
      if (id == e) slot = j;  // the routing's experts are distinct: at most one slot matches
      below += (id >= 0 && id < e) ? 1 : 0;
    }
    const int32_t count = slot >= 0 ? 1 : 0;
    if (write_global) {
      a.counts[e] = count;
      a.offsets[e] = below;
      a.tile_offsets[e] = below;  // ceil(count / kGemmBlockM) = count for counts of 0 and 1
    }
    if (e == a.experts - 1) {
      if (write_global) write_plan_tail(a, below + count, below + count);
      if (routed_rows_smem) *routed_rows_smem = below + count;
    }
    if (slot >= 0) {
      if (write_global) {
        a.perm[below] = slot;
        a.inv[slot] = below;
      }
      if (perm_smem) perm_smem[below] = slot;
    }
  }
  const int j = threadIdx.x;
  if (write_global && j < K && (ids[j] < 0 || ids[j] >= a.experts)) a.inv[j] = -1;
}

// The plan of a few tokens' pairs (pairs <= 32: the routed GEMM1 at T = 2 .. 4, Sm90GemmArgs::a_routed_token_rows)
// without plan_small_block's static shared memory (the GEMM's shared memory is all dynamic): thread e counts
// expert e's pairs over the ids itself, write_expert_offsets scans the counts and tile counts (warp_tot: 32 int2
// of the caller's scratch), and thread e then places its pairs in pair order. The same counts, offsets, tile
// offsets, tail, perm and inv as plan_small_block (a pair's row = offsets[e] + its earlier pairs with e). Every
// thread of a block of >= experts threads (a multiple of 32, <= 1024) calls it; ids visible to all.
__device__ __forceinline__ void plan_few_tokens_block(const PlanArgs& a, const int32_t* ids, int pairs,
                                                      int2* warp_tot) {
  const int e = threadIdx.x;
  int32_t count = 0;
  if (e < a.experts)
    for (int p = 0; p < pairs; ++p) count += ids[p] == e ? 1 : 0;
  const int32_t off = write_expert_offsets(a, count, warp_tot);
  if (count > 0) {
    int32_t row = off;
    for (int p = 0; p < pairs; ++p) {
      if (ids[p] != e) continue;
      a.perm[row] = p;
      a.inv[p] = row;
      ++row;
    }
  }
  if (e < pairs && (ids[e] < 0 || ids[e] >= a.experts)) a.inv[e] = -1;
}

}  // namespace nvfp4moe::cuda::kernels
