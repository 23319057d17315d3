// Grouped NVFP4 GEMM on the tensor cores with mma.sync m16n8k16 (bf16 in, f32 accumulate): the correct,
// general path of the cuda backend (issue 3); the sm90 wgmma kernel (sm90_nvfp4_grouped_gemm.cuh) is the fast
// one. Weights stay in the checkpoint layout; each 16-element block is dequantized exactly (e2m1 * e4m3 fits
// bf16) while it is staged into shared memory, so the per-tensor scales are the epilogue's alone.
//
// Tiles: BM = 64 token rows x BN = 64 weight rows x BK = 64, 4 warps in a 2 x 2 grid of 32 x 32 warp tiles.
// Persistent: a fixed grid walks tile = m_tile * n_tiles + n_tile, m tiles over the experts' row ranges read
// from tile_offsets/offsets in device memory. Every output element is one K loop in a fixed order (k tiles
// ascending, mma k16 steps ascending): the result of a row never depends on the batch (batch invariance).
// Gated (SwiGLU) tiles interleave gate and up rows so a tile's epilogue holds both halves of 32 outputs:
//   local weight row r: group = r / 16; column = n_tile*32 + (group/2)*16 + r%16; gate when group is even.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/moe_kernels.h"
#include "format/nvfp4.h"

