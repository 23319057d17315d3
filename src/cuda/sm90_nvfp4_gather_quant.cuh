// Quantize + gather: builds GEMM1's operand rows in expert order straight from `hidden` (one warp per 512
// columns of a row, each lane one 16-element NVFP4 block). w4a16: the bf16 row; w4a4: the row NVFP4-quantized with
// the expert's fixed activation scale (nvfp4-format.md section 4, exact division, the shared fmt:: code) and
// written as the exact bf16 operand e2m1 * sf. Optional: calibration amax, the Qwen shared-expert gate.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"
#include "format/nvfp4.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kGatherWarps = 8;
inline constexpr int kGatherChunkCols = 32 * 16;  // one warp-wide pass: 16 elements per lane

// 8 words of packed bf16 pairs (element 2i in the low half of word i) as 16 floats.
__device__ __forceinline__ void bf16x16_to_floats(const uint32_t (&w)[8], float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = fmt::bits_float(w[i] << 16);
    x[2 * i + 1] = fmt::bits_float(w[i] & 0xFFFF0000u);
  }
}

// Loads 16 consecutive elements of a hidden row as bf16 values (f32 input rounded to bf16 first).
template <bool F32>
__device__ __forceinline__ void load_block16(const void* row, int col, float (&x)[16], uint32_t (&bits)[8]) {
  if constexpr (F32) {
    const float4* src = reinterpret_cast<const float4*>(static_cast<const float*>(row) + col);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = src[q];
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint16_t b = fmt::bf16_from_float(f[i]);
        x[q * 4 + i] = fmt::bf16_to_float(b);
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) bits[i] = fmt::bf16x2_bits_exact(x[2 * i], x[2 * i + 1]);
  } else {
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(row) + col);
    const uint4 v0 = src[0], v1 = src[1];
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) bits[i] = w[i];
    bf16x16_to_floats(w, x);
  }
}

// max(amax, |x[i]|) over a 16-element block.
__device__ __forceinline__ float block16_absmax(const float (&x)[16], float amax) {
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));
  return amax;
}
// 16 bf16 values (8 packed pairs) to dst (16-byte aligned).
__device__ __forceinline__ void store_block16(uint16_t* dst, const uint32_t (&bits)[8]) {
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
  d[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
}
// Calibration: the max over the warp of its lanes' amax, in every lane.
__device__ __forceinline__ float warp_max(float amax) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  return amax;
}
// A warp's amax (warp_max'ed) into *dst by lane 0. Non-negative floats order like their bit patterns: an integer
// max is exact and order-free (also over the chunks of a row, the rows of an expert and the gather's order).
__device__ __forceinline__ void amax_to(float warp_amax, float* dst, int lane) {
  if (lane == 0 && warp_amax > 0.0f) atomicMax(reinterpret_cast<int*>(dst), __float_as_int(warp_amax));
}
__device__ __forceinline__ void warp_amax_to(float amax, float* dst, int lane) { amax_to(warp_max(amax), dst, lane); }

// In place: x (16 values, block16_absmax(x, 0) = vmax) -> NVFP4 with global scale gs -> exact bf16 operands
// (e2m1 * sf) in bits. fmt::quantize_activation_block's arithmetic, with the code round trip folded into
// fmt::e2m1_round. (vmax given: a block quantized with several scales takes its max once.)
__device__ __forceinline__ void quant_block16_operand(const float (&x)[16], float vmax, float gs,
                                                      uint32_t (&bits)[8]) {
  const fmt::ActivationBlockScale sc = fmt::activation_block_scales(vmax, gs);
#pragma unroll
  for (int i = 0; i < 8; ++i)  // e2m1 * e4m3 is exact in bf16: its bits are the top half of the fp32 ones
    bits[i] = fmt::bf16x2_bits_exact(fmt::e2m1_round(x[2 * i] * sc.output_scale) * sc.value,
                                     fmt::e2m1_round(x[2 * i + 1] * sc.output_scale) * sc.value);
}
__device__ __forceinline__ void quant_block16_operand(const float (&x)[16], float gs, uint32_t (&bits)[8]) {
  quant_block16_operand(x, block16_absmax(x, 0.0f), gs, bits);
}

// One work item of the gather, by one warp: columns [col0, col_end) of row r = hidden[t] with expert e's
// factors (gs[e], amax[e]); with gate_out the whole row (col0 = 0, col_end = H) and the shared gate of token t.
template <bool F32>
__device__ __forceinline__ void gather_item(const GatherArgs& a, int r, int t, int e, int col0, int col_end,
                                            int lane) {
  const int H = a.hidden_size;
  const size_t row_bytes_in = static_cast<size_t>(H) * (F32 ? 4 : 2);
  const void* src = static_cast<const uint8_t*>(a.hidden) + static_cast<size_t>(t) * row_bytes_in;
  uint16_t* dst = a.out + static_cast<size_t>(r) * H;
  const float gs = a.gs ? a.gs[e] : 0.0f;
  float amax = 0.0f, dot = 0.0f;
  for (int col = col0 + lane * 16; col < col_end; col += 32 * 16) {
    float x[16];
    uint32_t bits[8];
    load_block16<F32>(src, col, x, bits);
    amax = block16_absmax(x, amax);
    if (a.gate_out) {
      const uint4* gw = reinterpret_cast<const uint4*>(a.gate_weight + col);
      const uint4 g0 = gw[0], g1 = gw[1];
      const uint32_t g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dot = fmaf(x[2 * i], fmt::bits_float(g[i] << 16), dot);
        dot = fmaf(x[2 * i + 1], fmt::bits_float(g[i] & 0xFFFF0000u), dot);
      }
    }
    if (a.gs) quant_block16_operand(x, gs, bits);
    store_block16(dst + col, bits);
  }
  if (a.amax) warp_amax_to(amax, a.amax + e, lane);
  if (a.gate_out) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    if (lane == 0) a.gate_out[t] = 1.0f / (1.0f + expf(-dot));
  }
}

