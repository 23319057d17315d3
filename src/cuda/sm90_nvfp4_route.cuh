// Routing kernels: logits [T, E] -> top-k ids/weights [T, k]. One warp per token; the E scores of a token live
// in shared memory; the k winners are taken by k warp-wide argmax passes (ties to the lower expert id), so the
// slot order is by descending score, exactly the CPU reference's order (nvfp4-format.md sections 7, 9).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kRouteWarps = 2;  // tokens per block

// Shared memory per warp: key[E] f32, aux[E] f32, gscore[E] f32, eligible[E] u8.
__host__ __device__ inline size_t route_smem_per_warp(int experts) {
  return (static_cast<size_t>(experts) * 13 + 31) / 16 * 16;  // 16-byte aligned per warp
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
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
    const bool take = (oi != INT_MAX) && (bi == INT_MAX || ov > bv || (ov == bv && oi < bi));
    if (take) { bv = ov; bi = oi; }
  }
  return bi == INT_MAX ? -1 : bi;
}

// Routes token t with one warp; base: the warp's route_smem_per_warp(E) bytes of shared memory.
__device__ __forceinline__ void route_token(const RouteArgs& a, int t, uint8_t* base, int lane) {
  const int E = a.experts, K = a.top_k;
  float* key = reinterpret_cast<float*>(base);
  float* aux = key + E;
  float* gscore = aux + E;
  uint8_t* eligible = reinterpret_cast<uint8_t*>(gscore + E);
  const float* lg = a.logits + static_cast<int64_t>(t) * E;
  int32_t* ids = a.topk_ids + static_cast<int64_t>(t) * K;
  float* ws = a.topk_weights + static_cast<int64_t>(t) * K;

  if (a.kind == RouteKind::kSoftmax) {
    // Select on the logits (softmax is monotonic); weights p = exp(l - max) / sum exp(l - max).
    float mx = -FLT_MAX;
    for (int e = lane; e < E; e += 32) {
      const float v = lg[e];
      key[e] = v;
      eligible[e] = 1;
      mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    float z = 0.0f;
    for (int e = lane; e < E; e += 32) z += expf(key[e] - mx);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) z += __shfl_xor_sync(0xffffffffu, z, off);
    __syncwarp();
    // The k weights wait in shared memory (aux, unused here) for the renormalization: reading them back from
    // the global output would be k dependent round trips to L2 (microseconds at decode).
    float* wbuf = aux;
    float wsum = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int id = warp_argmax(key, eligible, E, lane);
      __syncwarp();
      if (lane == 0) {
        const float p = id >= 0 ? expf(key[id] - mx) / z : 0.0f;
        ids[j] = id;
        wbuf[j] = p;
        wsum += p;
        if (id >= 0) eligible[id] = 0;
      }
      __syncwarp();
    }
    wsum = __shfl_sync(0xffffffffu, wsum, 0);
    for (int j = lane; j < K; j += 32) ws[j] = (a.renormalize && wsum > 0.0f) ? wbuf[j] / wsum : wbuf[j];
    return;
  }

  // DeepSeek noaux_tc: s = sigmoid(l), key = s + bias; group score = sum of the top-2 keys of a group; keep
  // topk_group groups; top-k of key over kept experts; weight = s (unbiased), renormalized, times the scale.
  for (int e = lane; e < E; e += 32) {
    const float s = 1.0f / (1.0f + expf(-lg[e]));
    aux[e] = s;
    key[e] = s + (a.bias ? a.bias[e] : 0.0f);
    eligible[e] = 1;
  }
  __syncwarp();
  const int G = a.n_group;
  if (G > 1) {
    const int gsize = E / G;
    for (int g = lane; g < G; g += 32) {
      float t1 = -FLT_MAX, t2 = -FLT_MAX;
      for (int i = 0; i < gsize; ++i) {
        const float v = key[g * gsize + i];
        if (v > t1) { t2 = t1; t1 = v; }
        else if (v > t2) t2 = v;
      }
      gscore[g] = gsize >= 2 ? t1 + t2 : t1;
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
  float wsum = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int id = warp_argmax(key, eligible, E, lane);
    __syncwarp();
    if (lane == 0) {
      const float w = id >= 0 ? aux[id] : 0.0f;
      ids[j] = id;
      wbuf[j] = w;
      wsum += w;
      if (id >= 0) eligible[id] = 0;
    }
    __syncwarp();
  }
  wsum = __shfl_sync(0xffffffffu, wsum, 0);
  for (int j = lane; j < K; j += 32) {
    float w = wbuf[j];
    if (a.renormalize && wsum > 0.0f) w = w / wsum;
    ws[j] = w * a.scaling;
  }
}

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

}  // namespace nvfp4moe::cuda::kernels
