// Routing device functions (the kernels that call them: moe_kernels.cu, and the warp-streaming GEMM's T = 1
// routing in its own launch, sm90_nvfp4_warp_stream_gemm.cuh; no __global__ here, so that both translation units
// can include it): logits [T, E] -> top-k ids/weights [T, k]. One warp per token; the E scores of a token live
// in shared memory; the k winners are taken by k warp-wide argmax passes (ties to the lower expert id; over
// registers up to 256 experts, warp_topk_registers), so the slot order is by descending score, exactly the CPU
// reference's order (nvfp4-format.md sections 7, 9).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"
#include "cuda/route_rank.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kRouteWarps = 2;  // tokens per block

// Shared memory per warp: key[E] f32, aux[E] f32, gscore[E] f32, eligible[E] u8.
__host__ __device__ inline size_t route_smem_per_warp(int experts) {
  return (static_cast<size_t>(experts) * 13 + 31) / 16 * 16;  // 16-byte aligned per warp
}

// The lanes' candidates (bv, bi; bi == INT_MAX: none) reduced to the warp's winner in (value, lower index)
// order, the same on every lane. Returns -1 when no lane has one.
__device__ __forceinline__ int warp_argmax_reduce(float bv, int bi) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    const bool take = (oi != INT_MAX) && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi));
    if (take) { bv = ov; bi = oi; }
  }
  return bi == INT_MAX ? -1 : bi;
}

// Warp-wide argmax over eligible entries of key[0, n): (value, lower index) order. Returns -1 when none.
__device__ __forceinline__ int warp_argmax(const float* key, const uint8_t* eligible, int n, int lane) {
  float bv = -FLT_MAX;
  int bi = INT_MAX;
  for (int e = lane; e < n; e += 32) {
    if (!eligible[e]) continue;
    const float v = key[e];
    if (v != v) continue;  // NaN never wins
    if (bi == INT_MAX || v > bv) { bv = v; bi = e; }  // e ascends: an equal value keeps the lower id
  }
  return warp_argmax_reduce(bv, bi);
}

// The k argmax passes of one token with the candidates in registers: lane l holds experts l, l + 32, ...
// (kPerLane of them, E <= 32 * kPerLane), read once from shared memory with their eligibility (NaN never
// eligible), and a bit per candidate still in the running. Each pass is a local scan of kPerLane registers and
// the butterfly; the winner's lane drops its bit. The same winners in the same order as k calls of warp_argmax
// with eligible[id] = 0 between them (the local scan ascends in e, so an equal value keeps the lower id, and the
// butterfly is the same), without the passes' shared-memory scans and barriers. pick(j, id): on every lane after
// pass j, id warp-uniform (-1 past the valid experts).
template <int kPerLane, typename Pick>
__device__ __forceinline__ void warp_topk_registers(const float* key, const uint8_t* eligible, int E, int K, int lane,
                                                    Pick pick) {
  float v[kPerLane];
  uint32_t live = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    v[i] = 0.0f;
    if (e < E && eligible[e]) {
      const float x = key[e];
      if (x == x) {
        v[i] = x;
        live |= 1u << i;
      }
    }
  }
  for (int j = 0; j < K; ++j) {
    float bv = -FLT_MAX;
    int bi = INT_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (((live >> i) & 1u) && (bi == INT_MAX || v[i] > bv)) {
        bv = v[i];
        bi = lane + 32 * i;
      }
    const int id = warp_argmax_reduce(bv, bi);
    if (id >= 0 && (id & 31) == lane) live &= ~(1u << (id >> 5));
    pick(j, id);
  }
}
// Candidates a lane holds in registers for E experts: 4 (E <= 128), 8 (E <= 256), else 0 (the shared-memory
// passes). With k <= 32 only: lane j keeps slot j's id.
__device__ __forceinline__ int topk_registers_per_lane(int E, int K) {
  return K > 32 ? 0 : E <= 128 ? 4 : E <= 256 ? 8 : 0;
}

