// Random full-size MoeWeights and inputs for `nvfp4moe bench` (see bench.h). Fast: the bytes come from a
// counter-based generator, 8 bytes per call, threaded over 1 MiB chunks (memory-bandwidth bound).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cli/bench.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cli::bench {
namespace {

constexpr size_t kChunk = size_t(1) << 20;

// Fills dst[0, n) from (seed, chunk) streams. scale_codes: every byte mapped into the e4m3 codes
// [0x28, 0x40] (0.25 .. 2.0, 25 codes), else raw random bytes (any byte is two valid e2m1 codes).
void fill_random(uint8_t* dst, size_t n, uint64_t seed, bool scale_codes) {
  const int64_t chunks = static_cast<int64_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t begin = static_cast<size_t>(c) * kChunk, end = std::min(n, begin + kChunk);
    uint64_t ctr = mix64(seed ^ mix64(static_cast<uint64_t>(c) + 0x5EEDull));
    size_t i = begin;
    for (; i + 8 <= end; i += 8) {
      uint64_t r = mix64(ctr++);
      if (scale_codes) {
        uint64_t out = 0;
        for (int b = 0; b < 8; ++b) out |= static_cast<uint64_t>(0x28 + ((((r >> (8 * b)) & 0xFF) * 25) >> 8)) << (8 * b);
        r = out;
      }
      std::memcpy(dst + i, &r, 8);
    }
    if (i < end) {
      uint64_t r = mix64(ctr++);
      for (; i < end; ++i, r >>= 8)
        dst[i] = scale_codes ? static_cast<uint8_t>(0x28 + (((r & 0xFF) * 25) >> 8)) : static_cast<uint8_t>(r);
    }
  }
}

double unit(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }  // [0, 1)

float uniform(uint64_t seed, uint64_t i, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(unit(mix64(seed ^ mix64(i))));
}

// N(0, 1) from two counters (Box-Muller, cosine branch only: simple and thread-order free).
float normal(uint64_t seed, uint64_t i) {
  const double u1 = 1.0 - unit(mix64(seed ^ mix64(2 * i))), u2 = unit(mix64(seed ^ mix64(2 * i + 1)));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

void fill_experts(StackedExperts& s, int64_t experts, int64_t H, int64_t I, bool gated, uint64_t seed) {
  s.allocate(experts, H, I, gated);
  fill_random(s.w13.data(), s.w13.size(), seed ^ 0x1313ull, false);
  fill_random(s.w13_scale.data(), s.w13_scale.size(), seed ^ 0x5C13ull, true);
  fill_random(s.w2.data(), s.w2.size(), seed ^ 0x2222ull, false);
  fill_random(s.w2_scale.data(), s.w2_scale.size(), seed ^ 0x5C22ull, true);
  const float k1 = 64.0f * std::sqrt(static_cast<float>(H)), k2 = 64.0f * std::sqrt(static_cast<float>(I));
  const size_t e = static_cast<size_t>(experts);
  s.w13_gate_scale2.assign(gated ? e : 0, 0.0f);
  s.w13_up_scale2.assign(e, 0.0f);
  s.w13_input_scale.assign(e, 0.0f);
  s.w2_scale2.assign(e, 0.0f);
  s.w2_input_scale.assign(e, 0.0f);
  const uint64_t ss = seed ^ 0x5CA1E5ull;
  for (size_t x = 0; x < e; ++x) {
    if (gated) s.w13_gate_scale2[x] = uniform(ss, 6 * x + 0, 0.5f, 1.5f) / k1;
    s.w13_up_scale2[x] = gated ? s.w13_gate_scale2[x] : uniform(ss, 6 * x + 1, 0.5f, 1.5f) / k1;
    s.w2_scale2[x] = uniform(ss, 6 * x + 2, 0.5f, 1.5f) / k2;
    s.w13_input_scale[x] = 4.5f * uniform(ss, 6 * x + 3, 0.9f, 1.3f) / fmt::kWeightScaleDenom;
    s.w2_input_scale[x] = 4.0f * uniform(ss, 6 * x + 4, 0.9f, 1.3f) / fmt::kWeightScaleDenom;
  }
}

}  // namespace

