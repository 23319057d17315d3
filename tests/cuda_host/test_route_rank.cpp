// The decode block route's rank counts (src/cuda/route_rank.h: the default short-circuit form and the
// branch-free one), host side: equal to their definition on random and adversarial keys (ties, +-0, +-inf, NaN
// pads and NaN logits), and the ranks of the valid experts are a permutation of 0 .. valid-1 whose order is the
// k-argmax order (descending key, ties to the lower id). The grouped routing's warp group selection
// (warp_kept_groups' pieces, run as the warp runs them) keeps what the serial top-2 sums and argmax passes keep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/reference.h"
#include "cuda/route_rank.h"
#include "nvfp4moe/spec.h"
#include "support/grouped_route_keys.h"

namespace nvfp4moe::cuda {
namespace {

int rank_by_definition(const std::vector<float>& keys, int e) {
  const float k = keys[static_cast<size_t>(e)];
  int r = 0;
  for (int a = 0; a < static_cast<int>(keys.size()); ++a) {
    const float u = keys[static_cast<size_t>(a)];
    if (u > k || (u == k && a < e)) ++r;
  }
  return r;
}

std::vector<float> adversarial_keys(int experts, int padded, int pattern, std::mt19937& rng) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> keys(static_cast<size_t>(padded), nan);  // pads: NaN, as route_block writes them
  for (int e = 0; e < experts; ++e) {
    const float x = normal(rng);
    float v = x;
    switch (pattern) {
      case 0: v = x; break;
      case 1: v = 0.5f; break;                                         // all tied
      case 2: v = std::round(x) * 0.5f; break;                         // few distinct values
      case 3: v = (e % 3 == 0) ? 0.0f : (e % 3 == 1) ? -0.0f : std::round(x); break;  // +0 == -0
      case 4: v = (e % 5 == 0) ? -inf : (e % 11 == 3) ? inf : x; break;
      case 5: v = (e % 4 == 1) ? nan : std::round(x); break;          // NaN logits
      case 6: v = (e < 3) ? x : nan; break;                           // fewer valid experts than k
      default: v = -inf; break;
    }
    keys[static_cast<size_t>(e)] = v;
  }
  return keys;
}

TEST(RouteRank, EqualsTheDefinitionAndOrdersLikeArgmaxPasses) {
  std::mt19937 rng(2026);
  for (int experts : {1, 7, 8, 32, 33, 128, 160, 256, 384, 1024}) {
    const int padded = (experts + 31) / 32 * 32;
    for (int pattern = 0; pattern < 8; ++pattern) {
      SCOPED_TRACE(::testing::Message() << "E=" << experts << " pattern " << pattern);
      const std::vector<float> keys = adversarial_keys(experts, padded, pattern, rng);
      std::vector<int> valid;
      for (int e = 0; e < experts; ++e) {
        const float k = keys[static_cast<size_t>(e)];
        if (k != k) continue;
        valid.push_back(e);
        ASSERT_EQ(rank_among_keys(keys.data(), padded / 4, e, k), rank_by_definition(keys, e)) << "expert " << e;
        ASSERT_EQ(rank_among_keys_short_circuit(keys.data(), padded / 4, e, k), rank_by_definition(keys, e)) << e;
      }
      // The valid experts' ranks: a permutation, in the order of repeated argmax (max key, ties to lower id).
      std::vector<int> by_rank(valid.size(), -1);
      for (int e : valid) {
        const int r = rank_among_keys(keys.data(), padded / 4, e, keys[static_cast<size_t>(e)]);
        ASSERT_GE(r, 0);
        ASSERT_LT(r, static_cast<int>(valid.size()));
        ASSERT_EQ(by_rank[static_cast<size_t>(r)], -1) << "two experts with rank " << r;
        by_rank[static_cast<size_t>(r)] = e;
      }
      std::vector<int> order = valid;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return keys[static_cast<size_t>(a)] > keys[static_cast<size_t>(b)];
      });
      EXPECT_EQ(by_rank, order);
    }
  }
}

