// sm90_nvfp4_grouped_gemm.cuh: the Hopper (sm_90a) grouped GEMM over MoE experts with NVFP4 weights.
// Device code only, framework-free (CUDA runtime types, no library headers but src/format/nvfp4.h).
//
//   C[r, n] = alpha(e, half(n)) * sum_k A[r, k] * Wdq[e][n][k]      for the rows r of expert e,
//   r in [offsets[e], offsets[e+1]) (offsets read from device memory), Wdq = e2m1(code) * e4m3(block scale).
//
// Swap A/B: the weight is the wgmma A operand (M = 64 weight rows per instruction), dequantized from FP4 in
// registers; the expert's token rows are the wgmma N dimension (BT = 16..128), read by TMA from shared memory
// (128-byte swizzle). One CTA = 1 producer warpgroup (one thread issues the TMA and bulk copies) + WGS consumer
// warpgroups; each consumer owns one "unit" = two 64-row weight blocks (gate j / up j for the gated epilogue,
// two consecutive 64-column blocks otherwise), so the gate and up values of one output element sit in the same
// thread. The K reduction runs over k-tiles of 64 in order, with no split: a row's bits never depend on the
// other rows of the batch (design.md rule 3).
//
// Prepared weight layout (sm90_prepare_weights writes it; lossless: the checkpoint's bits, reordered):
//   bytes [E][units][k_tiles][2 blocks][2304]; one 2304-byte chunk = 64 weight rows x 64 k:
//     [0, 2048): FP4 codes, 16 bytes per consumer thread tid (warp w = tid/32, g = (tid%32)/4, t = tid%4);
//                32-bit word j (k16 step j) holds the 8 codes of wgmma A registers i = 0..3 (low element e = 0,
//                high e = 1), each bit at fp4_src_bit(i, e, q) (a fixed permutation, below). Register i covers
//                row r0 = 16w + g (i even) or r0 + 8 (i odd), k = 16j + 2t + 8 * (i / 2) (low) and k + 1
//                (high): the m64k16 A fragment.
//     [2048, 2304): e4m3 block scales, 8 bytes per row pair (w * 8 + g): word h2 = 0, 1 holds the scales of
//                k16 steps 2*h2 + jj for rows r0 + 8h, bit b at scale_src_bit(jj, h, b) (the 4 threads t of one
//                row pair read the same bytes).
//   Rows past N and k past K are zero codes with zero scales (contribute exactly 0).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdint>

#include "cuda/launch_pdl.cuh"
#include "cuda/sm90_gather_rows.h"
#include "cuda/sm90_mixed_last_pass.h"
#include "cuda/sm90_wgmma_bf16_rs.cuh"
#include "format/nvfp4.h"

// Measurement variants of the kernel (0 = the engine; the list is at dequant_experiment below).
#ifndef NVFP4MOE_SM90_DEQUANT_EXPERIMENT
#define NVFP4MOE_SM90_DEQUANT_EXPERIMENT 0
#endif

namespace nvfp4moe::cuda::sm90 {

inline constexpr int kBlockK = 64;           // k per tile: 64 bf16 = one 128-byte swizzle row of A
inline constexpr int kChunkBytes = 2304;     // one 64x64 weight block: 2048 code bytes + 256 scale bytes
inline constexpr int kCodeBytes = 2048;
inline constexpr int kUnitBytes = 2 * kChunkBytes;  // one consumer warpgroup's share of one k-tile
// Dequantized weights carry a factor 2^-26 (see dequant below); the epilogue multiplies it back exactly.
inline constexpr float kWeightUnscale = 67108864.0f;  // 2^26

enum class Epilogue : int {
  kF32 = 0,     // out f32 [rows, n_out] = alpha0[e] * acc                          (GEMM2)
  kSwiGLU = 1,  // out bf16 [rows, n_out]: silu(alpha0[e] * gate) * (alpha1[e] * up)  (GEMM1, gated)
  kRelu2 = 2,   // out bf16 [rows, n_out]: max(alpha0[e] * acc, 0)^2                  (GEMM1, non-gated)
};

struct GemmParams {
  const uint8_t* w;         // prepared weights, layout above
  const int32_t* offsets;   // [E + 1] row offsets of the experts (device)
  const float* alpha0;      // [E]: the alpha (kF32, kRelu2) or the gate's (kSwiGLU)
  const float* alpha1;      // [E]: the up half's alpha (kSwiGLU), else unused
  const float* gs;          // [E] or nullptr: NVFP4-quantize the bf16 output per 16 columns with gs[e]
  void* out;                // f32 or bf16 (uint16 bits) [rows, n_out], row-major
  int num_experts;
  int units;                // weight units per expert (128 prepared rows each)
  int k_tiles;              // ceil(K / 64)
  int n_out;                // output columns: N (kF32, kRelu2) or N / 2 (kSwiGLU)
  // Dynamic tile schedule (nullptr: the static one, tile blockIdx.x + i * gridDim.x). Each CTA takes tile
  // blockIdx.x first, then the next unclaimed one, gridDim.x + atomicAdd(tile_counter, 1), as its producer finishes
  // issuing a tile's loads, and hands each tile to its consumers through shared memory (TileSlot). Zero before the
  // launch; the launch's last claim resets it to zero, so consecutive launches (and graph replays) need no memset.
  int32_t* tile_counter = nullptr;
  // Consumer stagger (plain tile kernel, tiles of 64 rows and more: two consumer warpgroups of a unit each): the
  // second warpgroup starts this many nanoseconds (__nanosleep) after the first, so that their epilogues stop
  // coinciding (sm90_nvfp4_grouped_gemm_kernel). 0: both start together. Same bits either way.
  int consumer_stagger_ns = 0;
  // Gathered A (plain tile kernel; nullptr: A through the TMA descriptor). GEMM row r reads source row
  // gather_source_row(r) of gather_src [gather_src_rows, gather_k] bf16: the four producer warps copy each
  // k-tile's rows with cp.async into the stage, swizzled as the TMA would (produce_tiles_gathered).
  const uint16_t* gather_src = nullptr;
  const int32_t* gather_perm = nullptr;  // nullptr: source row = r
  int gather_src_rows = 0;
  int gather_k = 0;                      // K: the source's row length in elements
  int gather_top_k = 1;                  // rows below offsets[gather_perm_experts]: gather_perm[r] / gather_top_k
  int gather_perm_experts = 0;           // rows from offsets[gather_perm_experts] on: r - offsets[gather_perm_experts]
  int gather_shared_base = 0;            //   + gather_shared_base
};

// A tile as the producer hands it to the consumers in the dynamic schedule: one per pipeline stage, written with
// the tile's first k-tile (before that stage's full barrier is armed, which orders it before the consumers'
// wait), read by the consumers right after that wait and before any of them releases the stage.
struct TileSlot {
  int32_t expert;     // < 0: no more tiles (the consumers exit)
  int32_t local;      // tile index within the expert: n-tile * token tiles + token tile
  int32_t row_begin;  // the expert's first row (offsets[e])
  int32_t rows;       // the expert's rows
};

// Gathered A (GemmParams::gather_src, produce_tiles_gathered). A stage's full barrier then completes on thread 0's
// arrive.expect_tx (the weights' bytes, as always) and one arrival per producer thread, which its
// cp.async.mbarrier.arrive.noinc makes once the thread's copies of the stage have landed (no thread waits).
inline constexpr uint32_t kGatherFullArrivals = 1 + kGatherCopyThreads;
inline constexpr int kGatherProducerBarrier = 12;  // named barrier of the four producer warps (1..7: consumers)

// ------------------------------------------------------------------------------------------- PTX helpers
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// 2D tile of A (x = k element, y = row) into swizzled shared memory; completes on bar.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
// Contiguous bytes (multiple of 16) global -> shared; completes on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts128(uint32_t addr, int32_t x, int32_t y, int32_t z, int32_t w) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
}
__device__ __forceinline__ int4 lds128_volatile(uint32_t addr) {
  int4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
// Four 8x8 b16 matrices from shared memory; lane l gives the row address of row l % 8 of matrix l / 8, and
// receives in r[m] matrix m's (row lane / 4, columns 2 (lane % 4), +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Warp-level m16n8k16, f32 += bf16 * bf16 (the sync-MMA consumer's instruction): A = the same 4 fragment
// registers as one warp's share of wgmma's m64k16 A; d = c[0..3] = rows g, g, g + 8, g + 8 x tokens 2t, 2t + 1.
__device__ __forceinline__ void mma_16816(float* d, const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Per-thread 16-byte async copy global -> shared (generic proxy); src_bytes < 16 zero-fills the rest.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// Orders this thread's generic-proxy shared memory writes (its completed cp.async included) before later
// async-proxy accesses (wgmma reading the stage) that a release/acquire through an mbarrier makes follow them.
// sm_90a SASS: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The gathered-A consumers' fence after each full-barrier wait (consume_tiles' GATHER): the bidirectional fence
// above. Experiment 18 (an A/B build, docs/gemm.md "GEMM1 without the gather kernel") takes the uni-directional
// generic-to-async acquire form meant for an mbarrier hand-off instead, which ptxas compiles to no instruction on
// sm_90a (only the compiler's ordering): it measures what the MEMBAR costs per k-tile. Whether that form alone
// orders the producer warps' cp.async rows (generic-proxy writes, arrived with cp.async.mbarrier.arrive.noinc)
// before the wgmma's reads is the open question that keeps it out of the engine.
__device__ __forceinline__ void gathered_a_proxy_fence() {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 18
  asm volatile("fence.proxy.async::generic.acquire.sync_restrict::shared::cluster.cluster;" ::: "memory");
#else
  fence_proxy_async_shared();
#endif
}
// An arrival on bar once every cp.async this thread issued before it has completed; noinc: counted in the
// barrier's expected arrivals (its init count).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_count(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void sts32(uint32_t addr, int32_t x) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(x) : "memory");
}
__device__ __forceinline__ int32_t lds32_volatile(uint32_t addr) {
  int32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// Named barrier 1.. (0 is __syncthreads) over `threads` threads (a multiple of 32). The non-.aligned form: the
// compiler does not reconverge a warp before inline asm (the k-loop's `tid == 0` arrivals leave warp 0
// diverged), and bar.sync (= barrier.sync.aligned) executed by a diverged warp is what compute-sanitizer's
// synccheck reported at 8404347.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma boundary.
__device__ __forceinline__ void reg_fence(float& x) { asm volatile("" : "+f"(x)::"memory"); }
// reg_fence of every accumulator of a thread: before a wgmma batch's fence and after its wait, so that the compiler
// neither moves accumulator reads or writes across the asynchronous MMAs nor keeps copies of them.
template <int NB, int N>
__device__ __forceinline__ void reg_fence_all(float (&acc)[NB][N]) {
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < N; ++i) reg_fence(acc[b][i]);
}

// wgmma B descriptor: K-major tile of rows x 64 bf16 (128 bytes a row), 128-byte swizzle, 8-row groups 1024 B
// apart. The k16 step j inside the tile adds 32 * j bytes to the start address (field in 16-byte units).
__device__ __forceinline__ uint64_t make_b_desc(uint32_t smem_addr) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>(1) << 16;           // leading byte offset (unused with swizzled K-major)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;   // stride byte offset: 8 rows x 128 B
  d |= static_cast<uint64_t>(1) << 62;           // swizzle mode: 128 B
  return d;
}

template <int V>
struct IntC { static constexpr int value = V; };
// Wgmma<N>::mma (m64nNk16, A from registers): sm90_wgmma_bf16_rs.cuh, generated for every N the tiles use.