std::vector<float> random_logits(int64_t tokens, int64_t experts, RoutingKind kind, uint64_t seed, int64_t top_k) {
  NVFP4MOE_CHECK(kind != RoutingKind::Balanced || (top_k >= 1 && top_k <= experts), ArgumentError,
                 "random_logits: balanced routing needs 1 <= top_k <= experts, got top_k ", top_k, " for ", experts,
                 " experts");
  std::vector<float> v(static_cast<size_t>(tokens * experts));
  const uint64_t s = mix64(seed ^ 0x4C4F474954ull);
  const int64_t n = static_cast<int64_t>(v.size());
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(s, static_cast<uint64_t>(i));
    if (kind == RoutingKind::Skewed && i % experts < kHotExperts) x += kHotBoost;
    if (kind == RoutingKind::Balanced) {
      const int64_t t = i / experts, e = i % experts;
      const int64_t j = ((e - t * top_k) % experts + experts) % experts;  // e = (t k + j) mod E
      x = j < top_k ? kBalancedLogit + 0.25f * x : x - kBalancedLogit;
    }
    v[static_cast<size_t>(i)] = x;
  }
  return v;
}

std::vector<uint16_t> random_hidden(int64_t tokens, int64_t hidden, uint64_t seed) {
  std::vector<uint16_t> v(static_cast<size_t>(tokens * hidden));
  const uint64_t s = mix64(seed ^ 0x4849444445ull);
  const int64_t n = static_cast<int64_t>(v.size());
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    uint64_t r = mix64(s ^ mix64(static_cast<uint64_t>(b)));
    for (int64_t j = 0; j < 4 && 4 * b + j < n; ++j, r >>= 16) {
      // 16 random bits -> (0, 1) without 0 -> [-sqrt3, sqrt3]; bf16-rounded, then forced away from 0.
      const float u = (static_cast<float>(r & 0xFFFF) + 0.5f) * (1.0f / 65536.0f);
      float x = (2.0f * u - 1.0f) * 1.7320508f;
      uint16_t h = fmt::bf16_from_float(x);
      if ((h & 0x7FFF) == 0) h = fmt::bf16_from_float(0.001f);
      v[static_cast<size_t>(4 * b + j)] = h;
    }
  }
  return v;
}

std::vector<float> random_router_bias(int64_t experts, uint64_t seed) {
  std::vector<float> b(static_cast<size_t>(experts));
  const uint64_t s = mix64(seed) ^ 0xB1A5ull;
  for (size_t e = 0; e < b.size(); ++e) b[e] = 0.01f * normal(s, e);
  return b;
}

MoeWeights random_bench_weights(const MoeSpec& spec, uint64_t seed) {
  spec.validate();
  MoeWeights w;
  w.spec = spec;
  const uint64_t s = mix64(seed);
  fill_experts(w.experts, spec.num_experts, spec.hidden, spec.intermediate, spec.gated(), s ^ 0xE7ull);
  if (spec.shared_intermediate > 0)
    fill_experts(w.shared, 1, spec.hidden, spec.shared_intermediate, spec.gated(), s ^ 0x5E7ull);
  if (spec.has_router_bias) w.router_bias = random_router_bias(spec.num_experts, seed);
  if (spec.shared_expert_gated) {
    w.shared_gate_weight.resize(static_cast<size_t>(spec.hidden));
    const float rs = 1.0f / std::sqrt(static_cast<float>(spec.hidden));
    for (size_t i = 0; i < w.shared_gate_weight.size(); ++i)
      w.shared_gate_weight[i] = fmt::bf16_from_float(rs * normal(s ^ 0x6A7Eull, i));
  }
  w.validate();
  return w;
}

}  // namespace nvfp4moe::cli::bench