// The register form of the k passes (topk_registers_per_lane(E, K) != 0) with the weights: lane j < K records
// slot j's id (record(j, id)) and stores its weight weight_of(id) (0 for id -1) in wbuf[j]; then every lane sums
// the k weights in slot order, the running sum the shared-memory passes keep on lane 0 (the same bits). Returns
// that sum; wbuf[0, K) is visible to the warp.
template <typename Record, typename WeightOf>
__device__ __forceinline__ float warp_topk_registers_weights(const float* key, const uint8_t* eligible, int E, int K,
                                                             int lane, float* wbuf, Record record,
                                                             WeightOf weight_of) {
  int my_id = -1;
  auto keep = [&](int j, int id) {
    if (lane == j) my_id = id;
  };
  if (topk_registers_per_lane(E, K) == 4) warp_topk_registers<4>(key, eligible, E, K, lane, keep);
  else warp_topk_registers<8>(key, eligible, E, K, lane, keep);
  __syncwarp();
  if (lane < K) {
    record(lane, my_id);
    wbuf[lane] = my_id >= 0 ? weight_of(my_id) : 0.0f;
  }
  __syncwarp();
  float wsum = 0.0f;
  for (int j = 0; j < K; ++j) wsum += wbuf[j];
  return wsum;
}

// Logits (and router bias) per lane loaded at once: 32 * kRouteLoadBatch experts per round trip to memory. A
// load-then-store loop over e keeps one load in flight per lane, i.e. E / 32 dependent round trips per token
// (qwen3-30b: 4, deepseek-v3: 8 x 2 with the bias), microseconds at decode where the logits come from HBM.
inline constexpr int kRouteLoadBatch = 8;

// The softmax normalizer of one token by one warp: sum_e exp(key[e] - mx), lane partial sums over e = lane,
// lane + 32, ... then a butterfly. Both routing kernels call it, so their weights are the same bits.
__device__ __forceinline__ float warp_softmax_sum(const float* key, int E, float mx, int lane) {
  float z = 0.0f;
  for (int e = lane; e < E; e += 32) z += expf(key[e] - mx);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) z += __shfl_xor_sync(0xffffffffu, z, off);
  return z;
}
// The kept groups of one token's grouped routing, G <= 32 groups, by one warp alone (route_block: no shared-memory
// scores and two barriers fewer; group_top2_sum's serial walk by G threads was most of deepseek-v3's T = 1
// routing): the pieces of route_rank.h, L = kept_group_lanes(G) lanes a group, the pairs merged by shuffles within
// the group's aligned lanes, each group's rank among the scores by shuffles, one ballot. Returns bit g set for each
// kept group g, in every lane: the groups that group_top2_sum and topk_group argmax passes keep.
__device__ __forceinline__ unsigned warp_kept_groups(const float* key, int E, int G, int topk_group, int lane) {
  const int gsize = E / G, L = kept_group_lanes(G);
  const int g = lane / L, j = lane - g * L;
  float t1 = -FLT_MAX, t2 = -FLT_MAX;
  if (g < G)
    for (int i = j; i < gsize; i += L) group_top2_insert(t1, t2, key[g * gsize + i]);
  for (int off = 1; off < L; off <<= 1)
    group_top2_merge(t1, t2, __shfl_xor_sync(0xffffffffu, t1, off), __shfl_xor_sync(0xffffffffu, t2, off));
  const float score = gsize >= 2 ? t1 + t2 : t1;
  int rank = 0;
  for (int u = 0; u < G; ++u) rank += group_ranks_above(__shfl_sync(0xffffffffu, score, u * L), u, score, g) ? 1 : 0;
  const unsigned leaders =  // bit g L: group g kept
      __ballot_sync(0xffffffffu, j == 0 && g < G && group_score_valid(score) && rank < topk_group);
  unsigned kept = 0u;
  for (int u = 0; u < G; ++u) kept |= ((leaders >> (u * L)) & 1u) << u;
  return kept;
}