// ------------------------------------------------------------------------------------------- dequantization
// The prepared bit order (layout version 2). Everything below is a permutation of the checkpoint's bits inside
// one 32-bit word; the kernel undoes it with rotates and masks, the prepare kernel applies it with these maps.
//
// FP4: word j of a thread (k16 step j) holds its 4 A registers i (8 bits each: two e2m1 codes, e = 0 the low
// k element, e = 1 the high one). Register i is extracted as rotl(w, R) & mask, which must leave the code's
// magnitude bits q = 0..2 at bf16 bits 6..8 (+16e) and its sign (q = 3) at bit 15 (+16e): the "tiny" pattern
// (below). No 4 rotations of that 8-bit pattern tile 32 bits (exhaustive search), so registers 0..2 are one
// rotate + one AND each (register 0: rotation 0, the AND alone), and register 3 takes its m0, m1 and sign
// through rotation 2 and its m2 through rotation 10: 9 integer ops per word instead of 15.
__host__ __device__ constexpr int fp4_rotation(int i, int q) {
  return i == 0 ? 0 : i == 1 ? 6 : i == 2 ? 12 : (q == 2 ? 10 : 2);
}
__host__ __device__ constexpr int fp4_target_bit(int e, int q) { return 16 * e + (q < 3 ? 6 + q : 15); }
// Bit of the prepared word that holds bit q of code e of register i.
__host__ __device__ constexpr int fp4_src_bit(int i, int e, int q) {
  return (fp4_target_bit(e, q) - fp4_rotation(i, q) + 32) % 32;
}
// Block scales: word h2 (0, 1) of a row pair's 8 bytes holds the scales of k16 steps j = 2*h2 + jj (jj = 0, 1)
// for rows r0 (h = 0) and r0 + 8 (h = 1). Step jj = 0 sits where its "tiny" bf16 pattern goes (magnitude bits
// b = 0..6 at 4 + b (+16h), sign at 15 (+16h)): extracted by one AND; step jj = 1 fills the other 16 bits and
// comes out of rotl 4 (b = 0..3 and the sign) and rotl 28 (b = 4..6): two rotates and two LOP3s.
__host__ __device__ constexpr int scale_src_bit(int jj, int h, int b) {
  const int target = 16 * h + (b < 7 ? 4 + b : 15);
  if (jj == 0) return target;
  return (b < 4 || b == 7) ? (target - 4 + 32) % 32 : (target + 4) % 32;
}
__host__ __device__ constexpr bool prepared_bit_order_is_a_permutation() {
  unsigned fp4 = 0, sc = 0;
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 2; ++e)
      for (int q = 0; q < 4; ++q) {
        const unsigned bit = 1u << fp4_src_bit(i, e, q);
        if (fp4 & bit) return false;
        fp4 |= bit;
      }
  for (int jj = 0; jj < 2; ++jj)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 8; ++b) {
        const unsigned bit = 1u << scale_src_bit(jj, h, b);
        if (sc & bit) return false;
        sc |= bit;
      }
  return fp4 == 0xFFFFFFFFu && sc == 0xFFFFFFFFu;
}
static_assert(prepared_bit_order_is_a_permutation(), "the prepared bit order must be lossless");

// The prepared word of one k16 step from the 8 codes of its 4 registers (code[i][e], 4 bits each).
__host__ __device__ inline uint32_t pack_fp4_word(const uint32_t (&code)[4][2]) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i)
    for (int e = 0; e < 2; ++e)
      for (int q = 0; q < 4; ++q) w |= ((code[i][e] >> q) & 1u) << fp4_src_bit(i, e, q);
  return w;
}
// The prepared scale word of steps 2*h2, 2*h2 + 1 from sc[jj][h] (e4m3 bytes).
__host__ __device__ inline uint32_t pack_scale_word(const uint8_t (&sc)[2][2]) {
  uint32_t w = 0;
  for (int jj = 0; jj < 2; ++jj)
    for (int h = 0; h < 2; ++h)
      for (int b = 0; b < 8; ++b) w |= ((static_cast<uint32_t>(sc[jj][h]) >> b) & 1u) << scale_src_bit(jj, h, b);
  return w;
}

__device__ __forceinline__ uint32_t rotl(uint32_t w, int n) { return __funnelshift_l(w, w, n); }
__device__ __forceinline__ uint32_t lop_or_and(uint32_t x, uint32_t mx, uint32_t y, uint32_t my) {
  return (x & mx) | (y & my);
}
// FP4 register I of a prepared word -> bf16x2 "tiny" values: magnitude bits at bf16 bits 8..6 (exponent low
// bits + top mantissa bit), sign at bit 15. That reads as e2m1 * 2^-126 for every code, 0.5 included (it
// becomes the bf16 subnormal 2^-127).
inline constexpr uint32_t kTinyFp4Mask = 0x81C081C0u;
template <int I>
__device__ __forceinline__ uint32_t fp4x2_tiny(uint32_t w) {
  if constexpr (I == 0) return w & kTinyFp4Mask;
  // Where no masked bit wraps around, a plain shift gives the rotate's bits (ptxas may issue it as IMAD.SHL on
  // the FMA pipe instead of SHF on the integer pipe, which is the busier one).
  else if constexpr (I == 1) return (w << 6) & kTinyFp4Mask;
  else if constexpr (I == 2) return rotl(w, 12) & kTinyFp4Mask;
  else return lop_or_and(w << 2, 0x80C080C0u, rotl(w, 10), 0x01000100u);
}
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Scale word -> the 4 bf16x2 multipliers {s, s} * 2^100 (sc[jj][h]). The e4m3 bits placed at bf16 bits 10..4
// (sign at 15) read as s * 2^-120 for every scale, subnormal e4m3 included (they become bf16 subnormals, which
// mul.bf16x2 keeps); two exact multiplications by 2^110 (2^-10 s: normal, 4 significant bits; then 2^100 s)
// and a broadcast of each half (PRMT, or an operand selector). 5 integer ops + 4 multiplications + 4 PRMT for 4 scales (was ~9 ops per
// 2 scales through cvt e4m3 -> f16 -> f32 -> bf16). A NaN scale (0x7F / 0xFF, never written by a quantizer)
// reads as the finite +-480 here.
inline constexpr uint32_t kTinyScaleMask = 0x87F087F0u;
inline constexpr uint32_t kBf16x2Pow110 = 0x76807680u;  // {2^110, 2^110}
// Scale word -> its two multiplier pairs v[jj] = {s(jj, row r0), s(jj, row r0 + 8)} * 2^100 (bf16x2).
__device__ __forceinline__ void scale_pairs(uint32_t w, uint32_t (&v)[2]) {
  uint32_t q[2];
  q[0] = w & kTinyScaleMask;
  q[1] = lop_or_and(w << 4, 0x80F080F0u, w >> 4, 0x07000700u);  // = rotl 4 / rotl 28 under these masks
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) v[jj] = bf16x2_mul(bf16x2_mul(q[jj], kBf16x2Pow110), kBf16x2Pow110);
}
// A pair -> the two broadcasts {s_r0, s_r0} and {s_r8, s_r8}: a b16 pack that ptxas folds into the consumer
// HMUL2's .H0_H0 / .H1_H1 operand (no instruction).
__device__ __forceinline__ void broadcast_pair(uint32_t v, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\nmov.b32 %0, {l, l};\nmov.b32 %1, {h, h};\n}"
      : "=r"(lo), "=r"(hi)
      : "r"(v));
}
// One 64x64 block for this thread from 16 bytes of codes and the block's 4 converted scale pairs
// (pairs[h2][jj], k16 step 2*h2 + jj) -> 16 bf16x2 A registers (a[4j + i]: k16 step j, fragment register i),
// each exact e2m1 * e4m3 * 2^-26: tiny(e2m1) * (s * 2^100).
__device__ __forceinline__ void dequant_block_pairs(const uint4 codes, const uint32_t (&pairs)[2][2],
                                                    uint32_t (&a)[16]) {
  const uint32_t words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t s0, s1;  // rows r0 and r0 + 8
    broadcast_pair(pairs[j >> 1][j & 1], s0, s1);
    const uint32_t w = words[j];
    a[4 * j + 0] = bf16x2_mul(fp4x2_tiny<0>(w), s0);
    a[4 * j + 1] = bf16x2_mul(fp4x2_tiny<1>(w), s1);
    a[4 * j + 2] = bf16x2_mul(fp4x2_tiny<2>(w), s0);
    a[4 * j + 3] = bf16x2_mul(fp4x2_tiny<3>(w), s1);
  }
}
// The same from the block's two raw scale words (one thread converting everything: the exactness test's
// entry point; the kernel shares the conversion across a quad instead, see dequant_ktile).
// The e4m3 bits placed at bf16 bits 10..4 (sign at 15) read as s * 2^-120 for every scale, subnormal e4m3
// included (bf16 subnormals, which mul.bf16x2 keeps); two exact multiplications by 2^110 (2^-10 s: normal,
// 4 significant bits; then 2^100 s). A NaN scale (0x7F / 0xFF, never written by a quantizer) reads as the
// finite +-480 here.
__device__ __forceinline__ void dequant_block(const uint4 codes, const uint2 sc, uint32_t (&a)[16]) {
  uint32_t pairs[2][2];
  scale_pairs(sc.x, pairs[0]);
  scale_pairs(sc.y, pairs[1]);
  dequant_block_pairs(codes, pairs, a);
}
// One k-tile of this thread's NB blocks (2: a whole unit; 1: half a unit, WPU = 2). The 4 threads t of a quad
// (same g) need the same 2 NB scale words (2 per block): thread t loads and converts only word t % 2 of block
// t / 2 (scale_word_offset; with one block threads 2, 3 repeat 0, 1) and the quad exchanges the converted
// pairs by shuffles. Per thread (NB = 2): 1 LDS.32 + 5 integer ops + 4 HMUL2 + 8 SHFL instead of 2 LDS.64 + 20
// integer ops + 16 HMUL2 (bit-identical results: the same conversion, done once).
template <int NB>
__device__ __forceinline__ int scale_word_offset(int warp, int g, int t) {
  return (NB == 1 ? 0 : t >> 1) * kChunkBytes + kCodeBytes + (warp * 8 + g) * 8 + (t & 1) * 4;
}
template <int NB>
__device__ __forceinline__ void dequant_ktile(const uint4 (&codes)[NB], uint32_t my_scale_word,
                                              uint32_t (&a)[NB][16]) {
  uint32_t mine[2];
  scale_pairs(my_scale_word, mine);
  uint32_t pairs[NB][2][2];  // [block][h2][jj]
  const int quad0 = (threadIdx.x & 31) & ~3;
#pragma unroll
  for (int src = 0; src < 2 * NB; ++src)
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      pairs[src >> 1][src & 1][jj] = __shfl_sync(0xFFFFFFFFu, mine[jj], quad0 + src);  // src == t: its own
    }
#pragma unroll
  for (int b = 0; b < NB; ++b) dequant_block_pairs(codes[b], pairs[b], a[b]);
}

// Measurement hook of bench/gemm_microbench.cu only (wrong results; never defined by the library build): how
// much of a k-tile's time the dequantization costs, by leaving it out (1: the code words go to wgmma as they
// are, the shared-memory loads stay) or doing it twice (2: a second pass over the first word of each block,
// dependent on the first pass; ptxas merges the rest); and what the A loads cost (3: A is loaded into each
// stage once, then left stale, so the k-loop reads only weights); 4: the scale conversion before 3d97e92
// (every thread converts all four words); 5: no wgmma (the dequantized registers go to an empty asm). (6, the
// k-loop two k-tiles ahead of its wgmma with wait<1>, measured slower at 69a6420 and removed: docs/gemm.md.)
// 7: the wgmma consumers only wait for each stage and release it (no shared-memory reads, no dequantization, no
// wgmma): what the data movement alone costs; 8: as 7, and the producer arrives on the full barrier without
// loading anything (launch, tile cursor, barrier round trips and epilogue alone). (9, GEMM1's idle CTAs
// prefetching GEMM2's weights into L2, and 10, 9 plus an L2 evict_first hint on every weight load, measured
// slower at 4df64cb and removed: docs/gemm.md.) (13, 14 and 15, whole-layer A/B builds of the
// warp-streaming path, measured at deb21f8 / cde2f8d and removed: docs/gemm.md.) 17 (a whole-tree A/B build with
// correct results, `cmake -DNVFP4MOE_SM90_EXPERIMENT=17`): the tile kernels' SwiGLU epilogue computes its silus
// in batches without a branch per division (silu_batch, swiglu_values). (23 and 24, the warp-streaming quantizing
// GEMM1's row quantization before its first weight copies or by its idle warps, measured at cac7c88: 24 is the
// engine's at T = 1, quantize_rows in sm90_nvfp4_warp_stream_gemm.cuh.)
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 1 || NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 2
__device__ __forceinline__ void dequant_experiment(const uint4 (&codes)[2], const uint2 (&sc)[2],
                                                   uint32_t (&a)[2][16]) {
#pragma unroll
  for (int b = 0; b < 2; ++b) {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 1
    const uint32_t w[4] = {codes[b].x, codes[b].y, codes[b].z, codes[b].w};
#pragma unroll
    for (int i = 0; i < 16; ++i) a[b][i] = w[i / 4] ^ sc[b].x;
#else
    uint32_t first[16];
    dequant_block(codes[b], sc[b], first);
    const uint32_t dep = first[15] >> 31;  // 0 or 1: makes the second pass depend on the first
    dequant_block(make_uint4(codes[b].x ^ dep, codes[b].y, codes[b].z, codes[b].w), sc[b], a[b]);
#endif
  }
}
#endif

