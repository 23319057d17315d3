// The sm90 GEMM's tile heuristic (host code of the CUDA backend; runs without a GPU, so in CI): it always
// returns a configuration of the one explicit list, the smallest token tile that holds the expected rows of an
// expert, and the number of consumer warpgroups from the measured cases (docs/gemm.md, docs/benchmarks.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cuda/cuda_layer.h"
#include "cuda/sm90_nvfp4_grouped_gemm.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cuda {
namespace {

bool listed(const Sm90GemmConfig& c) {
  for (const auto& l : sm90_gemm_configs())
    if (l.block_t == c.block_t && l.stages == c.stages && l.consumer_warpgroups == c.consumer_warpgroups &&
        l.warpgroups_per_unit == c.warpgroups_per_unit)
      return true;
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
          EXPECT_FALSE(sm90_opt_in_config(c)) << rows << " rows, E " << experts << ": " << to_string(c);
          const double rpe = static_cast<double>(rows) / static_cast<double>(experts);
          if (rpe <= 128) EXPECT_GE(c.block_t, rpe) << rows << " rows, E " << experts;
          else EXPECT_TRUE(c.block_t == 128 || c.block_t == 144) << rows << " rows, E " << experts;
        }
}

TEST(Sm90PickConfig, RoutedDecodeAndPrefill) {
  // deepseek-v3 T = 1 (8 rows on 256 experts): GEMM1 the 2-warpgroup tile, twice the CTA tiles (85 vs 123 us),
  // 128 of them in one wave; GEMM2 (56 units) would be 224 wg2 tiles = 2 waves: wg4, 112 tiles in one.
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, kDeepseekGemm1Units, kSms}).consumer_warpgroups, 2);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, kDeepseekGemm2Units, kSms}).consumer_warpgroups, 4);
  // 1 row per expert on all of them: the 4-warpgroup tile (2.69 vs 2.52 TB/s), many waves of tiles.
  const Sm90GemmConfig one = sm90_pick_tile_config(Sm90GemmLoad{256, 256, kDeepseekGemm1Units, kSms});
  EXPECT_EQ(one.block_t, 16);
  EXPECT_EQ(one.consumer_warpgroups, 4);
  // Unknown units / SMs: the list rule alone (as before the wave rule existed).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{256, 256, 0, 0}).consumer_warpgroups, 4);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, 0, 0}).consumer_warpgroups, 2);
  // Prefill: bt144 where the rows scatter around a multiple of 128 (T k / E = 128 +- 11: 1.08 expected weight
  // passes instead of 1.5; 256 +- 16: 2.02 instead of 2.5), bt128 where it saves no pass (192: 2 either way) or
  // under 15% of them (512: 4.5 -> 4.0; 1024: 8.5 -> 7.7), as measured (bench/results/fc6bb15-prefill-tile-ab/).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 256, kDeepseekGemm1Units, kSms}).block_t, 144);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 128, 24, kSms}).block_t, 144);      // 256 rows
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 6, 128, 15, kSms}).block_t, 128);      // 192 rows
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{16384 * 8, 256, kDeepseekGemm1Units, kSms}).block_t, 128);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{16384 * 8, 128, 12, kSms}).block_t, 128);    // 1024 rows
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 256, 0, 0}).block_t, 144);          // the list rule too
  // A quantizing GEMM1 (w4a4) keeps bt128 (its epilogue at BT = 144 measured slower: protocol run 8d09971).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 128, 12, kSms, true}).block_t, 128);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 256, kDeepseekGemm1Units, kSms, true}).block_t, 128);
  // One expert (the shared expert's launch) has exactly its rows: 4096 rows = 32 passes of 128, 29 of 144 (9%).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096, 1, 15, kSms}).block_t, 128);
}

// Where T k / E lands on a small tile's size, the tile one size up (bt16 -> bt32 at 16 rows, bt32 -> bt64 at 32),
// measured faster (bench/results/fc6bb15-tile-size-ab/); not at 12 rows (11% of the passes saved) nor from bt64
// to the prefill tile at 64.
TEST(Sm90PickConfig, SmallTileOneUpWhereTheMeanSitsOnItsSize) {
  auto bt = [](int64_t rows, int64_t experts, int units) {
    return sm90_pick_tile_config(Sm90GemmLoad{rows, experts, units, kSms}).block_t;
  };
  EXPECT_EQ(bt(256 * 8, 128, 12), 32);   // qwen3-30b T = 256: 16 rows per expert
  EXPECT_EQ(bt(512 * 8, 128, 12), 64);   // T = 512: 32
  EXPECT_EQ(bt(1024 * 8, 128, 12), 64);  // T = 1024: 64, stays
  EXPECT_EQ(bt(256 * 6, 128, 15), 16);   // nemotron-nano T = 256: 12 rows, stays
  EXPECT_EQ(bt(128 * 8, 128, 12), 16);   // 8 rows
  EXPECT_EQ(bt(256 * 8, 128, 0), 32);    // the list rule alike (no units)
  // The shared expert's own launch (one expert, exactly T rows): no spread, no move (nemotron-nano T = 16 took
  // bt32 for it at 8d09971 and lost 7.6% against bt16).
  EXPECT_EQ(bt(16, 1, 15), 16);
  EXPECT_EQ(bt(32, 1, 15), 32);
  EXPECT_EQ(bt(0, 128, 12), 16);  // no rows: nothing to save, no move
  EXPECT_EQ(bt(0, 1, 12), 16);
}

TEST(Sm90PickConfig, ExpectedTilePasses) {
  EXPECT_DOUBLE_EQ(sm90_expected_tile_passes(0.0, 128), 0.0);
  EXPECT_NEAR(sm90_expected_tile_passes(128.0, 128), 1.5, 0.03);   // half the experts above 128 rows
  EXPECT_NEAR(sm90_expected_tile_passes(128.0, 144), 1.08, 0.02);
  EXPECT_NEAR(sm90_expected_tile_passes(192.0, 128), 2.0, 0.01);
  EXPECT_NEAR(sm90_expected_tile_passes(192.0, 144), 2.0, 0.01);
  EXPECT_NEAR(sm90_expected_tile_passes(4.0, 16), 1.0, 0.001);
  EXPECT_NEAR(sm90_expected_tile_passes(1e6, 128), 1e6 / 128 + 0.5, 0.05);  // many passes: m / B + 1/2
  EXPECT_NEAR(sm90_expected_tile_passes(1e8, 16), 1e8 / 16 + 0.5, 0.05);
  for (double m : {10.0, 100.0, 300.0, 3000.0})
    EXPECT_LE(sm90_expected_tile_passes(m, 144), sm90_expected_tile_passes(m, 128)) << m;
}

TEST(Sm90PickConfig, SharedExpertUnderOneWaveTakesTheMostCtaTiles) {
  // The shared expert at T = 1: one expert, one row. The list rule says wg4 (8 CTA tiles for GEMM1 on 132 SMs);
  // the wave rule takes the 2-warpgroup tile of the same token tile (16 CTA tiles).
  const Sm90GemmConfig g1 = sm90_pick_tile_config(Sm90GemmLoad{1, 1, kDeepseekGemm1Units, kSms});
  EXPECT_EQ(g1.block_t, 16);
  EXPECT_EQ(g1.consumer_warpgroups, 2);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{16, 1, kDeepseekGemm2Units, kSms}).consumer_warpgroups, 2);
  // Several waves (qwen3-30b T = 16: 128 rows on 128 experts, 12 units): not the 2-warpgroup tile (768 tiles,
  // 6 waves) but wg3 (512, 4 waves) or wg4 (384, 3 waves).
  EXPECT_GE(sm90_pick_tile_config(Sm90GemmLoad{128, 128, 12, kSms}).consumer_warpgroups, 3);
}