namespace nvfp4moe::cuda::kernels {

inline constexpr int kMmaBM = kGemmBlockM, kMmaBN = 64, kMmaBK = 64;
inline constexpr int kMmaThreads = 128;
inline constexpr int kMmaLds = kMmaBK + 8;  // bf16 per staged row: +16 bytes keeps fragment loads conflict-free
inline constexpr int kMmaLdc = kMmaBN + 4;  // f32 per row of the epilogue tile
static_assert(kMmaBM * kMmaLdc * 4 <= 2 * kMmaBM * kMmaLds * 2, "epilogue tile must fit the staging buffers");

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// 16 activation values (already bf16-rounded) -> 16 bf16 operands at dst (quantized when gs > 0).
__device__ __forceinline__ void store_act16(uint16_t* dst, const float (&v)[16], const float* gs_arr, int e,
                                            float* amax_arr) {
  uint32_t bits[8];
  if (gs_arr) {
    uint8_t codes[16];
    const uint8_t sf = fmt::quantize_activation_block(v, 16, gs_arr[e], codes);
    const float s = fmt::e4m3_decode(sf);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      bits[i] = fmt::bf16x2_bits_exact(fmt::e2m1_decode(codes[2 * i]) * s, fmt::e2m1_decode(codes[2 * i + 1]) * s);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) bits[i] = fmt::bf16x2_bits_exact(v[2 * i], v[2 * i + 1]);
  }
  if (amax_arr) {
    float m = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
    if (m > 0.0f) atomicMax(reinterpret_cast<int*>(amax_arr + e), __float_as_int(m));
  }
  uint4* d = reinterpret_cast<uint4*>(dst);
  d[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
  d[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
}

template <GemmEpilogue EPI>
__global__ void __launch_bounds__(kMmaThreads) grouped_gemm_mma_kernel(GroupedGemmArgs p) {
  pdl_wait_then_allow_next();
  constexpr bool kGated = EPI == GemmEpilogue::kSwiGLU;
  __shared__ __align__(16) uint16_t smem[2 * kMmaBM * kMmaLds];
  uint16_t* As = smem;                    // (BM, BK) bf16, row stride kMmaLds
  uint16_t* Ws = smem + kMmaBM * kMmaLds; // (BN, BK) bf16, row stride kMmaLds
  float* Cs = reinterpret_cast<float*>(smem);  // (BM, BN) f32 after the K loop, row stride kMmaLdc

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int wm = warp >> 1, wn = warp & 1;
  const int N = p.n, K = p.k, E = p.experts;
  const int I = kGated ? N / 2 : N;  // output columns
  const int n_tiles = kGated ? (I + 31) / 32 : (N + kMmaBN - 1) / kMmaBN;
  const int k_tiles = (K + kMmaBK - 1) / kMmaBK;
  const int total = p.tile_offsets[E] * n_tiles;

  for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const int mt = tile / n_tiles, nt = tile - mt * n_tiles;
    int lo = 0, hi = E;  // largest e with tile_offsets[e] <= mt: the expert owning this m tile
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (p.tile_offsets[mid] <= mt) lo = mid; else hi = mid;
    }
    const int e = lo;
    const int row0 = p.offsets[e] + (mt - p.tile_offsets[e]) * kMmaBM;
    const int row_end = p.offsets[e + 1];
    const uint8_t* wb = p.w + static_cast<size_t>(e) * N * (K / 2);
    const uint8_t* sb = p.w_scale + static_cast<size_t>(e) * N * (K / 16);

    // This thread's staging chunks: A 4 x (row, 8 bf16), W 2 x (row, 16 codes + 1 scale).
    int a_row[4], a_col[4], w_row[2], w_col[2], w_src[2];
    bool a_ok[4], w_ok[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = tid + i * kMmaThreads;
      a_row[i] = c >> 3;
      a_col[i] = (c & 7) * 8;
      a_ok[i] = row0 + a_row[i] < row_end;
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = tid + i * kMmaThreads;
      const int r = c >> 2;
      w_row[i] = r;
      w_col[i] = (c & 3) * 16;
      if constexpr (kGated) {
        const int grp = r >> 4;
        const int col = nt * 32 + (grp >> 1) * 16 + (r & 15);
        w_ok[i] = col < I;
        w_src[i] = (grp & 1) ? I + col : col;
      } else {
        w_src[i] = nt * kMmaBN + r;
        w_ok[i] = w_src[i] < N;
      }
    }
    uint4 ra[4];
    uint2 rw[2];
    uint8_t rs[2];
    auto load = [&](int kt) {
      const int k0 = kt * kMmaBK;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = k0 + a_col[i];
        ra[i] = (a_ok[i] && col < K)
                    ? *reinterpret_cast<const uint4*>(p.a + static_cast<size_t>(row0 + a_row[i]) * K + col)
                    : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int col = k0 + w_col[i];
        const bool ok = w_ok[i] && col < K;
        rw[i] = ok ? *reinterpret_cast<const uint2*>(wb + static_cast<size_t>(w_src[i]) * (K / 2) + col / 2)
                   : make_uint2(0, 0);
        rs[i] = ok ? sb[static_cast<size_t>(w_src[i]) * (K / 16) + col / 16] : uint8_t(0);
      }
    };

    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    load(0);
    for (int kt = 0; kt < k_tiles; ++kt) {
      __syncthreads();  // the previous k tile (or tile epilogue) is done with shared memory
#pragma unroll
      for (int i = 0; i < 4; ++i) *reinterpret_cast<uint4*>(As + a_row[i] * kMmaLds + a_col[i]) = ra[i];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const float s = fmt::e4m3_decode(rs[i]);
        const uint32_t lo32 = rw[i].x, hi32 = rw[i].y;
        uint32_t bits[8];
#pragma unroll
        for (int q = 0; q < 8; ++q) {
          const uint32_t byte = ((q < 4 ? lo32 : hi32) >> ((q & 3) * 8)) & 0xFFu;
          // e2m1 * e4m3 is exact in bf16: truncating the fp32 bits loses nothing.
          bits[q] = fmt::bf16x2_bits_exact(fmt::e2m1_decode(static_cast<uint8_t>(byte & 0xF)) * s,
                                           fmt::e2m1_decode(static_cast<uint8_t>(byte >> 4)) * s);
        }
        uint4* d = reinterpret_cast<uint4*>(Ws + w_row[i] * kMmaLds + w_col[i]);
        d[0] = make_uint4(bits[0], bits[1], bits[2], bits[3]);
        d[1] = make_uint4(bits[4], bits[5], bits[6], bits[7]);
      }
      __syncthreads();
      if (kt + 1 < k_tiles) load(kt + 1);  // global loads of the next k tile fly during the MMAs
#pragma unroll
      for (int ks = 0; ks < kMmaBK / 16; ++ks) {
        const int kb = ks * 16 + 2 * tq;
        uint32_t af[2][4], bf[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const uint16_t* r0 = As + (wm * 32 + i * 16 + g) * kMmaLds + kb;
          af[i][0] = *reinterpret_cast<const uint32_t*>(r0);
          af[i][1] = *reinterpret_cast<const uint32_t*>(r0 + 8 * kMmaLds);
          af[i][2] = *reinterpret_cast<const uint32_t*>(r0 + 8);
          af[i][3] = *reinterpret_cast<const uint32_t*>(r0 + 8 * kMmaLds + 8);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint16_t* r0 = Ws + (wn * 32 + j * 8 + g) * kMmaLds + kb;
          bf[j][0] = *reinterpret_cast<const uint32_t*>(r0);
          bf[j][1] = *reinterpret_cast<const uint32_t*>(r0 + 8);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16_16816(acc[i][j], af[i], bf[j]);
      }
    }

