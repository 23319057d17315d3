// sm90_nvfp4_warp_stream_gemm.cuh: the decode grouped GEMM in which every warp streams its own weight rows.
// Device code only; the same prepared weights, arguments, epilogues and bits as sm90_nvfp4_grouped_gemm.cuh
// (whose dequantization, MMA wrapper, tile cursor and quantizer it uses).
//
// Why a second kernel: at decode (a few rows per expert) the tile GEMM has one unit (128 weight rows) per
// consumer warpgroup and k-tile stages shared by the CTA; with 96..288 units on 132 SMs most SMs get 1..3
// units, so the work is either spread over too few SMs (qwen3-30b T = 1: 96 CTAs) or has a one-unit tail
// (deepseek-v3 T = 1: 288 units, 2.18 per SM), and each k-tile pays a CTA-wide handshake. The mma.sync MMA works
// per warp on exactly one warp's share of a unit (16 rows of each of its two 64-row blocks: the 16 bytes of
// codes per thread and the scale words of its row pairs), so the work unit here is that "piece": 32 weight rows
// (rows 16 s .. 16 s + 15 of both blocks of a unit, s = 0..3) over all of K, for one token tile of up to 8 rows.
// 4 x units pieces per expert and token tile; pieces go round-robin over all warps of the grid (CTA fastest, so
// every SM gets an equal share: deepseek-v3 T = 1 has 1152 GEMM1 pieces, 8 or 9 per SM).
//
// Each warp runs its pieces alone: no producer warp, no CTA barrier, no mbarrier. A ring of DEPTH k-tile slots
// per warp in shared memory is filled by the warp's own cp.async (each lane copies its 2 x 16 code bytes and
// its scale word, and 2 of the token tile's 64 16-byte chunks, zero-filled past the tile's rows and past K),
// DEPTH - 1 k-tiles ahead of the MMA (the k-loop rolled, or unrolled by DEPTH: ws_piece_k_loop_*). Per
// k-tile: wait for the oldest group, read the slot (the lane's own codes and scale word, the token tile by
// ldmatrix), refill the slot read one k-tile before, dequantize (dequant_ktile<2>: the same conversion as every
// other config), 8 mma.sync m16n8k16 (two accumulator chains,
// the gate / up or the two 64-row blocks), each accumulator summing the k16 steps in order from zero: the
// same bits as the tile kernels (tested bitwise against them, and batch invariance over every config).
// The broadcast-row kernels (T = 1: every token row is row 0 of `a`) instead keep that row in the CTA's shared
// memory for the launch (one bulk copy), so their slots hold only weights and their k-loop copies no tokens
// (ws_piece_k_loop_resident_row).
#pragma once

#include <type_traits>
#include <utility>

#include "cuda/sm90_nvfp4_gather_quant.cuh"
#include "cuda/sm90_nvfp4_grouped_gemm.cuh"
#include "cuda/sm90_nvfp4_grouped_gemm.h"
#include "cuda/sm90_nvfp4_plan_block.cuh"
#include "cuda/sm90_nvfp4_route.cuh"

namespace nvfp4moe::cuda::sm90 {

// UNROLLED: the k-loop unrolled by DEPTH (ws_piece_k_loop_unrolled) or rolled.
// SPW: warp slices per piece (1: the piece is one warp slice; 2: two adjacent slices of the same unit, whose
// token tile is copied and read once: fewer instructions per weight byte, half as many pieces).
// One warp's k-tile slot: per slice, the codes of the two blocks (32 lanes x 16 B each) and the lanes' scale
// words (32 x 4 B; lane (g, t) holds word t % 2 of block t / 2 of row pair g, as dequant_ktile<2> expects); then
// the token tile (8 rows x 64 bf16, chunk c of row r at 16 (c ^ r): conflict-free ldmatrix).
inline constexpr int kWsTokens = 8;  // token rows per piece: one n-tile of mma.m16n8k16
// Experts per lane of a cursor step: 9, so that one step (288 experts) covers every preset's GEMMs at decode,
// deepseek-v3's 257 included (the shared expert merged as expert 256), and a warp's last seek answers from
// registers (TileCursor::end). With 8 (256 a step) deepseek-v3's last seeks still walked the offsets: its
// layer did not gain from the cursor's end at all (bench/results/1830377-cursor-end-ab-h100).
inline constexpr int kWsExpertsPerLane = 9;
// BPW: 64-row blocks a warp streams (2: both blocks of its slices; 1: one block, the piece's two blocks on warps
// 2j and 2j + 1, "_b1": at T = 1 the lone warp's k-loop is its own instruction chain, and this halves the
// dequantization and MMAs in it without changing any accumulator's K order).
// TOKENS: the slot holds the token tile (false: the broadcast-row kernels, whose token row is resident in the CTA's
// shared memory for the whole launch, WarpStreamTraits::kResidentRow).
template <int SPW, int BPW = 2, bool TOKENS = true>
struct WarpStreamSlot {
  static constexpr int kSliceBytes = BPW * 512 + 128;  // codes of the warp's blocks, then the scale words
  static constexpr int kScaleOffset = BPW * 512;        // within a slice
  static constexpr int kTokenOffset = SPW * kSliceBytes;
  static constexpr int kBytes = kTokenOffset + (TOKENS ? 1024 : 0);
  static constexpr int kPiecesPerUnit = 4 / SPW;
};

// RESIDENT_ROW (the broadcast-row kernels, WsRows::kBroadcast): every piece's token rows are row 0 of `a`, so the
// CTA copies that row into shared memory once (one bulk copy on an mbarrier, zero-padded to whole k-tiles) and
// the slots hold only weights. Behind the handoff area: the mbarrier (16 bytes), 128 zero bytes (the ldmatrix rows
// past the tile's rows read them), then the row (k_tiles x 128 bytes, sized at launch: resident_row_bytes).
inline constexpr int kMaxSmemPerBlock = 232448;  // sm_90's opt-in maximum of dynamic shared memory a block
template <int WARPS, int DEPTH, int SPW, bool UNROLLED, Epilogue EPI, int BPW = 2, bool RESIDENT_ROW = false>
struct WarpStreamTraits {  // (UNROLLED, EPI only so that each kernel gets its own one-time launch check, kernel_ready)
  static_assert(DEPTH >= 2, "a ring of at least two k-tile slots");
  static_assert(SPW == 1 || SPW == 2, "one or two warp slices per piece");
  static_assert(BPW == 1 || BPW == 2, "one or both 64-row blocks per warp");
  static_assert(BPW == 2 || WARPS % 2 == 0, "warp pairs");
  static constexpr int kThreads = WARPS * 32;
  using Slot = WarpStreamSlot<SPW, BPW, !RESIDENT_ROW>;
  // With one block a warp: the second warp's accumulators handed to the first (the epilogue's), two buffers a
  // pair (by piece parity), 16 bytes a lane and slice.
  static constexpr int kHandoffOffset = WARPS * DEPTH * Slot::kBytes;
  static constexpr int kHandoffBytes = BPW == 1 ? WARPS / 2 * 2 * 32 * SPW * 16 : 0;
  static constexpr int kRowBarrierOffset = kHandoffOffset + kHandoffBytes;
  static constexpr int kRowZeroOffset = kRowBarrierOffset + 16;
  static constexpr int kRowZeroBytes = 128;  // >= 64 + 16: the second ldmatrix of a k-tile reads 64 bytes further
  static constexpr int kRowOffset = kRowZeroOffset + kRowZeroBytes;
  // The fixed part; the resident row adds resident_row_bytes(k_tiles) at launch.
  static constexpr int kSmemBytes = RESIDENT_ROW ? kRowOffset : kRowBarrierOffset;
  static constexpr int resident_row_bytes(int k_tiles) { return RESIDENT_ROW ? k_tiles * 128 : 0; }
  static_assert(kRowOffset % 16 == 0, "the bulk copy's destination is 16-byte aligned");
  static constexpr int kRegsNeeded = 0;  // no setmaxnreg: the launch's own register count is what it needs
  static_assert(kSmemBytes <= kMaxSmemPerBlock, "shared memory per block");
};

// The T = 1 routing of a routed kernel (ROUTED, Sm90GemmArgs::one_token_route) works in the CTA's ring slots before
// any weight copy: route_block's scratch, then the k ids (16-byte aligned: block_route_smem rounds up).
__host__ __device__ inline int one_token_route_ids_offset(int experts, int top_k) {
  return static_cast<int>(kernels::block_route_smem(1, experts, top_k));
}
__host__ __device__ inline int one_token_route_scratch_bytes(int experts, int top_k) {
  return one_token_route_ids_offset(experts, top_k) + 4 * top_k;
}
// The same for T tokens (WsRows::kRoutedTokens): route_block's scratch, the T x k ids, then the plan's scan
// scratch (32 int2, plan_few_tokens_block's warp_tot).
__host__ __device__ inline int token_rows_route_ids_offset(int tokens, int experts, int top_k) {
  return static_cast<int>(kernels::block_route_smem(tokens, experts, top_k));
}
__host__ __device__ inline int token_rows_route_scan_offset(int tokens, int experts, int top_k) {
  return (token_rows_route_ids_offset(tokens, experts, top_k) + 4 * tokens * top_k + 15) / 16 * 16;
}
__host__ __device__ inline int token_rows_route_scratch_bytes(int tokens, int experts, int top_k) {
  return token_rows_route_scan_offset(tokens, experts, top_k) + 32 * 8;
}

// The quantizing kernels' contiguous piece range of this CTA (kBroadcastQuantized, kRoutedTokensQuantized): pieces
// [begin, end) of the launch's places x n_pieces (floor or ceil of pieces / CTAs, as many as the round-robin gives
// it), which belong to the places place0 .. place0 + places - 1. In 32-bit unsigned arithmetic: the host bounds
// pieces x CTAs below 2^32 (contiguous_ranges_within_two_experts), and a 64-bit division is a call into a
// subroutine: with it, the routing -> first piece span of these kernels was ~0.8 us longer than the broadcast
// kernel's at every preset (experiment 19c, bench/results/44abfde-x19c-t1-first-piece-h100).
__device__ __forceinline__ void ws_contiguous_piece_range(const int places_total, const int n_pieces, int& begin,
                                                          int& end, int& place0, int& places) {
  const uint32_t pieces = static_cast<uint32_t>(places_total) * static_cast<uint32_t>(n_pieces);
  const uint32_t b = pieces * blockIdx.x / gridDim.x, e = pieces * (blockIdx.x + 1u) / gridDim.x;
  const uint32_t per_place = static_cast<uint32_t>(n_pieces), first = b / per_place;
  begin = static_cast<int>(b);
  end = static_cast<int>(e);
  place0 = static_cast<int>(first);
  places = e > b ? static_cast<int>((e - 1u) / per_place - first + 1u) : 0;
}

// A warp's T = 2 .. 4 routing pairs (the routed kernels of WsRows::kRoutedTokens and kDirectTokenIds): lane p <
// pairs holds pair p's expert `id` (-1: none; its token p / k). same: the lanes of the same expert (in token order:
// the plan's rows of that expert); first: p is its expert's first pair; place: the chosen experts below its expert
// (its place in expert order, the expert's tile offset); rows_below: the pairs of experts below it (its offset);
// valid_pairs: the pairs with an expert (offsets[E]); chosen_experts: the distinct chosen experts.
struct WsPairPlaces {
  unsigned same;
  bool first;
  int place, rows_below, valid_pairs, chosen_experts;
};
__device__ __forceinline__ WsPairPlaces ws_pair_places(const int id, const int pairs, const int lane) {
  WsPairPlaces r;
  r.same = __match_any_sync(0xFFFFFFFFu, id);
  r.first = id >= 0 && (r.same & ((1u << lane) - 1u)) == 0u;
  r.place = 0;
  r.rows_below = 0;
  for (int j = 0; j < pairs; ++j) {
    const int other = __shfl_sync(0xFFFFFFFFu, id, j);
    const bool other_first = __shfl_sync(0xFFFFFFFFu, r.first ? 1 : 0, j) != 0;
    r.place += (other_first && other < id) ? 1 : 0;
    r.rows_below += (other >= 0 && other < id) ? 1 : 0;
  }
  r.valid_pairs = __popc(__ballot_sync(0xFFFFFFFFu, id >= 0));
  r.chosen_experts = __popc(__ballot_sync(0xFFFFFFFFu, r.first));
  return r;
}

// cp_async16 / cp_async4 / cp_async_commit / cp_async_wait: sm90_nvfp4_grouped_gemm.cuh.

// Where a warp-streaming kernel's token rows come from: row r of `a` (kDirect, the gathered copy), row 0 of `a`
// for every row (kBroadcast: Sm90GemmArgs::a_broadcast_row, T = 1; resident in shared memory), or GemmParams::gather_src through the plan's
// permutation (kGathered: Sm90GemmArgs::a_gather_src, the decode GEMM1 without a gather step), or row 0 of `a`
// NVFP4-quantized with each routed expert's activation scale (kBroadcastQuantized: Sm90GemmArgs::
// a_broadcast_quant_gs, the routed GEMM1 of w4a4 at T = 1; the quantized rows resident in shared memory). Each its
// own instantiation, so that the others keep their code. kRoutedTokens: the routed GEMM1 at T = 2 .. 4
// (Sm90GemmArgs::a_routed_token_rows): the T rows of `a` resident in shared memory, a piece's tile rows the tokens
// routed to its expert.
// kDirectTokenIds: GEMM2 after such a GEMM1 (direct rows; Sm90OneTokenRoute::read_ids with route.tokens = T): its
// pieces from the T k ids GEMM1 wrote, read after its wait or guessed before it, as at T = 1.
// kRoutedTokensQuantized: kRoutedTokens in w4a4 (Sm90GemmArgs::a_routed_token_quant_gs): a CTA runs a contiguous
// range of pieces (as kBroadcastQuantized) and quantizes the rows of the tokens routed to its (at most
// kWsMaxQuantRows) experts with each one's activation scale in shared memory: in place over the token's raw row,
// and where a token has both experts, the second expert's into one more row (2 T rows in all).
enum class WsRows {
  kDirect,
  kBroadcast,
  kGathered,
  kBroadcastQuantized,
  kRoutedTokens,
  kDirectTokenIds,
  kRoutedTokensQuantized
};

// kBroadcastQuantized: a CTA runs one contiguous range of the launch's pieces (at most ceil(pieces / CTAs), far
// fewer than an expert's pieces at T = 1), so its pieces belong to at most this many routed experts (the host
// checks it: sm90_broadcast_quant_rows_fit), and it keeps that many quantized rows beside the raw one.
inline constexpr int kWsMaxQuantRows = 2;
// The named barrier of a CTA's quantizing warps (the warp pairs of BPW = 1 use 1 .. WARPS / 2).
inline constexpr int kWsQuantRowsBarrier = 15;
// kRoutedTokensQuantized keeps this many resident rows a token (its row, and its second expert's quantized copy).
inline constexpr int kWsTokenQuantRowsPerToken = 2;

// A lane's two token chunks of a piece (chunk lane and lane + 32: tile row lane / 8 + 4 h, 16-byte column
// lane % 8): where each chunk's row starts (column 0 of its source row; a valid address even when the row is
// not read), whether the row is read at all (false: zero-filled: past the tile's rows, or no source row), and
// a valid address for the zero-filling copies (src-size 0).
struct WsTokenRows {
  const uint16_t* row[2];
  bool ok[2];
  const uint16_t* any;
};

// Calls f(std::integral_constant<int, i>{}) for i = 0 .. N - 1 (compile-time indices: constant slot addresses).
template <int N, typename F, int... I>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl<N>(f, std::make_integer_sequence<int, N>{});
}