TEST(Sm90PickConfig, NoSecondNearlyEmptyWave) {
  // deepseek-v3 T = 1 with the shared expert as expert E: 9 rows on 257 experts. GEMM1 (32 units): wg2 gives
  // 144 CTA tiles = 2 waves on 132 SMs (12 SMs run a second tile while 120 idle); wg3 gives 99 tiles, one wave.
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{9, 257, kDeepseekGemm1Units, kSms}).consumer_warpgroups, 3);
  // GEMM2 (56 units): wg2 252 tiles, wg3 171 (both 2 waves), wg4 126 (one wave).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{9, 257, kDeepseekGemm2Units, kSms}).consumer_warpgroups, 4);
  // Without the shared expert (8 rows, 256 experts): 128 wg2 tiles fit one wave, so wg2 stays.
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, kDeepseekGemm1Units, kSms}).consumer_warpgroups, 2);
  // Fewer SMs (a partitioned GPU): 128 wg2 tiles on 100 SMs are 2 waves; wg3 (88 tiles) is one.
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, kDeepseekGemm1Units, 100}).consumer_warpgroups, 3);
}

TEST(Sm90PickConfig, HalfUnitTilesOnlyWhenTheUnitsDoNotFillTheSms) {
  // qwen3-30b T = 1: 8 rows on 128 experts; GEMM1 12 units per expert (96 in all: 48 two-unit tiles on 132
  // SMs), GEMM2 16 (128: 64 tiles). One unit per tile on two warpgroups: 96 / 128 tiles, still one wave.
  for (int units : {12, 16}) {
    const Sm90GemmConfig c = sm90_pick_tile_config(Sm90GemmLoad{8, 128, units, kSms});
    EXPECT_EQ(c.block_t, 16);
    EXPECT_EQ(c.warpgroups_per_unit, 2) << units << " units";
    EXPECT_EQ(c.units_per_tile(), 1) << units << " units";
  }
  // deepseek-v3 T = 1 (256 or 288 / 504 units with the shared expert): half-unit tiles would need 2+ waves.
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{8, 256, kDeepseekGemm1Units, kSms}).warpgroups_per_unit, 1);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{9, 257, kDeepseekGemm1Units, kSms}).warpgroups_per_unit, 1);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{9, 257, kDeepseekGemm2Units, kSms}).warpgroups_per_unit, 1);
  // Many rows: never (the list rule and the prefill tile).
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 256, kDeepseekGemm1Units, kSms}).warpgroups_per_unit, 1);
  EXPECT_EQ(sm90_pick_tile_config(Sm90GemmLoad{128, 128, 12, kSms}).warpgroups_per_unit, 1);
  EXPECT_EQ(to_string(Sm90GemmConfig{16, 14, 2, 2}), "bt16_s14_wg2_half");
  EXPECT_EQ(to_string(Sm90GemmConfig{16, 9, 4, 1, true}), "bt16_s9_wg4_sync");
  EXPECT_EQ(to_string(Sm90GemmConfig{16, 14, 2, 2, true}), "bt16_s14_wg2_half_sync");
}

// The consumers' MMA (bench/results/194b639-ab/): mma.sync for whole-unit bt16 tiles with 3 or 4 warpgroups at
// <= 4 rows per expert tile, wgmma for the half-unit tiles, the one-wave wg2 tile, 5..16 rows and larger tiles.
TEST(Sm90PickConfig, SyncMmaWhereTheLayerMeasuredItFaster) {
  auto name = [](const Sm90GemmLoad& l) { return to_string(sm90_pick_tile_config(l)); };
  EXPECT_EQ(name(Sm90GemmLoad{9, 257, kDeepseekGemm1Units, kSms}), "bt16_s14_wg3_sync");  // deepseek-v3 T = 1
  EXPECT_EQ(name(Sm90GemmLoad{9, 257, kDeepseekGemm2Units, kSms}), "bt16_s9_wg4_sync");
  const Sm90GemmConfig t64 = sm90_pick_tile_config(Sm90GemmLoad{64 * 9, 257, kDeepseekGemm1Units, kSms});
  EXPECT_TRUE(t64.mma_sync) << to_string(t64);                                          // 2.2 rows per expert
  EXPECT_FALSE(sm90_pick_tile_config(Sm90GemmLoad{8, 128, 12, kSms}).mma_sync);              // qwen3-30b T = 1: half
  EXPECT_FALSE(sm90_pick_tile_config(Sm90GemmLoad{2048, 256, kDeepseekGemm1Units, kSms}).mma_sync);  // 8 rows
  EXPECT_FALSE(sm90_pick_tile_config(Sm90GemmLoad{4096 * 8, 256, kDeepseekGemm1Units, kSms}).mma_sync);
  EXPECT_FALSE(sm90_pick_tile_config(Sm90GemmLoad{8, 256, 0, 0}).mma_sync);  // list rule: no units, no SMs
  for (const auto& c : sm90_gemm_configs()) {
    if (c.mma_sync) EXPECT_EQ(c.block_t, 16) << to_string(c);
    Sm90GemmConfig twin{};
    const bool has = sm90_gemm_mma_twin(c, !c.mma_sync, &twin);
    EXPECT_EQ(has, c.block_t == 16) << to_string(c);  // every bt16 tile has both kinds, no other tile has
    if (has) EXPECT_EQ(twin.mma_sync, !c.mma_sync);
  }
}

// The chained GEMM1 -> GEMM2 launch exists for listed configs only, and the decode points the docs name as
// chained under the tile rule (qwen3-30b T = 1, 2; qwen3-235b T = 1: both GEMMs on one config with a chained
// kernel) pick such a pair, while deepseek-v3 T = 1 (GEMM1 wg3, GEMM2 wg4) does not. (sm90_pick_config takes the
// warp-streaming kernel at these points, which has no chained form; the tile pairs stay reachable through
// NVFP4MOE_SM90_CONFIG.)
TEST(Sm90PickConfig, ChainedConfigsAreListedAndTakenWhereTheDocsSay) {
  ASSERT_FALSE(sm90_chained_configs().empty());
  for (const auto& c : sm90_chained_configs()) {
    EXPECT_TRUE(listed(c)) << to_string(c);
    EXPECT_TRUE(sm90_chained_available(c)) << to_string(c);
  }
  Sm90GemmConfig prefill{};
  ASSERT_TRUE(sm90_gemm_config_by_name("bt144_s8_wg2", &prefill));
  EXPECT_FALSE(sm90_chained_available(prefill));
  struct Point { const char* name; int64_t rows, experts; int units1, units2; bool chained; };
  const Point points[] = {
      {"qwen3-30b T=1", 8, 128, 12, 16, true},     // I = 768: 12 gated units; H = 2048: 16 units
      {"qwen3-30b T=2", 16, 128, 12, 16, true},
      {"qwen3-235b T=1", 8, 128, 24, 32, true},    // I = 1536, H = 4096
      {"deepseek-v3 T=1", 9, 257, kDeepseekGemm1Units, kDeepseekGemm2Units, false},
  };
  for (const auto& pt : points) {
    const Sm90GemmConfig c1 = sm90_pick_tile_config(Sm90GemmLoad{pt.rows, pt.experts, pt.units1, kSms});
    const Sm90GemmConfig c2 = sm90_pick_tile_config(Sm90GemmLoad{pt.rows, pt.experts, pt.units2, kSms});
    const bool chainable = c1 == c2 && sm90_chained_available(c1);
    EXPECT_EQ(chainable, pt.chained) << pt.name << ": " << to_string(c1) << " / " << to_string(c2);
  }
}