// ------------------------------------------------------------------------------------------- scheduler
// Persistent tiles in the order (expert, n-tile, token-tile), token tiles fastest so that CTAs running at the
// same time share a weight tile through L2. Every role walks the same sequence; indices only grow, so the
// expert cursor only moves forward (one pass over offsets per CTA).
// Called by all 32 lanes of a warp (the same idx): the experts after the current one are examined 256 at a
// time (8 consecutive experts per lane: 9 independent offsets loads, their tile counts summed in the lane, a
// warp scan of the sums, a ballot for the first lane whose tiles reach idx, and that lane's local search).
// An expert-at-a-time walk is a chain of dependent loads and branches: with 257 experts and 9 busy ones at
// decode, ~257 serialized steps before a CTA finds its first tile and again before it exits; 32 experts per
// step (until 2b09d03) still made 9 dependent L2 round trips of the exit walk at deepseek-v3 T = 1.
// Experts per lane of one cursor step. 1 is the 32-experts-per-step walk that ran until 2b09d03 (one expert per
// lane, two offsets loads). At 8 (3d97e92) qwen3-30b (E = 128, short K: a seek per short tile) ran 3-7% slower
// at T = 4..1024; the A/B at 69a6420 (-DNVFP4MOE_SM90_CURSOR_EXPERTS_PER_LANE=1 in CMAKE_CUDA_FLAGS builds width
// 1) put it in the per-seek cost of the lane's local search, now one pass (2bb7842: the regression gone, the
// T = 1 gain of the wide step kept; bench/results/69a6420-ab/, 2bb7842-ab/).
#ifndef NVFP4MOE_SM90_CURSOR_EXPERTS_PER_LANE
#define NVFP4MOE_SM90_CURSOR_EXPERTS_PER_LANE 8
#endif
inline constexpr int kConsumerExpertsPerLane = NVFP4MOE_SM90_CURSOR_EXPERTS_PER_LANE;
inline constexpr int kProducerExpertsPerLane = kConsumerExpertsPerLane < 4 ? kConsumerExpertsPerLane : 4;
static_assert(kConsumerExpertsPerLane >= 1 && kConsumerExpertsPerLane <= 16, "experts per lane: 1..16");
template <int BT>
struct TileCursor {
  int e = -1, first = 0, count = 0, ttiles = 1, row_begin = 0, rows = 0;
  // KNOWS_END (the warp-streaming kernels): the tile index past every expert's tiles, kept once a step has
  // covered the last expert (-1 until then), so that a warp's last seek (the index past its last piece)
  // returns without loading the offsets again. That walk was an L2 round trip at the end of every warp, ~0.5
  // us in the tail of each decode launch (x19's timeline, docs/gemm.md "Where the time goes at T = 1"). The
  // tile kernels do not keep it: one more live register made their 40-register producer warps spill.
  int end = -1;
  // kPerLane experts per lane and step (32 * kPerLane per warp step): the producer warp, which runs on 40
  // registers, uses fewer than the consumers; both walk the same tiles.
  template <int kPerLane, bool KNOWS_END = false>
  __device__ __forceinline__ bool seek(const GemmParams& p, int n_ctiles, int idx) {
    if (idx < first + count) return true;
    if (KNOWS_END && end >= 0 && idx >= end) {
      e = p.num_experts;
      first = end;
      count = 0;
      return false;
    }
    const int lane = threadIdx.x & 31;
    int next_first = first + count;  // tile index of expert e + 1's first tile
    auto tiles = [&](int ee, int r) { return ee < p.num_experts && r > 0 ? (r + BT - 1) / BT * n_ctiles : 0; };
    for (int e0 = e + 1; e0 < p.num_experts; e0 += 32 * kPerLane) {
      // Lane l holds experts base .. base + kPerLane - 1: kPerLane + 1 independent offsets loads.
      const int base = e0 + kPerLane * lane;
      int off[kPerLane + 1];
#pragma unroll
      for (int j = 0; j <= kPerLane; ++j) off[j] = base + j <= p.num_experts ? __ldg(p.offsets + base + j) : 0;
      int sum = 0;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) sum += tiles(base + j, off[j + 1] - off[j]);
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += v;
      }
      const unsigned hit = __ballot_sync(0xFFFFFFFFu, next_first + incl > idx);
      if (hit != 0u) {
        // Every lane finds the first of its experts whose tiles reach idx (one pass with a running count);
        // lane l's answer is the one.
        int acc = next_first + incl - sum, jf = 0, f_first = 0, f_rb = 0, f_end = 0;
        bool found = false;
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
          const int cj = tiles(base + j, off[j + 1] - off[j]);
          if (!found && acc + cj > idx) {
            found = true;
            jf = j;
            f_first = acc;
            f_rb = off[j];
            f_end = off[j + 1];
          }
          acc += cj;
        }
        const int l = __ffs(hit) - 1;
        e = __shfl_sync(0xFFFFFFFFu, base + jf, l);
        first = __shfl_sync(0xFFFFFFFFu, f_first, l);
        row_begin = __shfl_sync(0xFFFFFFFFu, f_rb, l);
        rows = __shfl_sync(0xFFFFFFFFu, f_end - f_rb, l);
        ttiles = (rows + BT - 1) / BT;
        count = ttiles * n_ctiles;
        if (KNOWS_END && e0 + 32 * kPerLane >= p.num_experts)
          end = next_first + __shfl_sync(0xFFFFFFFFu, incl, 31);
        return true;
      }
      next_first += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
    e = p.num_experts;
    first = next_first;
    count = 0;
    return false;
  }
};

// ------------------------------------------------------------------------------------------- epilogue helpers
__device__ __forceinline__ float silu_f32(float v) { return v / (1.0f + expf(-v)); }

// NVFP4 quantization (fmt::quantize_activation_block semantics) of NB 16-column groups at once. Group q of this
// thread holds v[q][0] (row r0) and v[q][1] (row r0 + 8) of one token; its other 14 values sit in the 8 lanes
// with the same lane % 4 (g = lane / 4 = 0..7). All 8 lanes of a group need the same block scale: lane g
// computes it only for group g % NB and the lanes exchange the results (2 SHFL per group instead of 8 copies
// of the scale arithmetic: an exact division, the e4m3 rounding and 1 / (sf / gs)). Returns the bf16 bits of
// the operand values e2m1(q) * sf.
template <int NB>
__device__ __forceinline__ void quantize_groups(const float (&v)[NB][2], float gs, uint16_t (&o)[NB][2]) {
  static_assert(NB >= 1 && NB <= 8 && (NB & (NB - 1)) == 0, "a power of two, one group per lane g at most");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float vmax[NB];
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    float m = fmaxf(fabsf(v[q][0]), fabsf(v[q][1]));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 4));
    m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 8));
    vmax[q] = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, 16));
  }
  // mine = vmax[g % NB] as a tree of selects on the bits of g (an if-chain over q became a local-memory table).
  float sel[NB];
#pragma unroll
  for (int q = 0; q < NB; ++q) sel[q] = vmax[q];
#pragma unroll
  for (int w = 1; w < NB; w *= 2) {
    const bool hi = (g & w) != 0;
#pragma unroll
    for (int q = 0; q + w < NB; q += 2 * w) sel[q] = hi ? sel[q + w] : sel[q];
  }
  // fmaxf with 0: the reference's max starts from 0, so a group of 16 NaNs has vmax 0 there (sf 0, operands 0),
  // not NaN (which would have given sf 0x7F and NaN operands).
  const fmt::ActivationBlockScale mine = fmt::activation_block_scales(fmaxf(sel[0], 0.0f), gs);
#pragma unroll
  for (int q = 0; q < NB; ++q) {
    const float os = __shfl_sync(0xFFFFFFFFu, mine.output_scale, 4 * q + t);  // lane g = q of this t: group q
    const float sff = __shfl_sync(0xFFFFFFFFu, mine.value, 4 * q + t);
#pragma unroll
    for (int h = 0; h < 2; ++h) o[q][h] = fmt::bf16_bits_exact(fmt::e2m1_round(v[q][h] * os) * sff);
  }
}

// The activation epilogue of one GEMM1 output, shared by every kernel (so that all give the same bits):
// bf16(silu(alpha0 * gate) * (alpha1 * up)) (SwiGLU) or bf16(max(alpha0 * acc, 0)^2) (relu^2; up unused).
template <Epilogue EPI>
__device__ __forceinline__ float activation_value(float acc, float up, float al0, float al1) {
  float x;
  if constexpr (EPI == Epilogue::kSwiGLU) {
    x = silu_f32(acc * al0) * (up * al1);
  } else {
    const float y = fmaxf(acc * al0, 0.0f);
    x = y * y;
  }
  return fmt::bf16_round(x);
}
// silu's division v / d (d = 1 + expf(-v)), the IEEE quotient, for N values at once without a branch per value.
// `v / d` compiles to the fast path (MUFU.RCP, one Newton step, the quotient and one remainder correction: five
// FFMA) behind FCHK, a range check that branches to a slow-path subroutine for operands it cannot vouch for; each
// branch is a convergence region (BSSY / BSYNC) that ptxas does not schedule across, so the SwiGLU epilogue runs
// its 72 silus a thread (bt144) one after another, ~100 cycles of dependent latency each. Here every value takes
// the same fast-path arithmetic, written out, and one check for the whole batch decides whether it may stand:
// every |v| in [2^-60, 2^60] (or v == 0, whose quotient is v itself) and every d <= 2^60 (d >= 1 always), a range
// deep inside FCHK's (no intermediate can be subnormal, overflow or special); otherwise the batch takes `v / d` as
// before. So the bits are the IEEE quotient's wherever the fast path is the compiler's own result, which the GPU
// test SiluBatchIsTheIeeeDivisionForEveryFloat checks for all 2^32 inputs.
__device__ __forceinline__ float div_fast_path(float v, float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  const float e = __fmaf_rn(-d, r, 1.0f);
  const float r1 = __fmaf_rn(r, e, r);
  const float q0 = __fmul_rn(v, r1);
  const float rem = __fmaf_rn(-d, q0, v);
  return __fmaf_rn(r1, rem, q0);
}
template <int N>
__device__ __forceinline__ void silu_batch(const float (&v)[N], float (&out)[N]) {
  float d[N];
  bool in_range = true;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    d[i] = 1.0f + expf(-v[i]);
    const float a = fabsf(v[i]);
    // (written so that a NaN fails it)
    in_range = in_range && ((a >= 0x1p-60f && a <= 0x1p60f) || a == 0.0f) && d[i] <= 0x1p60f;
    out[i] = a == 0.0f ? v[i] : div_fast_path(v[i], d[i]);
  }
  if (!in_range) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = v[i] / d[i];
  }
}

// N SwiGLU outputs, each activation_value<kSwiGLU>(gate, up, al0, al1) bit for bit, through silu_batch: the N
// silus interleave instead of running as N dependent chains behind their divisions' branches. The warp-streaming
// GEMM1's epilogue (4 values a lane) takes it: it ran ~0.93 us a warp, the same with warm code (x20,
// bench/results/c5ed872-x20-gemm-twice-h100), on the critical path of every decode layer.
template <int N>
__device__ __forceinline__ void swiglu_values_batched(const float (&gate)[N], const float (&up)[N], float al0,
                                                      float al1, float (&x)[N]) {
  float g[N], s[N];
#pragma unroll
  for (int i = 0; i < N; ++i) g[i] = gate[i] * al0;
  silu_batch<N>(g, s);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = fmt::bf16_round(s[i] * (up[i] * al1));
}
// The tile kernels' N SwiGLU outputs: with NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 17 (an A/B build, measured within
// noise at prefill: docs/benchmarks.md) batched as above; otherwise one value at a time.
template <int N>
__device__ __forceinline__ void swiglu_values(const float (&gate)[N], const float (&up)[N], float al0, float al1,
                                              float (&x)[N]) {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 17
  swiglu_values_batched<N>(gate, up, al0, al1, x);
#else
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = activation_value<Epilogue::kSwiGLU>(gate[i], up[i], al0, al1);
#endif
}
// The SwiGLU values of NG quantization groups, two a group (v[q][h]: row r0 + 8 h), from a kernel's own accumulator
// layout: gate_up(q, h, gate, up) names group q's h-th gate and up accumulators. BATCHED: swiglu_values_batched
// (the warp-streaming kernels), else swiglu_values (the tile kernels); the same bits either way.
template <int NG, bool BATCHED, class GateUp>
__device__ __forceinline__ void swiglu_groups(GateUp&& gate_up, float al0, float al1, float (&v)[NG][2]) {
  float gate[2 * NG], up[2 * NG], x[2 * NG];  // value 2 q + h
#pragma unroll
  for (int q = 0; q < NG; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h) gate_up(q, h, gate[2 * q + h], up[2 * q + h]);
  if constexpr (BATCHED) swiglu_values_batched<2 * NG>(gate, up, al0, al1, x);
  else swiglu_values<2 * NG>(gate, up, al0, al1, x);
#pragma unroll
  for (int q = 0; q < NG; ++q)
#pragma unroll
    for (int h = 0; h < 2; ++h) v[q][h] = x[2 * q + h];
}

