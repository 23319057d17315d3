// Launchers of the MoE layer's kernels (one translation unit for all of them: the build machine is small).
// Each checks its arguments, launches with a fixed or shape-derived grid (never a routing-derived one), with
// programmatic dependent launch (launch_pdl.cuh), and returns the launch's status.
#include "cuda/moe_kernels.h"
#include "nvfp4moe/error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cuda/sm80_nvfp4_grouped_gemm_mma.cuh"
#include "cuda/sm90_nvfp4_combine.cuh"
#include "cuda/sm90_nvfp4_gather_quant.cuh"
#include "cuda/sm90_nvfp4_plan.cuh"
#include "cuda/sm90_nvfp4_route.cuh"

namespace nvfp4moe::cuda {

bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || v[0] == '\0' || std::strcmp(v, "0") != 0;
}

bool env_opt_in(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

bool pdl_enabled() {
  static const bool enabled = env_switch("NVFP4MOE_PDL");
  return enabled;
}

namespace {
bool block_route_enabled() {
  static const bool on = env_switch("NVFP4MOE_BLOCK_ROUTE");
  return on;
}
int block_route_max_tokens_from_env() {
  const char* v = std::getenv("NVFP4MOE_BLOCK_ROUTE_MAX_TOKENS");
  return parse_block_route_max_tokens(v ? v : "");
}
}  // namespace

bool parse_env_decimal(const std::string& t, long long lo, long long hi, long long* out) {
  if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos) return false;
  *out = std::stoll(t);
  return *out >= lo && *out <= hi;
}

int parse_block_route_max_tokens(const std::string& value) {
  if (value.empty()) return kBlockRouteMaxTokens;
  long long n = 0;
  if (!parse_env_decimal(value, 0, kFusedRoutePlanTokens, &n))
    throw ArgumentError("NVFP4MOE_BLOCK_ROUTE_MAX_TOKENS: expected a decimal integer in [0, " +
                        std::to_string(kFusedRoutePlanTokens) + "], got '" + value + "'");
  return static_cast<int>(n);
}

int block_route_max_tokens() {
  static const int n = block_route_max_tokens_from_env();
  return n;
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

namespace kernels {
// The routing kernel of T > kFusedRoutePlanTokens (a warp per token) and the caller ids' copy; their device
// functions are in sm90_nvfp4_route.cuh.
__global__ void route_kernel(RouteArgs a) {
  pdl_wait_then_allow_next();
  extern __shared__ __align__(16) uint8_t route_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= a.tokens) return;  // whole warp leaves together
  route_token(a, t, route_smem + static_cast<size_t>(warp) * route_smem_per_warp(a.experts), lane);
}

__global__ void copy_topk_kernel(const int32_t* __restrict__ ids, const float* __restrict__ weights, int pairs,
                                 int experts, int32_t* __restrict__ ids_out, float* __restrict__ weights_out) {
  pdl_wait_then_allow_next();
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += gridDim.x * blockDim.x) {
    const int id = ids[p];
    const bool ok = id >= 0 && id < experts;
    ids_out[p] = ok ? id : -1;
    weights_out[p] = weights[p];
  }
}
}  // namespace kernels

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
// + the plan's 6.3 KB and the ids' 2 KB of static shared memory < 48 KB
inline constexpr size_t kFusedRouteSmemBytes = 36 * 1024;

// The routing of a one-block decode kernel: by the whole block (route_block) when block_route, else one warp
// per token (route_token). Every thread calls it; routed_ids receives the ids. Ends with a barrier.
// The warp routing here keeps the shared-memory argmax passes (register_topk false, so the register form is not
// compiled into these kernels at all): measured on an H100 (bench/results/32b85e3-register-topk-ab-h100/ and
// 26f9824-register-topk-check-h100/), the register form in this block took qwen3-30b / qwen3-235b T = 4 (128
// experts) from 47.3 / 124.8 us to 48.5 / 125.2, and a build that chose it at runtime above 128 experts, not
// running it at 128, to 49.1 / 126.6, while leaving it out of these kernels kept both at 47.4 / 124.8.
// route_kernel (T > 32) keeps the register form: -1.9..-2.5 us.
__device__ __forceinline__ void route_small(const RouteArgs& r, bool block_route, uint8_t* route_smem,
                                            int32_t* routed_ids, bool write_global) {
  if (block_route) {
    route_block(r, route_smem, routed_ids, write_global);
  } else {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp < r.tokens)
      route_token(r, warp, route_smem + static_cast<size_t>(warp) * route_smem_per_warp(r.experts), lane,
                  routed_ids, write_global, /*register_topk=*/false);
  }
  __syncthreads();  // the routing's ids are visible to the whole block from here on
}