// route_block's two stages, run here as the block runs them: each expert's rank among its 32-key segment
// (rank_among_keys on the segment), the local ranks < kc = min(k, 32) as candidates (NaN in empty slots and in
// the float4 tail), then each candidate's rank among the candidates (rank_among_candidates). Slots 0 .. k-1 must
// hold exactly the experts of rank 0 .. k-1 among all keys (and -1 past the valid ones), for k from 1 to past 32.
TEST(RouteRank, TwoStagesGiveTheSlotsOfOneRankAmongAllKeys) {
  std::mt19937 rng(2027);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int experts : {1, 7, 8, 32, 33, 128, 160, 256, 320, 384, 1024})
    for (int k : {1, 2, 6, 8, 9, 31, 32, 33, 40})
      for (int pattern = 0; pattern < 8; ++pattern) {
        if (k > experts) continue;
        SCOPED_TRACE(::testing::Message() << "E=" << experts << " k=" << k << " pattern " << pattern);
        const int padded = (experts + 31) / 32 * 32;
        const std::vector<float> keys = adversarial_keys(experts, padded, pattern, rng);
        std::vector<int> want(static_cast<size_t>(k), -1);
        for (int e = 0; e < experts; ++e)
          if (keys[static_cast<size_t>(e)] == keys[static_cast<size_t>(e)]) {
            const int r = rank_by_definition(keys, e);
            if (r < k) want[static_cast<size_t>(r)] = e;
          }
        const int kc = std::min(k, 32), segs = padded / 32, ncand = segs * kc, nc4 = (ncand + 3) / 4;
        std::vector<float> ck(static_cast<size_t>(padded), 1234.5f);  // stale values where the block has them
        std::vector<int32_t> ci(static_cast<size_t>(padded), 77);
        for (int s = 0; s < segs; ++s)
          for (int j = 0; j < kc; ++j) ck[static_cast<size_t>(s * kc + j)] = nan;
        for (int j = ncand; j < 4 * nc4; ++j) ck[static_cast<size_t>(j)] = nan;
        for (int e = 0; e < padded; ++e) {
          const float key = keys[static_cast<size_t>(e)];
          if (key != key) continue;
          const int s = e / 32, local = rank_among_keys(keys.data() + 32 * s, 8, e - 32 * s, key);
          if (local < kc) {
            ck[static_cast<size_t>(s * kc + local)] = key;
            ci[static_cast<size_t>(s * kc + local)] = e;
          }
        }
        std::vector<int> got(static_cast<size_t>(k), -1);
        for (int c = 0; c < ncand; ++c) {
          const float key = ck[static_cast<size_t>(c)];
          if (key != key) continue;
          const int r = rank_among_candidates(ck.data(), ci.data(), nc4, ci[static_cast<size_t>(c)], key);
          if (r < k) {
            ASSERT_EQ(got[static_cast<size_t>(r)], -1) << "two candidates with rank " << r;
            got[static_cast<size_t>(r)] = ci[static_cast<size_t>(c)];
          }
        }
        EXPECT_EQ(got, want);
      }
}

// DeepSeek's group selection as route_token defines it: group_top2_sum per group, then topk_group argmax passes
// over the valid scores (neither NaN nor -inf), ties to the lower group. Bit g: group g kept.
uint32_t kept_groups_by_argmax_passes(const std::vector<float>& keys, int G, int topk_group,
                                      std::vector<float>* scores) {
  const int gsize = static_cast<int>(keys.size()) / G;
  std::vector<float> gscore(static_cast<size_t>(G));
  for (int g = 0; g < G; ++g) gscore[static_cast<size_t>(g)] = group_top2_sum(keys.data() + g * gsize, gsize);
  *scores = gscore;
  uint32_t kept = 0u;
  for (int r = 0; r < topk_group; ++r) {
    int best = -1;
    for (int g = 0; g < G; ++g) {
      const float v = gscore[static_cast<size_t>(g)];
      if (!group_score_valid(v) || ((kept >> g) & 1u)) continue;
      if (best < 0 || v > gscore[static_cast<size_t>(best)]) best = g;  // (ties: the lower group, seen first)
    }
    if (best < 0) break;
    kept |= 1u << best;
  }
  return kept;
}

// warp_kept_groups' steps on 32 emulated lanes: the strided top-2 walk, the xor butterfly within L lanes (every
// lane reads its partner's values from before the round, as __shfl_xor_sync does), the ranks from lane u L's score,
// the ballot of the groups' first lanes.
uint32_t kept_groups_as_the_warp(const std::vector<float>& keys, int G, int topk_group, std::vector<float>* scores) {
  const int E = static_cast<int>(keys.size()), gsize = E / G, L = kept_group_lanes(G);
  float t1[32], t2[32], score[32];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / L, j = lane - g * L;
    t1[lane] = t2[lane] = -FLT_MAX;
    if (g < G)
      for (int i = j; i < gsize; i += L)
        group_top2_insert(t1[lane], t2[lane], keys[static_cast<size_t>(g * gsize + i)]);
  }
  for (int off = 1; off < L; off <<= 1) {
    float o1[32], o2[32];
    for (int lane = 0; lane < 32; ++lane) o1[lane] = t1[lane ^ off], o2[lane] = t2[lane ^ off];
    for (int lane = 0; lane < 32; ++lane) group_top2_merge(t1[lane], t2[lane], o1[lane], o2[lane]);
  }
  for (int lane = 0; lane < 32; ++lane) score[lane] = gsize >= 2 ? t1[lane] + t2[lane] : t1[lane];
  uint32_t leaders = 0u;
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / L, j = lane - g * L;
    int rank = 0;
    for (int u = 0; u < G; ++u) rank += group_ranks_above(score[u * L], u, score[lane], g) ? 1 : 0;
    if (j == 0 && g < G && group_score_valid(score[lane]) && rank < topk_group) leaders |= 1u << lane;
    if (j == 0 && g < G) (*scores)[static_cast<size_t>(g)] = score[lane];
  }
  uint32_t kept = 0u;
  for (int u = 0; u < G; ++u) kept |= ((leaders >> (u * L)) & 1u) << u;
  return kept;
}

