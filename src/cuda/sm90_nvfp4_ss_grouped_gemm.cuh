// sm_90a NVFP4 grouped GEMM with the dequantized weights in shared memory ("SS": both wgmma operands from shared
// memory), for prefill. docs/gemm.md, "Prefill with SS wgmma".
//
// Why: the register-A tile kernel (sm90_nvfp4_grouped_gemm.cuh) dequantizes a unit's k-tile in each consumer
// thread, into the registers its wgmma reads, once per token tile. An expert with more rows than one tile (bt144:
// 145..288 rows, which near-uniform routing at T k / E ~ 128 gives a quarter of the experts) pays a second pass
// whose dequantization costs about as much as the first while its wgmmas are small (N <= 64): the spread of the
// expert counts is what keeps uniform prefill at ~0.6 of dense bf16 (docs/gemm.md, "Where uniform prefill loses
// to balanced routing"). Here one warpgroup dequantizes each k-tile of one unit (both 64-row blocks) once into a
// 128-byte-swizzled K-major bf16 tile in shared memory, and two consumer warpgroups run m64nNk16 with A and B
// both from shared memory, each on its own token sub-tile of up to 144 rows: an expert of up to 288 rows is one
// pass, and the consumers issue nothing but wgmma.
//
// Roles (4 warpgroups, one CTA an SM, persistent over (expert, unit, 288-row token tile)):
//   warpgroup 0, warp 0: the producer (the tile walk; lane 0 issues a stage's TMA loads: the unit's 4.6 KB of
//     codes and scales and one or two 144-row token boxes, the second only where the tile has more than 144
//     rows). The dynamic schedule (GemmParams::tile_counter) as in the register-A kernel.
//   warpgroup 1: the dequantizer. Per k-tile: the unit's weights from the stage (each thread exactly the words a
//     register-A consumer thread of a whole unit loads, dequant_ktile: the same bf16 values), stmatrix of its
//     fragments into a dequantized slot, fence.proxy.async (generic-proxy writes before the wgmma's async-proxy
//     reads), an arrive on the slot's full barrier; then it releases the weight stage.
//   warpgroups 2, 3: consumer c takes token rows [144 c, 144 c + 144) of a tile of more than 144 rows (rows past the
//     tile's count are not stored), N = mma_n_for_rows<144>(its rows); a tile of up to 144 rows goes to one of the
//     two, alternately; one without rows in a tile only waits and releases.
// The bits: every accumulator sums the same bf16 products (the same weights, the same activations) over the same
// k16 steps in the same order as the register-A kernel's; SS and RS wgmma give the same results (tested bitwise
// against bt144_s8_wg2: BatchInvariance, SsBitIdenticalToRegisterA).
#pragma once

#include "cuda/sm90_nvfp4_grouped_gemm.cuh"
#include "cuda/sm90_wgmma_bf16_ss.cuh"