// What a lane reads from one k-tile slot: its codes and scale word of each slice, and the token tile's B
// fragments (ldmatrix.x4 per pair of k16 steps).
template <int SPW, int BPW>
struct WsSlotRegs {
  uint4 codes[SPW][BPW];
  uint32_t sw[SPW];
  uint32_t bf[4][2];
};
// The lane's own codes and scale word of each slice (its own bytes only: no other lane's copies are read).
template <int SPW, int BPW>
__device__ __forceinline__ void ws_read_slot_weights(const uint32_t slot, const int lane, WsSlotRegs<SPW, BPW>& r) {
  using Slot = WarpStreamSlot<SPW, BPW>;  // (the slice layout; the same with or without the token tile)
#pragma unroll
  for (int j = 0; j < SPW; ++j) {
    const uint32_t sl = slot + j * Slot::kSliceBytes;
#pragma unroll
    for (int b = 0; b < BPW; ++b) r.codes[j][b] = lds128(sl + b * 512 + lane * 16);
    r.sw[j] = lds32(sl + Slot::kScaleOffset + lane * 4);
  }
}
// The k-tile's B fragments: ldmatrix.x4 of chunks 4h .. 4h + 3 (k16 steps 2h, 2h + 1) at addr(h).
template <int SPW, int BPW, class AddrFn>
__device__ __forceinline__ void ws_read_token_fragments(AddrFn&& addr, WsSlotRegs<SPW, BPW>& r) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint32_t q[4];
    ldmatrix_x4(addr(h), q);
    r.bf[2 * h][0] = q[0];
    r.bf[2 * h][1] = q[1];
    r.bf[2 * h + 1][0] = q[2];
    r.bf[2 * h + 1][1] = q[3];
  }
}
template <int SPW, int BPW>
__device__ __forceinline__ void ws_read_slot(const uint32_t slot, const int lane, const uint32_t ldsm_off,
                                             WsSlotRegs<SPW, BPW>& r) {
  using Slot = WarpStreamSlot<SPW, BPW>;
  ws_read_slot_weights<SPW, BPW>(slot, lane, r);
  ws_read_token_fragments<SPW, BPW>([&](int h) { return slot + Slot::kTokenOffset + (ldsm_off ^ (h << 6)); }, r);
}
// Every accumulator of a piece from zero (each k-loop starts its piece with it).
template <int SPW>
__device__ __forceinline__ void ws_zero_acc(float (&acc)[SPW][2][4]) {
#pragma unroll
  for (int j = 0; j < SPW; ++j)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[j][b][i] = 0.0f;
}
// A lane's weight copies of one k-tile into `slot`, `ahead` k-tiles past the sources wcode / wscale (this lane's
// code bytes and scale word of the piece's first slice, of the warp's first block): its 16 code bytes of each
// of the warp's blocks and its scale word of each slice. Both k-loops issue them through this.
template <int SPW, int BPW>
__device__ __forceinline__ void ws_copy_weights(const uint32_t slot, const uint8_t* wcode, const uint8_t* wscale,
                                                const int ahead, const int lane) {
  using Slot = WarpStreamSlot<SPW, BPW>;  // (the slice layout; the same with or without the token tile)
#pragma unroll
  for (int j = 0; j < SPW; ++j) {
    const uint32_t sl = slot + j * Slot::kSliceBytes;
#pragma unroll
    for (int b = 0; b < BPW; ++b)
      cp_async16(sl + b * 512 + lane * 16, wcode + ahead * kUnitBytes + j * 512 + b * kChunkBytes, 16);
    cp_async4(sl + Slot::kScaleOffset + lane * 4, wscale + ahead * kUnitBytes + j * 64);
  }
}
// The k-tile's 4 k16 steps of each slice: dequant_ktile<BPW> (the conversion every config uses), then 4 BPW
// mma.sync in step order into the warp's accumulator chains (block b: acc[sj][b]; with one block acc[sj][0]).
template <int SPW, int BPW>
__device__ __forceinline__ void ws_mma_slot(const WsSlotRegs<SPW, BPW>& r, float (&acc)[SPW][2][4]) {
#pragma unroll
  for (int sj = 0; sj < SPW; ++sj) {
    uint32_t af[BPW][16];
    dequant_ktile<BPW>(r.codes[sj], r.sw[sj], af);
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int b = 0; b < BPW; ++b) {
        const uint32_t fr[4] = {af[b][4 * j], af[b][4 * j + 1], af[b][4 * j + 2], af[b][4 * j + 3]};
        mma_16816(acc[sj][b], fr, r.bf[j][0], r.bf[j][1]);
      }
  }
}