// The stored bits of N quantization groups' values (activation_value results, bf16 numbers already): NVFP4
// operand values (quantize_groups) with gs, else the values' own bf16 bits (no second rounding: it could not
// change them, and cost ~5 instructions a value).
template <int N>
__device__ __forceinline__ void output_bits(const float (&v)[N][2], bool quantize, float gs, uint16_t (&o)[N][2]) {
  if (quantize) {
    quantize_groups<N>(v, gs, o);
  } else {
#pragma unroll
    for (int q = 0; q < N; ++q)
#pragma unroll
      for (int h = 0; h < 2; ++h) o[q][h] = fmt::bf16_bits_exact(v[q][h]);
  }
}
// The wgmma N of a token tile with `rows` rows (1..BT): the smallest of 16 / 32 / 64 / 128 / 144 (<= BT) that holds
// them, so an expert's last, partial tile does not pay for BT columns. (Steps of 16, 16..144, measured slower in
// the layer at 13aabf8: +2..4% at prefill, bench/results/13aabf8-widths-scan-ab/.)
template <int BT>
__host__ __device__ constexpr int mma_n_for_rows(int rows) {
  return rows <= 16 ? 16 : rows <= 32 || BT <= 32 ? 32 : rows <= 64 || BT <= 64 ? 64 : rows <= 128 || BT <= 128 ? 128 : 144;
}

// One wgmma batch at the width n_mma (mma_n_for_rows<BT>), committed: run(IntC<N>{}) issues the batch's wgmmas
// at N. Each width a branch of its own with its own commit.
template <int BT, class Run>
__device__ __forceinline__ void run_at_wgmma_width(int n_mma, Run&& run) {
  if constexpr (BT >= 144) { if (n_mma == 144) { run(IntC<144>{}); wgmma_commit(); return; } }
  if constexpr (BT >= 128) { if (n_mma == 128) { run(IntC<128>{}); wgmma_commit(); return; } }
  if constexpr (BT >= 64) { if (n_mma >= 64) { run(IntC<64>{}); wgmma_commit(); return; } }
  if constexpr (BT >= 32) { if (n_mma >= 32) { run(IntC<32>{}); wgmma_commit(); return; } }
  run(IntC<16>{});
  wgmma_commit();
}

// ------------------------------------------------------------------------------------------- the kernel
// BT: token rows per tile (wgmma N); WGS: consumer warpgroups; STAGES: pipeline depth; WPU: consumer warpgroups
// per unit. WPU = 1: each warpgroup owns a unit (both 64-row blocks; WGS units per CTA tile). WPU = 2: the two
// blocks of a unit go to two warpgroups (WGS / 2 units per tile), for launches with too few units to fill the
// SMs (qwen3-30b T = 1: 96 GEMM1 units = 48 two-unit tiles on 132 SMs): each warpgroup runs half the k-loop's
// work, and each accumulator still sums the same wgmmas in the same order (bit-identical to WPU = 1). The
// SwiGLU epilogue needs gate and up in one thread: the up block's warpgroup hands its accumulators to the gate
// block's through shared memory (one named barrier per unit slot, synced twice per tile).
//
// SYNC: the consumers' MMA. false: wgmma (register A, the token tile as the smem B operand), a warpgroup-wide
// asynchronous instruction that the 4 warps of a warpgroup issue together and wait for. true: mma.sync
// m16n8k16, per warp, on the same A fragment registers (one warp's share of wgmma's m64k16 A is exactly the
// m16k16 A of mma.sync) and the same accumulator layout (wgmma accumulator i = token 8 (i / 4) + 2t + i % 2,
// row g + 8 ((i / 2) % 2) is n-tile i / 4's c[i % 4]); B fragments by ldmatrix from the swizzled token tile.
// Each warp then runs on its own (it releases a stage as soon as its registers hold the stage's data) and an
// expert tile with at most 8 rows runs N = 8 instead of wgmma's smallest N = 16. Both sum each output's k16
// dot products in the same order into one fp32 accumulator; the tensor cores' k16 step gives the same bits
// either way (tested bitwise against the wgmma configs: BatchInvariance, SyncMmaBitIdenticalToWgmma).
template <int BT, int WGS, int STAGES, Epilogue EPI, int WPU = 1, bool SYNC = false>
struct KernelTraits {
  static_assert(BT % 16 == 0 && BT >= 16 && (BT <= 128 || BT == 144),
                "BT: wgmma N in 16..128 or 144, two m64 blocks per thread");
  static_assert(BT <= 128 || WGS == 2, "BT = 144 (144 accumulators a thread): two consumer warpgroups");
  static_assert(!SYNC || BT == 16, "the sync-MMA consumer: decode tiles (BT = 16: one or two n-tiles of 8)");
  static_assert(WGS == 2 || (WGS == 3 && BT <= 32) || (WGS == 4 && BT <= 16),
                "WGS 3 only up to BT = 32, WGS 4 only with the small accumulators of BT = 16");
  static_assert(WPU == 1 || (WPU == 2 && WGS % 2 == 0), "WPU: 1, or 2 with an even number of warpgroups");
  static constexpr int kUnitsPerTile = WGS / WPU;
  static constexpr int kBlocksPerWarpgroup = 2 / WPU;  // 64-row weight blocks (accumulator chains) per thread
  static constexpr int kThreads = (WGS + 1) * 128;
  // Arrivals that release a stage: one per consumer warp (lane 0 after a __syncwarp), in both consumers. The
  // wgmma path once arrived from one thread per warpgroup after its wgmma wait: safe on the hardware (the
  // other threads' loads fed that warpgroup-collective wgmma) but not ordered by anything the memory model
  // counts. Racecheck reports both forms (it wants every reading thread's own arrive); see docs/gemm.md, "The
  // wgmma consumers' stage release under racecheck".
  static constexpr int kEmptyArrivals = WGS * 4;
  // Warpgroups that store a tile's output (the up block's warpgroup of a WPU = 2 SwiGLU tile hands its
  // accumulators over instead): a chained launch's done[e] gets one arrival from each per GEMM1 tile.
  static constexpr int kStoringWarpgroups = WPU == 2 && EPI == Epilogue::kSwiGLU ? kUnitsPerTile : WGS;
  // setmaxnreg budgets. The CTA owns kThreads x (registers ptxas gave the kernel) registers; asking for more
  // than that in setmaxnreg.inc blocks forever, so the launcher checks kRegsNeeded against the compiled count.
  // ptxas allocates each branch under its setmaxnreg value (the consumers' spills grow when theirs shrinks), so
  // the consumers keep the most the CTA allows and the producer (one TMA thread plus its warp's tile cursor,
  // which loads several offsets per lane at once: it spilled at 24) gets what is left, rounded down to 8.
  // BT = 144: 144 accumulators + 64 A registers a consumer thread; 232 spilled in the k-loop, so the consumers get
  // 240 and the producer 24 (its cursor's few spills are outside the consumers' loop).
  static constexpr int kConsumerRegs = BT > 128 ? 240 : WGS <= 2 ? 232 : WGS == 3 ? 160 : 112;
  static constexpr int kProducerRegs = BT > 128 ? 24 : WGS <= 2 ? 40 : 32;
  static constexpr int kRegsNeeded = 128 * kProducerRegs + WGS * 128 * kConsumerRegs;
  static_assert(kRegsNeeded <= 65536, "setmaxnreg budget exceeds the register file");
  static constexpr int kABytes = BT * 128;                  // one stage of A: BT rows x 64 bf16, swizzled
  static constexpr int kWBytes = kUnitsPerTile * kUnitBytes;  // one stage of weights
  static constexpr int kStageBytes = kABytes + kWBytes;
  // WPU = 2 with SwiGLU: per unit slot, the up block's BT / 2 accumulators of each of its 128 threads.
  static constexpr int kExchangeBytes = WPU == 2 && EPI == Epilogue::kSwiGLU ? kUnitsPerTile * 128 * (BT / 2) * 4 : 0;
  // Gathered A (produce_tiles_gathered): two buffers, each a tile (TileSlot) and its BT source rows, so that
  // the producer warps publish the next tile while none reads the previous one's.
  static constexpr int kGatherBufBytes = static_cast<int>(sizeof(TileSlot)) + BT * 4;
  static constexpr int kSmemBytes = 1024 /*align*/ + STAGES * kStageBytes + kExchangeBytes + STAGES * 16 /*barriers*/ +
                                    STAGES * static_cast<int>(sizeof(TileSlot)) + 2 * kGatherBufBytes;
  static_assert(kABytes % 1024 == 0, "A stages must stay 1024-byte aligned for the 128B swizzle");
  static_assert(kSmemBytes <= 232448, "shared memory per block");
};

// ------------------------------------------------------------------------------------------- GEMM1 -> GEMM2 chain
// GEMM1 and GEMM2 of one expert group in one persistent launch (sm90_nvfp4_chained_gemm_kernel): every CTA
// walks GEMM1's tiles, then continues the same index sequence into GEMM2's (GEMM2 tile j = index
// tiles(GEMM1) + j), so a CTA has finished all its GEMM1 tiles before it waits for anything, and with the grid
// at most the CTAs that fit at once (one per SM) every GEMM1 tile runs: no deadlock. A GEMM2 tile of expert e
// reads GEMM1's output rows of e (all its columns), so its producer waits until every GEMM1 tile of e has been
// published: done[e] counts the storing warpgroups' finished tiles (release after their stores), GEMM2's
// producer loads the tile's weights first (they do not depend on GEMM1), then acquires done[e] and issues the
// A loads. passed[e] counts GEMM2 tiles past that wait; the last one resets both counters, so every launch
// leaves them zero (zero them once, at allocation; no per-forward memset). The bits are those of two launches:
// every accumulator sums the same k-tiles in the same order, and GEMM2 reads the same activations.
struct ChainSync {
  int32_t* done = nullptr;    // [E] GEMM1 warpgroup-tiles stored, per expert
  int32_t* passed = nullptr;  // [E] GEMM2 tiles whose producer saw its expert complete
  int per_token_tile = 0;     // done[e] arrivals per token tile of expert e: GEMM1 n-tiles x storing warpgroups
};
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}
__device__ __forceinline__ void red_add_release_gpu(int32_t* p, int32_t v) {
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A strong load with no ordering (no stale cached copy; a value another grid may be writing at the same time).
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ int32_t ld_acquire_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// ------------------------------------------------------------------------------------------- the tile walks
// The dynamic schedule's next claim, by the issuing lane of warp 0 once a tile's loads are all issued: the
// consumers still have up to STAGES k-tiles of it buffered, which hides the atomic's round trip, and a CTA holds at
// most one claimed tile in reserve. Returns the claimed tile index in every lane of the warp.
__device__ __forceinline__ int claim_next_tile(const GemmParams& p, bool issuer) {
  int next = 0;
  if (issuer) next = static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1);
  return __shfl_sync(0xFFFFFFFFu, next, 0);
}
// The dynamic schedule's end, by the issuing thread: the end slot in stage s once the consumers have released it
// (nothing is loaded into it; ARRIVALS: the full barrier's count), then the counter's reset. After the failed seek
// n_tiles (the cursor's `first`) is the launch's tile count n. The CTAs with a tile of their own (min(G, n)) each
// claim until a claim fails, and every tile past the first G is claimed once: the claims number
// max(n - G, 0) + min(G, n), and the one that returns the last value resets the counter (every other claim of this
// launch has returned by then; the next launch touches it only after this one completed).
template <uint32_t ARRIVALS>
__device__ __forceinline__ void end_dynamic_schedule(const GemmParams& p, int s, uint32_t phase, uint32_t full0,
                                                     uint32_t empty0, uint32_t slots, int idx, int n_tiles) {
  mbar_wait(empty0 + 8 * s, phase ^ 1);
  sts128(slots + s * sizeof(TileSlot), -1, 0, 0, 0);
  if constexpr (ARRIVALS == 1) mbar_arrive(full0 + 8 * s);
  else mbar_arrive_count(full0 + 8 * s, ARRIVALS);
  const int G = static_cast<int>(gridDim.x), n = n_tiles;
  const int claims = max(n - G, 0) + min(G, n);
  if (idx >= G && idx - G == claims - 1) atomicExch(p.tile_counter, 0);
}