// One block a warp (ws8_s6_w16_b1): GEMM1 only, K >= 40 k-tiles, where each warp pair streams at most one piece.
TEST(Sm90PickConfig, OneBlockAWarpForLongGemm1AtOnePieceAPair) {
  auto pick = [](int64_t rows, int64_t experts, int units, int k_tiles, bool gemm1) {
    return to_string(sm90_pick_config(Sm90GemmLoad{rows, experts, units, kSms, false, k_tiles, gemm1}));
  };
  EXPECT_EQ(pick(8, 128, 24, 64, true), "ws8_s6_w16_b1");   // qwen3-235b T = 1 GEMM1 (768 pieces, K = 4096)
  EXPECT_EQ(pick(4, 128, 45, 45, true), "ws8_s6_w16_b1");   // gpt-oss-120b T = 1 GEMM1 (720, K = 2880)
  EXPECT_EQ(pick(6, 128, 15, 42, true), "ws8_s6_w16_b1");   // nemotron-nano T = 1 GEMM1 (360, K = 2688)
  EXPECT_EQ(pick(8, 128, 12, 32, true), "ws8_s6_w16");      // qwen3-30b T = 1 GEMM1: K = 2048 (measured +0.1 us)
  EXPECT_EQ(pick(4, 128, 23, 45, false), "ws8_s6_w16");     // gpt-oss-120b T = 1 GEMM2: not GEMM1
  EXPECT_EQ(pick(8, 128, 34, 64, true), "ws8_s6_w16_u");    // 1088 pieces: unrolled, no pairs
  EXPECT_EQ(pick(8, 128, 32, 64, true), "ws8_s6_w16_b1");   // 1024 pieces: 2048 warps of the grid's 2112
  EXPECT_EQ(pick(32, 128, 24, 64, true), "ws8_s4_w16_x2");  // qwen3-235b T = 4: the two-slice pieces
  // The 24-warp b1 config is listed but opt-in: never picked, even where 2 x pieces exceed the 16-warp grid
  // (deepseek-v3 T = 1 GEMM1: 9 experts x 32 units x 4 = 1152 pieces, K = 7168).
  Sm90GemmConfig w24{};
  ASSERT_TRUE(sm90_gemm_config_by_name("ws8_s5_w24_b1", &w24));
  EXPECT_TRUE(sm90_opt_in_config(w24));
  EXPECT_EQ(w24.blocks_per_warp, 1);
  EXPECT_EQ(4 * w24.consumer_warpgroups, 24);
  EXPECT_EQ(pick(9, 257, 32, 112, true), "ws8_s6_w16_u");
  int opt_in = 0;
  for (const auto& c : sm90_gemm_configs()) opt_in += sm90_opt_in_config(c) ? 1 : 0;
  EXPECT_EQ(opt_in, 1);
  const Sm90ConfigOverride o = parse_sm90_config_override("gemm1=ws8_s5_w24_b1");
  EXPECT_TRUE(o.gemm1_set && o.gemm1 == w24);
}

// The warp-streaming decode kernel: taken at <= 2 rows per active expert with units and SMs known (measured
// faster in the layer up to there: bench/results/5c91ef5-ws-ab/), never by the list rule, never at prefill.
TEST(Sm90PickConfig, WarpStreamingAtDecodeOnly) {
  auto pick = [](int64_t rows, int64_t experts, int units, int sms = kSms) {
    return to_string(sm90_pick_config(Sm90GemmLoad{rows, experts, units, sms}));
  };
  struct Case {
    int64_t rows, experts;
    int units;
    const char* why;
  };
  // One slice per piece: few rows per expert and too few two-slice pieces (active experts x units x 2 < 8 per SM);
  // the rolled k-loop where the one-slice pieces (x 4) are < 8 per SM (each warp streams alone), else unrolled.
  for (const Case& c : {Case{8, 128, 12, "qwen3-30b T=1 GEMM1 (384 pieces)"}, {8, 128, 16, "qwen3-30b T=1 GEMM2"},
                        Case{8, 128, 24, "qwen3-235b T=1 GEMM1 (768)"}, {4, 128, 45, "gpt-oss-120b T=1 GEMM1 (720)"},
                        Case{1, 1, 56, "the shared expert at T=1"}, {2, 1, 12, "two rows of one expert"}})
    EXPECT_EQ(pick(c.rows, c.experts, c.units), "ws8_s6_w16") << c.why;
  for (const Case& c : {Case{32, 128, 12, "qwen3-30b T=4 GEMM1 (768 x2 pieces, 1536)"},
                        Case{32, 128, 16, "qwen3-30b T=4 GEMM2 (1024 x2 pieces)"},
                        Case{24, 128, 15, "nemotron-nano T=4 GEMM1 (720 x2 pieces)"},
                        Case{9, 257, 32, "deepseek-v3 T=1 GEMM1 (1152 pieces)"},
                        Case{8, 256, 56, "deepseek-v3 T=1 GEMM2 (896 x2 pieces)"}})
    EXPECT_EQ(pick(c.rows, c.experts, c.units), "ws8_s6_w16_u") << c.why;
  EXPECT_EQ(pick(11, 128, 12), "ws8_s6_w16");    // 528 pieces: < 8 per SM
  EXPECT_EQ(pick(22, 128, 12), "ws8_s6_w16_u");  // 1056: the bound itself
  // Two slices per piece: <= 4 rows per active expert and >= 8 x2 pieces per SM.
  for (const Case& c : {Case{32, 256, 32, "deepseek-v3 T=4 GEMM1 (2048)"}, {32, 256, 56, "deepseek-v3 T=4 GEMM2"},
                        Case{32, 128, 24, "qwen3-235b T=4 GEMM1 (1536)"}, {128, 128, 12, "qwen3-30b T=16 (3072)"},
                        Case{512, 257, 32, "deepseek-v3 T=64 (2 rows)"}, {512, 128, 24, "qwen3-235b T=64 (4 rows)"},
                        Case{576, 257, 32, "2.24 rows"}})
    EXPECT_EQ(pick(c.rows, c.experts, c.units), "ws8_s4_w16_x2") << c.why;
  EXPECT_EQ(pick(44, 44, 12), "ws8_s4_w16_x2");  // 44 x 12 x 2 = 1056 = 8 x 132: the bound itself
  EXPECT_EQ(pick(43, 43, 12), "ws8_s6_w16_u");   // 1032
  EXPECT_EQ(pick(32, 128, 24, 200), "ws8_s6_w16_u");  // 1536 < 8 x 200: the bound scales with the SMs
  // The tile kernels: more than 4 rows per active expert, or 3..4 rows with too few pieces, or unknown units/SMs.
  for (const Case& c : {Case{640, 128, 24, "5 rows"}, {1024, 128, 12, "8 rows"}, {2304, 257, 32, "9 rows"},
                        Case{4096 * 8, 256, 32, "prefill"}, {3, 1, 12, "3 rows of one expert, 24 x2 pieces"},
                        Case{64, 1, 12, "64 rows of one expert"}}) {
    const Sm90GemmConfig cfg = sm90_pick_config(Sm90GemmLoad{c.rows, c.experts, c.units, kSms});
    EXPECT_FALSE(cfg.warp_stream) << c.why << ": " << to_string(cfg);
  }
  EXPECT_FALSE(sm90_pick_config(Sm90GemmLoad{8, 128, 0, 0}).warp_stream);  // list rule
  EXPECT_FALSE(sm90_pick_config(Sm90GemmLoad{8, 128, 12, 0}).warp_stream);
  int listed_ws = 0;
  for (const auto& c : sm90_gemm_configs()) {
    if (!c.warp_stream) continue;
    ++listed_ws;
    EXPECT_EQ(c.block_t, 8) << to_string(c);
    EXPECT_FALSE(sm90_chained_available(c)) << to_string(c);
    EXPECT_FALSE(sm90_gemm_mma_twin(c, true, nullptr)) << to_string(c);
  }
  EXPECT_GE(listed_ws, 3);  // (an experiment build lists more)
  // Where the tile rule's decode picks go now: the tile rule itself is unchanged (tests above).
  EXPECT_EQ(to_string(sm90_pick_tile_config(Sm90GemmLoad{8, 128, 12, kSms})), "bt16_s14_wg2_half");
}