TEST(RouteRank, WarpKeptGroupsKeepWhatTheArgmaxPassesKeep) {
  std::mt19937 rng(2028);
  int cases = 0, partial = 0;
  for (auto [E, G] : test::grouped_route_shapes())
    for (int pattern = 0; pattern < test::kGroupedRouteKeyPatterns; ++pattern)
      for (int topk_group : {1, 2, G / 2 > 0 ? G / 2 : 1, G - 1 > 0 ? G - 1 : 1, G}) {
        SCOPED_TRACE(::testing::Message() << "E=" << E << " G=" << G << " topk_group=" << topk_group << " pattern "
                                          << pattern);
        const std::vector<float> keys = test::grouped_route_keys(E, E / G, pattern, rng);
        std::vector<float> want_scores, got_scores(static_cast<size_t>(G));
        const uint32_t want = kept_groups_by_argmax_passes(keys, G, topk_group, &want_scores);
        const uint32_t got = kept_groups_as_the_warp(keys, G, topk_group, &got_scores);
        EXPECT_EQ(got, want);
        for (int g = 0; g < G; ++g) {  // the same values (a zero sum's sign aside, which == ignores)
          const float a = got_scores[static_cast<size_t>(g)], b = want_scores[static_cast<size_t>(g)];
          EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << "group " << g << ": " << a << " vs " << b;
        }
        ++cases;
        partial += (want != 0u && want != (G == 32 ? ~0u : (1u << G) - 1u)) ? 1 : 0;
      }
  EXPECT_EQ(cases, 14 * test::kGroupedRouteKeyPatterns * 5);
  EXPECT_GT(partial, 300);  // most cases keep some groups and not others
}

// The CPU reference (the oracle) routes DeepSeek's grouped top-k as the block routing does: the kept groups by
// group_top2_sum's scores (a NaN or -inf score never kept), then the k ids by rank_among_keys over the kept groups'
// keys. Keys from the adversarial patterns through the router bias (logits -inf: sigmoid 0, key = 0 + bias), so NaN,
// +-inf and -FLT_MAX keys reach both. Before 2026-12-08 the CPU reference scored a group with one key that counts by
// that key alone and could keep a -inf group, which this test catches (patterns 5 to 7).
TEST(RouteRank, CpuReferenceKeepsTheGroupsAndIdsOfTheBlockRouting) {
  std::mt19937 rng(2029);
  const float ninf = -std::numeric_limits<float>::infinity();
  int cases = 0, with_missing_ids = 0;
  for (auto [E, G] : test::grouped_route_shapes())
    for (int pattern = 0; pattern < test::kGroupedRouteKeyPatterns; ++pattern)
      for (int topk_group : {1, 2, G - 1 > 0 ? G - 1 : 1}) {
        const int K = std::min(E, 8);
        SCOPED_TRACE(::testing::Message() << "E=" << E << " G=" << G << " topk_group=" << topk_group << " k=" << K
                                          << " pattern " << pattern);
        std::vector<float> keys = test::grouped_route_keys(E, E / G, pattern, rng);
        for (float& k : keys) k = 0.0f + k;  // the bias as the key: -0 becomes +0, as 0 + bias does
        MoeSpec spec;
        spec.num_experts = E;
        spec.top_k = K;
        spec.routing = Routing::SigmoidGroupedTopK;
        spec.n_group = G;
        spec.topk_group = topk_group;
        spec.has_router_bias = true;
        const std::vector<float> logits(static_cast<size_t>(E), ninf);
        std::vector<int32_t> cpu_ids(static_cast<size_t>(K));
        std::vector<float> cpu_ws(static_cast<size_t>(K));
        cpu::route(spec, logits.data(), keys.data(), 1, cpu_ids.data(), cpu_ws.data());

        std::vector<float> scores;
        const uint32_t kept = kept_groups_by_argmax_passes(keys, G, topk_group, &scores);
        const int padded = (E + 3) / 4 * 4;
        std::vector<float> eligible_keys(static_cast<size_t>(padded), std::numeric_limits<float>::quiet_NaN());
        for (int e = 0; e < E; ++e)
          if ((kept >> (e / (E / G))) & 1u) eligible_keys[static_cast<size_t>(e)] = keys[static_cast<size_t>(e)];
        std::vector<int32_t> block_ids(static_cast<size_t>(K), -1);
        for (int e = 0; e < E; ++e) {
          const float k = eligible_keys[static_cast<size_t>(e)];
          if (k != k) continue;
          const int r = rank_among_keys(eligible_keys.data(), padded / 4, e, k);
          if (r < K) block_ids[static_cast<size_t>(r)] = e;
        }
        EXPECT_EQ(cpu_ids, block_ids);
        ++cases;
        with_missing_ids += std::count(block_ids.begin(), block_ids.end(), -1) > 0 ? 1 : 0;
      }
  EXPECT_EQ(cases, 14 * test::kGroupedRouteKeyPatterns * 3);
  EXPECT_GT(with_missing_ids, 20);  // rows where the kept groups hold fewer than k keys that count
}

}  // namespace
}  // namespace nvfp4moe::cuda