__global__ void __launch_bounds__(kScanThreads) route_plan_small_kernel(RouteArgs r, PlanArgs a, int pairs,
                                                                        bool block_route) {
  pdl_wait_then_allow_next();
  extern __shared__ __align__(16) uint8_t route_smem[];
  __shared__ int32_t routed_ids[kSmallPlanPairs];  // the routing's ids, for the plan (also written to global)
  route_small(r, block_route, route_smem, routed_ids, true);
  if (a.tokens == 1) plan_one_token_block(a, routed_ids, true, nullptr, nullptr);  // k compares an expert
  else plan_small_block(a, pairs, routed_ids);
}
}  // namespace kernels

namespace {
// The one-block decode routing's shape: block routing when T <= kBlockRouteAnyTopKTokens, or T <=
// block_route_max_tokens() with top-k >= kBlockRouteMinTopK, and T * Ep fits a block
// (then the block has block_route_threads at least: T * Ep, and a statistics warp per token with the softmax),
// else a warp per token; the plan's one thread per expert either way.
struct SmallRouteShape {
  bool block_route = false;
  int threads = 0;
  size_t smem = 0;
};
SmallRouteShape small_route_shape(const RouteArgs& r, const PlanArgs& a) {
  SmallRouteShape s;
  const bool block_t = r.tokens <= std::min(kBlockRouteAnyTopKTokens, block_route_max_tokens()) ||
                       (r.tokens <= block_route_max_tokens() && r.top_k >= kBlockRouteMinTopK);
  s.block_route = block_route_enabled() && block_t &&
                  kernels::block_route_fits(r.tokens, r.experts);
  s.threads = kernels::plan_block_threads(a.experts, r.tokens);
  if (s.block_route) {
    s.threads = std::max(s.threads, kernels::block_route_threads(r.tokens, r.experts, r.kind == RouteKind::kSoftmax));
    s.smem = kernels::block_route_smem(r.tokens, r.experts, r.top_k);
  } else {
    s.smem = static_cast<size_t>(r.tokens) * kernels::route_smem_per_warp(r.experts);
  }
  return s;
}
bool route_plan_fusable(const RouteArgs& r, const PlanArgs& a, const SmallRouteShape& sh) {
  const int pairs = a.tokens * a.top_k;
  return r.tokens > 0 && r.tokens <= kFusedRoutePlanTokens && pairs <= kSmallPlanPairs &&
         sh.smem <= kernels::kFusedRouteSmemBytes && r.tokens == a.tokens && r.top_k == a.top_k &&
         r.experts == a.experts && r.topk_ids == a.topk_ids;
}
}  // namespace

cudaError_t launch_route_plan(const RouteArgs& r, const PlanArgs& a, cudaStream_t stream) {
  const int pairs = a.tokens * a.top_k;
  const SmallRouteShape sh = small_route_shape(r, a);
  if (!route_plan_fusable(r, a, sh)) {
    const cudaError_t err = launch_route(r, stream);
    return err != cudaSuccess ? err : launch_plan(a, stream);
  }
  if (!r.logits || !r.topk_weights || r.experts > kMaxExperts || r.top_k > r.experts) return cudaErrorInvalidValue;
  return launch_pdl(kernels::route_plan_small_kernel, dim3(1), dim3(sh.threads), sh.smem, stream, r, a, pairs,
                    sh.block_route);
}