TEST(Sm90ConfigOverride, NamesRoundTripAndTheOverrideParses) {
  for (const auto& c : sm90_gemm_configs()) {
    Sm90GemmConfig back{};
    ASSERT_TRUE(sm90_gemm_config_by_name(to_string(c), &back)) << to_string(c);
    EXPECT_EQ(to_string(back), to_string(c));
  }
  EXPECT_FALSE(sm90_gemm_config_by_name("bt16_s9_wg5", nullptr));

  const Sm90ConfigOverride none = parse_sm90_config_override("");
  EXPECT_FALSE(none.gemm1_set);
  EXPECT_FALSE(none.gemm2_set);
  const Sm90ConfigOverride both = parse_sm90_config_override("bt16_s9_wg4");
  ASSERT_TRUE(both.gemm1_set && both.gemm2_set);
  EXPECT_EQ(to_string(both.gemm1), "bt16_s9_wg4");
  EXPECT_EQ(to_string(both.gemm2), "bt16_s9_wg4");
  const Sm90ConfigOverride second = parse_sm90_config_override("gemm2=bt16_s14_wg3");
  EXPECT_FALSE(second.gemm1_set);
  ASSERT_TRUE(second.gemm2_set);
  EXPECT_EQ(to_string(second.gemm2), "bt16_s14_wg3");
  const Sm90ConfigOverride each = parse_sm90_config_override("gemm1=bt32_s12_wg3,gemm2=bt144_s8_wg2");
  ASSERT_TRUE(each.gemm1_set && each.gemm2_set);
  EXPECT_EQ(to_string(each.gemm1), "bt32_s12_wg3");
  EXPECT_EQ(to_string(each.gemm2), "bt144_s8_wg2");
  const Sm90ConfigOverride sync = parse_sm90_config_override("mma=sync");
  EXPECT_FALSE(sync.gemm1_set || sync.gemm2_set);
  EXPECT_EQ(sync.mma_sync, 1);
  const Sm90ConfigOverride mixed = parse_sm90_config_override("gemm1=bt16_s9_wg4_sync,mma=wgmma");
  ASSERT_TRUE(mixed.gemm1_set);
  EXPECT_FALSE(mixed.gemm2_set);
  EXPECT_TRUE(mixed.gemm1.mma_sync);
  EXPECT_EQ(mixed.mma_sync, 0);
  EXPECT_EQ(parse_sm90_config_override("").mma_sync, -1);
}

// The longest broadcast row each config keeps in shared memory (Sm90GemmArgs::a_broadcast_row; host code, matched
// to the config through the same list entry as the launch): what is left of sm_90's 232448 bytes a block after the
// weight-only rings (16 warps x 6 slots x 1152 bytes, or 640 with one block a warp plus its 8 KB handoff), the
// mbarrier and the zero bytes (144), in whole k-tiles of 128 bytes. Tile configs keep none.
TEST(Sm90BroadcastRow, MaxKIsWhatTheRingsLeaveOfABlock) {
  int warp_stream = 0;
  for (const auto& c : sm90_gemm_configs()) {
    const int max_k = sm90_broadcast_row_max_k(c);
    if (!c.warp_stream) {
      EXPECT_EQ(max_k, 0) << to_string(c);
      continue;
    }
    ++warp_stream;
    EXPECT_GE(max_k, 7168) << to_string(c) << ": every preset's hidden size must fit";
    EXPECT_EQ(max_k % 64, 0) << to_string(c);
  }
  EXPECT_GE(warp_stream, 1);
  Sm90GemmConfig c;
  ASSERT_TRUE(sm90_gemm_config_by_name("ws8_s6_w16", &c));
  EXPECT_EQ(sm90_broadcast_row_max_k(c), (232448 - (16 * 6 * 1152 + 144)) / 128 * 64);
  ASSERT_TRUE(sm90_gemm_config_by_name("ws8_s6_w16_b1", &c));
  EXPECT_EQ(sm90_broadcast_row_max_k(c), (232448 - (16 * 6 * 640 + 8192 + 144)) / 128 * 64);
}

// Each bad value makes parse throw an ArgumentError whose message quotes the value and names each of `names`.
template <class Parse>
void expect_refused(Parse parse, const std::vector<std::string>& bads, const std::vector<std::string>& names) {
  for (const std::string& bad : bads) {
    try {
      parse(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ArgumentError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + bad + "'"), std::string::npos) << what;
      for (const std::string& n : names) EXPECT_NE(what.find(n), std::string::npos) << what;
    }
  }
}

TEST(Sm90ConfigOverride, BadValuesAreRefusedNamingTheChoices) {
  expect_refused(parse_sm90_config_override,
                 {"bt16", "gemm3=bt16_s9_wg4", "gemm1=bt16_s9_wg4,gemm1=bt16_s14_wg2", "gemm1=", "gemm1=bt16_s9_wg4,",
                  "gemm1=bt16_s9_wg4;gemm2=bt16_s9_wg4", "mma=fast", "mma=sync,mma=sync"},
                 {"NVFP4MOE_SM90_CONFIG", "bt16_s9_wg4"});  // (the accepted names are listed)
}

TEST(ConsumerStagger, TheSettingParses) {
  const ConsumerStagger none = parse_consumer_stagger("");
  EXPECT_EQ(none.gemm1, 0);
  EXPECT_EQ(none.gemm2, 0);
  const ConsumerStagger both = parse_consumer_stagger("2500");
  EXPECT_EQ(both.gemm1, 2500);
  EXPECT_EQ(both.gemm2, 2500);
  const ConsumerStagger each = parse_consumer_stagger("4000,0");
  EXPECT_EQ(each.gemm1, 4000);
  EXPECT_EQ(each.gemm2, 0);
  const ConsumerStagger edge = parse_consumer_stagger("0," + std::to_string(kSm90MaxConsumerStaggerNs));
  EXPECT_EQ(edge.gemm1, 0);
  EXPECT_EQ(edge.gemm2, kSm90MaxConsumerStaggerNs);
}

