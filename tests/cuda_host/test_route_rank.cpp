// The decode block route's rank counts (src/cuda/route_rank.h: the default short-circuit form and the
// branch-free one), host side: equal to their definition on random and adversarial keys (ties, +-0, +-inf, NaN
// pads and NaN logits), and the ranks of the valid experts are a permutation of 0 .. valid-1 whose order is the
// k-argmax order (descending key, ties to the lower id).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/route_rank.h"

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

}  // namespace
}  // namespace nvfp4moe::cuda