// The k-loop of one piece: acc (zeroed here) receives the piece's k16 steps in order, the ring of DEPTH slots at
// `ring`. Two forms with the same groups, waits and arithmetic (the same bits). Rolled: the slot indices and the
// sources are counters (measured faster where each warp streams one piece alone, qwen3-30b / nemotron-nano /
// gpt-oss-120b T = 1: the unrolled loop's code is DEPTH times larger; bench/results/5c66c7a-ws-unroll-ab/).
// The token rows: token_rows(), a WsTokenRows. The prologue (the first DEPTH - 1 k-tiles) is split where the
// rows are not known yet (split, or before the PDL wait: !waited): the weights of those k-tiles first, then the
// wait (if not waited), token_rows() (which may load them: their round trip overlaps the weights' copies), and
// the token tiles. after_prologue() runs once the prologue's copies are issued (the next piece's lookups).
// speculation_holds(): where the loop waits (in its prologue), once the prologue's copies are issued: false when
// the piece was chosen from ids read before the wait that the wait proved stale (the guessing GEMM2 at T = 1): the
// loop then drains its copies and returns false (acc undefined; the caller runs its pieces again with the ids it
// now has).
template <int DEPTH, int SPW, int BPW, class TokenRowsFn, class AfterPrologueFn, class SpeculationFn>
__device__ __forceinline__ bool ws_piece_k_loop_rolled(const int k, const GemmParams& p, const uint32_t ring,
    const int lane, const int g, const int t, const uint32_t ldsm_off, const uint8_t* wunit, const int slice0,
    const bool split, bool& waited, TokenRowsFn&& token_rows, AfterPrologueFn&& after_prologue,
    SpeculationFn&& speculation_holds, float (&acc)[SPW][2][4]) {
  using Slot = WarpStreamSlot<SPW, BPW>;
  // Running sources of the next k-tile to fill (issue() is called for k-tiles 0, 1, 2, ... in order): this
  // lane's code bytes of both blocks, its scale word, and its two chunks of the token tile (chunk lane and
  // lane + 32: row r = chunk / 8, 16-byte column c = chunk % 8), zero-filled past the tile's rows and past K.
  // (slice j of the piece: + j * 512 code bytes, + j * 64 scale bytes)
  const uint8_t* wcode = wunit + slice0 * 512 + lane * 16;
  const uint8_t* wscale = wunit + scale_word_offset<BPW>(slice0, g, t);
  const uint16_t* asrc[2];
  const uint16_t* azero = nullptr;
  uint32_t adst[2];
  bool arow_ok[2];
  int acol[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int chunk = lane + 32 * h, r = chunk >> 3, c = chunk & 7;
    acol[h] = 8 * c;
    adst[h] = static_cast<uint32_t>(Slot::kTokenOffset + r * 128 + ((c ^ r) << 4));
  }
  auto set_rows = [&](const WsTokenRows& tr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      arow_ok[h] = tr.ok[h];
      asrc[h] = tr.row[h] + acol[h];
    }
    azero = tr.any;
  };
  int kt_fill = 0;
  // The copies of k-tile kt_fill + ahead into `slot`: the weights (constant), then the token tile.
  auto copy_weights = [&](uint32_t slot, int ahead) { ws_copy_weights<SPW, BPW>(slot, wcode, wscale, ahead, lane); };
  auto copy_tokens = [&](uint32_t slot, int ahead) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = arow_ok[h] && acol[h] + ahead * kBlockK < k;
      cp_async16(slot + adst[h], ok ? asrc[h] + ahead * kBlockK : azero, ok ? 16u : 0u);
    }
  };
  auto advance = [&](int n) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      asrc[h] += n * kBlockK;
      acol[h] += n * kBlockK;
    }
    wcode += n * kUnitBytes;
    wscale += n * kUnitBytes;
    kt_fill += n;
  };
  // Fills the next k-tile's slot (if any k-tile is left) and closes one cp.async group either way, so that
  // "all but the newest DEPTH - 2 groups done" always means "k-tile kt done" in the loop below.
  auto issue = [&](uint32_t slot) {
    if (kt_fill < p.k_tiles) {
      copy_weights(slot, 0);
      copy_tokens(slot, 0);
      advance(1);
    }
    cp_async_commit();
  };
  if (!split) set_rows(token_rows());  // (known: computed, not loaded)
  ws_zero_acc<SPW>(acc);
  auto slot_of = [&](int s) { return ring + static_cast<uint32_t>(s * Slot::kBytes); };
  if (waited && !split) {
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d) issue(slot_of(d));
  } else {
    // Before the PDL wait (the launch allows it: only the token rows come from the previous kernel), or before
    // the rows are known: the weights of the first DEPTH - 1 k-tiles stream in first; their token tiles follow
    // the wait and the rows' lookup. Group 0 then holds all those weights and every group one token tile:
    // "group kt done" still means "k-tile kt done".
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d)
      if (d < p.k_tiles) copy_weights(slot_of(d), d);
    bool guessed = false;
    if (!waited) {
      kernels::pdl_wait_then_allow_next();
      waited = true;
      guessed = true;
    }
    if (split) set_rows(token_rows());
#pragma unroll
    for (int d = 0; d < DEPTH - 1; ++d) {
      if (d < p.k_tiles) copy_tokens(slot_of(d), d);
      cp_async_commit();
    }
    advance(min(DEPTH - 1, p.k_tiles));
    // (checked once the token copies are out: the check's round trip overlaps theirs)
    if (guessed && !speculation_holds()) {
      cp_async_wait_all();  // the copies of a piece that is not this launch's: in before the slots are reused
      return false;
    }
  }
  after_prologue();
  int s_read = 0, s_fill = DEPTH - 1;
  for (int kt = 0; kt < p.k_tiles; ++kt) {
    cp_async_wait<DEPTH - 2>();  // this lane's copies of k-tile kt are in
    __syncwarp();                // and every lane's (the token tile is read across lanes)
    const uint32_t slot = slot_of(s_read);
    WsSlotRegs<SPW, BPW> r;
    ws_read_slot<SPW, BPW>(slot, lane, ldsm_off, r);
    __syncwarp();  // every lane has read slot kt - 1's successor; the slot read last k-tile is free
    issue(slot_of(s_fill));  // k-tile kt + DEPTH - 1
    if (++s_read == DEPTH) s_read = 0;
    if (++s_fill == DEPTH) s_fill = 0;
    ws_mma_slot<SPW, BPW>(r, acc);
  }
  return true;
}

// Unrolled by DEPTH: every slot address is the ring's base plus a constant, the sources advance once per DEPTH
// k-tiles, the token tile's row zero-fill is a src-size set once per piece and the K tail has its own branch
// (~13% fewer executed SASS per k-tile; measured faster with two slices per warp, and with one where the warps
// share their schedulers: deepseek-v3 T = 1, 5c66c7a-ws-unroll-ab). token_rows, split, after_prologue: as in
// the rolled form (without split, the PDL wait comes first: no early weights in this form).
template <int DEPTH, int SPW, int BPW, class TokenRowsFn, class AfterPrologueFn, class SpeculationFn>
__device__ __forceinline__ bool ws_piece_k_loop_unrolled(const int k, const GemmParams& p, const uint32_t ring,
    const int lane, const int g, const int t, const uint32_t ldsm_off, const uint8_t* wunit, const int slice0,
    const bool split, bool& waited, TokenRowsFn&& token_rows, AfterPrologueFn&& after_prologue,
    SpeculationFn&& speculation_holds, float (&acc)[SPW][2][4]) {
  using Slot = WarpStreamSlot<SPW, BPW>;
  if (!split && !waited) {
    kernels::pdl_wait_then_allow_next();
    waited = true;
    // (the guessing kernel splits its first piece, so it checks below; here for any caller that does not)
    if (!speculation_holds()) return false;
  }
  // Sources of k-tile kt0 + d (kt0: the first k-tile of the current group of DEPTH; d < 2 DEPTH - 1, a compile-
  // time offset once the loop below is unrolled): this lane's code bytes of both blocks, its scale word, and its
  // two chunks of the token tile (chunk lane and lane + 32: row r = chunk / 8, 16-byte column c = chunk % 8),
  // zero-filled past the tile's rows (src-size 0 from a valid address) and past K.
  // (slice j of the piece: + j * 512 code bytes, + j * 64 scale bytes)
  const uint8_t* wcode = wunit + slice0 * 512 + lane * 16;
  const uint8_t* wscale = wunit + scale_word_offset<BPW>(slice0, g, t);
  const uint16_t* asrc[2];
  const uint16_t* azero = nullptr;
  uint32_t adst[2], abytes[2], atail[2];
  const int k_tiles = p.k_tiles;
  // The k-tile whose token chunks end inside K (-1: K % 64 == 0, every chunk is whole).
  const int ragged_kt = k % kBlockK != 0 ? k_tiles - 1 : -1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int chunk = lane + 32 * h, r = chunk >> 3, c = chunk & 7;
    adst[h] = static_cast<uint32_t>(Slot::kTokenOffset + r * 128 + ((c ^ r) << 4));
  }
  auto set_rows = [&](const WsTokenRows& tr) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int c = lane & 7;
      asrc[h] = tr.row[h] + 8 * c;
      abytes[h] = tr.ok[h] ? 16u : 0u;
      const int tail_col = (k_tiles - 1) * kBlockK + 8 * c;  // this chunk's first column in the last k-tile
      atail[h] = tr.ok[h] ? static_cast<uint32_t>(2 * max(0, min(8, k - tail_col))) : 0u;
    }
    azero = tr.any;
  };
  if (!split) set_rows(token_rows());
  // The copies of k-tile kt0 + D into `slot` (if that k-tile exists): the weights, the token tile.
  auto fill_weights = [&](const int kt0, auto d_const, const uint32_t slot) {
    constexpr int D = decltype(d_const)::value;
    if (kt0 + D < k_tiles) ws_copy_weights<SPW, BPW>(slot, wcode, wscale, D, lane);
  };
  auto fill_tokens = [&](const int kt0, auto d_const, const uint32_t slot) {
    constexpr int D = decltype(d_const)::value;
    if (kt0 + D < k_tiles) {
      if (kt0 + D != ragged_kt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) cp_async16(slot + adst[h], asrc[h] + D * kBlockK, abytes[h]);
      } else {  // the last k-tile of a K that is not a multiple of 64: each chunk's bytes inside K
#pragma unroll
        for (int h = 0; h < 2; ++h)
          cp_async16(slot + adst[h], atail[h] != 0 ? asrc[h] + D * kBlockK : azero, atail[h]);
      }
    }
  };
  // Fills k-tile kt0 + D into `slot` (if that k-tile exists) and closes one cp.async group either way, so that
  // "all but the newest DEPTH - 2 groups done" always means "the k-tile read next is done" in the loop below.
  auto fill = [&](const int kt0, auto d_const, const uint32_t slot) {
    fill_weights(kt0, d_const, slot);
    fill_tokens(kt0, d_const, slot);
    cp_async_commit();
  };
  ws_zero_acc<SPW>(acc);
  // Slot d holds k-tiles d, d + DEPTH, d + 2 DEPTH, ...: unrolled by DEPTH, every slot address is the ring's
  // base plus a constant, and the sources advance once per DEPTH k-tiles.
  if (!split) {
    static_for<DEPTH - 1>([&](auto d) { fill(0, d, ring + decltype(d)::value * Slot::kBytes); });
  } else {  // the weights first; group 0 holds them all and the first token tile (as in the rolled form)
    static_for<DEPTH - 1>([&](auto d) { fill_weights(0, d, ring + decltype(d)::value * Slot::kBytes); });
    bool guessed = false;
    if (!waited) {
      kernels::pdl_wait_then_allow_next();
      waited = true;
      guessed = true;
    }
    set_rows(token_rows());
    static_for<DEPTH - 1>([&](auto d) {
      fill_tokens(0, d, ring + decltype(d)::value * Slot::kBytes);
      cp_async_commit();
    });
    if (guessed && !speculation_holds()) {  // (as in the rolled form)
      cp_async_wait_all();
      return false;
    }
  }
  after_prologue();
  for (int kt0 = 0; kt0 < k_tiles; kt0 += DEPTH) {
    static_for<DEPTH>([&](auto d_const) {
      constexpr int d = decltype(d_const)::value;
      if (kt0 + d >= k_tiles) return;  // (and every later d of this group)
      cp_async_wait<DEPTH - 2>();  // this lane's copies of k-tile kt0 + d are in
      __syncwarp();                // and every lane's (the token tile is read across lanes)
      const uint32_t slot = ring + d * Slot::kBytes;
      WsSlotRegs<SPW, BPW> r;
      ws_read_slot<SPW, BPW>(slot, lane, ldsm_off, r);
      __syncwarp();  // every lane has read slot d; the slot read one k-tile before is free
      // k-tile kt0 + d + DEPTH - 1 into the slot read one k-tile before.
      fill(kt0, std::integral_constant<int, d + DEPTH - 1>{}, ring + ((d + DEPTH - 1) % DEPTH) * Slot::kBytes);
      ws_mma_slot<SPW, BPW>(r, acc);
    });
    wcode += DEPTH * kUnitBytes;
    wscale += DEPTH * kUnitBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) asrc[h] += DEPTH * kBlockK;
  }
  return true;
}

