// The decode block route's rank of one expert among a token's keys (route_block, sm90_nvfp4_route.cuh): the
// number of experts a with key[a] > key[e], or key[a] == key[e] and a < e. NaN keys (pads, experts outside the
// kept groups, NaN logits) are never counted. Ranks 0 .. k-1 are the top-k slots in order, exactly the k argmax
// passes of the warp path (ties to the lower id). Host and device: tests/cuda_host/test_route_rank.cpp checks
// it against that definition without a GPU.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "format/nvfp4.h"  // NVFP4_HD

#if defined(__CUDACC__)
#include <cuda_runtime.h>
#endif

namespace nvfp4moe::cuda {

// The short-circuit form (route_block's until 2026-12-04; kept as the tests' second form of the count): keys
// 4 * n4 floats (16-byte aligned on the device), k = keys[e] (not NaN). nvcc 13 (sm_90a) compiles it into
// predicates spilled into the bits of one register and read back, a chain of ~10 dependent instructions per key:
// 2.7 us of the T = 1 routing kernel at 128 experts, 6.4 us at 256 (clock stamps, docs/gemm.md "Route stops").
NVFP4_HD int rank_among_keys_short_circuit(const float* keys, int n4, int e, float k) {
  int rank = 0;
  for (int q = 0; q < n4; ++q) {
#if defined(__CUDA_ARCH__)
    const float4 u = reinterpret_cast<const float4*>(keys)[q];
    const float uv[4] = {u.x, u.y, u.z, u.w};
#else
    const float uv[4] = {keys[4 * q], keys[4 * q + 1], keys[4 * q + 2], keys[4 * q + 3]};
#endif
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int ai = 4 * q + i;
      rank += (uv[i] > k || (uv[i] == k && ai < e)) ? 1 : 0;
    }
  }
  return rank;
}

// The four-counter count both ranks share: the keys a (4 * n4 floats, 16-byte aligned on the device) with
// key > k, or key == k and tie id < id, where ids(q, i) fills the tie ids of keys 4q .. 4q + 3 (their positions,
// or stored expert ids). Four counters (one per float4 lane) and the compares joined by & and | instead of || /
// &&: ~90 SASS per 16 keys in four independent chains, no register bitmask (measured on the H200 against the
// short-circuit form: qwen3-30b T = 1 -1.5 us, deepseek-v3 -3.2 us per layer;
// bench/results/7bcce2f-route-variants-ab/).
template <class TieIds>
NVFP4_HD int count_before(const float* keys, int n4, int id, float k, const TieIds& ids) {
  int r0 = 0, r1 = 0, r2 = 0, r3 = 0;
  for (int q = 0; q < n4; ++q) {
#if defined(__CUDA_ARCH__)
    const float4 v = reinterpret_cast<const float4*>(keys)[q];
    const float u0 = v.x, u1 = v.y, u2 = v.z, u3 = v.w;
#else
    const float u0 = keys[4 * q], u1 = keys[4 * q + 1], u2 = keys[4 * q + 2], u3 = keys[4 * q + 3];
#endif
    int i[4];
    ids(q, i);
    r0 += static_cast<int>(u0 > k) | (static_cast<int>(u0 == k) & static_cast<int>(i[0] < id));
    r1 += static_cast<int>(u1 > k) | (static_cast<int>(u1 == k) & static_cast<int>(i[1] < id));
    r2 += static_cast<int>(u2 > k) | (static_cast<int>(u2 == k) & static_cast<int>(i[2] < id));
    r3 += static_cast<int>(u3 > k) | (static_cast<int>(u3 == k) & static_cast<int>(i[3] < id));
  }
  return (r0 + r1) + (r2 + r3);
}
struct PositionTieIds {  // key a's tie id is its position
  NVFP4_HD void operator()(int q, int (&i)[4]) const {
    const int a = 4 * q;
    i[0] = a, i[1] = a + 1, i[2] = a + 2, i[3] = a + 3;
  }
};
struct StoredTieIds {  // key a's tie id is ids[a] (16-byte aligned on the device)
  const int32_t* ids;
  NVFP4_HD void operator()(int q, int (&i)[4]) const {
#if defined(__CUDA_ARCH__)
    const int4 v = reinterpret_cast<const int4*>(ids)[q];
    i[0] = v.x, i[1] = v.y, i[2] = v.z, i[3] = v.w;
#else
    for (int j = 0; j < 4; ++j) i[j] = ids[4 * q + j];
#endif
  }
};