TEST(ConsumerStagger, BadValuesAreRefusedNamingTheVariableAndTheValue) {
  const std::string too_big = std::to_string(kSm90MaxConsumerStaggerNs + 1);
  expect_refused(parse_consumer_stagger,
                 {"-1", "1e3", "12,", ",12", "1,2,3", " 5", "0x10", too_big, "99999999999", "5," + too_big},
                 {"NVFP4MOE_CONSUMER_STAGGER_NS", std::to_string(kSm90MaxConsumerStaggerNs)});
}

TEST(GatherTokenMajorMinTokens, TheSettingParses) {
  EXPECT_EQ(parse_gather_token_major_min_tokens(""), kGatherTokenMajorMinTokens);
  EXPECT_EQ(parse_gather_token_major_min_tokens("1"), 1);
  EXPECT_EQ(parse_gather_token_major_min_tokens("4096"), 4096);
  EXPECT_EQ(parse_gather_token_major_min_tokens("2147483647"), 2147483647);
}

TEST(GatherTokenMajorMinTokens, BadValuesAreRefusedNamingTheVariableAndTheValue) {
  expect_refused(parse_gather_token_major_min_tokens,
                 {"0", "-1", "1e3", " 5", "0x10", "2147483648", "99999999999", "12,", "never"},
                 {"NVFP4MOE_GATHER_TOKEN_MAJOR_MIN_TOKENS", "[1, 2147483647]"});
}

TEST(BlockRouteMaxTokens, TheSettingParses) {
  EXPECT_EQ(parse_block_route_max_tokens(""), kBlockRouteMaxTokens);
  EXPECT_EQ(parse_block_route_max_tokens("0"), 0);
  EXPECT_EQ(parse_block_route_max_tokens("3"), 3);
  EXPECT_EQ(parse_block_route_max_tokens(std::to_string(kFusedRoutePlanTokens)), kFusedRoutePlanTokens);
}

// strtol's leniency (a sign, leading spaces) refused as the other settings refuse it.
TEST(BlockRouteMaxTokens, BadValuesAreRefusedNamingTheVariableAndTheValue) {
  expect_refused(parse_block_route_max_tokens,
                 {"-1", "+3", " 3", "3 ", "x", "0x4", "1e1", std::to_string(kFusedRoutePlanTokens + 1), "99999999999"},
                 {"NVFP4MOE_BLOCK_ROUTE_MAX_TOKENS", "[0, " + std::to_string(kFusedRoutePlanTokens) + "]"});
}

// The configs the T = 1 tests name: the three with routed kernels, the two-slice one and a tile config (neither
// has them).
struct T1Configs {
  Sm90GemmConfig ws, ws_u, b1, x2, tile;
};
T1Configs t1_configs() {
  T1Configs c;
  const std::pair<const char*, Sm90GemmConfig*> names[] = {{"ws8_s6_w16", &c.ws}, {"ws8_s6_w16_u", &c.ws_u},
                                                           {"ws8_s6_w16_b1", &c.b1}, {"ws8_s4_w16_x2", &c.x2},
                                                           {"bt16_s9_wg4", &c.tile}};
  for (const auto& [name, config] : names) EXPECT_TRUE(sm90_gemm_config_by_name(name, config)) << name;
  return c;
}

// A routing T = 1 GEMM1's arguments (qwen3-30b's shapes: 128 experts, top-8, N 1536, K 2048) over static host
// buffers that the launcher never dereferences: its refusals come before any device call.
void routed_gemm1_args(Sm90OneTokenRoute& rt, Sm90GemmArgs& g) {
  alignas(16) static uint16_t a[64];
  alignas(16) static uint8_t w[64];
  static int32_t ids[8], counts[128], offsets[130], perm[8], inv[8];
  static float alpha[129], weights[8], logits[128];
  rt = Sm90OneTokenRoute{};
  rt.route.logits = logits;
  rt.route.tokens = 1;
  rt.route.experts = 128;
  rt.route.top_k = 8;
  rt.route.topk_ids = ids;
  rt.route.topk_weights = weights;
  rt.plan.tokens = 1;
  rt.plan.experts = 128;
  rt.plan.top_k = 8;
  rt.plan.counts = counts;
  rt.plan.offsets = offsets;
  rt.plan.tile_offsets = offsets;
  rt.plan.perm = perm;
  rt.plan.inv = inv;
  rt.write_outputs = true;
  g = Sm90GemmArgs{};
  g.a = a;
  g.a_rows_capacity = 1;
  g.w = w;
  g.shape = sm90_prepared_shape(128, 1536, 2048, true);
  g.offsets = offsets;
  g.alpha0 = alpha;
  g.alpha1 = alpha;
  g.out = a;
  g.epilogue = Sm90GemmEpilogue::kSwiGLU;
  g.a_broadcast_row = true;
  g.one_token_route = &rt;
}

// A refusal case of a routed launch: `bend` changes the arguments, the route or the config of a valid launch;
// the launcher must refuse it before any device call with a message naming `name` and containing `expect`.
// The same GEMM1 routing T = 4 tokens (Sm90GemmArgs::a_routed_token_rows).
void token_rows_gemm1_args(Sm90OneTokenRoute& rt, Sm90GemmArgs& g) {
  routed_gemm1_args(rt, g);
  rt.route.tokens = 4;
  rt.plan.tokens = 4;
  g.a_broadcast_row = false;
  g.a_routed_token_rows = true;
  g.a_rows_capacity = 4;
}

struct RouteCase {
  const char* what;
  std::function<void(Sm90GemmArgs&, Sm90OneTokenRoute&, Sm90GemmConfig&)> bend;
  const char* expect;
};
void expect_route_refusals(const std::vector<RouteCase>& cases, const Sm90GemmArgs& g, const Sm90OneTokenRoute& rt,
                           const Sm90GemmConfig& config, const char* name) {
  for (const RouteCase& k : cases) {
    Sm90GemmArgs args = g;
    Sm90OneTokenRoute route = rt;
    Sm90GemmConfig c = config;
    args.one_token_route = &route;
    k.bend(args, route, c);
    EXPECT_EQ(sm90_nvfp4_grouped_gemm(args, c, nullptr, 132), cudaErrorInvalidValue) << k.what;
    const std::string msg = sm90_gemm_last_error_message();
    EXPECT_NE(msg.find(name), std::string::npos) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.what << ": " << msg;
  }
}