// The k-loop of one piece of a broadcast-row kernel (WsRows::kBroadcast, T = 1: every token row is row 0 of `a`,
// resident in the CTA's shared memory for the whole launch). Against ws_piece_k_loop_rolled, a k-tile has no token
// copies, no zero-fill predicates and no cross-lane data in the ring (a lane reads only the code bytes and scale
// word its own cp.async wrote, so no __syncwarp either), the slot addresses run as pointers, and the loop is split
// where the fills end (no branch per k-tile): the same weights, MMAs and order (the same bits), ~40 fewer SASS
// a k-tile, which is what a lone warp's k-tile costs at T = 1 (docs/gemm.md, "The rolled k-loop pipelined").
// tok: this lane's ldmatrix address of k-tile 0 (its token row's chunk lane / 8 in the resident row, or the zero
// bytes for the rows past the tile's), tok_step: 128 or 0 a k-tile. row_ready(): once the prologue's weight
// copies are issued (the PDL wait, the row's copy and its mbarrier).
template <int DEPTH, int SPW, int BPW, class RowReadyFn, class AfterPrologueFn>
__device__ __forceinline__ void ws_piece_k_loop_resident_row(const GemmParams& p, const uint32_t ring, const int lane,
    const int g, const int t, uint32_t tok, const uint32_t tok_step, const uint8_t* wunit, const int slice0,
    RowReadyFn&& row_ready, AfterPrologueFn&& after_prologue, float (&acc)[SPW][2][4]) {
  using Slot = WarpStreamSlot<SPW, BPW, false>;
  const uint8_t* wcode = wunit + slice0 * 512 + lane * 16;
  const uint8_t* wscale = wunit + scale_word_offset<BPW>(slice0, g, t);
  const int k_tiles = p.k_tiles;
  ws_zero_acc<SPW>(acc);
  // The first DEPTH - 1 k-tiles' weights (one group each, empty past K), then the row.
#pragma unroll
  for (int d = 0; d < DEPTH - 1; ++d) {
    if (d < k_tiles) ws_copy_weights<SPW, BPW>(ring + d * Slot::kBytes, wcode, wscale, d, lane);
    cp_async_commit();
  }
  wcode += (DEPTH - 1) * kUnitBytes;  // the next k-tile to fill: DEPTH - 1
  wscale += (DEPTH - 1) * kUnitBytes;
  row_ready();
  after_prologue();
  const uint32_t ring_end = ring + DEPTH * Slot::kBytes;
  uint32_t slot_read = ring, slot_fill = ring + (DEPTH - 1) * Slot::kBytes;
  auto read = [&](WsSlotRegs<SPW, BPW>& r) {
    cp_async_wait<DEPTH - 2>();  // this lane's copies of the k-tile are in (all it reads of the ring)
    ws_read_slot_weights<SPW, BPW>(slot_read, lane, r);
    ws_read_token_fragments<SPW, BPW>([&](int h) { return tok + 64 * h; }, r);
    tok += tok_step;
  };
  auto next_slot = [&] {
    slot_read += Slot::kBytes;
    if (slot_read == ring_end) slot_read = ring;
  };
  int kt = 0;
  // k-tiles 0 .. k_tiles - DEPTH: each read is followed by the fill of k-tile kt + DEPTH - 1 into the slot read
  // one k-tile before (its lane's bytes were read into registers by then).
  for (; kt <= k_tiles - DEPTH; ++kt) {
    WsSlotRegs<SPW, BPW> r;
    read(r);
    ws_copy_weights<SPW, BPW>(slot_fill, wcode, wscale, 0, lane);
    cp_async_commit();
    wcode += kUnitBytes;
    wscale += kUnitBytes;
    slot_fill = slot_read;
    next_slot();
    ws_mma_slot<SPW, BPW>(r, acc);
  }
  // The last DEPTH - 1 k-tiles (or all, K < DEPTH k-tiles): nothing left to fill; an empty group per k-tile keeps
  // "all but the newest DEPTH - 2 groups done" meaning "this k-tile is in".
  for (; kt < k_tiles; ++kt) {
    WsSlotRegs<SPW, BPW> r;
    read(r);
    cp_async_commit();
    next_slot();
    ws_mma_slot<SPW, BPW>(r, acc);
  }
}

// The source row of each of a lane's two token chunks in a gathered piece (WsRows::kGathered): tile rows
// lane / 8 and lane / 8 + 4 of the piece whose first GEMM row is row_base. The permutation entries are loaded by
// ws_gathered_perm_entries (one piece ahead), the rest is arithmetic (gather_source_row: -1 = zeros).
__device__ __forceinline__ void ws_gathered_perm_entries(const GemmParams& p, const int perm_rows,
                                                         const int64_t row_base, const int tile_rows, const int lane,
                                                         int (&entry)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 3) + 4 * h;
    const int64_t row = row_base + r;
    entry[h] = p.gather_perm != nullptr && r < tile_rows && row < perm_rows ? __ldg(p.gather_perm + row) : 0;
  }
}
__device__ __forceinline__ WsTokenRows ws_gathered_token_rows(const GemmParams& p, const int perm_rows,
                                                              const int64_t row_base, const int tile_rows,
                                                              const int lane, const int (&entry)[2]) {
  WsTokenRows tr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = (lane >> 3) + 4 * h;
    const int src = r < tile_rows ? gather_source_row(static_cast<int>(row_base) + r, p.gather_perm != nullptr,
                                                      perm_rows, entry[h], p.gather_top_k, p.gather_src_rows,
                                                      p.gather_shared_base)
                                  : -1;
    tr.ok[h] = src >= 0;
    tr.row[h] = p.gather_src + static_cast<int64_t>(src >= 0 ? src : 0) * p.gather_k;
  }
  tr.any = p.gather_src;
  return tr;
}

// a: bf16 [rows, k] (the rows of p.offsets); k: the element count of a row (K % 16 == 0). ROWS: where the token
// rows come from (WsRows; kDirect: row r of a; kBroadcast: row 0 of a for every row; kGathered: p.gather_src
// through the permutation, a unused).
//
// kGathered (the decode GEMM1 without a gather step): every piece's rows need their permutation entries, a
// dependent L2 load after the piece's seek. A warp runs several pieces in turn (qwen3-235b T = 64: ~11), so the
// entries of piece i + 1 are looked up during piece i: right after piece i's prologue copies are issued, the warp
// seeks piece i + 1 (a copy of the cursor) and loads its two entries per lane, which piece i + 1's prologue then
// reads from registers. The first piece's entries are loaded after its weights' copies are issued (the split
// prologue), so that their round trip overlaps those. These kernels wait for the previous kernel first (the
// routing kernel writes the permutation and the offsets; before_wait is ignored).
//
// BPW = 1 ("_b1"): warps 2j and 2j + 1 of a CTA (two schedulers) walk the same pieces, the first streaming block 0
// of each (the SwiGLU gate), the second block 1 (up); the second hands its accumulators to the first through
// shared memory and the first runs the epilogue on exactly the values one warp with both blocks would hold.
//
// ROUTED (Sm90GemmArgs::one_token_route, T = 1): the broadcast-row kernels (GEMM1) route the token themselves after
// their PDL wait (route_block, all the CTA's threads, in its ring slots before any weight copy; CTA 0 also writes
// the routing's and the plan's outputs with rt.write_outputs), the direct-row ones (GEMM2, rt.read_ids) read the k
// ids the previous launch wrote, after their wait or (before_wait) as a guess before it, checked after it (below,
// kSpeculates); each warp then maps a piece index to its expert from the k ids
// in registers (routed_seek) in place of TileCursor::seek over the offsets: the same pieces, experts and rows as
// the plan's offsets give.
template <int WARPS, int DEPTH, int SPW, bool UNROLLED, Epilogue EPI, WsRows ROWS = WsRows::kDirect, int BPW = 2,
          bool ROUTED = false>
