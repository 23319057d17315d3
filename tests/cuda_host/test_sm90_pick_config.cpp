// The sm90 GEMM's tile heuristic (host code of the CUDA backend; runs without a GPU, so in CI): it always
// returns a configuration of the one explicit list, the smallest token tile that holds the expected rows of an
// expert, and the number of consumer warpgroups from the measured cases (docs/gemm.md, docs/benchmarks.md).
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/sm90_nvfp4_grouped_gemm.h"

namespace nvfp4moe::cuda {
namespace {

bool listed(const Sm90GemmConfig& c) {
  for (const auto& l : sm90_gemm_configs())
    if (l.block_t == c.block_t && l.stages == c.stages && l.consumer_warpgroups == c.consumer_warpgroups) return true;
  return false;
}

constexpr int kSms = 132;
constexpr int kDeepseekGemm1Units = 32;  // 2I = 4096 gated: 64 gate + 64 up rows per unit
constexpr int kDeepseekGemm2Units = 56;  // H = 7168: 128 rows per unit

TEST(Sm90PickConfig, AlwaysFromTheListAndTheTileHoldsTheRows) {
  for (int64_t rows : {0, 1, 8, 128, 256, 1792, 4096, 4224, 7936, 16384, 32768, 1048576})
    for (int64_t experts : {1, 8, 128, 256})
      for (int units : {0, 12, 32, 56})
        for (int sms : {0, kSms}) {
          const Sm90GemmConfig c = sm90_pick_config(Sm90GemmLoad{rows, experts, units, sms});
          EXPECT_TRUE(listed(c)) << rows << " rows, E " << experts;
          const double rpe = static_cast<double>(rows) / static_cast<double>(experts);
          if (rpe <= 128) EXPECT_GE(c.block_t, rpe) << rows << " rows, E " << experts;
          else EXPECT_EQ(c.block_t, 128);
        }
}

TEST(Sm90PickConfig, RoutedDecodeAndPrefill) {
  // deepseek-v3 T = 1 (8 rows on 256 experts): the 2-warpgroup tile, twice the CTA tiles (85 vs 123 us).
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{8, 256, kDeepseekGemm1Units, kSms}).consumer_warpgroups, 2);
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{8, 256, kDeepseekGemm2Units, kSms}).consumer_warpgroups, 2);
  // 1 row per expert on all of them: the 4-warpgroup tile (2.69 vs 2.52 TB/s), many waves of tiles.
  const Sm90GemmConfig one = sm90_pick_config(Sm90GemmLoad{256, 256, kDeepseekGemm1Units, kSms});
  EXPECT_EQ(one.block_t, 16);
  EXPECT_EQ(one.consumer_warpgroups, 4);
  // Unknown units / SMs: the list rule alone (as before the wave rule existed).
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{256, 256, 0, 0}).consumer_warpgroups, 4);
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{8, 256, 0, 0}).consumer_warpgroups, 2);
  // Prefill: the 128-row tile.
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{4096 * 8, 256, kDeepseekGemm1Units, kSms}).block_t, 128);
}

TEST(Sm90PickConfig, SharedExpertUnderOneWaveTakesTheMostCtaTiles) {
  // The shared expert at T = 1: one expert, one row. The list rule says wg4 (8 CTA tiles for GEMM1 on 132 SMs);
  // the wave rule takes the 2-warpgroup tile of the same token tile (16 CTA tiles).
  const Sm90GemmConfig g1 = sm90_pick_config(Sm90GemmLoad{1, 1, kDeepseekGemm1Units, kSms});
  EXPECT_EQ(g1.block_t, 16);
  EXPECT_EQ(g1.consumer_warpgroups, 2);
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{16, 1, kDeepseekGemm2Units, kSms}).consumer_warpgroups, 2);
  // Enough tiles for a wave: unchanged (qwen3-30b T = 16: 128 rows on 128 experts, 12 units -> 384 wg4 tiles).
  EXPECT_EQ(sm90_pick_config(Sm90GemmLoad{128, 128, 12, kSms}).consumer_warpgroups, 4);
}

}  // namespace
}  // namespace nvfp4moe::cuda