namespace kernels {
// One token (T = 1): every row of the gather is token 0's, so a warp's first item (fixed by the grid) has its
// 16 columns per lane known before the routing: route_plan_gather_small_kernel loads them first and this
// finishes the item from them (gather_item's arithmetic and stores, without the Qwen2 gate, which never fuses).
// Only the 8 bf16 pairs stay live across the routing (the values are exactly those bf16 numbers, f32 input
// included: load_block16 rounds it first).
__device__ __forceinline__ void gather_item_loaded(const GatherArgs& g, int r, int e, int col, uint32_t (&bits)[8],
                                                   int lane) {
  float amax = 0.0f;
  if (col < g.hidden_size) {
    float x[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = fmt::bits_float(bits[i] << 16);
      x[2 * i + 1] = fmt::bits_float(bits[i] & 0xFFFF0000u);
    }
    amax = block16_absmax(x, amax);
    if (g.gs) quant_block16_operand(x, g.gs[e], bits);
    store_block16(g.out + static_cast<size_t>(r) * g.hidden_size + col, bits);
  }
  if (g.amax) warp_amax_to(amax, g.amax + e, lane);
}

// Routing + plan + gather at decode in one launch (no kernel boundary, and no round trip to memory, between
// them). Every block routes all T tokens and plans them in its own shared memory (a few microseconds of work
// that would otherwise be a launch and a dependency each); block 0 alone writes the routing and the plan to
// global memory, for the GEMMs and the combine. Then each block gathers its share of the rows, from the plan
// in its shared memory. The same routing, plan and rows as route_plan_small_kernel + gather_kernel.
// The T = 1 preload and the w4a4 scales in shared memory: turning both off measured -0.3..+0.75 us per layer
// at T = 1 (+0.75 on qwen3-235b, +0.4 on nemotron-nano; experiment 14, bench/results/deb21f8-x13-x14-ab).
template <bool F32>
__global__ void __launch_bounds__(kScanThreads) route_plan_gather_small_kernel(RouteArgs r, PlanArgs a, GatherArgs g,
                                                                               int pairs, bool block_route,
                                                                               int gs_smem_offset) {
  pdl_wait_then_allow_next();
  extern __shared__ __align__(16) uint8_t route_smem[];
  __shared__ int32_t routed_ids[kSmallPlanPairs];
  __shared__ int32_t plan_perm[kSmallPlanPairs];
  __shared__ int32_t plan_rows;
  const bool leader = blockIdx.x == 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = g.hidden_size, warps = blockDim.x >> 5;
  const int chunks = (H + kGatherChunkCols - 1) / kGatherChunkCols;
  // Loads that do not depend on the routing go out first, with the routing's own: (1) w4a4: the experts'
  // activation scales into shared memory (gs_smem_offset > 0; read per row once its expert is known: a
  // dependent global load otherwise), visible after route_small's barriers; (2) T = 1: this warp's first item.
  if (g.gs && gs_smem_offset > 0) {
    float* gs_smem = reinterpret_cast<float*>(route_smem + gs_smem_offset);
    const int n = g.experts + (g.append_shared ? 1 : 0);
    for (int i = threadIdx.x; i < n; i += blockDim.x) gs_smem[i] = __ldg(g.gs + i);
    g.gs = gs_smem;
  }
  const int item0 = blockIdx.x * warps + warp;
  const bool loaded = g.tokens == 1 && item0 < g.max_rows * chunks;
  const int col_loaded = (item0 % chunks) * kGatherChunkCols + lane * 16;
  uint32_t bits[8];
  if (loaded && col_loaded < H) {
    float x[16];
    load_block16<F32>(g.hidden, col_loaded, x, bits);
  }
  route_small(r, block_route, route_smem, routed_ids, leader);
  if (a.tokens == 1) plan_one_token_block(a, routed_ids, leader, plan_perm, &plan_rows);
  else plan_small_block(a, pairs, routed_ids, leader, plan_perm, &plan_rows);
  __syncthreads();  // plan_perm and plan_rows
  const int routed_rows = plan_rows;
  const int rows = routed_rows + (g.append_shared ? g.tokens : 0);
  const int items = rows * chunks;
  for (int item = item0; item < items; item += gridDim.x * warps) {
    const int row = item / chunks, col0 = (item % chunks) * kGatherChunkCols;
    int t, e;
    if (row < routed_rows) {
      const int p = plan_perm[row];
      t = p / g.top_k;
      e = routed_ids[p];
    } else {
      t = row - routed_rows;
      e = g.experts;  // the shared expert as expert E
    }
    if (loaded && item == item0) gather_item_loaded(g, row, e, col_loaded, bits, lane);
    else gather_item<F32>(g, row, t, e, col0, min(H, col0 + kGatherChunkCols), lane);
  }
}
}  // namespace kernels

