// Launchers of the MoE layer's kernels (one translation unit for all of them: the build machine is small).
// Each checks its arguments, launches with a fixed or shape-derived grid (never a routing-derived one), with
// programmatic dependent launch (launch_pdl.cuh), and returns the launch's status.
#include "cuda/moe_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/sm80_nvfp4_grouped_gemm_mma.cuh"
#include "cuda/sm90_nvfp4_combine.cuh"
#include "cuda/sm90_nvfp4_gather_quant.cuh"
#include "cuda/sm90_nvfp4_plan.cuh"
#include "cuda/sm90_nvfp4_route.cuh"

namespace nvfp4moe::cuda {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("NVFP4MOE_PDL");
    return v == nullptr || v[0] == '\0' || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

int device_sm_count() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  static int cached[64] = {};
  if (dev < 0 || dev >= 64) return 132;
  if (cached[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 132;
    cached[dev] = n;
  }
  return cached[dev];
}

cudaError_t launch_route(const RouteArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0) return cudaSuccess;
  if (!a.logits || !a.topk_ids || !a.topk_weights || a.experts <= 0 || a.experts > kMaxExperts || a.top_k <= 0 ||
      a.top_k > a.experts)
    return cudaErrorInvalidValue;
  const size_t smem = kernels::kRouteWarps * kernels::route_smem_per_warp(a.experts);
  const int grid = (a.tokens + kernels::kRouteWarps - 1) / kernels::kRouteWarps;
  return launch_pdl(kernels::route_kernel, dim3(grid), dim3(kernels::kRouteWarps * 32), smem, stream, a);
}

cudaError_t launch_copy_topk(const int32_t* ids, const float* weights, int pairs, int experts, int32_t* ids_out,
                             float* weights_out, cudaStream_t stream) {
  if (pairs <= 0) return cudaSuccess;
  if (!ids || !weights || !ids_out || !weights_out) return cudaErrorInvalidValue;
  const int grid = std::min((pairs + 255) / 256, device_sm_count() * 4);
  return launch_pdl(kernels::copy_topk_kernel, dim3(grid), dim3(256), 0, stream, ids, weights, pairs, experts,
                    ids_out, weights_out);
}

cudaError_t launch_plan(const PlanArgs& a, cudaStream_t stream) {
  const int pairs = a.tokens * a.top_k;
  if (pairs <= 0) return cudaSuccess;
  if (a.experts <= 0 || a.experts > kMaxExperts) return cudaErrorInvalidValue;
  if (pairs <= kSmallPlanPairs)
    return launch_pdl(kernels::plan_small_kernel, dim3(1), dim3(kernels::plan_block_threads(a.experts)), 0, stream, a,
                      pairs);
  const int chunks = static_cast<int>(plan_chunks(pairs));
  cudaError_t err = launch_pdl(kernels::plan_count_kernel, dim3(chunks), dim3(kPlanChunk), 0, stream, a.topk_ids,
                               pairs, a.experts, a.chunk_counts);
  if (err != cudaSuccess) return err;
  err = launch_pdl(kernels::plan_scan_kernel, dim3(1), dim3(kernels::plan_block_threads(a.experts)), 0, stream, a,
                   chunks);
  if (err != cudaSuccess) return err;
  return launch_pdl(kernels::plan_scatter_kernel, dim3(chunks), dim3(kPlanChunk), 0, stream, a, pairs);
}

namespace kernels {
inline constexpr size_t kFusedRouteSmemBytes = 36 * 1024;  // + the plan's 10 KB of static shared memory < 48 KB

__global__ void __launch_bounds__(kScanThreads) route_plan_small_kernel(RouteArgs r, PlanArgs a, int pairs) {
  pdl_wait_then_allow_next();
  extern __shared__ __align__(16) uint8_t route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp < r.tokens)
    route_token(r, warp, route_smem + static_cast<size_t>(warp) * route_smem_per_warp(r.experts), lane);
  __syncthreads();  // the routing's ids (global memory) are visible to the whole block from here on
  plan_small_block(a, pairs);
}
}  // namespace kernels

cudaError_t launch_route_plan(const RouteArgs& r, const PlanArgs& a, cudaStream_t stream) {
  const int pairs = a.tokens * a.top_k;
  const size_t smem = static_cast<size_t>(r.tokens) * kernels::route_smem_per_warp(r.experts);
  const bool fused = r.tokens > 0 && r.tokens <= kFusedRoutePlanTokens && pairs <= kSmallPlanPairs &&
                     smem <= kernels::kFusedRouteSmemBytes && r.tokens == a.tokens && r.top_k == a.top_k &&
                     r.experts == a.experts && r.topk_ids == a.topk_ids;
  if (!fused) {
    const cudaError_t err = launch_route(r, stream);
    return err != cudaSuccess ? err : launch_plan(a, stream);
  }
  if (!r.logits || !r.topk_weights || r.experts > kMaxExperts || r.top_k > r.experts) return cudaErrorInvalidValue;
  return launch_pdl(kernels::route_plan_small_kernel, dim3(1), dim3(kernels::plan_block_threads(a.experts, r.tokens)),
                    smem, stream, r, a, pairs);
}