// The producer's walk over one launch's tiles (warp 0 of warpgroup 0; lane 0 issues the loads), starting at
// tile index idx with the pipeline at stage s / phase. Returns the index past the launch's tiles, relative to
// the next launch of a chain. CHAINED: GEMM2 of a chain (A waits, above).
// Dynamic schedule (p.tile_counter): the producer claims each next tile and writes it into the tile slot of the
// stage that carries the tile's first k-tile; after the last, it hands the consumers an end slot.
// DYNAMIC_OK: the launch may schedule dynamically (the plain kernel; a chain's tiles follow the static order,
// which its GEMM2 waits rely on).
// MIXED: the mixed last pass (sm90_mixed_last_pass.h; sm90_nvfp4_mixed_pass_gemm_kernel): a mixed tile's stage
// gets one unit's weights (slot 0) and, besides the A box, the narrow token tile's rows by tmap_tail (boxes of
// kMixedTailRows rows) at kMixedTailOffset of the weight stage.
template <int BT, int WGS, int STAGES, int WPU, bool SYNC, bool CHAINED, bool DYNAMIC_OK = false, bool MIXED = false>
__device__ __forceinline__ int produce_tiles(const CUtensorMap* tmap_a, const GemmParams& p, int idx, int& s,
                                             uint32_t& phase, uint8_t* smem_a, uint8_t* smem_w, uint32_t full0,
                                             uint32_t empty0, uint32_t slots, const ChainSync& chain,
                                             [[maybe_unused]] const CUtensorMap* tmap_tail = nullptr) {
  using Tr = KernelTraits<BT, WGS, STAGES, Epilogue::kF32, WPU, SYNC>;  // stage sizes: the same for every EPI
  constexpr int UPT = Tr::kUnitsPerTile;
  static_assert(!MIXED || (UPT == 2 && WPU == 1 && !SYNC && !CHAINED && BT >= 64), "the mixed last pass: 2 units");
  static_assert(!MIXED || Tr::kWBytes >= kMixedTailOffset + kMixedTailRows * 128, "the narrow rows fit the stage");
  const int n_ctiles = (p.units + UPT - 1) / UPT;
  const bool issuer = threadIdx.x == 0;
  const bool dynamic = DYNAMIC_OK && p.tile_counter != nullptr;
  TileCursor<BT> cur;
  while (cur.template seek<kProducerExpertsPerLane>(p, n_ctiles, idx)) {
    const int local = idx - cur.first;
    const int n_idx = local / cur.ttiles, t_idx = local - n_idx * cur.ttiles;
    // (MIXED only: constants otherwise, so that the other kernels keep their code)
    [[maybe_unused]] const MixedTilePlace place = MIXED ? mixed_tile_place(BT, cur.rows, n_idx, t_idx, 0)
                                                        : MixedTilePlace{};
    [[maybe_unused]] const bool mixed = MIXED && place.mixed != 0;
    const int row0 = cur.row_begin + (MIXED ? place.tok0 : t_idx * BT);
    const uint8_t* wsrc[UPT];
#pragma unroll
    for (int c = 0; c < UPT; ++c) {
      const int unit = min(n_idx * UPT + c, p.units - 1);  // a consumer past the last unit computes a copy
      wsrc[c] = p.w + (static_cast<size_t>(cur.e) * p.units + unit) * p.k_tiles * kUnitBytes;
    }
    if constexpr (MIXED)
      wsrc[0] = p.w + (static_cast<size_t>(cur.e) * p.units + min(place.unit, p.units - 1)) * p.k_tiles * kUnitBytes;
    if (issuer) {
      auto load_a = [&](int stage, int kt) {
        tma_load_2d(smem_u32(smem_a + stage * Tr::kABytes), tmap_a, kt * kBlockK, row0, full0 + 8 * stage);
      };
      // CHAINED: until expert e's GEMM1 output is complete, the stages get their weights only and the A loads
      // wait (deferred: k-tiles kt_def.., stages s_def..); at most STAGES of them, or the next empty wait would
      // wait for a stage that cannot fill.
      [[maybe_unused]] const int32_t need = cur.ttiles * chain.per_token_tile;
      bool ready = !CHAINED;
      [[maybe_unused]] int deferred = 0, kt_def = 0, s_def = 0;
      auto become_ready = [&]() {
        if constexpr (CHAINED) {
          while (ld_acquire_gpu(chain.done + cur.e) < need) {
          }
          fence_proxy_async_global();  // the acquired generic-proxy stores, before this thread's TMA reads them
          for (int j = 0; j < deferred; ++j) load_a((s_def + j) % STAGES, kt_def + j);
          deferred = 0;
          ready = true;
          // The last GEMM2 tile of e past the wait resets e's counters (nobody reads them again this launch).
          if (atomicAdd(chain.passed + cur.e, 1) == cur.count - 1) {
            *reinterpret_cast<volatile int32_t*>(chain.done + cur.e) = 0;
            *reinterpret_cast<volatile int32_t*>(chain.passed + cur.e) = 0;
          }
        }
      };
      if constexpr (CHAINED) {
        if (ld_acquire_gpu(chain.done + cur.e) >= need) become_ready();
      }
      for (int kt = 0; kt < p.k_tiles; ++kt) {
        if (CHAINED && !ready && deferred == STAGES) become_ready();
        mbar_wait(empty0 + 8 * s, phase ^ 1);
        const uint32_t full = full0 + 8 * s;
        if (dynamic && kt == 0) sts128(slots + s * sizeof(TileSlot), cur.e, local, cur.row_begin, cur.rows);
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 3
        // Measurement hook (see dequant_experiment): A is loaded into each stage once, then left stale.
        const bool with_a = kt < STAGES;
        mbar_expect_tx(full, with_a ? Tr::kStageBytes : Tr::kWBytes);
        if (with_a) load_a(s, kt);
#elif NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 8
        mbar_arrive(full);  // measurement hook: nothing loaded
        if (++s == STAGES) { s = 0; phase ^= 1; }
        continue;
#else
        if constexpr (MIXED) {
          if (mixed) {  // the A box, the narrow rows, one unit's weights
            mbar_expect_tx(full, Tr::kABytes + kMixedTailRows * 128 + kUnitBytes);
            load_a(s, kt);
            tma_load_2d(smem_u32(smem_w + s * Tr::kWBytes + kMixedTailOffset), tmap_tail, kt * kBlockK, row0 + BT,
                        full);
            bulk_load(smem_u32(smem_w + s * Tr::kWBytes), wsrc[0] + static_cast<size_t>(kt) * kUnitBytes, kUnitBytes,
                      full);
            if (++s == STAGES) { s = 0; phase ^= 1; }
            continue;
          }
        }
        mbar_expect_tx(full, Tr::kStageBytes);
        if (ready) {
          load_a(s, kt);
        } else if (deferred++ == 0) {
          kt_def = kt;
          s_def = s;
        }
#endif
#pragma unroll
        for (int c = 0; c < UPT; ++c)
          bulk_load(smem_u32(smem_w + s * Tr::kWBytes + c * kUnitBytes),
                    wsrc[c] + static_cast<size_t>(kt) * kUnitBytes, kUnitBytes, full);
        if (++s == STAGES) { s = 0; phase ^= 1; }
      }
      if (CHAINED && !ready) become_ready();
    }
    if (dynamic) {
      idx = claim_next_tile(p, issuer);
    } else {
      __syncwarp();
      idx += gridDim.x;
    }
  }
  if (dynamic && issuer) end_dynamic_schedule<1>(p, s, phase, full0, empty0, slots, idx, cur.first);
  return idx - cur.first;  // after the failed seek cur.first is the launch's tile count
}

// The source row of GEMM row r for a gathered A (GemmParams::gather_*; sm90_gather_rows.h), or -1 (read as zeros).
// perm_rows = offsets[gather_perm_experts].
__device__ __forceinline__ int gather_source_row(const GemmParams& p, int r, int perm_rows) {
  const bool permuted = p.gather_perm != nullptr && r < perm_rows;
  return gather_source_row(r, p.gather_perm != nullptr, perm_rows, permuted ? __ldg(p.gather_perm + r) : 0,
                           p.gather_top_k, p.gather_src_rows, p.gather_shared_base);
}

// The producer of a gathered A (GemmParams::gather_src; the plain tile kernel's walks, static or dynamic): all
// four producer warps. Warp 0 walks (or claims) the tiles as produce_tiles does and publishes each one in a
// gather buffer; the 128 threads then write the tile's BT source rows next to it (-1: none, and for the rows
// past the tile's; one barrier each way), and
// per k-tile every thread copies its share of the stage's A rows with cp.async: thread t the 16-byte chunk t % 8
// of rows t / 8 + 16 i, at the position the 128-byte swizzle gives it (chunk c of row r at c ^ (r % 8), what the
// TMA writes for a 1024-byte aligned stage), zero-filled past K, for rows without a source and for the rows past
// the tile's (their wgmma columns are not stored). Thread 0 also arms the stage (arrive.expect_tx for the
// weights) and issues the weights' bulk loads.
// Each thread's cp.async.mbarrier.arrive.noinc signals its copies of the stage when they land (the consumers'
// fence.proxy.async orders them before the wgmma: consume_tiles' GATHER). The bits: each stage holds the values a
// pre-gathered A would, so every accumulator sums the same products in the same order.
template <int BT, int WGS, int STAGES, int WPU, bool SYNC>
__device__ __forceinline__ void produce_tiles_gathered(const GemmParams& p, uint8_t* smem_a, uint8_t* smem_w,
                                                       uint32_t full0, uint32_t empty0, uint32_t slots,
                                                       uint32_t gather) {
  using Tr = KernelTraits<BT, WGS, STAGES, Epilogue::kF32, WPU, SYNC>;
  constexpr int UPT = Tr::kUnitsPerTile;
  constexpr int kPasses = gather_passes(BT);  // rows per thread and k-tile (sm90_gather_rows.h)
  static_assert(kGatherCopyThreads == 128, "the producer warpgroup's threads copy A");
  // (The producer runs on 24..40 registers: the loop keeps one k-tile counter for the stage and its phase, and
  // recomputes the rest.)
  const int n_ctiles = (p.units + UPT - 1) / UPT;
  const int tid = static_cast<int>(threadIdx.x);
  const bool dynamic = p.tile_counter != nullptr;
  const int perm_rows = p.gather_perm != nullptr ? __ldg(p.offsets + p.gather_perm_experts) : 0;
  // Thread tid copies the 16-byte chunk tid % 8 of rows tid / 8 + 16 i (sm90_gather_rows.h).
  const uint32_t a_thread = smem_u32(smem_a) + gather_copy_offset(tid);
  const uint32_t w_base = smem_u32(smem_w);
  TileCursor<BT> cur;  // warp 0's
  int idx = blockIdx.x, issued = 0;  // k-tiles issued: stage issued % STAGES, empty phase (issued / STAGES) & 1
  for (int iter = 0;; ++iter) {
    const uint32_t buf = gather + static_cast<uint32_t>((iter & 1) * Tr::kGatherBufBytes);
    if (tid < 32) {
      const bool found = cur.template seek<kProducerExpertsPerLane>(p, n_ctiles, idx);
      if (tid == 0) sts128(buf, found ? cur.e : -1, idx - cur.first, cur.row_begin, cur.rows);
    }
    named_bar_sync(kGatherProducerBarrier, 128);  // the tile is published (and the buffer's last reader is done)
    const int4 tile = lds128_volatile(buf);
    if (tile.x < 0) break;
    const int ttiles = (tile.w + BT - 1) / BT;
    const int n_idx = tile.y / ttiles, t_idx = tile.y - n_idx * ttiles;
    const int row0 = tile.z + t_idx * BT;
    const int tile_rows = min(BT, tile.w - t_idx * BT);
    for (int r = tid; r < BT; r += 128)
      sts32(buf + 16 + 4 * r, r < tile_rows ? gather_source_row(p, row0 + r, perm_rows) : -1);
    named_bar_sync(kGatherProducerBarrier, 128);  // the source rows are written
    for (int kt = 0; kt < p.k_tiles; ++kt, ++issued) {
      const int s = issued % STAGES;
      mbar_wait(empty0 + 8 * s, ((issued / STAGES) & 1) ^ 1);
      if (tid == 0) {
        const uint32_t full = full0 + 8 * s;
        if (dynamic && kt == 0) sts128(slots + s * sizeof(TileSlot), tile.x, tile.y, tile.z, tile.w);
        mbar_expect_tx(full, Tr::kWBytes);
#pragma unroll
        for (int c = 0; c < UPT; ++c) {
          const int unit = min(n_idx * UPT + c, p.units - 1);  // a consumer past the last unit computes a copy
          const uint8_t* src =
              p.w + ((static_cast<size_t>(tile.x) * p.units + unit) * p.k_tiles + kt) * kUnitBytes;
          bulk_load(w_base + s * Tr::kWBytes + c * kUnitBytes, src, kUnitBytes, full);
        }
      }
      // Every row of the stage (the rows past the tile's as zeros, like rows without a source): no branch per
      // copy. A zero-filled copy reads nothing; its address is the source's row 0.
      const int col = kt * kBlockK + (tid % 8) * 8;
      const uint32_t bytes = col < p.gather_k ? 16u : 0u;
      const char* src_kt = reinterpret_cast<const char*>(p.gather_src) + 2 * col;
      const uint32_t row_bytes = 2u * static_cast<uint32_t>(p.gather_k);
      const uint32_t dst = a_thread + s * Tr::kABytes;
      const uint32_t rows_at = buf + 16 + 4 * gather_copy_row(tid, 0);
#pragma unroll
      for (int i = 0; i < kPasses; ++i) {
        const int src = lds32_volatile(rows_at + 4 * kGatherRowsPerPass * i);
        const uint64_t row_offset = static_cast<uint64_t>(static_cast<uint32_t>(max(src, 0))) * row_bytes;
        cp_async16(dst + i * kGatherPassBytes, src_kt + row_offset, src >= 0 ? bytes : 0u);
      }
      cp_async_mbar_arrive_noinc(full0 + 8 * s);
    }
    if (tid < 32) idx = dynamic ? claim_next_tile(p, tid == 0) : idx + static_cast<int>(gridDim.x);
  }
  cp_async_wait_all();  // (this thread's last copies, before it exits)
  if (dynamic && tid == 0)  // the end slot with all of the stage's arrivals at once
    end_dynamic_schedule<kGatherFullArrivals>(p, issued % STAGES, (issued / STAGES) & 1, full0, empty0, slots, idx,
                                              cur.first);
}