namespace nvfp4moe::cuda::sm90 {

inline constexpr int kSsSubRows = 144;               // token rows of one consumer warpgroup (wgmma N <= 144)
inline constexpr int kSsTileRows = 2 * kSsSubRows;   // token rows of a CTA tile
inline constexpr int kSsBlockBytes = 64 * 128;       // one dequantized 64-row block: 64 rows x 64 k bf16, swizzled

template <int STAGES, int DEQ_SLOTS = 2>
struct SsTraits {
  static constexpr int kThreads = 4 * 128;
  static constexpr int kSubABytes = kSsSubRows * 128;  // one 144-row token box of a stage (TMA, 128-byte swizzle)
  static constexpr int kABytes = 2 * kSubABytes;
  static constexpr int kWBytes = kUnitBytes;           // one unit's k-tile: 2 x (2048 code + 256 scale bytes)
  static constexpr int kDeqBytes = 2 * kSsBlockBytes;  // one dequantized slot: both blocks of the unit
  static constexpr int kDeqSlots = DEQ_SLOTS;
  // A weight-and-token stage is free once the dequantizer's 4 warps (weights) and the consumers' 8 (tokens) have
  // released it; a dequantized slot once the 8 consumer warps have.
  static constexpr int kEmptyArrivals = 4 + 8;
  static constexpr int kDeqFullArrivals = 4;
  static constexpr int kDeqEmptyArrivals = 8;
  // setmaxnreg: the producer as the register-A kernel's 2-warpgroup tiles; the dequantizer holds one k-tile's
  // fragments (32) and its codes; the consumers 144 accumulators and no A registers.
  static constexpr int kProducerRegs = 40;
  static constexpr int kDequantRegs = 88;
  static constexpr int kConsumerRegs = 192;
  static constexpr int kRegsNeeded = 128 * (kProducerRegs + kDequantRegs) + 2 * 128 * kConsumerRegs;
  static_assert(kRegsNeeded <= 65536, "setmaxnreg budget exceeds the register file");
  static constexpr int kBarrierBytes = (2 * STAGES + 2 * kDeqSlots) * 8;
  static constexpr int kSmemBytes = 1024 /*align*/ + STAGES * kABytes + kDeqSlots * kDeqBytes + STAGES * kWBytes +
                                    kBarrierBytes + STAGES * static_cast<int>(sizeof(TileSlot));
  static_assert(kSubABytes % 1024 == 0 && kDeqBytes % 1024 == 0, "swizzled tiles stay 1024-byte aligned");
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// stmatrix of four 8x8 b16 matrices: matrix i from register r[i], its rows at the addresses of lanes 8i .. 8i + 7.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}

struct SsSmem {
  uint32_t a, deq, w;                 // token stages, dequantized slots, weight stages (shared addresses)
  uint32_t full0, empty0, dfull0, dempty0, slots;
};

// The next tile of a dequantizer or consumer warpgroup: from the tile slot of the stage that holds the tile's first
// k-tile (dynamic schedule; waits for that stage), or from its own cursor (static). False: no tile left.
struct SsTile {
  int e, local, row_begin, rows;
};
__device__ __forceinline__ bool ss_next_tile(const GemmParams& p, bool dynamic, TileCursor<kSsTileRows>& cur,
                                             int& idx, int iter, const SsSmem& sm, int s, uint32_t phase,
                                             SsTile& tile) {
  if (dynamic) {
    mbar_wait(sm.full0 + 8 * s, phase);
    const int4 ts = lds128_volatile(sm.slots + s * sizeof(TileSlot));
    tile = SsTile{ts.x, ts.y, ts.z, ts.w};
    return ts.x >= 0;
  }
  if (iter > 0) idx += gridDim.x;
  if (!cur.template seek<kConsumerExpertsPerLane>(p, p.units, idx)) return false;
  tile = SsTile{cur.e, idx - cur.first, cur.row_begin, cur.rows};
  return true;
}

template <int STAGES, int DEQ_SLOTS>
__device__ __forceinline__ void produce_ss_tiles(const CUtensorMap* tmap_a, const GemmParams& p, const SsSmem& sm) {
  using Tr = SsTraits<STAGES, DEQ_SLOTS>;
  const bool issuer = threadIdx.x == 0;
  const bool dynamic = p.tile_counter != nullptr;
  int idx = blockIdx.x, s = 0;
  uint32_t phase = 0;
  TileCursor<kSsTileRows> cur;
  while (cur.template seek<kProducerExpertsPerLane>(p, p.units, idx)) {
    const int local = idx - cur.first;
    const int n_idx = local / cur.ttiles, t_idx = local - n_idx * cur.ttiles;
    const int row0 = cur.row_begin + t_idx * kSsTileRows;
    // The second token box only where the tile has rows there (its consumer is idle otherwise).
    const bool two = cur.rows - t_idx * kSsTileRows > kSsSubRows;
    if (issuer) {
      const uint8_t* wsrc = p.w + (static_cast<size_t>(cur.e) * p.units + n_idx) * p.k_tiles * kUnitBytes;
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        mbar_wait(sm.empty0 + 8 * s, phase ^ 1);
        const uint32_t full = sm.full0 + 8 * s;
        if (dynamic && kt == 0) sts128(sm.slots + s * sizeof(TileSlot), cur.e, local, cur.row_begin, cur.rows);
        mbar_expect_tx(full, Tr::kWBytes + (two ? 2 : 1) * Tr::kSubABytes);
        const uint32_t a_dst = sm.a + s * Tr::kABytes;
        tma_load_2d(a_dst, tmap_a, kt * kBlockK, row0, full);
        if (two) tma_load_2d(a_dst + Tr::kSubABytes, tmap_a, kt * kBlockK, row0 + kSsSubRows, full);
        bulk_load(sm.w + s * Tr::kWBytes, wsrc + static_cast<size_t>(kt) * kUnitBytes, kUnitBytes, full);
        if (++s == STAGES) { s = 0; phase ^= 1; }
      }
    }
    if (dynamic) {
      idx = claim_next_tile(p, issuer);
    } else {
      __syncwarp();
      idx += gridDim.x;
    }
  }
  if (dynamic && issuer) end_dynamic_schedule<1>(p, s, phase, sm.full0, sm.empty0, sm.slots, idx, cur.first);
}

// The dequantizer warpgroup. Thread (warp w, lane 4g + t) dequantizes what a register-A consumer thread of a whole
// unit would: rows 16w + g, 16w + g + 8 of each block, k 2t, 2t + 1, 2t + 8, 2t + 9 of each k16 step j
// (a[b][4j .. 4j + 3], the m64k16 A fragment). stmatrix.x4 of step j's four registers writes that warp's 16 rows
// x 16 k of block b: matrix i = register a[b][4j + i] holds rows + 8 (i & 1), k + 8 (i >> 1); lane l addresses
// row l % 8 of matrix l / 8. Row r of a block is 128 bytes at r x 128, its 16-byte chunk c at (c ^ (r % 8)) x 16:
// the TMA's 128-byte swizzle, which the wgmma descriptor (make_b_desc) reads for A as it does for the tokens.
template <int STAGES, int DEQ_SLOTS>
__device__ __forceinline__ void dequant_ss_tiles(const GemmParams& p, const SsSmem& sm) {
  using Tr = SsTraits<STAGES, DEQ_SLOTS>;
  const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool dynamic = p.tile_counter != nullptr;
  const int row = 16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1);  // the row this lane addresses
  const uint32_t row_addr = static_cast<uint32_t>(row) * 128;
  const int chunk_hi = lane >> 4, swz = lane & 7;  // (row % 8 == lane % 8)
  const uint32_t scale_off = static_cast<uint32_t>(scale_word_offset<2>(warp, g, t));
  int idx = blockIdx.x, s = 0, d = 0;
  uint32_t phase = 0, dphase = 0;
  TileCursor<kSsTileRows> cur;
  for (int iter = 0;; ++iter) {
    SsTile tile;
    if (!ss_next_tile(p, dynamic, cur, idx, iter, sm, s, phase, tile)) break;
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      mbar_wait(sm.full0 + 8 * s, phase);
      const uint32_t wsm = sm.w + s * Tr::kWBytes;
      uint4 codes[2];
#pragma unroll
      for (int b = 0; b < 2; ++b) codes[b] = lds128(wsm + b * kChunkBytes + tid * 16);
      uint32_t a[2][16];
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 1
      // Measurement hook (gemm_microbench only, wrong results): the conversion left out as in the register-A
      // kernel's experiment 1 (the code words, XOR the scale word, go to stmatrix as they are); the loads, the
      // stores, the fence and the handoff stay. Whether the dequantizer's conversion chain bounds the SS kernel.
      const uint32_t sw = lds32(wsm + scale_off);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const uint32_t w[4] = {codes[b].x, codes[b].y, codes[b].z, codes[b].w};
#pragma unroll
        for (int i = 0; i < 16; ++i) a[b][i] = w[i / 4] ^ sw;
      }
#else
      dequant_ktile<2>(codes, lds32(wsm + scale_off), a);
#endif
      mbar_wait(sm.dempty0 + 8 * d, dphase ^ 1);  // the consumers are done with this slot's previous k-tile
      const uint32_t dst = sm.deq + d * Tr::kDeqBytes + row_addr;
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          stmatrix_x4(dst + b * kSsBlockBytes + ((((2 * j + chunk_hi) ^ swz)) << 4), a[b][4 * j], a[b][4 * j + 1],
                      a[b][4 * j + 2], a[b][4 * j + 3]);
      fence_proxy_async_shared();  // this thread's stmatrix writes, before the consumers' wgmma reads them
      // The weight stage's release comes after the stmatrix (asm volatile, in order): its registers were computed
      // from every word this thread loaded, so no load of the stage is still in flight at the arrive.
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(sm.dfull0 + 8 * d);
        mbar_arrive(sm.empty0 + 8 * s);
      }
      if (++s == STAGES) { s = 0; phase ^= 1; }
      if (++d == DEQ_SLOTS) { d = 0; dphase ^= 1; }
    }
  }
}