// The T = 1 routing in the warp-streaming launch (Sm90GemmArgs::one_token_route): which configs have its kernels
// (GEMM1's broadcast-row activation kernels routing; GEMM2's direct-row f32 kernels reading GEMM1's ids), what
// fits their 512-thread CTAs and ring slots, and the launcher's refusals, each by name and before any device call
// (host-only: the pointers below are never dereferenced).
TEST(Sm90OneTokenRoute, AvailabilityFitAndRefusals) {
  const T1Configs t1 = t1_configs();
  const Sm90GemmConfig &ws = t1.ws, &ws_u = t1.ws_u, &b1 = t1.b1, &x2 = t1.x2, &tile = t1.tile;
  for (const Sm90GemmConfig& c : {ws, ws_u, b1}) {
    EXPECT_TRUE(sm90_one_token_route_available(c, Sm90GemmEpilogue::kSwiGLU, true)) << to_string(c);
    EXPECT_TRUE(sm90_one_token_route_available(c, Sm90GemmEpilogue::kRelu2, true)) << to_string(c);
    EXPECT_FALSE(sm90_one_token_route_available(c, Sm90GemmEpilogue::kF32, true)) << to_string(c);
    EXPECT_FALSE(sm90_one_token_route_available(c, Sm90GemmEpilogue::kSwiGLU, false)) << to_string(c);
    EXPECT_TRUE(sm90_one_token_route_fits(c, 256, 8)) << to_string(c);  // deepseek-v3
    EXPECT_TRUE(sm90_one_token_route_fits(c, 512, 32)) << to_string(c);
    EXPECT_FALSE(sm90_one_token_route_fits(c, 513, 8)) << to_string(c);  // a thread an expert: 16 warps
    EXPECT_FALSE(sm90_one_token_route_fits(c, 128, 33)) << to_string(c);
    EXPECT_FALSE(sm90_one_token_route_fits(c, 4, 8)) << to_string(c);   // top_k > experts
  }
  EXPECT_TRUE(sm90_one_token_route_available(ws, Sm90GemmEpilogue::kF32, false));
  EXPECT_TRUE(sm90_one_token_route_available(ws_u, Sm90GemmEpilogue::kF32, false));
  EXPECT_FALSE(sm90_one_token_route_available(b1, Sm90GemmEpilogue::kF32, false));  // (GEMM2 keeps two blocks)
  EXPECT_FALSE(sm90_one_token_route_available(x2, Sm90GemmEpilogue::kSwiGLU, true));
  EXPECT_FALSE(sm90_one_token_route_available(tile, Sm90GemmEpilogue::kSwiGLU, true));
  EXPECT_FALSE(sm90_one_token_route_fits(tile, 128, 8));

  Sm90OneTokenRoute rt;
  Sm90GemmArgs g;
  routed_gemm1_args(rt, g);
  const std::vector<RouteCase> cases = {
      {"a config without routed kernels", [&](auto&, auto&, auto& c) { c = x2; }, "has no routed kernel"},
      {"read_ids with a broadcast row", [](auto&, auto& r, auto&) { r.read_ids = true; }, "read_ids with a_broadcast_row"},
      {"routing with direct rows", [](auto& a, auto&, auto&) { a.a_broadcast_row = false; a.epilogue = Sm90GemmEpilogue::kF32;
                                                             a.shape = sm90_prepared_shape(128, 2048, 768, false); },
       "routing in a direct-row launch"},
      {"the prologue before the wait with the routing",
       [](auto& a, auto&, auto&) { a.prologue_before_pdl_wait = true; }, "prologue_before_pdl_wait with the routing"},
      {"two tokens", [](auto&, auto& r, auto&) { r.route.tokens = 2; r.plan.tokens = 2; }, "route.tokens must be 1"},
      {"top_k 33", [](auto&, auto& r, auto&) { r.route.top_k = 33; }, "route.top_k"},
      {"600 experts", [](auto&, auto& r, auto&) { r.route.experts = 600; r.plan.experts = 600; }, "do not fit"},
      {"no logits", [](auto&, auto& r, auto&) { r.route.logits = nullptr; }, "route.logits is null"},
      {"the plan's experts", [](auto&, auto& r, auto&) { r.plan.experts = 64; }, "plan.experts / top_k / tokens"},
      {"the launch's experts", [](auto&, auto& r, auto&) { r.plan.append_shared = true; }, "shape.num_experts must be"},
      {"no plan outputs", [](auto&, auto& r, auto&) { r.plan.perm = nullptr; }, "write_outputs with a null"},
  };
  expect_route_refusals(cases, g, rt, ws, "one_token_route");
}

// w4a4 at T = 1: the routed GEMM1 quantizing the broadcast row per expert (Sm90GemmArgs::a_broadcast_quant_gs).
// Its rows in shared memory (the raw row and two quantized ones: a third of the plain broadcast row's K), the
// fit of each CTA's contiguous piece range within two experts (every preset on 132 SMs; too few SMs or too many
// experts of few units do not), and the launcher's refusals by name, before any device call (host-only).
TEST(Sm90BroadcastQuantRows, MaxKFitAndRefusals) {
  const T1Configs t1 = t1_configs();
  const Sm90GemmConfig &ws = t1.ws, &ws_u = t1.ws_u, &b1 = t1.b1, &x2 = t1.x2, &tile = t1.tile;
  EXPECT_EQ(sm90_broadcast_row_max_k(ws, true), (232448 - (16 * 6 * 1152 + 144)) / (3 * 128) * 64);
  EXPECT_EQ(sm90_broadcast_row_max_k(b1, true), (232448 - (16 * 6 * 640 + 8192 + 144)) / (3 * 128) * 64);
  EXPECT_EQ(sm90_broadcast_row_max_k(tile, true), 0);
  for (const Sm90GemmConfig& c : {ws, ws_u, b1}) {
    EXPECT_GE(sm90_broadcast_row_max_k(c, true), 7168) << to_string(c) << ": every preset's hidden size must fit";
    // (units: gated N / 2 / 64 or N / 128; routed experts: top_k + a merged shared expert)
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 32, 9, 132)) << to_string(c);   // deepseek-v3
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 24, 8, 132)) << to_string(c);   // qwen3-235b
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 12, 8, 132)) << to_string(c);   // qwen3-30b
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 45, 4, 132)) << to_string(c);   // gpt-oss-120b
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 15, 6, 132)) << to_string(c);   // nemotron-nano
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 1, 1, 1)) << to_string(c);      // 4 pieces on one CTA
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 32, 0, 132)) << to_string(c);   // nothing routed
    // 8 experts x 4 pieces on 4 CTAs: 8 pieces a CTA span 3 experts where a range starts at an expert's last
    EXPECT_FALSE(sm90_broadcast_quant_rows_fit(c, 1, 8, 4)) << to_string(c);
    EXPECT_FALSE(sm90_broadcast_quant_rows_fit(c, 32, 9, 2)) << to_string(c);    // 576 pieces a CTA: up to 6
    // The kernel's range arithmetic is 32-bit (ws_contiguous_piece_range): pieces x CTAs must stay below 2^32.
    // 2^20 units a expert (4 or 2 pieces each) x 9 experts x 132 CTAs is past it, though each range lies within
    // two experts; 2^16 units is not.
    EXPECT_FALSE(sm90_broadcast_quant_rows_fit(c, 1 << 20, 9, 132)) << to_string(c);
    EXPECT_TRUE(sm90_broadcast_quant_rows_fit(c, 1 << 16, 9, 132)) << to_string(c);
    // products past int64 (2^30 units x 4 pieces x 2^30 experts x 2^30 CTAs): refused, not wrapped around
    EXPECT_FALSE(sm90_broadcast_quant_rows_fit(c, 1 << 30, 1 << 30, 1 << 30)) << to_string(c);
  }
  // 2 experts x 4 pieces on 2 CTAs: each CTA one expert; on 3 CTAs ranges of 2 / 3 / 3 pieces, within two
  EXPECT_TRUE(sm90_broadcast_quant_rows_fit(ws, 1, 2, 2));
  EXPECT_TRUE(sm90_broadcast_quant_rows_fit(ws, 1, 2, 3));
  EXPECT_FALSE(sm90_broadcast_quant_rows_fit(x2, 32, 9, 132));    // no routed kernel
  EXPECT_FALSE(sm90_broadcast_quant_rows_fit(tile, 32, 9, 132));

  static float gs[129];
  Sm90OneTokenRoute rt;
  Sm90GemmArgs g;
  routed_gemm1_args(rt, g);
  g.gs = gs;
  g.a_broadcast_quant_gs = gs;
  struct Case {
    const char* what;
    std::function<void(Sm90GemmArgs&, int&)> bend;
    const char* expect;
  };
  const Case cases[] = {
      {"no routing", [](auto& x, auto&) { x.one_token_route = nullptr; }, "only with a_broadcast_row and a routing"},
      {"no broadcast row",
       [](auto& x, auto&) { x.a_broadcast_row = false; x.one_token_route = nullptr; }, "got a_broadcast_row = false"},
      {"a row past the limit",
       [](auto& x, auto&) { x.shape = sm90_prepared_shape(128, 1536, 20480, true); }, "shape.k = 20480 exceeds"},
      {"too few SMs", [](auto&, auto& sms) { sms = 2; }, "more than two experts' pieces on a CTA"},
  };
  for (const Case& k : cases) {
    Sm90GemmArgs args = g;
    int sms = 132;
    k.bend(args, sms);
    EXPECT_EQ(sm90_nvfp4_grouped_gemm(args, ws, nullptr, sms), cudaErrorInvalidValue) << k.what;
    const std::string msg = sm90_gemm_last_error_message();
    EXPECT_NE(msg.find("a_broadcast_quant_gs"), std::string::npos) << k.what << ": " << msg;
    EXPECT_NE(msg.find(k.expect), std::string::npos) << k.what << ": " << msg;
  }
}