// The epilogue of one accumulator tile (consume_tiles): acc[b][i] holds weight row 16 warp + g + 8 ((i >> 1) & 1)
// of block b (WPU = 2: of block `half`) and token 8 (i >> 2) + 2t + (i & 1) of the rows that start at GEMM row
// row_base; rows_valid of them are stored (the f32 rows, or the activation in bf16 or NVFP4-quantized; up_acc: the
// up block of a WPU = 2 SwiGLU unit).
template <int BT, int NB, Epilogue EPI, int WPU, int UP>
__device__ __forceinline__ void store_tile_outputs(const GemmParams& p, const float (&acc)[NB][BT / 2],
                                                   const float (&up_acc)[UP], int e, int unit, int half,
                                                   int64_t row_base, int rows_valid, int warp, int g, int t) {
  (void)up_acc;
  const bool unit_ok = unit < p.units;
  const float gsv = p.gs != nullptr ? __ldg(p.gs + e) : 0.0f;
  if constexpr (EPI == Epilogue::kF32) {
    const float al = __ldg(p.alpha0 + e) * kWeightUnscale;
    float* out = static_cast<float*>(p.out);
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < BT / 2; ++i) {
        const int col = unit * 128 + (b + half) * 64 + 16 * warp + g + 8 * ((i >> 1) & 1);
        const int tok = 8 * (i >> 2) + 2 * t + (i & 1);
        if (unit_ok && tok < rows_valid && col < p.n_out) out[(row_base + tok) * p.n_out + col] = acc[b][i] * al;
      }
  } else {
    uint16_t* out = static_cast<uint16_t*>(p.out);
    const float al0 = __ldg(p.alpha0 + e) * kWeightUnscale;
    const float al1 = EPI == Epilogue::kSwiGLU ? __ldg(p.alpha1 + e) * kWeightUnscale : 0.0f;
    // Output 64-column blocks of this warpgroup: SwiGLU 1 per unit; relu^2 its accumulator blocks.
    constexpr int kBlocksOut = EPI == Epilogue::kSwiGLU ? 1 : NB;
    // Quantization groups of this thread: (b, i0, ip) -> row r0 value acc[b][i0 + ip], row r0 + 8 value
    // acc[b][i0 + ip + 2], token 8 * (i0 / 4) + 2t + ip; taken 8 at a time (quantize_groups).
    struct GroupPos { int b, i0, ip; };
    auto group_pos = [](int q) { return GroupPos{(q >> 1) / (BT / 8), ((q >> 1) % (BT / 8)) * 4, q & 1}; };
    constexpr int kGroups = kBlocksOut * BT / 4;
    // Batches of 8 groups (quantize_groups computes one block scale per lane, shared by 8 lanes) and, where
    // kGroups is not a multiple of 8 (BT = 144 SwiGLU: 36 groups), one tail batch of 4: every batch of 4
    // costs the scale arithmetic of a batch of 8 (half its lanes' results are duplicates).
    static_assert(kGroups % 4 == 0 || kGroups < 8, "batches of 8 and at most one of 4");
    auto batch = [&](int q0, auto n_const) {
      constexpr int N = decltype(n_const)::value;
      float v[N][2];
      if constexpr (EPI == Epilogue::kSwiGLU) {
        swiglu_groups<N, false>(
            [&](int qq, int h, float& gate, float& up) {
              const auto [b, i0, ip] = group_pos(q0 + qq);
              const int i = i0 + ip + 2 * h;
              gate = acc[0][i];
              if constexpr (WPU == 2) up = up_acc[i]; else up = acc[NB - 1][i];
            },
            al0, al1, v);
      } else {
#pragma unroll
        for (int qq = 0; qq < N; ++qq) {
          const auto [b, i0, ip] = group_pos(q0 + qq);
#pragma unroll
          for (int h = 0; h < 2; ++h) v[qq][h] = activation_value<EPI>(acc[b][i0 + ip + 2 * h], 0.0f, al0, al1);
        }
      }
      uint16_t o[N][2];
      output_bits<N>(v, p.gs != nullptr, gsv, o);
#pragma unroll
      for (int qq = 0; qq < N; ++qq) {
        const auto [b, i0, ip] = group_pos(q0 + qq);
        const int tok = 8 * (i0 >> 2) + 2 * t + ip;
        const int colb = (EPI == Epilogue::kSwiGLU ? unit * 64 : unit * 128 + (b + half) * 64) + 16 * warp + g;
        // The address always, the two stores predicated: a branch around the pair made one convergence region
        // per group, which ptxas does not schedule across (8 a batch).
        uint16_t* const dst = out + (row_base + tok) * p.n_out + colb;
        const bool row_ok = unit_ok && tok < rows_valid;
        if (row_ok && colb < p.n_out) dst[0] = o[qq][0];
        if (row_ok && colb + 8 < p.n_out) dst[8] = o[qq][1];
      }
    };
    if constexpr (kGroups < 8) {
      batch(0, IntC<kGroups>{});
    } else {
      constexpr int kWhole = kGroups / 8 * 8;
#pragma unroll
      for (int q0 = 0; q0 < kWhole; q0 += 8) batch(q0, IntC<8>{});
      if constexpr (kGroups > kWhole) batch(kWhole, IntC<kGroups - kWhole>{});
    }
  }
}

// The consumer warpgroups' walk over one launch's tiles, from tile index idx with the pipeline at stage s /
// phase. Returns the index past the launch's tiles, relative to the next launch of a chain. SIGNAL: GEMM1 of a
// chain (each storing warpgroup publishes its finished tiles in done[expert]).
// GATHER: the stages' A rows come from the producer warps' cp.async (produce_tiles_gathered), generic-proxy
// writes: a fence.proxy.async after each full-barrier wait puts one on the causality path from those writes to
// the wgmma that reads them (the TMA's writes need none).
// MIXED: the mixed last pass (sm90_mixed_last_pass.h): in a mixed tile both warpgroups read slot 0's weights,
// the second one its token rows at kMixedTailOffset of the weight stage.
template <int BT, int WGS, int STAGES, Epilogue EPI, int WPU, bool SYNC, bool SIGNAL, bool DYNAMIC_OK = false,
          bool GATHER = false, bool MIXED = false>