cudaError_t launch_gather(const GatherArgs& a, cudaStream_t stream) {
  if (a.max_rows <= 0) return cudaSuccess;
  if (!a.hidden || !a.out || !a.offsets || a.hidden_size % 16 != 0) return cudaErrorInvalidValue;
  if (a.gate_out && !a.gate_weight) return cudaErrorInvalidValue;
  if (a.append_shared && !a.perm) return cudaErrorInvalidValue;
  const int64_t chunks = a.gate_out ? 1 : (a.hidden_size + kernels::kGatherChunkCols - 1) / kernels::kGatherChunkCols;
  const int64_t items = static_cast<int64_t>(a.max_rows) * chunks;
  const int grid = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((items + kernels::kGatherWarps - 1) / kernels::kGatherWarps, device_sm_count() * 8)));
  const dim3 block(kernels::kGatherWarps * 32);
  return a.hidden_f32 ? launch_pdl(kernels::gather_kernel<true>, dim3(grid), block, 0, stream, a)
                      : launch_pdl(kernels::gather_kernel<false>, dim3(grid), block, 0, stream, a);
}

cudaError_t launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.max_tiles <= 0) return cudaSuccess;
  if (!a.a || !a.w || !a.w_scale || !a.offsets || !a.tile_offsets || !a.alpha0 || !a.out || a.n <= 0 ||
      a.k <= 0 || a.k % 16 != 0 || a.n % 16 != 0 || a.experts <= 0)
    return cudaErrorInvalidValue;
  if (a.epilogue == GemmEpilogue::kSwiGLU && (!a.alpha1 || (a.n / 2) % 16 != 0)) return cudaErrorInvalidValue;
  const int grid = std::max(1, std::min(a.max_tiles, device_sm_count() * 8));
  const dim3 block(kernels::kMmaThreads);
  switch (a.epilogue) {
    case GemmEpilogue::kF32:
      return launch_pdl(kernels::grouped_gemm_mma_kernel<GemmEpilogue::kF32>, dim3(grid), block, 0, stream, a);
    case GemmEpilogue::kSwiGLU:
      return launch_pdl(kernels::grouped_gemm_mma_kernel<GemmEpilogue::kSwiGLU>, dim3(grid), block, 0, stream, a);
    case GemmEpilogue::kRelu2:
      return launch_pdl(kernels::grouped_gemm_mma_kernel<GemmEpilogue::kRelu2>, dim3(grid), block, 0, stream, a);
  }
  return cudaErrorInvalidValue;
}

namespace kernels {
inline constexpr int kActAmaxWarps = 8;

// One warp per row (grid-stride over rows, so the grid is fixed); each lane one 16-element block at a time.
__global__ void __launch_bounds__(kActAmaxWarps * 32) act_amax_kernel(ActAmaxArgs a) {
  pdl_wait_then_allow_next();
  const int lane = threadIdx.x & 31;
  const int rows = a.offsets[a.experts];
  for (int r = blockIdx.x * kActAmaxWarps + (threadIdx.x >> 5); r < rows; r += gridDim.x * kActAmaxWarps) {
    // Invariant offsets[lo] <= r < offsets[hi]: ends at the expert that owns row r (skipping empty ones).
    int lo = 0, hi = a.experts;
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (a.offsets[mid] <= r) lo = mid;
      else hi = mid;
    }
    const int e = lo;
    uint16_t* row = a.act + static_cast<size_t>(r) * a.cols;
    const float gs = a.gs ? a.gs[e] : 0.0f;
    float amax = 0.0f;
    for (int col = lane * 16; col < a.cols; col += 32 * 16) {
      float x[16];
      uint32_t bits[8];
      load_block16<false>(row, col, x, bits);
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
      if (a.gs) {
        quant_block16_operand(x, gs, bits);
        uint4* d = reinterpret_cast<uint4*>(row + col);
        d[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
        d[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (lane == 0 && amax > 0.0f) atomicMax(reinterpret_cast<int*>(a.amax + e), __float_as_int(amax));
  }
}
}  // namespace kernels

cudaError_t launch_act_amax(const ActAmaxArgs& a, cudaStream_t stream) {
  if (a.max_rows <= 0) return cudaSuccess;
  if (!a.act || !a.offsets || !a.amax || a.experts <= 0 || a.cols <= 0 || a.cols % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(a.act) & 15) != 0)
    return cudaErrorInvalidValue;
  const int grid = std::max(1, std::min((a.max_rows + kernels::kActAmaxWarps - 1) / kernels::kActAmaxWarps,
                                        device_sm_count() * 8));
  return launch_pdl(kernels::act_amax_kernel, dim3(grid), dim3(kernels::kActAmaxWarps * 32), 0, stream, a);
}

cudaError_t launch_combine(const CombineArgs& a, cudaStream_t stream) {
  if (a.tokens <= 0) return cudaSuccess;
  if (!a.out || !a.inv || !a.topk_weights || a.hidden_size % 4 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = static_cast<int64_t>(a.tokens) *
                         ((a.hidden_size + kernels::kCombineCols - 1) / kernels::kCombineCols);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_pdl(kernels::combine_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kernels::kCombineThreads), 0,
                    stream, a);
}

}  // namespace nvfp4moe::cuda
