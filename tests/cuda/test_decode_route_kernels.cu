// Device tests of the decode routing kernels' building blocks on the GPU, each against a second form of the same
// function: the one-token plan plan_one_token_block (the routing kernels' plan at T = 1) writes exactly what
// plan_small_block (their plan at T >= 2) writes for the same ids, every global array and the shared-memory perm
// / row count the fused kernel reads; rank_among_keys (route_block's count) equals the short-circuit form of the
// count on adversarial keys; warp_kept_groups (route_block's group selection) keeps the groups that the
// serial form (group_top2_sum per group, then the ranks) keeps. The layer tests cover the kernels end to end against
// the CPU reference.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/moe_kernels.h"
#include "cuda/route_rank.h"
#include "cuda/sm90_nvfp4_plan_block.cuh"
#include "cuda/sm90_nvfp4_route.cuh"
#include "support/cuda_test_support.h"
#include "support/grouped_route_keys.h"

namespace nvfp4moe::cuda {
namespace {

using test::DevBuf;

// One block plans one token's k ids (copied to shared memory first, as the routing leaves them) with either
// function; the shared-memory outputs are copied out after the block's barrier.
template <bool ONE_TOKEN>
__global__ void plan_probe_kernel(PlanArgs a, const int32_t* ids, int32_t* perm_smem_out, int32_t* rows_out) {
  __shared__ int32_t sids[kSmallPlanPairs];
  __shared__ int32_t perm_smem[kSmallPlanPairs];
  __shared__ int32_t rows;
  for (int i = threadIdx.x; i < a.top_k; i += blockDim.x) sids[i] = ids[i];
  for (int i = threadIdx.x; i < kSmallPlanPairs; i += blockDim.x) perm_smem[i] = -7;
  if (threadIdx.x == 0) rows = -7;
  __syncthreads();
  if constexpr (ONE_TOKEN) kernels::plan_one_token_block(a, sids, true, perm_smem, &rows);
  else kernels::plan_small_block(a, a.top_k, sids, true, perm_smem, &rows);
  __syncthreads();
  for (int i = threadIdx.x; i < a.top_k; i += blockDim.x) perm_smem_out[i] = perm_smem[i];
  if (threadIdx.x == 0) *rows_out = rows;
}

struct PlanResult {
  std::vector<int32_t> counts, offsets, tile_offsets, perm, inv, shared_offsets, shared_tile_offsets, perm_smem, rows;
  bool operator==(const PlanResult&) const = default;
};

// PlanArgs over one set of output buffers (T tokens, K slots, E experts; offsets and tile offsets hold E + 2).
PlanArgs plan_args(int T, int K, int E, const int32_t* ids, DevBuf<int32_t>& counts, DevBuf<int32_t>& offsets,
                   DevBuf<int32_t>& tiles, DevBuf<int32_t>& perm, DevBuf<int32_t>& inv) {
  PlanArgs a;
  a.topk_ids = ids;
  a.tokens = T;
  a.top_k = K;
  a.experts = E;
  a.counts = counts.p;
  a.offsets = offsets.p;
  a.tile_offsets = tiles.p;
  a.perm = perm.p;
  a.inv = inv.p;
  return a;
}

template <bool ONE_TOKEN>
PlanResult run_plan(const std::vector<int32_t>& ids, int experts, int threads, bool append_shared, bool shared) {
  const int K = static_cast<int>(ids.size());
  DevBuf<int32_t> d_ids(ids), counts(experts), offsets(experts + 2), tiles(experts + 2), perm(K), inv(K), soff(2),
      stiles(2), perm_smem(K), rows(1);
  for (auto* b : {&counts, &offsets, &tiles, &perm, &inv, &soff, &stiles, &perm_smem, &rows})
    EXPECT_EQ(cudaMemset(b->p, 0x55, b->n * sizeof(int32_t)), cudaSuccess);  // untouched entries stay 0x55555555
  PlanArgs a = plan_args(1, K, experts, d_ids.p, counts, offsets, tiles, perm, inv);
  a.shared_offsets = shared ? soff.p : nullptr;
  a.shared_tile_offsets = shared ? stiles.p : nullptr;
  a.append_shared = append_shared;
  plan_probe_kernel<ONE_TOKEN><<<1, threads>>>(a, d_ids.p, perm_smem.p, rows.p);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return {counts.get(), offsets.get(), tiles.get(), perm.get(), inv.get(), soff.get(), stiles.get(),
          perm_smem.get(), rows.get()};
}

TEST(DecodeRouteKernels, OneTokenPlanEqualsPlanSmallBlock) {
  std::mt19937 rng(4242);
  int cases = 0;
  for (int experts : {1, 8, 40, 128, 160, 256, 300, 1024}) {
    for (int K : {1, 2, 6, 8, 16}) {
      if (K > experts) continue;
      for (int pattern = 0; pattern < 4; ++pattern) {
        // The routing's ids: K distinct experts in slot order; pattern 1: some slots without an expert (-1, as
        // when fewer than k experts are valid); 2: ids out of range (never from the routing; both plans drop
        // them); 3: no expert at all.
        std::vector<int32_t> all(experts);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        std::vector<int32_t> ids(all.begin(), all.begin() + K);
        for (int j = 0; j < K; ++j) {
          if (pattern == 1 && j % 3 == 2) ids[j] = -1;
          if (pattern == 2 && j % 2 == 1) ids[j] = experts + j;
          if (pattern == 3) ids[j] = -1;
        }
        const int base_threads = kernels::plan_block_threads(experts);
        for (int threads : {base_threads, 1024}) {
          for (int shared = 0; shared < 3; ++shared) {  // 0: none, 1: its own plan {0, T}, 2: expert E
            SCOPED_TRACE(::testing::Message() << "E=" << experts << " k=" << K << " pattern " << pattern
                                              << " threads " << threads << " shared " << shared);
            const PlanResult ref = run_plan<false>(ids, experts, threads, shared == 2, shared == 1);
            const PlanResult got = run_plan<true>(ids, experts, threads, shared == 2, shared == 1);
            EXPECT_EQ(got.counts, ref.counts);
            EXPECT_EQ(got.offsets, ref.offsets);
            EXPECT_EQ(got.tile_offsets, ref.tile_offsets);
            EXPECT_EQ(got.perm, ref.perm);
            EXPECT_EQ(got.inv, ref.inv);
            EXPECT_EQ(got.shared_offsets, ref.shared_offsets);
            EXPECT_EQ(got.shared_tile_offsets, ref.shared_tile_offsets);
            EXPECT_EQ(got.perm_smem, ref.perm_smem);
            EXPECT_EQ(got.rows, ref.rows);
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 500);
}

// Thread e: expert e's rank among the Ep keys both ways (keys staged in shared memory as route_block has them),
// route_block's form and the short-circuit one.
__global__ void rank_probe_kernel(const float* keys, int Ep, int32_t* rank_short_circuit, int32_t* rank_branch_free) {
  __shared__ __align__(16) float kt[1024];
  for (int i = threadIdx.x; i < Ep; i += blockDim.x) kt[i] = keys[i];
  __syncthreads();
  const int e = threadIdx.x;
  if (e >= Ep) return;
  const float k = kt[e];
  int rank = -1, rank2 = -1;
  if (k == k) {
    rank = rank_among_keys_short_circuit(kt, Ep / 4, e, k);
    rank2 = rank_among_keys(kt, Ep / 4, e, k);
  }
  rank_short_circuit[e] = rank;
  rank_branch_free[e] = rank2;
}

TEST(DecodeRouteKernels, BranchFreeRankEqualsShortCircuitOnDevice) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int experts : {1, 8, 32, 40, 128, 256, 384, 1024}) {
    const int Ep = (experts + 31) / 32 * 32;
    for (int pattern = 0; pattern < 8; ++pattern) {
      SCOPED_TRACE(::testing::Message() << "E=" << experts << " pattern " << pattern);
      std::vector<float> keys(Ep, nan);
      for (int e = 0; e < experts; ++e) {
        const float x = normal(rng);
        float v = x;
        switch (pattern) {
          case 0: v = x; break;
          case 1: v = 0.5f; break;
          case 2: v = std::round(x) * 0.5f; break;
          case 3: v = (e % 3 == 0) ? 0.0f : (e % 3 == 1) ? -0.0f : std::round(x); break;
          case 4: v = (e % 5 == 0) ? -inf : (e % 11 == 3) ? inf : x; break;
          case 5: v = (e % 4 == 1) ? nan : std::round(x); break;
          case 6: v = (e < 3) ? x : nan; break;
          default: v = -inf; break;
        }
        keys[e] = v;
      }
      DevBuf<float> d_keys(keys);
      DevBuf<int32_t> r1(Ep), r2(Ep);
      rank_probe_kernel<<<1, Ep>>>(d_keys.p, Ep, r1.p, r2.p);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto a = r1.get(), b = r2.get();
      EXPECT_EQ(a, b);
      for (int e = 0; e < Ep; ++e) EXPECT_EQ(b[e] < 0, !(keys[e] == keys[e])) << e;  // ranked iff not NaN
    }
  }
}

// One warp: the kept groups of E keys in G groups by warp_kept_groups, and by the serial form route_block used
// before it (group_top2_sum by one thread a group, then each group's rank among the valid scores).
__global__ void kept_groups_probe_kernel(const float* keys, int E, int G, int topk_group, uint32_t* warp_form,
                                         uint32_t* serial_form) {
  __shared__ float k[1024];
  __shared__ float score[32];
  const int lane = threadIdx.x;
  for (int i = lane; i < E; i += 32) k[i] = keys[i];
  __syncwarp();
  const uint32_t w = kernels::warp_kept_groups(k, E, G, topk_group, lane);
  if (lane < G) score[lane] = group_top2_sum(k + lane * (E / G), E / G);
  __syncwarp();
  if (lane == 0) {
    uint32_t kept = 0u;
    for (int g = 0; g < G; ++g) {
      const float v = score[g];
      int rank = 0;
      for (int u = 0; u < G; ++u) {
        const float su = score[u];
        rank += (!(su != su || su == -INFINITY) && (su > v || (su == v && u < g))) ? 1 : 0;
      }
      if (!(v != v || v == -INFINITY) && rank < topk_group) kept |= 1u << g;
    }
    *warp_form = w;
    *serial_form = kept;
  }
}

TEST(DecodeRouteKernels, WarpKeptGroupsEqualSerialGroupSelection) {
  std::mt19937 rng(7);
  int cases = 0, differing_masks = 0;
  for (auto [E, G] : test::grouped_route_shapes())
    for (int pattern = 0; pattern < test::kGroupedRouteKeyPatterns; ++pattern)
      for (int topk_group : {1, G / 2 > 0 ? G / 2 : 1, G}) {
        SCOPED_TRACE(::testing::Message() << "E=" << E << " G=" << G << " topk_group=" << topk_group << " pattern "
                                          << pattern);
        DevBuf<float> d_keys(test::grouped_route_keys(E, E / G, pattern, rng));
        DevBuf<uint32_t> w(1), s(1);
        kept_groups_probe_kernel<<<1, 32>>>(d_keys.p, E, G, topk_group, w.p, s.p);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const uint32_t a = w.get()[0], b = s.get()[0];
        EXPECT_EQ(a, b);
        differing_masks += (b != 0u && b != (G == 32 ? ~0u : (1u << G) - 1u)) ? 1 : 0;
        ++cases;
      }
  EXPECT_EQ(cases, 14 * test::kGroupedRouteKeyPatterns * 3);
  EXPECT_GT(differing_masks, 100);  // most cases keep some groups and not others: the masks are compared, not trivial
}

}  // namespace
}  // namespace nvfp4moe::cuda