    // Epilogue: accumulators -> shared (BM, BN) f32 tile -> per-element math -> global.
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = wm * 32 + i * 16 + g, c = wn * 32 + j * 8 + 2 * tq;
        *reinterpret_cast<float2*>(Cs + r * kMmaLdc + c) = make_float2(acc[i][j][0], acc[i][j][1]);
        *reinterpret_cast<float2*>(Cs + (r + 8) * kMmaLdc + c) = make_float2(acc[i][j][2], acc[i][j][3]);
      }
    __syncthreads();
    const float a0 = p.alpha0[e];
    if constexpr (EPI == GemmEpilogue::kF32) {
      float* out = static_cast<float*>(p.out);
      for (int idx = tid; idx < kMmaBM * (kMmaBN / 4); idx += kMmaThreads) {
        const int r = idx / (kMmaBN / 4), c = (idx % (kMmaBN / 4)) * 4;
        const int row = row0 + r, col = nt * kMmaBN + c;
        if (row >= row_end || col >= N) continue;
        const float* s = Cs + r * kMmaLdc + c;
        *reinterpret_cast<float4*>(out + static_cast<size_t>(row) * N + col) =
            make_float4(a0 * s[0], a0 * s[1], a0 * s[2], a0 * s[3]);
      }
    } else if constexpr (EPI == GemmEpilogue::kSwiGLU) {
      const float a1 = p.alpha1[e];
      uint16_t* out = static_cast<uint16_t*>(p.out);
      const int r = tid >> 1, b = tid & 1;  // 64 rows x 2 blocks of 16 outputs
      const int row = row0 + r, col = nt * 32 + b * 16;
      if (row < row_end && col < I) {
        const float* gate = Cs + r * kMmaLdc + b * 32;
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = fmt::bf16_round(silu(a0 * gate[i]) * (a1 * gate[16 + i]));
        store_act16(out + static_cast<size_t>(row) * I + col, v, p.gs, e, p.amax);
      }
    } else {
      uint16_t* out = static_cast<uint16_t*>(p.out);
      for (int idx = tid; idx < kMmaBM * (kMmaBN / 16); idx += kMmaThreads) {
        const int r = idx >> 2, b = idx & 3;
        const int row = row0 + r, col = nt * kMmaBN + b * 16;
        if (row >= row_end || col >= N) continue;
        const float* s = Cs + r * kMmaLdc + b * 16;
        float v[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const float h = fmaxf(a0 * s[i], 0.0f);
          v[i] = fmt::bf16_round(h * h);
        }
        store_act16(out + static_cast<size_t>(row) * N + col, v, p.gs, e, p.amax);
      }
    }
  }
}

}  // namespace nvfp4moe::cuda::kernels