// The rank of expert e (key k = keys[e], not NaN) among its token's keys: route_block's first stage (over its
// warp's 32-key segment) and, over all keys, the count both stages together reproduce.
NVFP4_HD int rank_among_keys(const float* keys, int n4, int e, float k) {
  return count_before(keys, n4, e, k, PositionTieIds{});
}

// The two-stage rank's second stage (route_block): a candidate (key k, not NaN; expert id) among its token's
// 4 * n4 candidates (keys ckeys, NaN in unused slots; expert ids cids, both 16-byte aligned on the device): the
// number of candidates with key > k, or key == k and a lower expert id. The candidates are the experts of rank < k
// among their own 32-key segment (rank_among_keys). For an expert of rank < k among all keys this is that rank
// (every expert before it in the order is a candidate too), for any other candidate it is >= k: slots 0 .. k-1
// get exactly what rank_among_keys over all keys gives (tests/cuda_host/test_route_rank.cpp).
NVFP4_HD int rank_among_candidates(const float* ckeys, const int32_t* cids, int n4, int id, float k) {
  return count_before(ckeys, n4, id, k, StoredTieIds{cids});
}

// DeepSeek's group selection (route_token, route_block), host and device; the CPU reference (src/cpu/reference.cpp)
// defines it the same way (docs/numerics.md section 5). A group's score is the sum of its two largest keys, walked
// in key order from -FLT_MAX (NaN and -inf never rise above that start): one key above -inf scores key - FLT_MAX,
// none -inf.
NVFP4_HD void group_top2_insert(float& t1, float& t2, float v) {
  if (v > t1) {
    t2 = t1;
    t1 = v;
  } else if (v > t2) {
    t2 = v;
  }
}
NVFP4_HD float group_top2_sum(const float* key, int gsize) {  // one thread, in key order
  float t1 = -FLT_MAX, t2 = -FLT_MAX;
  for (int i = 0; i < gsize; ++i) group_top2_insert(t1, t2, key[i]);
  return gsize >= 2 ? t1 + t2 : t1;
}
// warp_kept_groups' pieces (sm90_nvfp4_route.cuh): L lanes a group (the largest power of two with G L <= 32), each
// walking keys j, j + L, ... of its group into a top-2 pair (group_top2_insert), the pairs merged over the L lanes by
// group_top2_merge: the two largest of the union, so the score is group_top2_sum's values in another order (up to
// the sign of a zero sum, which no compare tells apart). tests/cuda_host/test_route_rank.cpp runs these pieces as
// the warp does against group_top2_sum and the argmax passes.
NVFP4_HD int kept_group_lanes(int groups) {
  int lanes = 32;
  while (lanes > 1 && lanes * groups > 32) lanes >>= 1;
  return lanes;
}
NVFP4_HD void group_top2_merge(float& t1, float& t2, float o1, float o2) {
  t2 = fmaxf(fminf(t1, o1), fmaxf(t2, o2));
  t1 = fmaxf(t1, o1);
}
// A group scoring -inf (no key above -inf, or a sum that overflowed) is never kept; NaN cannot arise (neither start
// is -inf) and is excluded too.
NVFP4_HD bool group_score_valid(float score) { return !(score != score || score == -INFINITY); }
// Whether group u (score su) ranks above group g (score s): a valid score, greater, or equal and a lower group. A
// group is kept when valid and fewer than topk_group groups rank above it: what topk_group argmax passes with ties
// to the lower group keep.
NVFP4_HD bool group_ranks_above(float su, int u, float s, int g) {
  return group_score_valid(su) && (su > s || (su == s && u < g));
}

}  // namespace nvfp4moe::cuda