namespace {
// Blocks of the fused route + plan + gather: one work item (row, 512 columns) per warp at the most rows this
// forward can have, at most kRoutePlanGatherMaxBlocks (every block routes and plans everything again, and holds
// its SM: a GEMM1 CTA, which needs a whole SM, cannot start its prologue there before the block has exited).
// Widening the blocks (warps beyond the routing's, up to 1024 threads, so that qwen3-235b / deepseek-v3 T = 4 and
// qwen3-30b T = 16 fit 16 blocks) measured slower than the two launches it replaced, +0.9..+3.1 us per layer
// (H100, bench/results/6289f73-wide-fused-gather-ab-h100): the form stays where the routing's threads suffice.
constexpr int kRoutePlanGatherMaxBlocks = 16;
int route_plan_gather_blocks(const GatherArgs& g, int threads) {
  const int64_t chunks = (g.hidden_size + kernels::kGatherChunkCols - 1) / kernels::kGatherChunkCols;
  const int64_t items = static_cast<int64_t>(g.max_rows) * chunks;
  return static_cast<int>(std::max<int64_t>(1, (items + threads / 32 - 1) / (threads / 32)));
}
bool route_plan_gather_fusable(const RouteArgs& r, const PlanArgs& a, const GatherArgs& g,
                               const SmallRouteShape& sh) {
  const int pairs = a.tokens * a.top_k;
  return route_plan_fusable(r, a, sh) && g.perm == a.perm && g.topk_ids == a.topk_ids &&
         g.offsets == a.offsets && g.tokens == a.tokens && g.top_k == a.top_k && g.experts == a.experts &&
         g.gate_out == nullptr && g.max_rows >= pairs && g.hidden_size > 0 &&
         route_plan_gather_blocks(g, sh.threads) <= kRoutePlanGatherMaxBlocks;
}
}  // namespace

bool route_plan_gather_fuses(const RouteArgs& r, const PlanArgs& a, const GatherArgs& g) {
  return route_plan_gather_fusable(r, a, g, small_route_shape(r, a));
}

cudaError_t launch_route_plan_gather(const RouteArgs& r, const PlanArgs& a, const GatherArgs& g,
                                     cudaStream_t stream) {
  const SmallRouteShape sh = small_route_shape(r, a);
  if (!route_plan_gather_fusable(r, a, g, sh)) {
    const cudaError_t err = launch_route_plan(r, a, stream);
    return err != cudaSuccess ? err : launch_gather(g, stream);
  }
  if (!r.logits || !r.topk_weights || r.experts > kMaxExperts || r.top_k > r.experts) return cudaErrorInvalidValue;
  if (!g.hidden || !g.out || g.hidden_size % 16 != 0) return cudaErrorInvalidValue;
  const int pairs = a.tokens * a.top_k;
  const int grid = route_plan_gather_blocks(g, sh.threads);
  // w4a4: the experts' activation scales after the routing's shared memory, where they fit.
  size_t smem = sh.smem;
  int gs_offset = 0;
  if (g.gs) {
    const size_t off = std::max<size_t>(16, (sh.smem + 15) / 16 * 16);
    const size_t end = off + static_cast<size_t>(g.experts + (g.append_shared ? 1 : 0)) * sizeof(float);
    if (end <= kernels::kFusedRouteSmemBytes) {
      gs_offset = static_cast<int>(off);
      smem = end;
    }
  }
  auto launch = [&](auto kernel) {
    return launch_pdl(kernel, dim3(grid), dim3(sh.threads), smem, stream, r, a, g, pairs, sh.block_route, gs_offset);
  };
  return g.hidden_f32 ? launch(kernels::route_plan_gather_small_kernel<true>)
                      : launch(kernels::route_plan_gather_small_kernel<false>);
}

cudaError_t launch_gather(const GatherArgs& a, cudaStream_t stream) {
  if (a.max_rows <= 0) return cudaSuccess;
  if (!a.hidden || !a.out || !a.offsets || a.hidden_size % 16 != 0) return cudaErrorInvalidValue;
  if (a.gate_out && !a.gate_weight) return cudaErrorInvalidValue;
  if (a.append_shared && !a.perm) return cudaErrorInvalidValue;
  if (a.token_major && (!a.perm || !a.inv || !a.topk_ids || a.gate_out)) return cudaErrorInvalidValue;
  const int64_t chunks = a.gate_out ? 1 : (a.hidden_size + kernels::kGatherChunkCols - 1) / kernels::kGatherChunkCols;
  const int64_t items = static_cast<int64_t>(a.token_major ? a.tokens : a.max_rows) * chunks;
  const int grid = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>((items + kernels::kGatherWarps - 1) / kernels::kGatherWarps, device_sm_count() * 8)));
  const dim3 block(kernels::kGatherWarps * 32);
  if (a.token_major)
    return a.hidden_f32 ? launch_pdl(kernels::gather_token_major_kernel<true>, dim3(grid), block, 0, stream, a)
                        : launch_pdl(kernels::gather_token_major_kernel<false>, dim3(grid), block, 0, stream, a);
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
      amax = block16_absmax(x, amax);
      if (a.gs) {
        quant_block16_operand(x, gs, bits);
        store_block16(row + col, bits);
      }
    }
    warp_amax_to(amax, a.amax + e, lane);
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