__global__ void __launch_bounds__(WARPS * 32, 1)
    sm90_nvfp4_warp_stream_gemm_kernel(const uint16_t* __restrict__ a, const int k, const GemmParams p,
                                       const bool before_wait, const Sm90OneTokenRoute rt,
                                       const float* __restrict__ quant_gs) {
  static_assert(!ROUTED || ROWS != WsRows::kGathered, "the routed kernels read a broadcast row or direct rows");
  constexpr bool kQuantRows = ROWS == WsRows::kBroadcastQuantized;
  static_assert(!kQuantRows || ROUTED, "the quantized rows follow the launch's own routing (GEMM1 at T = 1)");
  // (kTokenQuant: the token rows of kTokenRows, quantized per expert: w4a4)
  constexpr bool kTokenQuant = ROWS == WsRows::kRoutedTokensQuantized;
  constexpr bool kTokenRows = ROWS == WsRows::kRoutedTokens || kTokenQuant;
  static_assert(!kTokenRows || ROUTED, "the token rows follow the launch's own routing (GEMM1 at T = 2 .. 4)");
  // kContiguous: each CTA runs one contiguous range of the pieces (the quantizing kernels: few rows a CTA)
  constexpr bool kContiguous = kQuantRows || kTokenQuant;
  constexpr bool kTokenIds = ROWS == WsRows::kDirectTokenIds;
  static_assert(!kTokenIds || (ROUTED && BPW == 2), "GEMM2 at T = 2 .. 4 reads (guesses) GEMM1's ids: routed");
  constexpr bool kResidentRow = ROWS == WsRows::kBroadcast || kQuantRows || kTokenRows;
  using Tr = WarpStreamTraits<WARPS, DEPTH, SPW, UNROLLED, EPI, BPW, kResidentRow>;
  using Slot = typename Tr::Slot;
  extern __shared__ __align__(128) uint8_t ws_smem[];
  const int warp = static_cast<int>(threadIdx.x) >> 5, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t ring = smem_u32(ws_smem) + static_cast<uint32_t>(warp * DEPTH * Slot::kBytes);
  // The resident row (broadcast kernels): its mbarrier, the zero bytes and the row's padding past K are set up
  // while every thread is still here (warps without a piece exit early); warp 0 (which has the CTA's first piece
  // whenever any warp of the CTA has one) copies the row after its PDL wait, every warp waits for it once.
  [[maybe_unused]] const uint32_t row_bar = smem_u32(ws_smem) + Tr::kRowBarrierOffset;
  [[maybe_unused]] const uint32_t row_zero = smem_u32(ws_smem) + Tr::kRowZeroOffset;
  [[maybe_unused]] const uint32_t row_smem = smem_u32(ws_smem) + Tr::kRowOffset;
  [[maybe_unused]] bool row_seen = false;
  if constexpr (kResidentRow) {
    if (threadIdx.x == 0) {
      mbar_init(row_bar, 1);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    const int tid = static_cast<int>(threadIdx.x);
    for (int w = tid; w < Tr::kRowZeroBytes / 4; w += Tr::kThreads) sts32(row_zero + 4 * w, 0);
    // the row's padding past K (its 2k bytes are k / 2 words)
    for (int w = k / 2 + tid; w < p.k_tiles * 32; w += Tr::kThreads) sts32(row_smem + 4 * w, 0);
    if constexpr (kQuantRows) {  // and the quantized rows' (rows 1 .. kWsMaxQuantRows behind it, as long)
      const int pad = p.k_tiles * 32 - k / 2;
      for (int i = tid; i < kWsMaxQuantRows * pad; i += Tr::kThreads)
        sts32(row_smem + static_cast<uint32_t>((1 + i / pad) * p.k_tiles * 128 + 4 * (k / 2 + i % pad)), 0);
    }
    if constexpr (kTokenQuant) {  // and the other token rows' (rows 1 .. 2T - 1)
      const int pad = p.k_tiles * 32 - k / 2;
      for (int i = tid; i < (kWsTokenQuantRowsPerToken * rt.route.tokens - 1) * pad; i += Tr::kThreads)
        sts32(row_smem + static_cast<uint32_t>((1 + i / pad) * p.k_tiles * 128 + 4 * (k / 2 + i % pad)), 0);
    } else if constexpr (kTokenRows) {  // and the other token rows' (rows 1 .. T - 1)
      const int pad = p.k_tiles * 32 - k / 2;
      for (int i = tid; i < (rt.route.tokens - 1) * pad; i += Tr::kThreads)
        sts32(row_smem + static_cast<uint32_t>((1 + i / pad) * p.k_tiles * 128 + 4 * (k / 2 + i % pad)), 0);
    }
    __syncthreads();
  }
  // PDL: by default every global access follows the wait for the previous kernel of the stream. With
  // before_wait (the launcher's promise: the offsets were written two or more launches back, so only the token
  // rows `a` come from the previous kernel) the first piece's seek, factors and ring weights go before it (the
  // rolled loop waits after its weight copies, the unrolled one at its start; a warp without a piece exits
  // without reading anything the previous kernel writes). Its epilogue's stores follow the wait either way.
  bool waited = ROWS == WsRows::kGathered || !before_wait;
  if (waited) kernels::pdl_wait_then_allow_next();
  // Where the launch waited first, the row's copy goes out now, before any seek (its round trip then overlaps
  // the seek's and the weights'); otherwise warp 0 issues it right after its PDL wait (row_ready below).
  [[maybe_unused]] const bool row_copied_at_start = kResidentRow && waited;
  if constexpr (kResidentRow) {
    if (row_copied_at_start && threadIdx.x == 0) {
      if constexpr (kTokenRows) {  // the T rows (row 0 only in a launch that routes no token: warm-up)
        const int rows = rt.route.tokens > 1 ? rt.route.tokens : 1;
        mbar_expect_tx(row_bar, static_cast<uint32_t>(2 * k * rows));
        for (int r = 0; r < rows; ++r)
          bulk_load(row_smem + static_cast<uint32_t>(r * p.k_tiles * 128), a + static_cast<int64_t>(r) * k,
                    static_cast<uint32_t>(2 * k), row_bar);
      } else {
        mbar_expect_tx(row_bar, static_cast<uint32_t>(2 * k));
        bulk_load(row_smem, a, static_cast<uint32_t>(2 * k), row_bar);
      }
    }
  }
  const int n_pieces = p.units * Slot::kPiecesPerUnit;  // per expert and token tile
  // The T = 1 routing (ROUTED): lane j < k of every warp holds slot j's expert (route_id, -1: none) and its place
  // among the chosen experts in expert order (route_pos: the number of chosen experts below it, which is the
  // one-token plan's offsets[e]); routed_experts: the launch's experts with a row (the chosen ones, then the merged
  // shared expert as expert E).
  [[maybe_unused]] int route_id = -1, route_pos = 0, routed_experts = 0;
  [[maybe_unused]] auto derive_route_places = [&] {
    const int K = rt.route.top_k;
    route_pos = 0;
    for (int j = 0; j < K; ++j) {
      const int other = __shfl_sync(0xFFFFFFFFu, route_id, j);
      route_pos += (other >= 0 && other < route_id) ? 1 : 0;
    }
    routed_experts = __popc(__ballot_sync(0xFFFFFFFFu, route_id >= 0)) + (rt.plan.append_shared ? 1 : 0);
  };
  // The T = 2 .. 4 routing (kTokenRows: GEMM1 routes the T tokens; kTokenIds: GEMM2 reads the T k ids GEMM1
  // wrote): lane p < T k holds pair p's expert (pair_id, -1: none; token p / k); derive_pair_places(T k) sets the
  // rest from ws_pair_places (pair_same, pair_first, pair_place, pair_rows_below, valid_pairs: offsets[E], the merged
  // shared expert's first row) and routed_experts (the chosen experts, then the merged shared expert).
  [[maybe_unused]] int pair_id = -1, pair_place = 0, pair_rows_below = 0, valid_pairs = 0;
  [[maybe_unused]] unsigned pair_same = 0u;
  [[maybe_unused]] bool pair_first = false;
  [[maybe_unused]] unsigned piece_pairs = 0u;  // the current piece's pairs (lanes); 0: all T tokens in order
  [[maybe_unused]] auto derive_pair_places = [&](const int pairs) {
    const WsPairPlaces pp = ws_pair_places(pair_id, pairs, lane);
    pair_same = pp.same;
    pair_first = pp.first;
    pair_place = pp.place;
    pair_rows_below = pp.rows_below;
    valid_pairs = pp.valid_pairs;
    routed_experts = pp.chosen_experts + (rt.plan.append_shared ? 1 : 0);
  };
  // The speculative GEMM2 (read_ids with before_wait: kSpeculates and not waited): GEMM1's CTA 0 writes the ids
  // ~2 us into GEMM1, and a GEMM2 CTA becomes resident only as a GEMM1 CTA exits (one CTA an SM), so the ids read
  // before the PDL wait are nearly always this forward's: each warp maps its first piece from them and issues that
  // piece's weights before the wait, as prologue_before_pdl_wait does with the offsets at T >= 2. They may still
  // be stale (a slow CTA 0, another forward's, anything in a fresh workspace): they are only a guess (a strong
  // relaxed load: no cached copy, any value; out-of-range ids read as none), checked once the wait has made
  // GEMM1's writes visible. If any of the warp's k ids differ, the warp drains its copies and runs its pieces again
  // from the first with the confirmed ids; nothing was stored (the epilogue follows the wait), so the result is
  // the non-speculative one in every case.
  constexpr bool kSpeculates = ROUTED && !kResidentRow && BPW == 2;
  // This lane's slot of the ids by a strong load (before the wait: a guess; after it: the ids GEMM1 wrote).
  [[maybe_unused]] auto strong_route_id = [&] {
    const int id = rt.route.top_k > lane ? ld_relaxed_gpu(rt.route.topk_ids + lane) : -1;
    return id < 0 || id >= rt.route.experts ? -1 : id;
  };
  // (kTokenIds: this lane's pair of the T k ids)
  [[maybe_unused]] auto strong_pair_id = [&] {
    const int id = rt.route.tokens * rt.route.top_k > lane ? ld_relaxed_gpu(rt.route.topk_ids + lane) : -1;
    return id < 0 || id >= rt.route.experts ? -1 : id;
  };
  auto speculation_holds = [&]() -> bool {
    if constexpr (kSpeculates && kTokenIds) {
      if (rt.route.tokens < 1) return true;  // (nothing routed: no piece, nothing guessed)
      const int confirmed = strong_pair_id();
      if (__all_sync(0xFFFFFFFFu, confirmed == pair_id)) return true;
      pair_id = confirmed;
      derive_pair_places(rt.route.tokens * rt.route.top_k);
      if (rt.misspeculations != nullptr && lane == 0) atomicAdd(rt.misspeculations, 1);
      return false;
    } else if constexpr (kSpeculates) {
      if (rt.route.tokens != 1) return true;  // (nothing routed: no piece, nothing guessed)
      const int confirmed = strong_route_id();
      if (__all_sync(0xFFFFFFFFu, confirmed == route_id)) return true;
      route_id = confirmed;
      derive_route_places();
      if (rt.misspeculations != nullptr && lane == 0) atomicAdd(rt.misspeculations, 1);
      return false;
    } else {
      return true;
    }
  };
  if constexpr (kTokenRows) {
    if (rt.route.tokens >= 1) {  // (the host: 2 <= T <= kSm90RoutedTokensMax, T k <= 32; 0: nothing routed)
      const int T = rt.route.tokens, K = rt.route.top_k, P = T * K;
      int32_t* ids_smem =
          reinterpret_cast<int32_t*>(ws_smem + token_rows_route_ids_offset(T, rt.route.experts, K));
      const bool writes = rt.write_outputs && blockIdx.x == 0;
      kernels::route_block(rt.route, ws_smem, ids_smem, writes);  // the ids are visible after its last barrier
      if (writes)
        kernels::plan_few_tokens_block(
            rt.plan, ids_smem, P,
            reinterpret_cast<int2*>(ws_smem + token_rows_route_scan_offset(T, rt.route.experts, K)));
      pair_id = lane < P ? ids_smem[lane] : -1;  // (route_block's ids: an expert or -1)
      if (pair_id >= rt.route.experts) pair_id = -1;
      __syncthreads();  // every warp has read the scratch: the ring slots are the rings' from here on
      derive_pair_places(P);
    }
  } else if constexpr (kTokenIds) {
    if (rt.route.tokens >= 1) {  // GEMM2 (read_ids): the T k ids GEMM1 wrote, after the wait or guessed before it
      if (waited) {
        pair_id = rt.route.tokens * rt.route.top_k > lane ? __ldg(rt.route.topk_ids + lane) : -1;
        if (pair_id < 0 || pair_id >= rt.route.experts) pair_id = -1;
      } else {
        pair_id = strong_pair_id();  // before the wait: checked after it (speculation_holds)
      }
      derive_pair_places(rt.route.tokens * rt.route.top_k);
    }
  } else if constexpr (ROUTED) {
    if (rt.route.tokens == 1) {
      // (K is read after the routing in GEMM1's branch: read before it, ptxas scheduled the routed kernels
      // differently from the GPU-tested 3bf2a7d build, whose machine code this keeps)
      if constexpr (kResidentRow) {  // GEMM1: route (after the wait: the logits come from the previous kernel)
        int32_t* ids_smem = reinterpret_cast<int32_t*>(ws_smem + one_token_route_ids_offset(rt.route.experts,
                                                                                           rt.route.top_k));
        const bool writes = rt.write_outputs && blockIdx.x == 0;
        kernels::route_block(rt.route, ws_smem, ids_smem, writes);  // the ids are visible after its last barrier
        if (writes) kernels::plan_one_token_block(rt.plan, ids_smem, true, nullptr, nullptr);
        route_id = rt.route.top_k > lane ? ids_smem[lane] : -1;  // (route_block's ids: an expert or -1)
        if (route_id >= rt.route.experts) route_id = -1;
        __syncthreads();  // every warp has read the scratch: the ring slots are the rings' from here on
      } else {
        if constexpr (!kSpeculates) {  // (a kernel that cannot check a guess waits first)
          if (!waited) {
            kernels::pdl_wait_then_allow_next();
            waited = true;
          }
        }
        if (waited) {  // GEMM2, read_ids, after its wait (the previous launch wrote them)
          route_id = rt.route.top_k > lane ? __ldg(rt.route.topk_ids + lane) : -1;
          if (route_id < 0 || route_id >= rt.route.experts) route_id = -1;
        } else {
          route_id = strong_route_id();  // before the wait: checked after it (speculation_holds)
        }
      }
      derive_route_places();
    }
  }
  // The expert at place q < routed_experts of a routed kernel (warp-uniform q): the chosen expert with q chosen
  // experts below it, or past the chosen ones the merged shared expert (expert E).
  [[maybe_unused]] auto expert_at_place = [&](const int q) {
    const unsigned m = __ballot_sync(0xFFFFFFFFu, route_id >= 0 && route_pos == q);
    const int from = m != 0u ? __ffs(m) - 1 : 0;
    const int e = __shfl_sync(0xFFFFFFFFu, route_id, from);
    return m != 0u ? e : rt.route.experts;
  };
  // Piece idx of a routed kernel: expert place q = idx / n_pieces, one row (row q) and one token tile each. (Its
  // expert as expert_at_place finds it, written out: through that lambda ptxas scheduled the routed kernels
  // differently from the measured and GPU-tested build.)
  [[maybe_unused]] auto routed_seek = [&](TileCursor<kWsTokens>& c, const int idx) {
    const int q = idx / n_pieces;
    if (q >= routed_experts) return false;
    const unsigned m = __ballot_sync(0xFFFFFFFFu, route_id >= 0 && route_pos == q);
    const int from = m != 0u ? __ffs(m) - 1 : 0;
    const int e = __shfl_sync(0xFFFFFFFFu, route_id, from);
    c.e = m != 0u ? e : rt.route.experts;  // past the chosen ones: the merged shared expert
    c.first = q * n_pieces;
    c.count = n_pieces;
    c.ttiles = 1;
    c.row_begin = q;
    c.rows = 1;
    return true;
  };
  // kTokenRows: piece idx is expert place q = idx / n_pieces (the chosen experts in expert order, then the merged
  // shared expert), one token tile of its pairs' tokens: rows offsets[e] .. (what the plan writes).
  [[maybe_unused]] auto token_rows_seek = [&](TileCursor<kWsTokens>& c, const int idx) {
    const int q = idx / n_pieces;
    if (q >= routed_experts) return false;
    const unsigned m = __ballot_sync(0xFFFFFFFFu, pair_first && pair_place == q);
    const int from = m != 0u ? __ffs(m) - 1 : 0;
    const int e = __shfl_sync(0xFFFFFFFFu, pair_id, from);
    const int below = __shfl_sync(0xFFFFFFFFu, pair_rows_below, from);
    const unsigned same = __shfl_sync(0xFFFFFFFFu, pair_same, from);
    c.e = m != 0u ? e : rt.route.experts;  // past the chosen ones: the merged shared expert
    c.first = q * n_pieces;
    c.count = n_pieces;
    c.ttiles = 1;
    c.row_begin = m != 0u ? below : valid_pairs;
    c.rows = m != 0u ? __popc(same) : rt.route.tokens;
    piece_pairs = m != 0u ? same : 0u;
    return true;
  };
  // A piece's warps (2 with one block a warp): `walker` is the pair's place in the grid's round-robin of pieces,
  // `blk` the warp's block of each piece.
  constexpr int kWarpsPerPiece = 2 / BPW;
  constexpr int kWalkers = WARPS / kWarpsPerPiece;  // per CTA
  const int walker = warp / kWarpsPerPiece, blk = warp % kWarpsPerPiece;
  // The quantized rows (kQuantRows): the CTA runs the contiguous pieces [piece_begin, piece_end) of the launch's
  // routed_experts x n_pieces (as many as the round-robin gives it: floor or ceil of pieces / CTAs), walker w the
  // pieces piece_begin + w + i * kWalkers; so its pieces are those of the expert places quant_place0 ..
  // quant_place0 + quant_places - 1 (at most kWsMaxQuantRows: the host's sm90_broadcast_quant_rows_fit), whose
  // rows all its warps quantize once into shared memory (quantize_rows: a warp with a piece in the first row_ready
  // of its k-loops, after issuing that piece's first weights; a warp without one after finding none, e.g. 13 of
  // qwen3-30b's 16). The round-robin of the other kernels (walker w of CTA b: pieces w x CTAs + b + i x stride)
  // spreads a CTA's pieces over up to kWalkers experts.
  [[maybe_unused]] int piece_begin = 0, piece_end = 0, quant_place0 = 0, quant_places = 0, quant_threads = 0;
  [[maybe_unused]] float quant_gs0 = 0.0f, quant_gs1 = 0.0f;
  if constexpr (kQuantRows) {
    static_assert(kWsMaxQuantRows == 2 && (BPW == 2 || kWalkers < kWsQuantRowsBarrier),
                  "two scales; a named barrier the warp pairs (1 .. kWalkers) leave free");
    ws_contiguous_piece_range(routed_experts, n_pieces, piece_begin, piece_end, quant_place0, quant_places);
    if (quant_places > kWsMaxQuantRows) __trap();  // (excluded by the host: sm90_broadcast_quant_rows_fit)
    quant_threads = piece_end > piece_begin ? Tr::kThreads : 0;  // every warp of a CTA with a piece
    // The places' activation scales, loaded now: their round trip overlaps the first weights' copies.
    const int e0 = expert_at_place(quant_place0), e1 = expert_at_place(quant_place0 + 1);
    if (quant_places > 0) quant_gs0 = __ldg(quant_gs + e0);
    if (quant_places > 1) quant_gs1 = __ldg(quant_gs + e1);
  }
  // kTokenQuant: the same ranges over the T tokens' places (routed_experts: the chosen experts, then the merged
  // shared expert); quant_tokens0 / 1: the tokens routed to the range's first / second expert (bit t: token t; the
  // merged shared expert: all T), whose rows the CTA quantizes (quantize_token_rows).
  [[maybe_unused]] unsigned quant_tokens0 = 0u, quant_tokens1 = 0u;
  if constexpr (kTokenQuant) {
    static_assert(kWsMaxQuantRows == 2 && BPW == 2, "two scales; the named barrier 1 .. kWalkers leave free");
    ws_contiguous_piece_range(routed_experts, n_pieces, piece_begin, piece_end, quant_place0, quant_places);
    if (quant_places > kWsMaxQuantRows) __trap();  // (excluded by the host: sm90_token_rows_quant_fits)
    quant_threads = piece_end > piece_begin ? Tr::kThreads : 0;  // every warp of a CTA with a piece
    // Lane p < T k: pair p's token bit; a place's tokens are its expert's pairs' bits (OR over the warp).
    const unsigned token_bit = pair_id >= 0 ? 1u << (lane / rt.route.top_k) : 0u;
    const unsigned all_tokens = (1u << rt.route.tokens) - 1u;
    auto place_expert = [&](const int q, unsigned& tokens) {
      const unsigned m = __ballot_sync(0xFFFFFFFFu, pair_first && pair_place == q);
      const int e = __shfl_sync(0xFFFFFFFFu, pair_id, m != 0u ? __ffs(m) - 1 : 0);
      tokens = m != 0u ? __reduce_or_sync(0xFFFFFFFFu, pair_id == e ? token_bit : 0u) : all_tokens;
      return m != 0u ? e : rt.route.experts;  // past the chosen ones: the merged shared expert
    };
    const int e0 = place_expert(quant_place0, quant_tokens0), e1 = place_expert(quant_place0 + 1, quant_tokens1);
    if (quant_places > 0) quant_gs0 = __ldg(quant_gs + e0);
    if (quant_places > 1) quant_gs1 = __ldg(quant_gs + e1);
    if (quant_places < 2) quant_tokens1 = 0u;
    if (quant_places < 1) quant_tokens0 = 0u;
  }
  auto next_piece = [&](TileCursor<kWsTokens>& c, const int idx) {
    if constexpr (kContiguous) {
      if (idx >= piece_end) return false;
    }
    if constexpr (kTokenRows || kTokenIds) return token_rows_seek(c, idx);
    else if constexpr (ROUTED) return routed_seek(c, idx);
    else return c.template seek<kWsExpertsPerLane, true>(p, n_pieces, idx);
  };
  const int stride = kContiguous ? kWalkers : kWalkers * static_cast<int>(gridDim.x);
  [[maybe_unused]] int pieces_run = 0;  // (BPW = 1: the parity of the pair's handoff buffer)
  // ldmatrix.x4 lane l addresses token row l % 8, 16-byte chunk 4h + l / 8 of the slot's token tile.
  const uint32_t ldsm_off = (lane & 7) * 128 + (((lane >> 3) ^ (lane & 7)) << 4);
  // kQuantRows: the CTA's expert places' rows, quantized from the raw row (resident, its copy complete) as the
  // gather quantizes them (kernels::quant_block16_operand per 16 columns with the expert's activation scale: the
  // exact bf16 operands e2m1 x e4m3), into rows 1 and 2 of the resident rows, the 16-column blocks thread by thread;
  // then their barrier (a piece's warp reads any of the row's columns in its k-loop). The padding past K stays zero
  // (set at the start). Only the CTA's warps without a piece quantize (all of them where every warp has one): the
  // warps with a piece reach the row only after issuing their first DEPTH - 1 k-tiles' weight copies, then just join
  // the barrier. Quantized by every warp, the barrier waited for those late warps' share: 1.2-2.5 us from the row's
  // arrival (experiment 19); by the idle warps deepseek-v3 / qwen3-235b / qwen3-30b w4a4 T = 1 took -1.45 / -1.2 /
  // -0.4 us (experiment 24, bench/results/cac7c88-x23-x24-quant-order-ab-h100). The token rows of T = 2 .. 4
  // (quantize_token_rows) stay with every warp: 4 tokens' rows on the few idle warps of 8 rows measured +0.55 us at
  // qwen3-235b T = 4 there. (Quantizing before the first weight copies, experiment 23, gained less at T = 1 and lost
  // 1.5 us at T = 4. The idle warps' rows in 4 groups of k-tiles on named barriers, the piece warps' first k-loop
  // waiting for each group before its first k-tile, measured +0.2..0.95 us at every w4a4 T = 1 preset: 9d535bc,
  // bench/results/9d535bc-quant-groups-ab-h100.)
  [[maybe_unused]] auto quantize_rows = [&] {
    const int blocks = k / 16;  // per row
    const uint32_t row_stride = static_cast<uint32_t>(p.k_tiles) * 128u;
    const int busy = min(kWalkers, piece_end - piece_begin) * kWarpsPerPiece;  // the warps with a piece: 0 ..
    const int from = busy < WARPS ? busy : 0;                                   // (all busy: every warp quantizes)
    const int first = warp >= from ? (warp - from) * 32 + lane : 0x7FFFFFFF, step = (WARPS - from) * 32;
    for (int i = first; i < quant_places * blocks; i += step) {
      const int r = i >= blocks ? 1 : 0;  // (quant_places <= 2)
      const int b = i - r * blocks;
      const uint4 v0 = lds128(row_smem + 32u * b), v1 = lds128(row_smem + 32u * b + 16u);
      const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      float x[16];
      kernels::bf16x16_to_floats(w, x);  // (the gather's load_block16, from shared memory)
      uint32_t bits[8];
      kernels::quant_block16_operand(x, r == 0 ? quant_gs0 : quant_gs1, bits);
      const uint32_t dst = row_smem + (1u + r) * row_stride + 32u * b;
      sts128(dst, bits[0], bits[1], bits[2], bits[3]);
      sts128(dst + 16u, bits[4], bits[5], bits[6], bits[7]);
    }
    named_bar_sync(kWsQuantRowsBarrier, quant_threads);
  };
  // kTokenQuant: the rows of the tokens routed to the CTA's experts (quant_tokens0 / 1), each 16-column block by
  // one thread: the raw block (resident) quantized with the token's first expert's scale in place (row t), and for
  // a token routed to both experts also with the second's into row T + t (token_quant_row); then the barrier.
  [[maybe_unused]] auto quantize_token_rows = [&] {
    const int blocks = k / 16;  // per row
    const int T = rt.route.tokens;
    const uint32_t row_stride = static_cast<uint32_t>(p.k_tiles) * 128u;
    const unsigned tokens = quant_tokens0 | quant_tokens1;
    for (int i = warp * 32 + lane; i < __popc(tokens) * blocks; i += quant_threads) {
      const int j = i / blocks, b = i - j * blocks;
      unsigned m = tokens;
      for (int s = j; s > 0; --s) m &= m - 1u;  // its j-th token
      const int tok = __ffs(m) - 1;
      const bool first = ((quant_tokens0 >> tok) & 1u) != 0u, second = ((quant_tokens1 >> tok) & 1u) != 0u;
      const uint32_t src = row_smem + static_cast<uint32_t>(tok) * row_stride + 32u * b;
      const uint4 v0 = lds128(src), v1 = lds128(src + 16u);
      const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
      float x[16];
      kernels::bf16x16_to_floats(w, x);
      uint32_t bits[8];
      kernels::quant_block16_operand(x, first ? quant_gs0 : quant_gs1, bits);
      sts128(src, bits[0], bits[1], bits[2], bits[3]);
      sts128(src + 16u, bits[4], bits[5], bits[6], bits[7]);
      if (first && second) {
        kernels::quant_block16_operand(x, quant_gs1, bits);
        const uint32_t dst = src + static_cast<uint32_t>(T) * row_stride;
        sts128(dst, bits[0], bits[1], bits[2], bits[3]);
        sts128(dst + 16u, bits[4], bits[5], bits[6], bits[7]);
      }
    }
    named_bar_sync(kWsQuantRowsBarrier, quant_threads);
  };
  // Piece idx's first GEMM row and row count (cur: the cursor sought to idx).
  auto piece_rows = [&](const TileCursor<kWsTokens>& c, const int idx, int64_t& row_base, int& tile_rows) {
    const int local = idx - c.first;
    const int t_idx = local - local / c.ttiles * c.ttiles;
    const int tok0 = t_idx * kWsTokens;
    tile_rows = min(kWsTokens, c.rows - tok0);
    row_base = c.row_begin + tok0;
  };
  // One piece: the k-loop (token rows from rows_of(row_base, tile_rows), a WsTokenRows; split and after_prologue
  // as the k-loops take them), then the epilogue.
  auto run_piece = [&](const TileCursor<kWsTokens>& cur, const int idx, auto&& rows_of, const bool split,
                       auto&& after_prologue) {
    const int n_idx = (idx - cur.first) / cur.ttiles;
    const int unit = n_idx / Slot::kPiecesPerUnit, slice0 = n_idx % Slot::kPiecesPerUnit * SPW;
    int64_t row_base;
    int tile_rows;
    piece_rows(cur, idx, row_base, tile_rows);
    const uint8_t* wunit =
        p.w + (static_cast<size_t>(cur.e) * p.units + unit) * p.k_tiles * kUnitBytes + blk * kChunkBytes;
    // The expert's epilogue factors, loaded before the k-loop: issued after it, their L2 round trip was one more
    // step in series at the end of every piece (the same values either way). Loading them after the k-loop again
    // measured +0.05..1.0 us per layer at T = 1 / 4 (experiment 13, bench/results/deb21f8-x13-x14-ab).
    const int e = cur.e;
    const float al0 = __ldg(p.alpha0 + e) * kWeightUnscale;
    [[maybe_unused]] const float al1 = EPI == Epilogue::kSwiGLU ? __ldg(p.alpha1 + e) * kWeightUnscale : 0.0f;
    [[maybe_unused]] const float gsv = EPI != Epilogue::kF32 && p.gs != nullptr ? __ldg(p.gs + e) : 0.0f;
    auto token_rows = [&]() { return rows_of(row_base, tile_rows); };
    float acc[SPW][2][4];
    if constexpr (kResidentRow) {
      // ldmatrix lane l reads token row l % 8, chunk l / 8 (+ 4 for the second): the row for the tile's rows (all
      // row 0 of a), the zero bytes past them (as the zero-filled rows of a slot's token tile).
      const bool row_lane = (lane & 7) < tile_rows;
      auto row_ready = [&] {
        if (!waited) {
          kernels::pdl_wait_then_allow_next();
          waited = true;
        }
        if (!row_seen) {
          if (!row_copied_at_start && warp == 0 && lane == 0) {
            mbar_expect_tx(row_bar, static_cast<uint32_t>(2 * k));
            bulk_load(row_smem, a, static_cast<uint32_t>(2 * k), row_bar);
          }
          mbar_wait(row_bar, 0);
          if constexpr (kQuantRows) quantize_rows();
          if constexpr (kTokenQuant) quantize_token_rows();
          row_seen = true;
        }
      };
      // (kQuantRows: the piece's expert place's quantized row, row 1 + q - quant_place0 of the resident rows)
      int row_index = kQuantRows ? 1 + static_cast<int>(row_base) - quant_place0 : 0;
      if constexpr (kTokenRows) {  // (kTokenRows: the token of the piece's pair of tile row lane % 8)
        unsigned m = piece_pairs;
        for (int r = lane & 7; r > 0; --r) m &= m - 1u;
        row_index = piece_pairs != 0u ? (__ffs(m) - 1) / rt.route.top_k : (lane & 7);
        // (kTokenQuant: that token's row quantized for the piece's expert: in place, or for the range's second
        // expert of a token the first has too, row T + t; quantize_token_rows)
        if constexpr (kTokenQuant) {
          const bool second_place = cur.first / n_pieces != quant_place0;
          if (second_place && ((quant_tokens0 >> row_index) & 1u) != 0u) row_index += rt.route.tokens;
        }
      }
      const uint32_t row_base_smem = row_smem + static_cast<uint32_t>(row_index * p.k_tiles * 128);
      const uint32_t tok = row_lane ? row_base_smem + 16 * (lane >> 3) : row_zero;
      ws_piece_k_loop_resident_row<DEPTH, SPW, BPW>(p, ring, lane, g, t, tok, row_lane ? 128u : 0u, wunit, slice0,
                                                    row_ready, after_prologue, acc);
    } else if constexpr (!UNROLLED) {
      if (!ws_piece_k_loop_rolled<DEPTH, SPW, BPW>(k, p, ring, lane, g, t, ldsm_off, wunit, slice0, split, waited,
                                                   token_rows, after_prologue, speculation_holds, acc))
        return false;
    } else {
      if (!ws_piece_k_loop_unrolled<DEPTH, SPW, BPW>(k, p, ring, lane, g, t, ldsm_off, wunit, slice0, split, waited,
                                                     token_rows, after_prologue, speculation_holds, acc))
        return false;
    }
    cp_async_wait<0>();  // the empty groups past K (nothing in flight into a slot the next piece reuses)
    if constexpr (BPW == 1) {
      // Block 1's accumulators (acc[sj][0] of the second warp) to the first warp's acc[sj][1]. One named barrier
      // (1 + walker, the pair's 64 threads) per piece; two buffers by piece parity, so the write of piece i + 2
      // (after barrier i + 1) cannot overtake the read of piece i (before the reader reaches barrier i + 1).
      const uint32_t hand = smem_u32(ws_smem) + static_cast<uint32_t>(Tr::kHandoffOffset) +
                            static_cast<uint32_t>(((walker * 2 + (pieces_run & 1)) * 32 + lane) * SPW * 16);
      ++pieces_run;
      if (blk == 1) {
#pragma unroll
        for (int sj = 0; sj < SPW; ++sj)
          sts128(hand + sj * 16, __float_as_int(acc[sj][0][0]), __float_as_int(acc[sj][0][1]),
                 __float_as_int(acc[sj][0][2]), __float_as_int(acc[sj][0][3]));
        named_bar_sync(1 + walker, 64);
        return true;
      }
      named_bar_sync(1 + walker, 64);
#pragma unroll
      for (int sj = 0; sj < SPW; ++sj) {
        const uint4 v = lds128(hand + sj * 16);
        acc[sj][1][0] = __int_as_float(static_cast<int>(v.x));
        acc[sj][1][1] = __int_as_float(static_cast<int>(v.y));
        acc[sj][1][2] = __int_as_float(static_cast<int>(v.z));
        acc[sj][1][3] = __int_as_float(static_cast<int>(v.w));
      }
    }

    // ---------------------------------------------------------------- epilogue (the tile kernels' arithmetic)
    // acc[sj][b][i]: weight row 16 slice + g + 8 ((i >> 1) & 1) of block b, slice = slice0 + sj, token
    // row_base + 2t + (i & 1).
#pragma unroll
    for (int sj = 0; sj < SPW; ++sj) {
      const int slice = slice0 + sj;
      const float (&acc_s)[2][4] = acc[sj];
      if constexpr (EPI == Epilogue::kF32) {
        float* out = static_cast<float*>(p.out);
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = unit * 128 + b * 64 + 16 * slice + g + 8 * ((i >> 1) & 1);
            const int tok = 2 * t + (i & 1);
            if (tok < tile_rows && col < p.n_out) out[(row_base + tok) * p.n_out + col] = acc_s[b][i] * al0;
          }
      } else {
        uint16_t* out = static_cast<uint16_t*>(p.out);
        // Quantization groups of this thread (16 output columns of one token): q -> block b = q / 2 (relu^2; SwiGLU
        // has one output block), token 2t + q % 2, rows r0 (i = q % 2) and r0 + 8 (i + 2).
        constexpr int kGroups = EPI == Epilogue::kSwiGLU ? 2 : 4;
        float v[kGroups][2];
        if constexpr (EPI == Epilogue::kSwiGLU) {  // the 4 silus of a lane at once (swiglu_values_batched)
          swiglu_groups<kGroups, true>(
              [&](int q, int h, float& gate, float& up) {
                gate = acc_s[0][(q & 1) + 2 * h];
                up = acc_s[1][(q & 1) + 2 * h];
              },
              al0, al1, v);
        } else {
#pragma unroll
          for (int q = 0; q < kGroups; ++q)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              v[q][h] = activation_value<EPI>(acc_s[q >> 1][(q & 1) + 2 * h], 0.0f, al0, al1);
        }
        uint16_t o[kGroups][2];
        output_bits<kGroups>(v, p.gs != nullptr, gsv, o);
#pragma unroll
        for (int q = 0; q < kGroups; ++q) {
          const int tok = 2 * t + (q & 1);
          const int colb = (EPI == Epilogue::kSwiGLU ? unit * 64 : unit * 128 + (q >> 1) * 64) + 16 * slice + g;
          if (tok < tile_rows) {  // (the tile kernels' stores: each column inside n_out)
            if (colb < p.n_out) out[(row_base + tok) * p.n_out + colb] = o[q][0];
            if (colb + 8 < p.n_out) out[(row_base + tok) * p.n_out + colb + 8] = o[q][1];
          }
        }
      }
    }  // slices of the piece
    return true;
  };

  TileCursor<kWsTokens> cur;
  int idx = kContiguous ? piece_begin + walker : walker * static_cast<int>(gridDim.x) + static_cast<int>(blockIdx.x);
  if constexpr (ROWS != WsRows::kGathered) {
    // Row r of a, zero-filled past the tile's rows (src-size 0 from the tile's first row). (kBroadcast reads its
    // resident row instead: run_piece never calls this there.)
    auto rows_of = [&](const int64_t row_base, const int tile_rows) {
      WsTokenRows tr;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (lane >> 3) + 4 * h;
        tr.ok[h] = r < tile_rows;
        tr.row[h] = a + (row_base + (tr.ok[h] ? r : 0)) * static_cast<int64_t>(k);
      }
      tr.any = a;
      return tr;
    };
    auto nothing = [] {};
    if constexpr (kSpeculates) {
      // A warp whose guess was wrong (run_piece false, or the wait of a warp that found no piece under it) runs
      // again from its first piece with the confirmed ids. A piece chosen before the wait is split (its weights
      // before the wait, in the unrolled form too).
      const int idx0 = idx;
      for (;;) {
        bool again = false;
        for (; next_piece(cur, idx); idx += stride) {
          if (!run_piece(cur, idx, rows_of, !waited, nothing)) {
            again = true;
            break;
          }
        }
        if (!again && !waited) {
          kernels::pdl_wait_then_allow_next();
          waited = true;
          again = !speculation_holds();
        }
        if (!again) break;
        idx = idx0;
      }
    } else {
      for (; next_piece(cur, idx); idx += stride) run_piece(cur, idx, rows_of, false, nothing);
      if constexpr (kContiguous) {  // a warp without a piece quantizes its share too (quantize_rows), then exits
        if (!row_seen && piece_end > piece_begin) {
          mbar_wait(row_bar, 0);
          if constexpr (kQuantRows) quantize_rows();
          else quantize_token_rows();
          row_seen = true;
        }
      }
    }
  } else {
    // offsets[gather_perm_experts]: the rows past it are the appended shared expert's (none without a permutation)
    const int perm_rows = p.gather_perm != nullptr ? __ldg(p.offsets + p.gather_perm_experts) : 0;
    bool found = cur.template seek<kWsExpertsPerLane, true>(p, n_pieces, idx);
    int entry[2] = {0, 0};  // the current piece's permutation entries (loaded during the previous piece)
    bool entries_known = false;
    while (found) {
      TileCursor<kWsTokens> next = cur;
      const int next_idx = idx + stride;
      bool next_found = false;
      int next_entry[2] = {0, 0};
      auto rows_of = [&](const int64_t row_base, const int tile_rows) {
        if (!entries_known) ws_gathered_perm_entries(p, perm_rows, row_base, tile_rows, lane, entry);
        return ws_gathered_token_rows(p, perm_rows, row_base, tile_rows, lane, entry);
      };
      // The next piece's seek and entries, while this piece's first k-tiles stream in.
      auto look_ahead = [&] {
        next_found = next.template seek<kWsExpertsPerLane, true>(p, n_pieces, next_idx);
        if (next_found) {
          int64_t row_base;
          int tile_rows;
          piece_rows(next, next_idx, row_base, tile_rows);
          ws_gathered_perm_entries(p, perm_rows, row_base, tile_rows, lane, next_entry);
        }
      };
      run_piece(cur, idx, rows_of, !entries_known, look_ahead);
      cur = next;
      idx = next_idx;
      found = next_found;
      entry[0] = next_entry[0];
      entry[1] = next_entry[1];
      entries_known = true;
    }
  }
  // With before_wait, a warp waits in its first piece, so a launch without any piece (e.g. caller ids that route
  // no token to this rank's experts) would complete without ever waiting, possibly before the previous kernel:
  // the next kernel's wait, and the chain of waits behind it, would then not cover the previous one. One waiting
  // warp in the grid is enough for the launch's completion to follow the previous kernel's; warp 0 of block 0
  // runs piece 0, so it has waited whenever any piece exists and this costs nothing then.
  if (!waited && blockIdx.x == 0 && warp == 0) kernels::pdl_wait_then_allow_next();
  // A row copied at the start into a CTA none of whose warps had a piece: warp 0 waits for it before the CTA's
  // shared memory is released.
  if constexpr (kResidentRow) {
    if (row_copied_at_start && warp == 0 && !row_seen) mbar_wait(row_bar, 0);
  }
}

}  // namespace nvfp4moe::cuda::sm90
