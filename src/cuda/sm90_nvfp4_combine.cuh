// Combine: out[t] = sum_j w[t,j] * y[row(t,j)] in slot order (+ the shared expert), one block per (token,
// 512 columns), 4 columns per thread: at decode a token of H = 7168 is 14 blocks, each thread with its k + 1
// row loads in flight. A gather in a fixed order: no atomics, and a token's sum never sees other tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"
#include "format/nvfp4.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kCombineThreads = 128;
inline constexpr int kCombineCols = kCombineThreads * 4;
inline constexpr int kCombineBatch = 8;  // slots whose rows are loaded at once

// Its blocks fit beside the GEMM2 CTAs, so they start (PDL) while GEMM2 runs: everything but y (the slots' rows
// and weights, the shared gate and row base: written two or more launches back, launch_combine's contract) is
// loaded before the wait, and after it only y's rows (one dependent round trip instead of two at decode).
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(CombineArgs a) {
  const int H = a.hidden_size, K = a.top_k;
  const int chunks = (H + kCombineCols - 1) / kCombineCols;
  const int t = static_cast<int>(blockIdx.x / chunks);
  const int c = static_cast<int>(blockIdx.x % chunks) * kCombineCols + threadIdx.x * 4;
  // Every load a step needs is issued before the first is used: the shared expert's gate and row base with
  // the first batch's slots, then kCombineBatch slots' rows at once (a loop that loads a slot's row and adds it
  // keeps one dependent pair of round trips per slot in flight: 2k round trips per token at decode).
  const float sg = a.shared_y ? (a.shared_gate ? a.shared_gate[t] : 1.0f) : 0.0f;
  const size_t srow = a.shared_y ? static_cast<size_t>(a.shared_row_base ? *a.shared_row_base : 0) + t : 0;
  int row[kCombineBatch];
  float w[kCombineBatch];
  auto load_slots = [&](int j0) {
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      const int j = j0 + i;
      row[i] = j < K ? a.inv[static_cast<size_t>(t) * K + j] : -1;
      w[i] = j < K ? a.topk_weights[static_cast<size_t>(t) * K + j] : 0.0f;
    }
  };
  load_slots(0);
  pdl_wait_then_allow_next();
  if (c >= H) return;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int j0 = 0; j0 < K; j0 += kCombineBatch) {
    if (j0 > 0) load_slots(j0);
    float4 y[kCombineBatch];
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i)
      if (row[i] >= 0) y[i] = *reinterpret_cast<const float4*>(a.y + static_cast<size_t>(row[i]) * H + c);
    // In slot order, masked slots skipped: the same sums as one slot at a time.
#pragma unroll
    for (int i = 0; i < kCombineBatch; ++i) {
      if (row[i] < 0) continue;
      acc.x += w[i] * y[i].x;
      acc.y += w[i] * y[i].y;
      acc.z += w[i] * y[i].z;
      acc.w += w[i] * y[i].w;
    }
  }
  if (a.shared_y) {
    const float4 y = *reinterpret_cast<const float4*>(a.shared_y + srow * H + c);
    acc.x += sg * y.x;
    acc.y += sg * y.y;
    acc.z += sg * y.z;
    acc.w += sg * y.w;
  }
  if (a.out_bf16) {
    uint16_t* o = static_cast<uint16_t*>(a.out) + static_cast<size_t>(t) * H + c;
    const uint32_t lo = fmt::bf16_from_float(acc.x) | (static_cast<uint32_t>(fmt::bf16_from_float(acc.y)) << 16);
    const uint32_t hi = fmt::bf16_from_float(acc.z) | (static_cast<uint32_t>(fmt::bf16_from_float(acc.w)) << 16);
    *reinterpret_cast<uint2*>(o) = make_uint2(lo, hi);
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(a.out) + static_cast<size_t>(t) * H + c) = acc;
  }
}

}  // namespace nvfp4moe::cuda::kernels