template <int STAGES, int DEQ_SLOTS, Epilogue EPI>
__device__ __forceinline__ void consume_ss_tiles(const GemmParams& p, const SsSmem& sm) {
  using Tr = SsTraits<STAGES, DEQ_SLOTS>;
  // This consumer warpgroup (0 or 1), through a shuffle from lane 0: ptxas then treats it (and the token half and
  // wgmma width that follow from it) as warp-uniform. Computed from threadIdx directly, the width's branch counted as
  // divergent and ptxas serialized every wgmma (C7520) and spilled in the relu^2 epilogue.
  const int c = __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x) / 128 - 2, 0);
  const int tid = static_cast<int>(threadIdx.x) % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool dynamic = p.tile_counter != nullptr;
  int idx = blockIdx.x, s = 0, d = 0;
  uint32_t phase = 0, dphase = 0;
  TileCursor<kSsTileRows> cur;
  auto advance = [&]() {
    if (++s == STAGES) { s = 0; phase ^= 1; }
    if (++d == DEQ_SLOTS) { d = 0; dphase ^= 1; }
  };
  // A warp's release of a token stage and a dequantized slot once its wgmmas that read them are complete.
  auto release = [&](int stage, int slot) {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(sm.empty0 + 8 * stage);
      mbar_arrive(sm.dempty0 + 8 * slot);
    }
  };
  for (int iter = 0;; ++iter) {
    SsTile tile;
    if (!ss_next_tile(p, dynamic, cur, idx, iter, sm, s, phase, tile)) break;
    const int ttiles = (tile.rows + kSsTileRows - 1) / kSsTileRows;
    const int n_idx = tile.local / ttiles, t_idx = tile.local - n_idx * ttiles;
    const int tile_rows = min(kSsTileRows, tile.rows - t_idx * kSsTileRows);
    // The token half this warpgroup computes (-1: none). A tile of up to 144 rows has one half, in the stage's
    // first box: the CTA's tiles of that kind alternate between the two warpgroups (iter counts the same tiles in
    // both), so that one's epilogue overlaps the other's k-loop of the next tile, as the register-A kernel's
    // consumer stagger intends. A tile of more rows: half c to warpgroup c.
    const int sub = tile_rows > kSsSubRows ? c : (c == (iter & 1) ? 0 : -1);
    const int my_rows = sub < 0 ? 0 : sub == 0 ? min(tile_rows, kSsSubRows) : tile_rows - kSsSubRows;
    if (my_rows == 0) {  // nothing to compute: keep the barriers' counts (every stage and slot gets 8 arrivals)
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        mbar_wait(sm.full0 + 8 * s, phase);
        mbar_wait(sm.dfull0 + 8 * d, dphase);
        release(s, d);
        advance();
      }
      continue;
    }
    float acc[2][kSsSubRows / 2];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < kSsSubRows / 2; ++i) acc[b][i] = 0.0f;
    const int n_mma = mma_n_for_rows<kSsSubRows>(my_rows);
    // k-tile kt's 8 wgmmas: block b's A at its slot, k16 step j at +32 bytes (descriptor +2) in both operands;
    // b innermost, so that consecutive wgmmas use different accumulators (as the register-A kernel).
    auto issue = [&]() {
      const uint64_t desc_a = make_b_desc(sm.deq + d * Tr::kDeqBytes);
      const uint64_t desc_b = make_b_desc(sm.a + s * Tr::kABytes + sub * Tr::kSubABytes);
      reg_fence_all(acc);
      wgmma_fence();
      auto run = [&](auto n_const) {
        constexpr int NM = decltype(n_const)::value;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int b = 0; b < 2; ++b)
            WgmmaSS<NM>::mma(acc[b], desc_a + b * (kSsBlockBytes >> 4) + 2 * j, desc_b + 2 * j);
      };
      run_at_wgmma_width<kSsSubRows>(n_mma, run);
    };
    // One batch in flight across k-tiles, as the register-A kernel: issue kt, wait for kt - 1, release its stage
    // and slot, wait for kt + 1's.
    int s_prev = 0, d_prev = 0;
    for (int kt = 0; kt < p.k_tiles; ++kt) {
      mbar_wait(sm.full0 + 8 * s, phase);
      mbar_wait(sm.dfull0 + 8 * d, dphase);
      issue();
      if (kt > 0) {
        wgmma_wait<1>();
        release(s_prev, d_prev);
      }
      s_prev = s;
      d_prev = d;
      advance();
    }
    wgmma_wait<0>();
    reg_fence_all(acc);
    release(s_prev, d_prev);
    const float no_up[1] = {0.0f};
    store_tile_outputs<kSsSubRows, 2, EPI, 1>(p, acc, no_up, tile.e, n_idx, 0,
                                              tile.row_begin + t_idx * kSsTileRows + sub * kSsSubRows, my_rows, warp,
                                              g, t);
  }
}