__device__ __forceinline__ int consume_tiles(const GemmParams& p, int idx, int& s, uint32_t& phase,
                                             uint8_t* smem_a, uint8_t* smem_w, float* smem_xch, uint32_t full0,
                                             uint32_t empty0, uint32_t slots, [[maybe_unused]] int32_t* done) {
  using Tr = KernelTraits<BT, WGS, STAGES, EPI, WPU, SYNC>;
  constexpr int UPT = Tr::kUnitsPerTile, NB = Tr::kBlocksPerWarpgroup;
  static_assert(!MIXED || (UPT == 2 && WPU == 1 && !SYNC && !SIGNAL && !GATHER), "the mixed last pass: 2 units");
  const int n_ctiles = (p.units + UPT - 1) / UPT;
  const int c = static_cast<int>(threadIdx.x) / 128 - 1;
  const int slot = c / WPU, half = WPU == 2 ? c % 2 : 0;  // unit slot of the tile, block of the unit (WPU = 2)
  const uint32_t smem_w_u32 = smem_u32(smem_w);
  [[maybe_unused]] const uint32_t smem_a_u32 = smem_u32(smem_a);
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // The dynamic schedule (produce_tiles): the tile comes from the slot of the stage that holds its first k-tile;
  // the static one: every role walks blockIdx.x + i * gridDim.x with its own cursor.
  const bool dynamic = DYNAMIC_OK && p.tile_counter != nullptr;
  TileCursor<BT> cur;
  for (int iter = 0;; ++iter) {
    int e, local, row_begin, rows;
    if (dynamic) {
      mbar_wait(full0 + 8 * s, phase);
      const int4 ts = lds128_volatile(slots + s * sizeof(TileSlot));
      if (ts.x < 0) break;
      e = ts.x;
      local = ts.y;
      row_begin = ts.z;
      rows = ts.w;
    } else {
      if (iter > 0) idx += gridDim.x;
      if (!cur.template seek<kConsumerExpertsPerLane>(p, n_ctiles, idx)) break;
      e = cur.e;
      local = idx - cur.first;
      row_begin = cur.row_begin;
      rows = cur.rows;
    }
    const int ttiles = (rows + BT - 1) / BT;
    const int n_idx = local / ttiles, t_idx = local - n_idx * ttiles;
    // MIXED (constants otherwise, so that the other kernels keep their code): this warpgroup's unit, first token row
    // and weight slot (mixed_tile_place), and where its B (token rows) stage lies: b_base + stage * b_stride (the A
    // stages, or the narrow rows in the weight stages). Arithmetic on the tile's mixed flag and the slot, no branch:
    // a branch on a value derived from threadIdx anywhere in the consumers' path made ptxas serialize their wgmmas
    // (C7520).
    [[maybe_unused]] const MixedTilePlace place = MIXED ? mixed_tile_place(BT, rows, n_idx, t_idx, slot)
                                                        : MixedTilePlace{};
    const int unit = MIXED ? place.unit : n_idx * UPT + slot;
    [[maybe_unused]] uint32_t b_base = 0, b_stride = 0;
    if constexpr (MIXED) {
      const uint32_t tail = static_cast<uint32_t>(place.tail);
      // (warp broadcasts: the wgmma descriptors live in uniform registers, and a value derived from the slot is
      // not known to be uniform; unbroadcast, each wgmma waited for R2UR moves of its descriptor)
      const uint32_t a_u32 = smem_u32(smem_a);
      b_base = __shfl_sync(0xFFFFFFFFu, a_u32 + tail * (smem_w_u32 + kMixedTailOffset - a_u32), 0);
      b_stride = __shfl_sync(0xFFFFFFFFu, Tr::kABytes + tail * (Tr::kWBytes - Tr::kABytes), 0);
    }
    float acc[NB][BT / 2];
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int i = 0; i < BT / 2; ++i) acc[b][i] = 0.0f;

    // wgmma N for this tile (mma_n_for_rows).
    const int tile_rows = min(BT, rows - (MIXED ? place.tok0 : t_idx * BT));
    // MIXED: the two warpgroups of a mixed tile run different widths; the width comes from the slot, so ptxas takes
    // the width's branch for divergent unless the value is a warp broadcast (C7520 otherwise; CUTLASS broadcasts its
    // warpgroup index the same way).
    const int n_mma =
        MIXED ? __shfl_sync(0xFFFFFFFFu, mma_n_for_rows<BT>(tile_rows), 0) : mma_n_for_rows<BT>(tile_rows);

    // Software pipeline: the dequantization of k-tile kt+1 runs while the wgmmas of k-tile kt execute.
    // This thread's weight words of a stage: its 16 code bytes of each of its NB blocks, and the scale word it
    // converts for its quad (dequant_ktile). ld.shared on 32-bit shared addresses (a generic pointer here would
    // compile to generic LD.E). Both consumer kinds load through it.
    auto stage_weights = [&](int stage) {
      return smem_w_u32 + stage * Tr::kWBytes + (MIXED ? place.weight_slot : slot) * kUnitBytes + half * kChunkBytes;
    };
    auto load_codes = [&](uint32_t wsm, uint4 (&codes)[NB]) {
#pragma unroll
      for (int b = 0; b < NB; ++b) codes[b] = lds128(wsm + b * kChunkBytes + tid * 16);
    };
    auto load_scale_word = [&](uint32_t wsm) { return lds32(wsm + scale_word_offset<NB>(warp, g, t)); };
    auto load_dequant = [&](int stage, uint32_t (&a)[NB][16]) {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 7 || NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 8
      return;  // measurement hook: the stage is waited for and released, never read
#endif
      const uint32_t wsm = stage_weights(stage);
      uint4 codes[NB];
      load_codes(wsm, codes);
      if constexpr (NB == 1 || (NVFP4MOE_SM90_DEQUANT_EXPERIMENT != 1 && NVFP4MOE_SM90_DEQUANT_EXPERIMENT != 2 &&
                                NVFP4MOE_SM90_DEQUANT_EXPERIMENT != 4)) {
        // This thread's scale word (dequant_ktile shares it across the quad).
        dequant_ktile<NB>(codes, load_scale_word(wsm), a);
      } else {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 4
        // Measurement hook: the previous version (every thread converts all 4 scale words).
        uint2 sc[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) sc[b] = lds64(wsm + b * kChunkBytes + kCodeBytes + (warp * 8 + g) * 8);
#pragma unroll
        for (int b = 0; b < 2; ++b) dequant_block(codes[b], sc[b], a[b]);
#elif NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 1 || NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 2
        uint2 sc[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) sc[b] = lds64(wsm + b * kChunkBytes + kCodeBytes + (warp * 8 + g) * 8);
        dequant_experiment(codes, sc, a);
#endif
      }
    };
    auto issue = [&](int stage, const uint32_t (&a)[NB][16]) {
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 7 || NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 8
      return;  // measurement hook: no wgmma
#endif
      const uint64_t desc = make_b_desc(MIXED ? b_base + static_cast<uint32_t>(stage) * b_stride
                                              : smem_u32(smem_a + stage * Tr::kABytes));
      reg_fence_all(acc);
      wgmma_fence();
      auto run = [&](auto n_const) {
        constexpr int NM = decltype(n_const)::value;
        // b innermost: the two accumulator chains alternate, so one wgmma never waits on the previous one's
        // accumulator (small N is latency-bound otherwise; WPU = 2 has one chain). Each accumulator still sums k
        // in order.
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int b = 0; b < NB; ++b) {
            const uint32_t af[4] = {a[b][4 * j], a[b][4 * j + 1], a[b][4 * j + 2], a[b][4 * j + 3]};  // k16 step j
#if NVFP4MOE_SM90_DEQUANT_EXPERIMENT == 5
            // Measurement hook: no tensor-core work; the dequantized registers are consumed by an empty asm.
            asm volatile("" ::"r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]));
            (void)desc;
#else
            Wgmma<NM>::mma(acc[b], af, desc + 2 * j);
#endif
          }
      };
      run_at_wgmma_width<BT>(n_mma, run);
    };
    // A warp's release of a stage (both consumer kinds): every lane's reads of it are done (__syncwarp), then one
    // arrive. Only after the values read have been consumed by an instruction: ptxas does not make the arrive wait
    // for loads still in flight (scripts/sass_arrive_check.py).
    auto release = [&](int stage) {
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * stage);
    };
    if constexpr (!SYNC) {
      // One wgmma batch stays in flight across k-tiles: batch kt is issued while batch kt - 1 may still run,
      // and only then does the warpgroup wait for kt - 1 (wait_group 1), release its stage and dequantize
      // k-tile kt + 1 into the registers kt - 1 read. Waiting for the batch just issued (wait_group 0, before
      // 2026-12-04) drained the tensor pipe once per k-tile. The same wgmmas on the same accumulators in the
      // same order: the same bits.
      uint32_t a0[NB][16], a1[NB][16];
      int kt = 0;
      int s_prev = 0;  // the stage of the batch issued one k-tile earlier (released once that batch is done)
      auto step = [&](const uint32_t (&cur_a)[NB][16], uint32_t (&next_a)[NB][16]) {
        issue(s, cur_a);  // batch kt
        if (kt > 0) {
          wgmma_wait<1>();  // batch kt - 1 is done: its stage and its A registers (next_a) are free
          release(s_prev);
        }
        s_prev = s;
        int s_next = s + 1;
        uint32_t ph_next = phase;
        if (s_next == STAGES) { s_next = 0; ph_next ^= 1; }
        if (kt + 1 < p.k_tiles) {
          mbar_wait(full0 + 8 * s_next, ph_next);
          if constexpr (GATHER) gathered_a_proxy_fence();
          load_dequant(s_next, next_a);
        }
        s = s_next;
        phase = ph_next;
        ++kt;
      };
      mbar_wait(full0 + 8 * s, phase);
      if constexpr (GATHER) gathered_a_proxy_fence();
      load_dequant(s, a0);
      while (true) {
        step(a0, a1);
        if (kt >= p.k_tiles) break;
        step(a1, a0);
        if (kt >= p.k_tiles) break;
      }
      wgmma_wait<0>();  // the last batch
      reg_fence_all(acc);
      release(s_prev);
    } else {
      // mma.sync: each warp loads its stage (codes, its scale word, the B fragments of the rows this tile
      // has), dequantizes, and issues the k-tile's m16n8k16s while it fetches the next; it releases the stage
      // once those m16n8k16s are issued. Released right after the loads (before 2026-12-05), the arrive went out
      // with the ldmatrix loads still in flight: ptxas does not wait for them before the mbarrier arrive (their
      // scoreboards were open at the SYNCS.ARRIVE, SASS of bt16_s14_wg2_sync), and on the H200 about one launch in
      // 50 of that config gave a token row other bits (TileConfigsStableOverManyLaunches): the stage's next TMA
      // had landed before some ldmatrix read it. The HMMAs read the fragments' registers, so once they are
      // issued every load of the stage has completed.
      constexpr int NT = BT / 8;                // n-tiles of 8 tokens
      const int n_nt = (tile_rows + 7) / 8;      // the ones with rows (uniform over the CTA)
      // B fragment of k16 step j, n-tile nt: token nt * 8 + g, k 16j + 2t (+1) and + 8, i.e. 16-byte chunks 2j
      // and 2j + 1 of the token's 128-byte row, chunk c stored at c ^ (row % 8) (the TMA's 128B swizzle).
      // ldmatrix.x4 lane l addresses row nt * 8 + l % 8 of chunk 4h + l / 8: its offset in the stage is
      // nt * 1024 + (ldsm_off ^ 64h) (4h + m = 4h | m, and XOR by 4 in the chunk index is XOR by 64 in bytes).
      const uint32_t ldsm_off = (lane & 7) * 128 + (((lane >> 3) ^ (lane & 7)) << 4);
      int s_fetched = 0;  // the stage of the k-tile fetched last
      auto fetch = [&](uint32_t (&a)[NB][16], uint32_t (&bf)[NT][4][2]) {
        mbar_wait(full0 + 8 * s, phase);
        const uint32_t wsm = stage_weights(s);
        uint4 codes[NB];
        load_codes(wsm, codes);
        const uint32_t sw = load_scale_word(wsm);
        const uint32_t abase = smem_a_u32 + s * Tr::kABytes;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          if (nt >= n_nt) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // chunks 4h .. 4h + 3: k16 steps 2h, 2h + 1
            uint32_t q[4];
            ldmatrix_x4(abase + nt * 1024 + (ldsm_off ^ (h << 6)), q);
            bf[nt][2 * h][0] = q[0];
            bf[nt][2 * h][1] = q[1];
            bf[nt][2 * h + 1][0] = q[2];
            bf[nt][2 * h + 1][1] = q[3];
          }
        }
        s_fetched = s;
        if (++s == STAGES) { s = 0; phase ^= 1; }
        dequant_ktile<NB>(codes, sw, a);
      };
      auto mma = [&](const uint32_t (&a)[NB][16], const uint32_t (&bf)[NT][4][2]) {
        auto run = [&](auto nt_const) {
          constexpr int NTR = decltype(nt_const)::value;
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int b = 0; b < NB; ++b) {
              const uint32_t af[4] = {a[b][4 * j], a[b][4 * j + 1], a[b][4 * j + 2], a[b][4 * j + 3]};
#pragma unroll
              for (int nt = 0; nt < NTR; ++nt) mma_16816(&acc[b][4 * nt], af, bf[nt][j][0], bf[nt][j][1]);
            }
        };
        if constexpr (NT > 1) {
          if (n_nt > 1) { run(IntC<NT>{}); return; }
        }
        run(IntC<1>{});
      };
      uint32_t a0[NB][16], a1[NB][16], b0[NT][4][2], b1[NT][4][2];
      int kt = 0;
      auto step = [&](const uint32_t (&cur_a)[NB][16], const uint32_t (&cur_b)[NT][4][2],
                      uint32_t (&next_a)[NB][16], uint32_t (&next_b)[NT][4][2]) {
        mma(cur_a, cur_b);
        release(s_fetched);  // the stage cur_a / cur_b came from: its m16n8k16s are issued, their registers read
        if (kt + 1 < p.k_tiles) fetch(next_a, next_b);
        ++kt;
      };
      fetch(a0, b0);
      while (true) {
        step(a0, b0, a1, b1);
        if (kt >= p.k_tiles) break;
        step(a1, b1, a0, b0);
        if (kt >= p.k_tiles) break;
      }
    }

    // ---------------------------------------------------------------- epilogue
    // acc[b][i]: weight row 16*warp + g + 8*((i>>1)&1) of block b (WPU = 2: of block `half`), token
    // 8*(i>>2) + 2t + (i&1) of the tile.
    // WPU = 2 with SwiGLU: the up block's warpgroup writes its accumulators to its slot's exchange buffer and
    // is done with the tile; the gate block's reads them. Named barrier 1 + slot (both warpgroups of the slot,
    // bar.sync on both sides): once after the write, once after the read, so the next tile's write cannot
    // overtake this read. (An arrive on the writer's side would let it run ahead; compute-sanitizer's racecheck
    // does not follow arrive-to-sync ordering and reports every access.)
    [[maybe_unused]] float up_acc[WPU == 2 && EPI == Epilogue::kSwiGLU ? BT / 2 : 1];
    if constexpr (WPU == 2 && EPI == Epilogue::kSwiGLU) {
      float* xch = smem_xch + slot * (BT / 2) * 128;
      if (half == 1) {
#pragma unroll
        for (int i = 0; i < BT / 2; ++i) xch[i * 128 + tid] = acc[0][i];
        named_bar_sync(1 + slot, 256);  // written
        named_bar_sync(1 + slot, 256);  // read
        continue;
      }
      named_bar_sync(1 + slot, 256);
#pragma unroll
      for (int i = 0; i < BT / 2; ++i) up_acc[i] = xch[i * 128 + tid];
      named_bar_sync(1 + slot, 256);
    }
    const int tok0 = MIXED ? place.tok0 : t_idx * BT;
    store_tile_outputs<BT, NB, EPI, WPU>(p, acc, up_acc, e, unit, half, row_begin + tok0, min(BT, rows - tok0), warp,
                                         g, t);
    if constexpr (SIGNAL) {
      // GEMM1 of a chained launch: this warpgroup's stores of the tile are done. Each thread orders its own
      // (generic-proxy) stores before the async proxy that GEMM2's TMA reads through, the warpgroup meets,
      // and one thread publishes the tile at GPU scope (release; GEMM2's producer acquires).
      fence_proxy_async_global();
      named_bar_sync(4 + c, 128);
      if (tid == 0) red_add_release_gpu(done + e, 1);
    }
  }
  return dynamic ? 0 : idx - cur.first;  // (the dynamic schedule is never chained)
}