// Routes token t with one warp; base: the warp's route_smem_per_warp(E) bytes of shared memory. ids_mirror (or
// nullptr): shared memory that also receives the token's k ids (the fused plan reads them there instead of
// reading the global output back). write_global false: only the mirror is written (the blocks of the fused
// route + plan + gather that route for themselves, redundantly, next to the one that writes the outputs).
// register_topk: the k passes on registers where topk_registers_per_lane allows (else the shared-memory passes;
// the same ids and weights either way).
__device__ __forceinline__ void route_token(const RouteArgs& a, int t, uint8_t* base, int lane,
                                            int32_t* ids_mirror = nullptr, bool write_global = true,
                                            bool register_topk = true) {
  const int E = a.experts, K = a.top_k;
  float* key = reinterpret_cast<float*>(base);
  float* aux = key + E;
  float* gscore = aux + E;
  uint8_t* eligible = reinterpret_cast<uint8_t*>(gscore + E);
  const float* __restrict__ lg = a.logits + static_cast<int64_t>(t) * E;
  const float* __restrict__ bias = a.bias;
  int32_t* ids = a.topk_ids + static_cast<int64_t>(t) * K;
  float* ws = a.topk_weights + static_cast<int64_t>(t) * K;
  auto record_id = [&](int j, int id) {
    if (write_global) ids[j] = id;
    if (ids_mirror) ids_mirror[static_cast<int64_t>(t) * K + j] = id;
  };

  if (a.kind == RouteKind::kSoftmax) {
    // Select on the logits (softmax is monotonic); weights p = exp(l - max) / sum exp(l - max).
    float mx = -FLT_MAX;
    for (int e0 = 0; e0 < E; e0 += 32 * kRouteLoadBatch) {
      float v[kRouteLoadBatch];
#pragma unroll
      for (int i = 0; i < kRouteLoadBatch; ++i) {
        const int e = e0 + 32 * i + lane;
        v[i] = e < E ? __ldg(lg + e) : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kRouteLoadBatch; ++i) {
        const int e = e0 + 32 * i + lane;
        if (e < E) {
          key[e] = v[i];
          eligible[e] = 1;
          mx = fmaxf(mx, v[i]);
        }
      }
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float z = warp_softmax_sum(key, E, mx, lane);
    __syncwarp();
    // The k weights wait in shared memory (aux, unused here) for the renormalization: reading them back from
    // the global output would be k dependent round trips to L2 (microseconds at decode).
    float* wbuf = aux;
    if (register_topk && topk_registers_per_lane(E, K) > 0) {
      const float wsum = warp_topk_registers_weights(key, eligible, E, K, lane, wbuf, record_id,
                                                     [&](int id) { return expf(key[id] - mx) / z; });
      if (write_global && lane < K) ws[lane] = (a.renormalize && wsum > 0.0f) ? wbuf[lane] / wsum : wbuf[lane];
      return;
    }
    float wsum = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int id = warp_argmax(key, eligible, E, lane);
      __syncwarp();
      if (lane == 0) {
        const float p = id >= 0 ? expf(key[id] - mx) / z : 0.0f;
        record_id(j, id);
        wbuf[j] = p;
        wsum += p;
        if (id >= 0) eligible[id] = 0;
      }
      __syncwarp();
    }
    wsum = __shfl_sync(0xffffffffu, wsum, 0);
    if (write_global)
      for (int j = lane; j < K; j += 32) ws[j] = (a.renormalize && wsum > 0.0f) ? wbuf[j] / wsum : wbuf[j];
    return;
  }

  // DeepSeek noaux_tc: s = sigmoid(l), key = s + bias; group score = sum of the top-2 keys of a group; keep
  // topk_group groups; top-k of key over kept experts; weight = s (unbiased), renormalized, times the scale.
  for (int e0 = 0; e0 < E; e0 += 32 * kRouteLoadBatch) {
    float l[kRouteLoadBatch], b[kRouteLoadBatch];
#pragma unroll
    for (int i = 0; i < kRouteLoadBatch; ++i) {
      const int e = e0 + 32 * i + lane;
      l[i] = e < E ? __ldg(lg + e) : 0.0f;
      b[i] = (e < E && bias) ? __ldg(bias + e) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kRouteLoadBatch; ++i) {
      const int e = e0 + 32 * i + lane;
      if (e < E) {
        const float s = 1.0f / (1.0f + expf(-l[i]));
        aux[e] = s;
        key[e] = s + b[i];
        eligible[e] = 1;
      }
    }
  }
  __syncwarp();
  const int G = a.n_group;
  if (G > 1 && G <= 32 && a.warp_kept_groups) {  // (the warp's own form, as route_block's: the same groups)
    const int gsize = E / G;
    const unsigned kept = warp_kept_groups(key, E, G, a.topk_group, lane);
    for (int e = lane; e < E; e += 32) eligible[e] = (kept >> (e / gsize)) & 1u;
    __syncwarp();
  } else if (G > 1) {
    const int gsize = E / G;
    // An invalid score (-inf) becomes NaN, so that -inf marks only the groups taken below (before 2026-12-08 a
    // group scoring -inf was marked eligible too; route_block never keeps one, nor now the CPU reference).
    for (int g = lane; g < G; g += 32) {
      const float v = group_top2_sum(key + g * gsize, gsize);
      gscore[g] = group_score_valid(v) ? v : __int_as_float(0x7fffffff);
    }
    __syncwarp();
    // Group selection uses its own eligibility: gscore entries set to -inf once taken (ties: lower group).
    for (int r = 0; r < a.topk_group; ++r) {
      float bv = -FLT_MAX;
      int bi = INT_MAX;
      for (int g = lane; g < G; g += 32) {
        const float v = gscore[g];
        if (v != v || v == -INFINITY) continue;  // taken (or NaN)
        if (bi == INT_MAX || v > bv || (v == bv && g < bi)) { bv = v; bi = g; }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
        if (oi != INT_MAX && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi))) { bv = ov; bi = oi; }
      }
      __syncwarp();
      if (lane == 0 && bi != INT_MAX) gscore[bi] = -INFINITY;  // -inf marks "kept"
      __syncwarp();
    }
    for (int e = lane; e < E; e += 32) eligible[e] = (gscore[e / gsize] == -INFINITY) ? 1 : 0;
    __syncwarp();
  }
  // The k weights wait in shared memory (gscore: the group scores are consumed above) for the
  // renormalization, not in the global output (k dependent round trips to L2 to read them back).
  float* wbuf = gscore;
  if (register_topk && topk_registers_per_lane(E, K) > 0) {
    const float wsum =
        warp_topk_registers_weights(key, eligible, E, K, lane, wbuf, record_id, [&](int id) { return aux[id]; });
    if (write_global && lane < K) {
      float w = wbuf[lane];
      if (a.renormalize && wsum > 0.0f) w = w / wsum;
      ws[lane] = w * a.scaling;
    }
    return;
  }
  float wsum = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int id = warp_argmax(key, eligible, E, lane);
    __syncwarp();
    if (lane == 0) {
      const float w = id >= 0 ? aux[id] : 0.0f;
      record_id(j, id);
      wbuf[j] = w;
      wsum += w;
      if (id >= 0) eligible[id] = 0;
    }
    __syncwarp();
  }
  wsum = __shfl_sync(0xffffffffu, wsum, 0);
  if (!write_global) return;
  for (int j = lane; j < K; j += 32) {
    float w = wbuf[j];
    if (a.renormalize && wsum > 0.0f) w = w / wsum;
    ws[j] = w * a.scaling;
  }
}