template <int STAGES, int DEQ_SLOTS, Epilogue EPI>
__global__ void __launch_bounds__(4 * 128, 1)
    sm90_nvfp4_ss_grouped_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a, const GemmParams p) {
  using Tr = SsTraits<STAGES, DEQ_SLOTS>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  SsSmem sm;
  sm.a = smem_u32(base);
  sm.deq = sm.a + STAGES * Tr::kABytes;
  sm.w = sm.deq + Tr::kDeqSlots * Tr::kDeqBytes;
  sm.full0 = sm.w + STAGES * Tr::kWBytes;
  sm.empty0 = sm.full0 + 8 * STAGES;
  sm.dfull0 = sm.empty0 + 8 * STAGES;
  sm.dempty0 = sm.dfull0 + 8 * Tr::kDeqSlots;
  sm.slots = sm.dempty0 + 8 * Tr::kDeqSlots;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(sm.full0 + 8 * s, 1u);
      mbar_init(sm.empty0 + 8 * s, Tr::kEmptyArrivals);
    }
    for (int d = 0; d < Tr::kDeqSlots; ++d) {
      mbar_init(sm.dfull0 + 8 * d, Tr::kDeqFullArrivals);
      mbar_init(sm.dempty0 + 8 * d, Tr::kDeqEmptyArrivals);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  kernels::pdl_wait_then_allow_next();  // the offsets, A and the outputs: after the previous kernel (PDL)
  const int role = static_cast<int>(threadIdx.x) / 128;
  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Tr::kProducerRegs));
    if (threadIdx.x >= 32) return;
    if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tmap_a)) : "memory");
    produce_ss_tiles<STAGES, DEQ_SLOTS>(&tmap_a, p, sm);
  } else if (role == 1) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Tr::kDequantRegs));
    dequant_ss_tiles<STAGES, DEQ_SLOTS>(p, sm);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Tr::kConsumerRegs));
    consume_ss_tiles<STAGES, DEQ_SLOTS, EPI>(p, sm);
  }
}

}  // namespace nvfp4moe::cuda::sm90
