// Adversarial keys for DeepSeek's group selection (warp_kept_groups against the serial top-2 sums and argmax
// passes): the host test of its lane pieces (tests/cuda_host/test_route_rank.cpp) and its device test
// (tests/cuda/test_decode_route_kernels.cu) walk the same shapes and key patterns.
#pragma once

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace nvfp4moe::test {

// (E, G): deepseek-v3's 256 / 8, the layer tests' 32 / 8, 96 / 8, 512 / 8, and the corners of G <= 32 (groups of 1
// to 64 keys, one to 32 groups a warp's lanes hold).
inline std::vector<std::pair<int, int>> grouped_route_shapes() {
  return {{256, 8}, {32, 8}, {96, 8}, {512, 8}, {256, 32}, {32, 32}, {64, 2},
          {40, 5},  {1024, 16}, {6, 3}, {384, 12}, {24, 24}, {160, 20}, {8, 2}};
}

inline constexpr int kGroupedRouteKeyPatterns = 10;

// E keys in groups of gsize by pattern: sigmoid + bias as routed, every key tied, few values (ties within and across
// groups), signed zeros (zero sums of either sign), +-inf, NaN keys, one key a group (scores -FLT_MAX + key), no key
// that counts (scores -inf), -FLT_MAX keys (sums that overflow to -inf), whole groups NaN.
inline std::vector<float> grouped_route_keys(int E, int gsize, int pattern, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> keys(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) {
    const float x = normal(rng);
    float v = x;
    switch (pattern) {
      case 0: v = 1.0f / (1.0f + std::exp(-x)) + 0.1f * normal(rng); break;
      case 1: v = 0.5f; break;
      case 2: v = std::round(2.0f * x) * 0.25f; break;
      case 3: v = (e % 3 == 0) ? 0.0f : (e % 3 == 1) ? -0.0f : -std::fabs(std::round(x)); break;
      case 4: v = (e % 5 == 0) ? -inf : (e % 11 == 3) ? inf : x; break;
      case 5: v = (e % 4 == 1) ? nan : std::round(x); break;
      case 6: v = (e % gsize == 0) ? x : nan; break;
      case 7: v = (e < E / 2) ? nan : -inf; break;
      case 8: v = (e % 2) ? -FLT_MAX : x; break;
      default: v = (e / gsize) % 3 == 0 ? nan : x; break;
    }
    keys[static_cast<size_t>(e)] = v;
  }
  return keys;
}

}  // namespace nvfp4moe::test