// ------------------------------------------------------------------------------------------------------------
// Block-wide routing at decode: thread (t, e) = (tid / Ep, tid % Ep), Ep = E rounded up to warps, so the whole
// block works on the T tokens at once (T * Ep <= blockDim.x) instead of one warp per token walking k sequential
// argmax passes (~1-2 thousand dependent instructions: most of the routing kernel's 8-15 us at T = 1 while the
// block's other warps wait). The k winners are ranked instead: expert e takes slot r when r = the number of
// eligible, non-NaN experts a with key[a] > key[e], or key[a] == key[e] and a < e; k argmax passes with ties to
// the lower id select exactly the experts of rank 0 .. k-1 in that order (and -1 past the valid ones). The kept
// groups of the grouped routing likewise (rank < topk_group among the valid group scores). The normalizer, the
// group scores and the weights use the warp path's code and order: the same ids and weights, bit for bit, as
// route_token (tested: the fused decode path against the CPU reference, and batch invariance across T).
__host__ __device__ inline int block_route_stride(int experts) { return (experts + 31) / 32 * 32; }
__host__ __device__ inline bool block_route_fits(int tokens, int experts) {
  return tokens >= 1 && experts >= 1 && tokens * block_route_stride(experts) <= 1024;
}
// The block's threads for the block routing: T * Ep, and with the softmax one more warp per token where it fits
// (route_block: the statistics warps, which run beside the ranks).
__host__ __device__ inline bool block_route_stats_warps(int tokens, int experts, bool softmax) {
  return softmax && tokens * (block_route_stride(experts) + 32) <= 1024;
}
__host__ __device__ inline int block_route_threads(int tokens, int experts, bool softmax) {
  return tokens * block_route_stride(experts) + (block_route_stats_warps(tokens, experts, softmax) ? 32 * tokens : 0);
}
// key, aux, gscore / candidate keys / weights [T][Ep] f32, candidate ids [T][Ep] i32, slot [T][k] i32,
// stats [T][2] f32, kept [T][Ep] u8.
__host__ __device__ inline size_t block_route_smem(int tokens, int experts, int top_k) {
  const size_t te = static_cast<size_t>(tokens) * block_route_stride(experts);
  return (te * 17 + static_cast<size_t>(tokens) * top_k * 4 + static_cast<size_t>(tokens) * 8 + 15) / 16 * 16;
}

