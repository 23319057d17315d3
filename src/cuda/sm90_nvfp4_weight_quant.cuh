// Weight quantization to NVFP4 on the GPU (nvfp4-format.md section 3), bitwise equal to the CPU quantizer because
// both call the same __host__ __device__ fmt:: functions (format/nvfp4.h) on the same fp32 values:
//   1. weight_amax_kernel: amax(|W|) over a projection (max is exact and order-free, so the atomicMax over the
//      float bits of non-negative values is deterministic), plus the bits of a non-finite element if any.
//   2. weight_quantize_kernel: ws2 = fmt::weight_global_scale(max(amax_a, amax_b)) (gate and up pass each other's
//      amax, so they share one ws2), then one thread per 16-element block: fmt::quantize_weight_block (e4m3 block
//      scale, RNE e2m1 codes), 8 packed bytes and one scale byte. A [N, K] row-major weight with K % 16 == 0 is a
//      flat run of N*K/16 blocks, so the kernel does not need N or K.
// Sources are BF16, F16 or F32 (converted exactly to fp32), 16-byte aligned; 16 elements are read per step.
// Needs the default IEEE division (no --use_fast_math) for bit equality with the host.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "format/nvfp4.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kWeightQuantThreads = 256;
enum WeightSrcType : int { kSrcBf16 = 0, kSrcF16 = 1, kSrcF32 = 2 };

// IEEE half -> float, exact (the host's model::half_to_float, bit for bit).
__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24, exact
    return sign ? -v : v;
  }
  if (exp == 31) return fmt::bits_float(sign | 0x7F800000u | (man << 13));
  return fmt::bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// The 16 elements of block b as fp32.
template <int kType>
__device__ __forceinline__ void load_block16(const void* src, int64_t b, float (&v)[16]) {
  if constexpr (kType == kSrcF32) {
    const float4* p = reinterpret_cast<const float4*>(src) + b * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = __ldg(p + i);
      v[4 * i] = q.x;
      v[4 * i + 1] = q.y;
      v[4 * i + 2] = q.z;
      v[4 * i + 3] = q.w;
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(src) + b * 2;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 q = __ldg(p + i);
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = w[j] & 0xFFFFu, hi = w[j] >> 16;  // element 2j is the low half (little endian)
        if constexpr (kType == kSrcBf16) {
          v[8 * i + 2 * j] = fmt::bits_float(lo << 16);
          v[8 * i + 2 * j + 1] = fmt::bits_float(hi << 16);
        } else {
          v[8 * i + 2 * j] = half_bits_to_float(lo);
          v[8 * i + 2 * j + 1] = half_bits_to_float(hi);
        }
      }
    }
  }
}

// amax_bits: float bits of the running amax (start at 0); bad: [0] set to 1 and [1] to the bits of a non-finite
// element when one is seen.
template <int kType>
__global__ void __launch_bounds__(kWeightQuantThreads)
    weight_amax_kernel(const void* __restrict__ src, int64_t blocks, uint32_t* amax_bits, uint32_t* bad) {
  float m = 0.0f;
  bool has_bad = false;
  uint32_t bad_bits = 0;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[16];
    load_block16<kType>(src, b, v);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (!isfinite(v[i])) {
        has_bad = true;
        bad_bits = fmt::float_bits(v[i]);
      } else {
        m = fmaxf(m, fabsf(v[i]));
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  __shared__ float warp_max[kWeightQuantThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  if (has_bad) {
    atomicExch(bad + 1, bad_bits);
    atomicExch(bad, 1u);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bm = 0.0f;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) bm = fmaxf(bm, warp_max[w]);
    atomicMax(amax_bits, fmt::float_bits(bm));  // non-negative floats order as their bits
  }
}

template <int kType>
__global__ void __launch_bounds__(kWeightQuantThreads)
    weight_quantize_kernel(const void* __restrict__ src, int64_t blocks, const uint32_t* __restrict__ amax_a,
                           const uint32_t* __restrict__ amax_b, uint8_t* __restrict__ packed,
                           uint8_t* __restrict__ scales, float* ws2_out) {
  const float amax = fmaxf(fmt::bits_float(*amax_a), fmt::bits_float(*amax_b));
  const float ws2 = fmt::weight_global_scale(amax);
  if (ws2_out && blockIdx.x == 0 && threadIdx.x == 0) *ws2_out = ws2;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[16];
    load_block16<kType>(src, b, v);
    uint8_t codes[16];
    scales[b] = fmt::quantize_weight_block(v, fmt::kBlock, ws2, codes);
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo |= static_cast<uint32_t>(fmt::pack_e2m1x2(codes[2 * i], codes[2 * i + 1])) << (8 * i);
      hi |= static_cast<uint32_t>(fmt::pack_e2m1x2(codes[8 + 2 * i], codes[8 + 2 * i + 1])) << (8 * i);
    }
    reinterpret_cast<uint2*>(packed)[b] = make_uint2(lo, hi);
  }
}

}  // namespace nvfp4moe::cuda::kernels