// GEMM1 routing T = 2 .. 4 tokens (Sm90GemmArgs::a_routed_token_rows) and GEMM2 reading their ids
// (read_token_ids): which configs have the kernels, where the tokens fit (a thread per (token, expert) of the 512,
// T x top_k <= 32, the T rows beside the rings), and the launcher's refusals by name before any device call.
TEST(Sm90TokenRowsRoute, FitAndRefusals) {
  const T1Configs t1 = t1_configs();
  const Sm90GemmConfig &ws = t1.ws, &ws_u = t1.ws_u, &b1 = t1.b1, &x2 = t1.x2, &tile = t1.tile;
  for (const Sm90GemmConfig& c : {ws, ws_u, x2}) {
    SCOPED_TRACE(to_string(c));
    EXPECT_TRUE(sm90_token_rows_route_available(c));
    EXPECT_EQ(sm90_resident_rows_max_k(c, 1), sm90_broadcast_row_max_k(c));
    EXPECT_EQ(sm90_resident_rows_max_k(c, 3), sm90_broadcast_row_max_k(c, true));
    EXPECT_GE(sm90_resident_rows_max_k(c, kSm90RoutedTokensMax), 7168) << "every preset's hidden size at T = 4";
    for (int T = 2; T <= 4; ++T) {
      EXPECT_TRUE(sm90_token_rows_route_fits(c, T, 128, 8, 4096)) << T;   // qwen3-235b
      EXPECT_TRUE(sm90_token_rows_route_fits(c, T, 128, 6, 2688)) << T;   // nemotron-nano
      EXPECT_TRUE(sm90_token_rows_route_fits(c, T, 128, 4, 2880)) << T;   // gpt-oss-120b
    }
    EXPECT_TRUE(sm90_token_rows_route_fits(c, 2, 256, 8, 7168));   // deepseek-v3: 2 x 256 threads
    EXPECT_FALSE(sm90_token_rows_route_fits(c, 3, 256, 8, 7168));  // 768 (token, expert) threads
    EXPECT_FALSE(sm90_token_rows_route_fits(c, 1, 128, 8, 4096));  // T = 1 has its own kernels
    EXPECT_FALSE(sm90_token_rows_route_fits(c, 5, 128, 4, 4096));  // past kSm90RoutedTokensMax
    EXPECT_FALSE(sm90_token_rows_route_fits(c, 4, 64, 9, 4096));   // 36 pairs: more than a lane each
    EXPECT_FALSE(sm90_token_rows_route_fits(c, 4, 128, 8, sm90_resident_rows_max_k(c, 4) + 64));  // K too long
    EXPECT_TRUE(sm90_token_rows_route_fits(c, 4, 128, 8, sm90_resident_rows_max_k(c, 4)));
  }
  EXPECT_FALSE(sm90_token_rows_route_available(b1));  // (T = 1 only)
  EXPECT_FALSE(sm90_token_rows_route_available(tile));
  EXPECT_FALSE(sm90_token_rows_route_fits(tile, 2, 128, 8, 4096));

  Sm90OneTokenRoute rt;
  Sm90GemmArgs g;
  token_rows_gemm1_args(rt, g);
  const std::vector<RouteCase> cases = {
      {"no routing", [](auto& x, auto&, auto&) { x.one_token_route = nullptr; }, "only with a routing one_token_route"},
      {"a tile config", [&](auto&, auto&, auto& c) { c = tile; }, "only with a routing one_token_route and a config"},
      {"a config without the kernel", [&](auto&, auto&, auto& c) { c = b1; }, "sm90_token_rows_route_available"},
      {"with a broadcast row", [](auto& x, auto&, auto&) { x.a_broadcast_row = true; }, "with a_broadcast_row"},
      {"f32 epilogue",
       [](auto& x, auto&, auto&) {
         x.epilogue = Sm90GemmEpilogue::kF32;
         x.shape = sm90_prepared_shape(128, 1536, 2048, false);
       },
       "the f32 epilogue"},
      {"read_ids", [](auto&, auto& r, auto&) { r.read_ids = true; r.write_outputs = false; }, "with read_ids"},
      {"before the wait", [](auto& x, auto&, auto&) { x.prologue_before_pdl_wait = true; }, "prologue_before_pdl_wait"},
      {"T = 5", [](auto&, auto& r, auto&) { r.route.tokens = r.plan.tokens = 5; }, "route.tokens = 5"},
      {"T = 1", [](auto&, auto& r, auto&) { r.route.tokens = r.plan.tokens = 1; }, "route.tokens = 1"},
      {"too few rows", [](auto& x, auto&, auto&) { x.a_rows_capacity = 3; }, "a_rows_capacity must hold"},
  };
  expect_route_refusals(cases, g, rt, ws, "a_routed_token_rows");

  // GEMM2 after it: read_token_ids (f32, direct rows, read_ids of T tokens)
  Sm90GemmArgs g2 = g;
  g2.a_routed_token_rows = false;
  g2.read_token_ids = true;
  g2.epilogue = Sm90GemmEpilogue::kF32;
  g2.shape = sm90_prepared_shape(128, 2048, 768, false);
  g2.a_rows_capacity = 32;
  rt.read_ids = true;
  rt.write_outputs = false;
  const std::vector<RouteCase> cases2 = {
      {"no route", [](auto& x, auto&, auto&) { x.one_token_route = nullptr; }, "only with a read_ids one_token_route"},
      {"a config without the kernel", [&](auto&, auto&, auto& c) { c = b1; }, "sm90_token_rows_route_available"},
      {"not read_ids", [](auto&, auto& r, auto&) { r.read_ids = false; r.write_outputs = true; }, "only with read_ids"},
      {"with GEMM1's flag", [](auto& x, auto&, auto&) { x.a_routed_token_rows = true; }, "together"},
      {"T = 5", [](auto&, auto& r, auto&) { r.route.tokens = r.plan.tokens = 5; }, "route.tokens = 5"},
      {"36 pairs", [](auto&, auto& r, auto&) { r.route.top_k = r.plan.top_k = 9; }, "tokens x top_k <= 32"},
  };
  expect_route_refusals(cases2, g2, rt, x2, "read_token_ids");
}