__device__ __forceinline__ void route_block(const RouteArgs& a, uint8_t* smem, int32_t* ids_mirror,
                                            bool write_global) {
  const int E = a.experts, K = a.top_k, T = a.tokens, Ep = block_route_stride(E);
  float* key = reinterpret_cast<float*>(smem);  // [T][Ep]; pad entries NaN
  float* aux = key + T * Ep;                    // [T][Ep] sigmoid(l)
  float* gsw = aux + T * Ep;  // [T][Ep] group scores, then the candidates' keys, then token t's k weights at t * Ep
  int32_t* cid = reinterpret_cast<int32_t*>(gsw + T * Ep);  // [T][Ep] the candidates' expert ids
  int32_t* slot = cid + T * Ep;                              // [T][K]
  float* stat = reinterpret_cast<float*>(slot + T * K);      // [T][2]: mx, z
  uint8_t* kept = reinterpret_cast<uint8_t*>(stat + 2 * T);  // [T][Ep]
  const int tid = threadIdx.x, t = tid / Ep, e = tid - t * Ep, lane = tid & 31;
  const bool active = t < T, real = active && e < E;
  const bool softmax = a.kind == RouteKind::kSoftmax;
  float* kt = key + t * Ep;
  if (active) {
    float k = __int_as_float(0x7fffffff);  // NaN: never ranked, never counted
    if (real) {
      // The bias (a weight, not the previous kernel's output) is loaded ahead of the logit: written after it, its
      // load was issued only once the logit had arrived (the sigmoid's first instruction waits for the logit), two
      // global round trips in series before deepseek-v3's T = 1 routing could start.
      const float b = (!softmax && a.bias) ? __ldg(a.bias + e) : 0.0f;
      const float l = __ldg(a.logits + static_cast<int64_t>(t) * E + e);
      if (softmax) {
        k = l;
      } else {
        const float sg = 1.0f / (1.0f + expf(-l));
        aux[t * Ep + e] = sg;
        k = sg + b;
      }
    }
    kt[e] = k;
  }
  for (int i = tid; i < T * K; i += blockDim.x) {
    slot[i] = -1;
    if (ids_mirror) ids_mirror[i] = -1;
  }
  __syncthreads();
  const int G = softmax ? 1 : a.n_group;
  // The softmax statistics are read only by the weights, after the ranks' barrier: where the block has a warp per
  // token past the T * Ep ranking threads (block_route_threads), those warps compute them while the others rank;
  // else the token's first warp does, before the ranks.
  const bool stats_beside = block_route_stats_warps(T, E, softmax) &&
                            static_cast<int>(blockDim.x) >= block_route_threads(T, E, softmax);
  const bool warp_groups = G > 1 && G <= 32 && a.warp_kept_groups;
  unsigned kept_groups = ~0u;  // (warp_groups: bit g set where group g is kept)
  if (softmax && write_global) {  // (only the weights read them: a block that writes nothing needs the ids alone)
    const int ts = stats_beside ? (tid - T * Ep) >> 5 : t;  // the token whose statistics this warp computes
    if (stats_beside ? (tid >= T * Ep && ts < T) : (active && e < 32)) {  // max and normalizer, as the warp path
      const float* ks = key + ts * Ep;
      float mx = -FLT_MAX;
      for (int ee = lane; ee < E; ee += 32) mx = fmaxf(mx, ks[ee]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float z = warp_softmax_sum(ks, E, mx, lane);
      if (lane == 0) {
        stat[2 * ts] = mx;
        stat[2 * ts + 1] = z;
      }
    }
  } else if (warp_groups) {  // each warp finds the kept groups (the ineligible keys are marked past the barrier)
    if (active) kept_groups = warp_kept_groups(kt, E, G, a.topk_group, lane);
  } else if (G > 1) {
    const int gsize = E / G;
    if (active && e < G) gsw[t * Ep + e] = group_top2_sum(kt + e * gsize, gsize);
    __syncthreads();
    if (active && e < G) {
      const float v = gsw[t * Ep + e];
      const bool valid = !(v != v || v == -INFINITY);
      int rank = 0;
      for (int g = 0; g < G; ++g) {
        const float u = gsw[t * Ep + g];
        const bool uvalid = !(u != u || u == -INFINITY);
        rank += (uvalid && (u > v || (u == v && g < e))) ? 1 : 0;
      }
      kept[t * Ep + e] = (valid && rank < a.topk_group) ? 1 : 0;
    }
    __syncthreads();
    if (real && !kept[t * Ep + e / gsize]) kt[e] = __int_as_float(0x7fffffff);  // not eligible: never ranked
  }
  if (!stats_beside) __syncthreads();  // (the same for the whole block: blockDim and the arguments)
  // G <= 32: no warp reads the keys for the groups past the barrier, and stage 1 reads only its own warp's keys
  // (after its __syncwarp below), so each thread marks its own key ineligible.
  if (warp_groups && real && !((kept_groups >> (e / (E / G))) & 1u)) kt[e] = __int_as_float(0x7fffffff);
  // The ranks in two stages (route_rank.h, rank_among_candidates: exactly the slots of one rank among all keys,
  // with 8 + k Ep / 128 compare steps a thread instead of Ep / 4). Stage 1: each expert's rank among the 32 keys
  // of its own warp (Ep is whole warps, so a warp is one token's segment of 32 experts); local rank j < kc makes
  // it the segment's candidate j. Lane j < kc of the warp marks candidate slot j empty (NaN) first.
  const int kc = K < 32 ? K : 32, seg = e >> 5, ncand = (Ep >> 5) * kc, nc4 = (ncand + 3) >> 2;
  float* ck = gsw + t * Ep;  // the group scores are consumed
  int32_t* ci = cid + t * Ep;
  if (active) {
    if (lane < kc) ck[seg * kc + lane] = __int_as_float(0x7fffffff);
    if (seg == 0 && lane < 4 * nc4 - ncand) ck[ncand + lane] = __int_as_float(0x7fffffff);  // the float4 tail
  }
  __syncwarp();
  if (real) {
    const float k = kt[e];
    if (k == k) {
      // Four independent counters (route_rank.h): the short-circuit form of the same count compiled into one
      // dependent chain through a register's bits, 2.7 of the 5.2 us of the T = 1 routing at 128 experts.
      const int local = rank_among_keys(kt + 32 * seg, 8, lane, k);
      if (local < kc) {
        ck[seg * kc + local] = k;
        ci[seg * kc + local] = e;
      }
    }
  }
  __syncthreads();
  // Stage 2: candidate e of token t among the token's candidates (keys, then ids for ties).
  if (active && e < ncand) {
    const float k = ck[e];
    if (k == k) {
      const int id = ci[e];
      const int rank = rank_among_candidates(ck, ci, nc4, id, k);
      if (rank < K) {
        slot[t * K + rank] = id;
        if (ids_mirror) ids_mirror[t * K + rank] = id;
      }
    }
  }
  __syncthreads();
  // A block that writes nothing (the GEMM1 CTAs past CTA 0 at T = 1, the fused decode kernels' blocks past the
  // first) needs only the ids, complete in ids_mirror from the barrier above: no weights, no last barrier.
  if (!write_global) return;
  float* wts = gsw;  // the group scores are consumed
  for (int i = tid; i < T * K; i += blockDim.x) {
    const int tt = i / K, id = slot[i];
    float w = 0.0f;
    if (id >= 0) w = softmax ? expf(key[tt * Ep + id] - stat[2 * tt]) / stat[2 * tt + 1] : aux[tt * Ep + id];
    wts[tt * Ep + (i - tt * K)] = w;
    a.topk_ids[i] = id;
  }
  __syncthreads();
  // Thread (t, j) writes token t's weight j; each of the token's k threads sums its k weights in slot order (the
  // warp path's sum, so the same bits), instead of one thread dividing and storing k times in a row.
  if (tid < T * K) {
    const int tt = tid / K, j = tid - tt * K;
    const float* wt = wts + tt * Ep;
    float wsum = 0.0f;
    for (int i = 0; i < K; ++i) wsum += wt[i];
    float w = wt[j];
    float* ws = a.topk_weights + static_cast<int64_t>(tt) * K;
    if (softmax) {
      ws[j] = (a.renormalize && wsum > 0.0f) ? w / wsum : w;
    } else {
      if (a.renormalize && wsum > 0.0f) w = w / wsum;
      ws[j] = w * a.scaling;
    }
  }
}

}  // namespace nvfp4moe::cuda::kernels
