// The mixed last pass of the register-A prefill tiles (Sm90GemmArgs::mixed_last_pass; docs/gemm.md, "The mixed
// last pass"): which unit and token rows a tile index of an expert covers. Host and device:
// tests/cuda_host/test_sm90_mixed_last_pass.cpp checks on the CPU that the mixed tiles cover every (unit, token row)
// of an expert exactly once, as the plain tiles do.
//
// The plain tile kernel gives an expert of `rows` rows ttiles = ceil(rows / BT) token tiles for each of its
// n_ctiles unit pairs, tile index local = n_idx * ttiles + t_idx: units 2 n_idx and 2 n_idx + 1 (one a consumer
// warpgroup) over token rows [t_idx BT, t_idx BT + BT). A last token tile of at most kMixedTailRows rows is a whole
// pass over the unit pair's weights for a few wgmma columns (its dequantization alone on the schedulers). With the
// mixed last pass such an expert's last two token tiles of unit pair n_idx (t_idx = ttiles - 2, ttiles - 1) become
// two tiles of one unit each (units 2 n_idx and 2 n_idx + 1): both warpgroups dequantize that unit's weights from
// the stage, the first over the full token tile's BT rows (ttiles - 2), the second over the narrow one's rows
// (ttiles - 1), which the producer loads into the weight stage's unused second slot. The tile count and order are
// the plain ones, so the cursor and the dynamic schedule are unchanged; every accumulator sums the same k16 steps in
// the same order, so the bits are the plain tiles'.
#pragma once

#include "format/nvfp4.h"  // NVFP4_HD

namespace nvfp4moe::cuda::sm90 {

// The narrow token tile's largest row count, and where its rows sit in a weight stage: past the first unit slot's
// 4608 bytes, 1024-byte aligned for the 128-byte swizzle (a weight stage is two unit slots, 9216 bytes, on a
// 1024-byte aligned base), 32 rows x 128 bytes to the stage's end.
inline constexpr int kMixedTailRows = 32;
inline constexpr int kMixedTailOffset = 5120;

// Whether token tile t_idx of an expert with `rows` rows (ttiles token tiles of BT) is one of its mixed last two.
NVFP4_HD bool mixed_last_pass_tile(int block_t, int rows, int ttiles, int t_idx) {
  return ttiles >= 2 && rows - (ttiles - 1) * block_t <= kMixedTailRows && t_idx >= ttiles - 2;
}

// Consumer warpgroup `slot` (0 or 1) of the tile at (n_idx, t_idx): its unit, its first token row within the expert,
// the stage's weight slot it reads and whether it reads the narrow rows from the weight stage. Plain tiles: unit
// 2 n_idx + slot, row t_idx BT, weight slot `slot`. Arithmetic on the mixed flag, no branch: the kernel's consumers
// use it, and a branch on a value derived from threadIdx in their path made ptxas serialize their wgmmas (C7520).
struct MixedTilePlace {
  int unit;
  int tok0;
  int weight_slot;
  int tail;   // 1: the token rows in the weight stage (the mixed tile's second warpgroup)
  int mixed;  // 1: a mixed tile (mixed_last_pass_tile)
};
NVFP4_HD MixedTilePlace mixed_tile_place(int block_t, int rows, int n_idx, int t_idx, int slot) {
  const int ttiles = (rows + block_t - 1) / block_t;
  const int m = mixed_last_pass_tile(block_t, rows, ttiles, t_idx) ? 1 : 0;
  return {2 * n_idx + m * (t_idx - (ttiles - 2)) + (1 - m) * slot, (m * (ttiles - 2 - t_idx + slot) + t_idx) * block_t,
          (1 - m) * slot, m * slot, m};
}

}  // namespace nvfp4moe::cuda::sm90