// w4a4 at T = 2 .. 4: the token-routing GEMM1 quantizing its tokens' rows per expert (Sm90GemmArgs::
// a_routed_token_quant_gs). Where it fits (the token routing's limits, the T raw and 2 T quantized rows beside the
// rings, each CTA's contiguous piece range within two experts for the most experts T tokens reach), and the
// launcher's refusals by name, before any device call (host-only).
TEST(Sm90TokenRowsQuant, FitAndRefusals) {
  const T1Configs t1 = t1_configs();
  const Sm90GemmConfig &ws = t1.ws, &ws_u = t1.ws_u, &b1 = t1.b1, &x2 = t1.x2, &tile = t1.tile;
  EXPECT_EQ(sm90_resident_rows_max_k(ws, 8), (232448 - (16 * 6 * 1152 + 144)) / (8 * 128) * 64);
  for (const Sm90GemmConfig& c : {ws, ws_u, x2}) {
    SCOPED_TRACE(to_string(c));
    for (int T = 2; T <= 4; ++T) {
      SCOPED_TRACE(T);
      // (units: gated I / 64, relu^2 N / 128)
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 128, 8, 4096, 24, false, 132));  // qwen3-235b
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 128, 8, 2048, 12, false, 132));  // qwen3-30b
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 128, 4, 2880, 45, false, 132));  // gpt-oss-120b
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 128, 6, 2688, 15, false, 132));  // nemotron-nano (routed)
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 12, 2, 208, 1, true, 132));      // few pieces, merged shared
      EXPECT_FALSE(sm90_token_rows_quant_fits(c, T, 128, 8, 4096, 24, false, 2)) << "ranges past two experts";
      EXPECT_FALSE(sm90_token_rows_quant_fits(c, T, 128, 8, 4096, 24, false, 0));
      EXPECT_FALSE(sm90_token_rows_quant_fits(c, T, 128, 8, 4096, 0, false, 132));
      EXPECT_FALSE(sm90_token_rows_quant_fits(c, T, 128, 8, 4096, 1 << 20, false, 132)) << "pieces x CTAs >= 2^32";
      const int max_k = sm90_resident_rows_max_k(c, 2 * T);
      EXPECT_LT(max_k, sm90_resident_rows_max_k(c, T));
      EXPECT_TRUE(sm90_token_rows_quant_fits(c, T, 128, 8, max_k, 24, false, 132));
      EXPECT_FALSE(sm90_token_rows_quant_fits(c, T, 128, 8, max_k + 64, 24, false, 132)) << "rows past the smem";
      EXPECT_TRUE(sm90_token_rows_route_fits(c, T, 128, 8, max_k + 64)) << "(the raw rows alone fit)";
    }
    EXPECT_TRUE(sm90_token_rows_quant_fits(c, 2, 256, 8, 7168, 32, true, 132));    // deepseek-v3, T = 2
    EXPECT_FALSE(sm90_token_rows_quant_fits(c, 3, 256, 8, 7168, 32, true, 132));   // 768 (token, expert) threads
    EXPECT_FALSE(sm90_token_rows_quant_fits(c, 1, 128, 8, 4096, 24, false, 132));  // T = 1: its own kernel
    EXPECT_FALSE(sm90_token_rows_quant_fits(c, 5, 128, 4, 4096, 24, false, 132));
    // 2 tokens x top-2 of 4 experts reach at most 4 (+ shared): 5 x 4 pieces on 7 CTAs, ranges of 2 .. 3 pieces
    EXPECT_TRUE(sm90_token_rows_quant_fits(c, 2, 4, 2, 208, 1, true, 7));
  }
  EXPECT_FALSE(sm90_token_rows_quant_fits(b1, 2, 128, 8, 2048, 12, false, 132));  // no token kernel
  EXPECT_FALSE(sm90_token_rows_quant_fits(tile, 2, 128, 8, 2048, 12, false, 132));

  static float gs[129];
  Sm90OneTokenRoute rt;
  Sm90GemmArgs g;
  token_rows_gemm1_args(rt, g);
  g.gs = gs;
  g.a_routed_token_quant_gs = gs;
  const std::vector<RouteCase> cases = {
      {"without the token rows",
       [](auto& x, auto&, auto&) { x.a_routed_token_rows = false; }, "only with a_routed_token_rows"},
      {"a row past the limit",
       [](auto& x, auto&, auto&) { x.shape = sm90_prepared_shape(128, 1536, 8192, true); }, "shape.k = 8192 exceeds"},
  };
  expect_route_refusals(cases, g, rt, ws, "a_routed_token_quant_gs");
  Sm90GemmArgs few = g;
  few.one_token_route = &rt;
  EXPECT_EQ(sm90_nvfp4_grouped_gemm(few, ws, nullptr, 2), cudaErrorInvalidValue);
  const std::string msg = sm90_gemm_last_error_message();
  EXPECT_NE(msg.find("a_routed_token_quant_gs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("more than two experts' pieces on a CTA"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on 2 CTAs"), std::string::npos) << msg;
}

// Each call's message is its own: after a refused call, a call that fails in the CUDA runtime (here the device query
// of a machine without a GPU, num_sms = 0) names its own error and config, not the earlier refusal (1c1aa36's device
// run showed a chained launch's refusal under another kernel's failed launch). On a machine with a GPU the second call
// would launch on host pointers: skipped there.
TEST(Sm90GemmErrors, ACudaFailureDoesNotReportAnEarlierRefusal) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "needs a machine without a GPU";
  Sm90OneTokenRoute rt;
  Sm90GemmArgs g;
  routed_gemm1_args(rt, g);
  g.one_token_route = nullptr;
  g.a_broadcast_row = false;
  Sm90GemmConfig tile{};
  ASSERT_TRUE(sm90_gemm_config_by_name("bt144_s8_wg2", &tile));
  Sm90GemmArgs bad = g;
  bad.consumer_stagger_ns = -1;
  EXPECT_EQ(sm90_nvfp4_grouped_gemm(bad, tile, nullptr, 132), cudaErrorInvalidValue);
  EXPECT_NE(std::string(sm90_gemm_last_error_message()).find("consumer_stagger_ns"), std::string::npos);
  for (const char* name : {"bt144_s8_wg2", "bt128_s8_wg2", "bt16_s9_wg4"}) {
    Sm90GemmConfig c{};
    ASSERT_TRUE(sm90_gemm_config_by_name(name, &c));
    EXPECT_NE(sm90_nvfp4_grouped_gemm(g, c, nullptr, 0), cudaSuccess) << name;
    const std::string msg = sm90_gemm_last_error_message();
    EXPECT_EQ(msg.find("consumer_stagger_ns"), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find(std::string("sm90_nvfp4_grouped_gemm: config ") + name), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace nvfp4moe::cuda
