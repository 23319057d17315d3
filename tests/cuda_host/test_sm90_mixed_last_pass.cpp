// The mixed last pass's tile decode (src/cuda/sm90_mixed_last_pass.h), host side: for the prefill tiles (BT = 128,
// 144) and every expert size up to a few passes, the mixed tiles cover every (unit, token row) of the expert exactly
// once, as the plain tiles do; a mixed tile's two warpgroups share one unit (the weights the producer loads into
// slot 0), the second one's rows start BT after the first's (where the producer loads the narrow rows) and number at
// most kMixedTailRows; and only an expert's last two token tiles of a unit pair change.
#include <gtest/gtest.h>

#include <vector>

#include "cuda/sm90_mixed_last_pass.h"

namespace nvfp4moe::cuda::sm90 {
namespace {

TEST(MixedLastPass, TilesCoverEveryUnitAndRowOnce) {
  int mixed_experts = 0;
  for (int bt : {128, 144})
    for (int units : {1, 2, 3, 4, 7, 32, 56})
      for (int rows = 1; rows <= 5 * bt + 40; ++rows) {
        SCOPED_TRACE(::testing::Message() << "BT=" << bt << " units=" << units << " rows=" << rows);
        const int ttiles = (rows + bt - 1) / bt, n_ctiles = (units + 1) / 2;
        std::vector<int> covered(static_cast<size_t>(units) * rows, 0);
        bool any_mixed = false;
        for (int local = 0; local < n_ctiles * ttiles; ++local) {
          const int n_idx = local / ttiles, t_idx = local - n_idx * ttiles;
          const MixedTilePlace p0 = mixed_tile_place(bt, rows, n_idx, t_idx, 0);
          const MixedTilePlace p1 = mixed_tile_place(bt, rows, n_idx, t_idx, 1);
          const bool mixed = mixed_last_pass_tile(bt, rows, ttiles, t_idx);
          any_mixed |= mixed;
          ASSERT_EQ(p0.mixed, mixed ? 1 : 0);
          ASSERT_EQ(p1.mixed, mixed ? 1 : 0);
          ASSERT_EQ(p0.tail, 0);
          ASSERT_EQ(p1.tail, mixed ? 1 : 0);
          if (mixed) {
            ASSERT_GE(t_idx, ttiles - 2);
            ASSERT_EQ(p0.unit, p1.unit);              // one unit's weights, in slot 0
            ASSERT_EQ(p0.weight_slot, 0);
            ASSERT_EQ(p1.weight_slot, 0);
            ASSERT_EQ(p1.tok0, p0.tok0 + bt);         // the narrow rows the producer loads at row0 + BT
            ASSERT_EQ(p0.tok0, (ttiles - 2) * bt);    // the full token tile the A stage holds
            ASSERT_LE(rows - p1.tok0, kMixedTailRows);
            ASSERT_GT(rows - p1.tok0, 0);
          } else {
            ASSERT_EQ(p0.unit, 2 * n_idx);
            ASSERT_EQ(p1.unit, 2 * n_idx + 1);
            ASSERT_EQ(p0.tok0, t_idx * bt);
            ASSERT_EQ(p1.tok0, t_idx * bt);
            ASSERT_EQ(p0.weight_slot, 0);
            ASSERT_EQ(p1.weight_slot, 1);
          }
          for (const MixedTilePlace& p : {p0, p1}) {
            if (p.unit >= units) continue;  // a warpgroup past the last unit computes a copy and stores nothing
            for (int r = p.tok0; r < rows && r < p.tok0 + bt; ++r) ++covered[static_cast<size_t>(p.unit) * rows + r];
          }
        }
        for (size_t i = 0; i < covered.size(); ++i)
          ASSERT_EQ(covered[i], 1) << "unit " << i / rows << " row " << i % rows;
        const int last = rows - (ttiles - 1) * bt;
        ASSERT_EQ(any_mixed, ttiles >= 2 && last <= kMixedTailRows);
        mixed_experts += any_mixed ? 1 : 0;
      }
  EXPECT_EQ(mixed_experts, 2 * 7 * 5 * 32);  // per (BT, units): rows k BT + 1 .. k BT + 32, k = 1..5
}

TEST(MixedLastPass, TailFitsTheWeightStagesSecondSlot) {
  // The narrow rows (128-byte rows, 128B swizzle: 1024-byte aligned) end at the weight stage's end, past slot 0.
  constexpr int kUnitBytes = 4608, kStageWeightBytes = 2 * kUnitBytes;
  static_assert(kMixedTailOffset % 1024 == 0);
  static_assert(kMixedTailOffset >= kUnitBytes);
  static_assert(kMixedTailOffset + kMixedTailRows * 128 <= kStageWeightBytes);
  static_assert(kStageWeightBytes % 1024 == 0);
  SUCCEED();
}

}  // namespace
}  // namespace nvfp4moe::cuda::sm90