// Shared memory of a CTA: [STAGES][BT][128 B] A (swizzled), [STAGES][UPT][kUnitBytes] weights, the WPU = 2
// SwiGLU exchange, then the full and empty barriers (initialized here, before the PDL wait: shared memory only)
// and the dynamic schedule's tile slots.
template <class Tr, int STAGES>
struct CtaSmem {
  uint8_t* a;
  uint8_t* w;
  float* xch;
  uint32_t full0, empty0;
  uint32_t slots;   // [STAGES] TileSlot (dynamic schedule), 16-byte aligned
  uint32_t gather;  // [2][Tr::kGatherBufBytes] (gathered A), 16-byte aligned
  // gathered: the producer's four warps copy A (produce_tiles_gathered): a full barrier then completes on
  // kGatherFullArrivals arrivals instead of one.
  __device__ __forceinline__ explicit CtaSmem(uint8_t* raw, bool gathered = false) {
    uint8_t* base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    a = base;
    w = base + STAGES * Tr::kABytes;
    xch = reinterpret_cast<float*>(w + STAGES * Tr::kWBytes);
    uint64_t* bars = reinterpret_cast<uint64_t*>(w + STAGES * Tr::kWBytes + Tr::kExchangeBytes);
    full0 = smem_u32(bars);
    empty0 = smem_u32(bars + STAGES);
    slots = smem_u32(bars + 2 * STAGES);
    gather = slots + STAGES * static_cast<uint32_t>(sizeof(TileSlot));
    if (threadIdx.x == 0) {
      for (int s = 0; s < STAGES; ++s) {
        mbar_init(full0 + 8 * s, gathered ? kGatherFullArrivals : 1u);
        mbar_init(empty0 + 8 * s, Tr::kEmptyArrivals);
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
  }
};

// GATHER: A gathered by the producer warps (GemmParams::gather_src, produce_tiles_gathered; only the configs of
// NVFP4MOE_SM90_GATHER_CONFIGS): its own instantiation, so that the other kernels keep their code.
template <int BT, int WGS, int STAGES, Epilogue EPI, int WPU = 1, bool SYNC = false, bool GATHER = false>
__global__ void __launch_bounds__((WGS + 1) * 128, 1)
    sm90_nvfp4_grouped_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a, const GemmParams p) {
  using Tr = KernelTraits<BT, WGS, STAGES, EPI, WPU, SYNC>;
  extern __shared__ uint8_t smem_raw[];
  const CtaSmem<Tr, STAGES> sm(smem_raw, GATHER);
  // Everything above touches only shared memory and the kernel parameters; from here on the offsets, A and
  // the outputs are read and written: after the previous kernel of the stream (PDL, launch_pdl.cuh).
  kernels::pdl_wait_then_allow_next();
  // The consumer stagger (GemmParams::consumer_stagger_ns). The two consumer warpgroups of a prefill tile read
  // the same stages (one token tile, a unit each), so started together they run in step: both reach the tile's
  // epilogue together, and no wgmma issues until both are back (qwen3-30b T = 4096: the tensor pipe is 61% active
  // in GEMM1, 41% with the quantizing epilogue; docs/gemm.md, "The consumer stagger"). Started apart, they keep
  // the offset tile after tile (both do the same work per tile; the stage ring bounds the lead, since a stage is
  // refilled only once both have released it), so each one's epilogue overlaps the other's k-loop, which then
  // runs alone on the tensor cores (faster than when it shares them) for up to the lead's k-tiles. The second
  // consumer warpgroup (threads 256..383) sleeps once, here; every other thread sleeps 0 ns: no branch, so
  // ptxas keeps every role's code (a branched wait loop before the consumers made it serialize the wgmmas,
  // C7520). A lead larger than the ring allows is capped by the ring (the first warpgroup waits for stages;
  // nothing can deadlock). Each accumulator sums the same wgmmas in the same order: the same bits. Only the tiles
  // of 64 rows and more: the smaller ones run where a CTA has one or two tiles, so the trailer's lag at the
  // CTA's end (about the stagger itself) would not be paid back by the epilogues it overlaps.
  if constexpr (WGS == 2 && WPU == 1 && !SYNC && BT >= 64)
    __nanosleep(threadIdx.x >= 256 ? p.consumer_stagger_ns : 0);
  int s = 0;
  uint32_t phase = 0;
  if (threadIdx.x < 128) {
    // ---------------------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Tr::kProducerRegs));
    if constexpr (GATHER) {  // all four warps copy A
      produce_tiles_gathered<BT, WGS, STAGES, WPU, SYNC>(p, sm.a, sm.w, sm.full0, sm.empty0, sm.slots, sm.gather);
      return;
    }
    // Warp 0 walks the tiles (TileCursor::seek is warp-cooperative); its lane 0 issues the loads.
    if (threadIdx.x >= 32) return;
    if (threadIdx.x == 0) asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&tmap_a)) : "memory");
    produce_tiles<BT, WGS, STAGES, WPU, SYNC, false, true>(&tmap_a, p, blockIdx.x, s, phase, sm.a, sm.w, sm.full0,
                                                            sm.empty0, sm.slots, ChainSync{});
  } else {
    // ---------------------------------------------------------------- consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Tr::kConsumerRegs));
    consume_tiles<BT, WGS, STAGES, EPI, WPU, SYNC, false, true, GATHER>(p, blockIdx.x, s, phase, sm.a, sm.w, sm.xch,
                                                                        sm.full0, sm.empty0, sm.slots, nullptr);
  }
}

// The producer warpgroup's entry in the kernels with two A descriptors (mixed last pass, chain): its registers
// handed back, warps 1..3 done (warp 0 walks the tiles, its lane 0 issues the loads), both descriptors prefetched.
// Returns whether this thread goes on (warp 0).
__device__ __forceinline__ bool producer_warp_with_two_maps(const CUtensorMap* a, const CUtensorMap* b) {
  if (threadIdx.x >= 32) return false;
  if (threadIdx.x == 0) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(a)) : "memory");
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(b)) : "memory");
  }
  return true;
}

// The mixed last pass (Sm90GemmArgs::mixed_last_pass, sm90_mixed_last_pass.h): the plain tile kernel's walks, with
// an expert's narrow last token tile (at most kMixedTailRows rows) run beside its last full one, a unit a tile, its
// rows loaded through tmap_tail (the same A in boxes of kMixedTailRows rows). Its own kernel (the plain ones keep
// their code and parameters); the dynamic schedule and the consumer stagger as there.
template <int BT, int WGS, int STAGES, Epilogue EPI>
__global__ void __launch_bounds__((WGS + 1) * 128, 1)
    sm90_nvfp4_mixed_pass_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                      const __grid_constant__ CUtensorMap tmap_tail, const GemmParams p) {
  using Tr = KernelTraits<BT, WGS, STAGES, EPI, 1, false>;
  extern __shared__ uint8_t smem_raw[];
  const CtaSmem<Tr, STAGES> sm(smem_raw);
  kernels::pdl_wait_then_allow_next();
  __nanosleep(threadIdx.x >= 256 ? p.consumer_stagger_ns : 0);  // (the plain kernel's stagger, branch-free)
  int s = 0;
  uint32_t phase = 0;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Tr::kProducerRegs));
    if (!producer_warp_with_two_maps(&tmap_a, &tmap_tail)) return;
    produce_tiles<BT, WGS, STAGES, 1, false, false, true, true>(&tmap_a, p, blockIdx.x, s, phase, sm.a, sm.w,
                                                                sm.full0, sm.empty0, sm.slots, ChainSync{},
                                                                &tmap_tail);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Tr::kConsumerRegs));
    consume_tiles<BT, WGS, STAGES, EPI, 1, false, false, true, false, true>(p, blockIdx.x, s, phase, sm.a, sm.w,
                                                                            sm.xch, sm.full0, sm.empty0, sm.slots,
                                                                            nullptr);
  }
}

// GEMM1 (EPI1: SwiGLU or relu^2, p1) and GEMM2 (f32, p2: the same experts and offsets, A = p1.out) in one
// persistent launch (ChainSync above). The pipeline's stages and phases run on from GEMM1's tiles into
// GEMM2's, so a CTA's first GEMM2 weights stream in while its consumers finish GEMM1.
template <int BT, int WGS, int STAGES, Epilogue EPI1, int WPU = 1, bool SYNC = false>
__global__ void __launch_bounds__((WGS + 1) * 128, 1)
    sm90_nvfp4_chained_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a1,
                                   const __grid_constant__ CUtensorMap tmap_a2, const GemmParams p1,
                                   const GemmParams p2, const ChainSync chain) {
  static_assert(EPI1 != Epilogue::kF32, "GEMM1 of a chain: an activation epilogue");
  using Tr = KernelTraits<BT, WGS, STAGES, EPI1, WPU, SYNC>;  // GEMM1's layout (its SwiGLU exchange)
  extern __shared__ uint8_t smem_raw[];
  const CtaSmem<Tr, STAGES> sm(smem_raw);
  kernels::pdl_wait_then_allow_next();
  int s = 0;
  uint32_t phase = 0;
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Tr::kProducerRegs));
    if (!producer_warp_with_two_maps(&tmap_a1, &tmap_a2)) return;
    const int idx = produce_tiles<BT, WGS, STAGES, WPU, SYNC, false>(&tmap_a1, p1, blockIdx.x, s, phase, sm.a,
                                                                     sm.w, sm.full0, sm.empty0, sm.slots, chain);
    produce_tiles<BT, WGS, STAGES, WPU, SYNC, true>(&tmap_a2, p2, idx, s, phase, sm.a, sm.w, sm.full0, sm.empty0,
                                                    sm.slots, chain);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Tr::kConsumerRegs));
    const int idx = consume_tiles<BT, WGS, STAGES, EPI1, WPU, SYNC, true>(p1, blockIdx.x, s, phase, sm.a, sm.w,
                                                                          sm.xch, sm.full0, sm.empty0, sm.slots,
                                                                          chain.done);
    consume_tiles<BT, WGS, STAGES, Epilogue::kF32, WPU, SYNC, false>(p2, idx, s, phase, sm.a, sm.w, sm.xch,
                                                                     sm.full0, sm.empty0, sm.slots, nullptr);
  }
}


// ------------------------------------------------------------------------------------------- prepare
// One thread per (expert, unit, k-tile, block, consumer thread): gathers its 32 codes and (t == 0) its row
// pair's 8 scales from the checkpoint layout (packed [E][N][K/2], scales [E][N][K/16]).
// gated: N = 2I, block 0 of unit u = gate rows [64u, 64u + 64), block 1 = the up rows I + [64u, 64u + 64).
// (A template only so that the header can be included by several translation units.)
template <int kLayoutVersion = 2>
__global__ void sm90_prepare_weights_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales,
                                            uint8_t* __restrict__ out, int num_experts, int n, int k, int units,
                                            int k_tiles, int gated) {
  const int64_t total = static_cast<int64_t>(num_experts) * units * k_tiles * 2 * 128;
  for (int64_t id = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; id < total;
       id += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int tid = static_cast<int>(id % 128);
    int64_t rest = id / 128;
    const int b = static_cast<int>(rest % 2);
    rest /= 2;
    const int kt = static_cast<int>(rest % k_tiles);
    rest /= k_tiles;
    const int u = static_cast<int>(rest % units);
    const int e = static_cast<int>(rest / units);
    const int warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    const int half_n = n / 2;
    auto src_row = [&](int r) -> int {  // checkpoint row of block row r, or -1 for padding
      if (gated) {
        const int j = 64 * u + r;
        return j < half_n ? (b == 0 ? j : half_n + j) : -1;
      }
      const int row = 128 * u + 64 * b + r;
      return row < n ? row : -1;
    };
    const int rows[2] = {src_row(16 * warp + g), src_row(16 * warp + g + 8)};
    const int64_t kb = k / 2, ks = k / 16;
    auto code = [&](int row, int kk) -> uint32_t {
      if (row < 0 || kk >= k) return 0;
      const uint8_t byte = packed[(static_cast<int64_t>(e) * n + row) * kb + kk / 2];
      return (byte >> ((kk & 1) * 4)) & 0xFu;
    };
    uint32_t words[4];
    for (int j = 0; j < 4; ++j) {
      uint32_t cw[4][2];
      for (int i = 0; i < 4; ++i) {
        const int row = rows[i & 1];
        const int kk = kt * 64 + 16 * j + 2 * t + 8 * (i / 2);
        cw[i][0] = code(row, kk);
        cw[i][1] = code(row, kk + 1);
      }
      words[j] = pack_fp4_word(cw);
    }
    uint8_t* chunk = out + ((static_cast<int64_t>(e) * units + u) * k_tiles + kt) * kUnitBytes + b * kChunkBytes;
    *reinterpret_cast<uint4*>(chunk + tid * 16) = make_uint4(words[0], words[1], words[2], words[3]);
    if (t == 0) {
      uint32_t sw[2];
      for (int h2 = 0; h2 < 2; ++h2) {
        uint8_t sb[2][2];
        for (int jj = 0; jj < 2; ++jj)
          for (int h = 0; h < 2; ++h) {
            const int row = rows[h], blk = kt * 4 + 2 * h2 + jj;
            sb[jj][h] = (row >= 0 && blk * 16 < k) ? scales[(static_cast<int64_t>(e) * n + row) * ks + blk] : 0;
          }
        sw[h2] = pack_scale_word(sb);
      }
      const uint2 v = make_uint2(sw[0], sw[1]);
      *reinterpret_cast<uint2*>(chunk + kCodeBytes + (warp * 8 + g) * 8) = v;
    }
  }
}

}  // namespace nvfp4moe::cuda::sm90