// One warp per (row, 512-column chunk) work item, grid-stride: at decode a row of H = 7168 is 14 independent
// items (14 warps' loads in flight instead of one warp walking the row), at prefill the same total work. The
// Qwen2-style shared gate needs the whole row's dot product in one fixed order: with gate_out a work item is
// the whole row. Rows past offsets[experts] (append_shared): the shared expert's rows, t = r - offsets[E].
template <bool F32>
__global__ void __launch_bounds__(kGatherWarps * 32) gather_kernel(GatherArgs a) {
  pdl_wait_then_allow_next();
  const int lane = threadIdx.x & 31;
  const int routed_rows = a.perm ? a.offsets[a.experts] : 0;
  const int rows = a.perm ? routed_rows + (a.append_shared ? a.tokens : 0) : a.tokens;
  const int H = a.hidden_size;
  const int chunk_cols = a.gate_out ? H : kGatherChunkCols;
  const int chunks = (H + chunk_cols - 1) / chunk_cols;
  const int64_t items = static_cast<int64_t>(rows) * chunks;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5); item < items;
       item += static_cast<int64_t>(gridDim.x) * kGatherWarps) {
    const int r = static_cast<int>(item / chunks);
    const int col0 = static_cast<int>(item % chunks) * chunk_cols;
    int t = r, e = 0;
    if (a.perm) {
      if (r < routed_rows) {
        const int p = a.perm[r];
        t = p / a.top_k;
        e = a.topk_ids[p];
      } else {
        t = r - routed_rows;
        e = a.experts;  // the shared expert's factors follow the routed ones
      }
    }
    gather_item<F32>(a, r, t, e, col0, min(H, col0 + chunk_cols), lane);
  }
}

// Token-major (GatherArgs::token_major; prefill): one warp per (token, 512-column chunk) loads the chunk once and
// writes it to each of the token's rows: inv[t * k + j] for its k slots (with that slot's expert's factors; masked
// slots, inv -1, skipped) and, with append_shared, offsets[E] + t (the shared expert's, factors of index E). The
// expert-major kernel above loads a token's chunk once per row, in row order, i.e. in each expert's token order:
// once hidden outgrows the L2 (deepseek-v3 at T = 16384: 235 MB) those are k reads of it from HBM (1.9 GB) where
// this kernel reads it once. Every row gets the same values as there (the same per-row arithmetic; the calibration
// amax is an order-free max), so the same bits.
template <bool F32>
__global__ void __launch_bounds__(kGatherWarps * 32) gather_token_major_kernel(GatherArgs a) {
  pdl_wait_then_allow_next();
  const int lane = threadIdx.x & 31;
  const int H = a.hidden_size, K = a.top_k;
  const int shared_row0 = a.append_shared ? a.offsets[a.experts] : 0;
  const int chunks = (H + kGatherChunkCols - 1) / kGatherChunkCols;
  const int64_t items = static_cast<int64_t>(a.tokens) * chunks;
  const size_t row_bytes_in = static_cast<size_t>(H) * (F32 ? 4 : 2);
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * kGatherWarps + (threadIdx.x >> 5); item < items;
       item += static_cast<int64_t>(gridDim.x) * kGatherWarps) {
    const int t = static_cast<int>(item / chunks);
    const int col = static_cast<int>(item % chunks) * kGatherChunkCols + lane * 16;
    const bool active = col < H;  // (the last chunk of a row with H % 512 != 0; those lanes still shuffle)
    float x[16];
    uint32_t bits[8];
    float vmax = 0.0f;  // this lane's block max: the quantization's (once for all the token's rows) and the amax's
    if (active) {
      load_block16<F32>(static_cast<const uint8_t*>(a.hidden) + static_cast<size_t>(t) * row_bytes_in, col, x, bits);
      if (a.gs || a.amax) vmax = block16_absmax(x, 0.0f);
    }
    const float warp_amax = a.amax ? warp_max(vmax) : 0.0f;
    auto put = [&](int r, int e) {
      if (a.amax) amax_to(warp_amax, a.amax + e, lane);
      if (!active) return;
      uint16_t* dst = a.out + static_cast<size_t>(r) * H + col;
      if (a.gs) {
        uint32_t q[8];
        quant_block16_operand(x, vmax, a.gs[e], q);
        store_block16(dst, q);
      } else {
        store_block16(dst, bits);
      }
    };
    for (int j = 0; j < K; ++j) {
      const int p = t * K + j;
      const int r = a.inv[p];
      if (r >= 0) put(r, a.topk_ids[p]);
    }
    if (a.append_shared) put(shared_row0 + t, a.experts);
  }
}

}  // namespace nvfp4moe::cuda::kernels
