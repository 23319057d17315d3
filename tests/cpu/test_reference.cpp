// Tests of the CPU reference backend (src/cpu/reference.cpp) against a second, deliberately naive
// implementation of nvfp4-format.md sections 7 and 9 written here: per token, per slot, one element at a
// time, no grouping by expert, sharing nothing with the library but the fmt:: codecs. Plus determinism,
// batch invariance, accuracy against the fp32 layer, calibration statistics, input validation and a timing
// smoke test of the Qwen3-30B-A3B layer shape.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"
#include "support/test_support.h"

namespace nvfp4moe {
namespace {

using test::compare;
using test::Metrics;

// ======================================================================= the naive implementation
namespace naive {

// Routing (section 7) by stable sorts: the first k of the indices sorted by value, descending, ties in id order.
void route(const MoeSpec& spec, const float* logits, const float* bias, int64_t T, int32_t* ids, float* ws) {
  const int64_t E = spec.num_experts, K = spec.top_k;
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::vector<float> w(static_cast<size_t>(K));
    if (spec.routing == Routing::SoftmaxTopK) {
      float mx = l[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
      float z = 0.0f;
      for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - mx);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
      for (int64_t j = 0; j < K; ++j) w[j] = std::exp(l[order[j]] - mx) / z;
    } else {
      std::vector<float> s(static_cast<size_t>(E)), b(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        s[e] = 1.0f / (1.0f + std::exp(-l[e]));
        b[e] = s[e] + (bias ? bias[e] : 0.0f);
      }
      const int64_t G = spec.n_group, gs = E / G;
      std::vector<uint8_t> kept(static_cast<size_t>(G), 1);
      if (G > 1) {
        std::vector<float> score(static_cast<size_t>(G));
        for (int64_t g = 0; g < G; ++g) {
          std::vector<float> v(b.begin() + g * gs, b.begin() + (g + 1) * gs);
          std::sort(v.begin(), v.end(), std::greater<float>());
          score[g] = gs >= 2 ? v[0] + v[1] : v[0];
        }
        std::vector<int32_t> gorder(static_cast<size_t>(G));
        std::iota(gorder.begin(), gorder.end(), 0);
        std::stable_sort(gorder.begin(), gorder.end(), [&](int32_t x, int32_t y) { return score[x] > score[y]; });
        std::fill(kept.begin(), kept.end(), 0);
        for (int64_t r = 0; r < spec.topk_group; ++r) kept[gorder[r]] = 1;
      }
      order.erase(std::remove_if(order.begin(), order.end(), [&](int32_t e) { return !kept[e / gs]; }), order.end());
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return b[x] > b[y]; });
      for (int64_t j = 0; j < K; ++j) w[j] = s[order[j]];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += w[j];
    for (int64_t j = 0; j < K; ++j) {
      ids[t * K + j] = order[j];
      float v = w[j];
      if (spec.norm_topk_prob) v = v / sum;
      if (spec.routing == Routing::SigmoidGroupedTopK) v = v * spec.routed_scaling_factor;
      ws[t * K + j] = v;
    }
  }
}

enum class Kind { W4A16, W4A4, F32 };

// Weight element (e, n, k) of a stacked [E, N, K] NVFP4 tensor: code * block scale.
float wdq(const HostBuffer& w, const HostBuffer& sc, int64_t e, int64_t n, int64_t k, int64_t N, int64_t K) {
  const uint8_t byte = w.data()[(e * N + n) * (K / 2) + k / 2];
  const uint8_t code = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
  return fmt::e2m1_decode(code) * fmt::e4m3_decode(sc.data()[(e * N + n) * (K / 16) + k / 16]);
}

// The GEMM operand of an activation vector (section 4 in w4a4; as is otherwise).
std::vector<float> operand(const std::vector<float>& x, Kind kind, float input_scale) {
  if (kind != Kind::W4A4) return x;
  std::vector<float> op(x.size());
  const float gs = 1.0f / input_scale;
  for (size_t b = 0; b < x.size(); b += 16) {
    uint8_t codes[16];
    const uint8_t sf = fmt::quantize_activation_block(x.data() + b, 16, gs, codes);
    for (int i = 0; i < 16; ++i) op[b + i] = fmt::e2m1_decode(codes[i]) * fmt::e4m3_decode(sf);
  }
  return op;
}

struct Amax {
  float g1 = 0, g2 = 0;
};

// One expert on one token: y [H].
std::vector<float> expert(const StackedExperts& s, int64_t e, Kind kind, const std::vector<float>& x, Amax* am) {
  const int64_t H = s.hidden, I = s.intermediate, N1 = s.n1();
  if (am)
    for (float v : x) am->g1 = std::max(am->g1, std::fabs(v));
  const std::vector<float> op1 = operand(x, kind, s.w13_input_scale[e]);
  std::vector<float> h(static_cast<size_t>(N1));
  for (int64_t n = 0; n < N1; ++n) {
    const bool is_gate = s.gated && n < I;
    const float ws2 = is_gate ? s.w13_gate_scale2[e] : s.w13_up_scale2[e];
    float acc = 0.0f;
    for (int64_t k = 0; k < H; ++k) {
      float wv = wdq(s.w13, s.w13_scale, e, n, k, N1, H);
      if (kind == Kind::F32) wv = wv * ws2;
      acc += op1[k] * wv;
    }
    const float alpha = kind == Kind::F32 ? 1.0f : kind == Kind::W4A4 ? ws2 * s.w13_input_scale[e] : ws2;
    h[n] = alpha * acc;
  }
  std::vector<float> a(static_cast<size_t>(I));
  for (int64_t n = 0; n < I; ++n) {
    float v;
    if (s.gated) {
      const float g = h[n];
      v = (g / (1.0f + std::exp(-g))) * h[I + n];
    } else {
      v = h[n] > 0.0f ? h[n] * h[n] : 0.0f;
    }
    a[n] = kind == Kind::F32 ? v : fmt::bf16_round(v);
    if (am) am->g2 = std::max(am->g2, std::fabs(a[n]));
  }
  const std::vector<float> op2 = operand(a, kind, s.w2_input_scale[e]);
  std::vector<float> y(static_cast<size_t>(H));
  for (int64_t n = 0; n < H; ++n) {
    float acc = 0.0f;
    for (int64_t k = 0; k < I; ++k) {
      float wv = wdq(s.w2, s.w2_scale, e, n, k, H, I);
      if (kind == Kind::F32) wv = wv * s.w2_scale2[e];
      acc += op2[k] * wv;
    }
    const float alpha = kind == Kind::F32 ? 1.0f : kind == Kind::W4A4 ? s.w2_scale2[e] * s.w2_input_scale[e] : s.w2_scale2[e];
    y[n] = alpha * acc;
  }
  return y;
}

// The layer, token by token. hidden: the GEMM1 input values (bf16 values, or f32 for Kind::F32).
std::vector<float> layer(const MoeWeights& w, Kind kind, const std::vector<float>& hidden, int64_t T,
                         const std::vector<int32_t>& ids, const std::vector<float>& ws,
                         std::vector<Amax>* amax = nullptr, Amax* shared_amax = nullptr) {
  const int64_t H = w.spec.hidden, K = w.spec.top_k;
  std::vector<float> out(static_cast<size_t>(T * H), 0.0f);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> x(hidden.begin() + t * H, hidden.begin() + (t + 1) * H);
    std::vector<float> o(static_cast<size_t>(H), 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ids[t * K + j];
      if (e < 0) continue;
      const auto y = expert(w.experts, e, kind, x, amax ? &(*amax)[e] : nullptr);
      for (int64_t c = 0; c < H; ++c) o[c] += ws[t * K + j] * y[c];
    }
    if (w.has_shared()) {
      const auto y = expert(w.shared, 0, kind, x, shared_amax);
      float g = 1.0f;
      if (w.spec.shared_expert_gated) {
        float d = 0.0f;
        for (int64_t k = 0; k < H; ++k) d += x[k] * fmt::bf16_to_float(w.shared_gate_weight[k]);
        g = 1.0f / (1.0f + std::exp(-d));
      }
      for (int64_t c = 0; c < H; ++c) o[c] += w.spec.shared_expert_gated ? g * y[c] : y[c];
    }
    std::copy(o.begin(), o.end(), out.begin() + t * H);
  }
  return out;
}

}  // namespace naive

// ======================================================================= helpers
std::vector<float> run_ref(const MoeWeights& w, Mode mode, const std::vector<uint16_t>& hidden, int64_t T,
                           const std::vector<int32_t>& ids, const std::vector<float>& ws) {
  std::vector<float> out(static_cast<size_t>(T * w.spec.hidden), -7.0f);
  cpu::moe_forward(w, mode, hidden.data(), T, ids.data(), ws.data(), out.data());
  return out;
}

naive::Kind kind_of(Mode m) { return m == Mode::W4A4 ? naive::Kind::W4A4 : naive::Kind::W4A16; }

// Layer vs naive: rel L2 <= 1e-6, every element within 1e-5 * rms(ref) + 1e-5 |ref|, RMS ratio within 1e-5.
void expect_matches_naive(const MoeWeights& w, Mode mode, int64_t T, const std::vector<uint16_t>& hidden,
                          const std::vector<int32_t>& ids, const std::vector<float>& ws, const std::string& what) {
  const auto got = run_ref(w, mode, hidden, T, ids, ws);
  const auto want = naive::layer(w, kind_of(mode), test::bf16_to_f32(hidden), T, ids, ws);
  double rms = 0;
  for (float v : want) rms += double(v) * v;
  rms = want.empty() ? 0 : std::sqrt(rms / want.size());
  const Metrics m = compare(got, want, 1e-5 * rms, 1e-5);
  size_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) same += std::memcmp(&got[i], &want[i], 4) == 0;
  EXPECT_LE(m.rel_l2, 1e-6) << what << ": " << m.str();
  EXPECT_EQ(m.mismatches, 0u) << what << ": " << m.str();
  EXPECT_EQ(m.nonfinite, 0u) << what;
  if (!want.empty() && rms > 0) EXPECT_NEAR(m.rms_ratio, 1.0, 1e-5) << what;
  EXPECT_EQ(got.size(), want.size());
  if (::testing::Test::HasFailure())
    std::printf("  %s: %s bitwise-equal %zu/%zu\n", what.c_str(), m.str().c_str(), same, got.size());
}

MoeSpec spec_of(int64_t H, int64_t I, int64_t E, int64_t k, Activation act = Activation::SwiGLU, int64_t shared = 0,
                bool gated_shared = false) {
  MoeSpec s = test::small_spec(H, I, E, k);
  s.activation = act;
  s.shared_intermediate = shared;
  s.shared_expert_gated = gated_shared;
  return s;
}

void expect_route_equal(const MoeSpec& spec, const std::vector<float>& logits, const float* bias, int64_t T,
                        const std::string& what) {
  const int64_t K = spec.top_k;
  std::vector<int32_t> ids(T * K, -5), nids(T * K);
  std::vector<float> ws(T * K, -5.0f), nws(T * K);
  cpu::route(spec, logits.data(), bias, T, ids.data(), ws.data());
  naive::route(spec, logits.data(), bias, T, nids.data(), nws.data());
  for (int64_t i = 0; i < T * K; ++i) {
    ASSERT_EQ(ids[i], nids[i]) << what << " token " << i / K << " slot " << i % K;
    ASSERT_EQ(ws[i], nws[i]) << what << " token " << i / K << " slot " << i % K;
  }
}

// ======================================================================= routing
TEST(Route, SoftmaxMatchesNaive) {
  for (bool renorm : {true, false})
    for (int64_t E : {1, 5, 8, 40, 128, 257})
      for (int64_t k = 1; k <= std::min<int64_t>(10, E); ++k) {
        MoeSpec s = test::small_spec(16, 16, E, k);
        s.norm_topk_prob = renorm;
        const int64_t T = 9;
        expect_route_equal(s, test::random_logits(T, E, 100 + E * 11 + k, 3.0f), nullptr, T,
                           "softmax E=" + std::to_string(E) + " k=" + std::to_string(k));
      }
  // k = E.
  MoeSpec s = test::small_spec(16, 16, 12, 12);
  expect_route_equal(s, test::random_logits(5, 12, 7), nullptr, 5, "softmax k=E");
}

TEST(Route, SoftmaxValues) {
  MoeSpec s = test::small_spec(16, 16, 4, 2);
  s.norm_topk_prob = false;
  const std::vector<float> l = {0.0f, 2.0f, 1.0f, -1.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> ws(2);
  cpu::route(s, l.data(), nullptr, 1, ids.data(), ws.data());
  const double z = 1 + std::exp(2.0) + std::exp(1.0) + std::exp(-1.0);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_NEAR(ws[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(ws[1], std::exp(1.0) / z, 1e-6);
  s.norm_topk_prob = true;
  cpu::route(s, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_NEAR(ws[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(ws[0] + ws[1], 1.0, 1e-6);
}

TEST(Route, TiesGoToTheLowerId) {
  MoeSpec s = test::small_spec(16, 16, 8, 3);
  std::vector<float> l(8, 0.5f);  // all equal
  std::vector<int32_t> ids(3);
  std::vector<float> ws(3);
  cpu::route(s, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
  // A tie at the top-k boundary: 7 and 3 both 1.0, one slot left after expert 5.
  l = {0, 0, 0, 1.0f, 0, 2.0f, 0, 1.0f};
  s.top_k = 2;
  cpu::route(s, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_EQ(ids[0], 5);
  EXPECT_EQ(ids[1], 3);
  // Equal maxima.
  l = {0, 3.0f, 0, 0, 3.0f, 0, 0, 0};
  cpu::route(s, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 4);
  EXPECT_EQ(ws[0], ws[1]);
  // Grouped: ties everywhere.
  MoeSpec d = test::small_spec(16, 16, 8, 2);
  d.routing = Routing::SigmoidGroupedTopK;
  d.n_group = 4;
  d.topk_group = 1;
  ids.resize(2);
  ws.resize(2);
  l.assign(8, 0.0f);
  cpu::route(d, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  // Two exactly tied groups (1 and 3), keep 1: group 1 wins.
  l = {0, 0, 2.0f, 1.0f, 0, 0, 1.0f, 2.0f};
  cpu::route(d, l.data(), nullptr, 1, ids.data(), ws.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3}));
}

TEST(Route, DeepSeekGroupedMatchesNaive) {
  struct Case {
    int64_t E, G, keep, k;
    bool renorm;
    float scale;
  };
  for (const Case c : {Case{16, 4, 2, 4, true, 2.5f}, Case{16, 4, 2, 4, false, 1.0f}, Case{256, 8, 4, 8, true, 2.5f},
                       Case{24, 8, 3, 6, true, 1.5f}, Case{12, 1, 1, 5, true, 2.0f}, Case{8, 8, 3, 3, true, 1.0f},
                       Case{40, 4, 4, 10, false, 2.5f}, Case{10, 2, 2, 10, true, 1.0f}}) {
    MoeSpec s = test::small_spec(16, 16, c.E, c.k);
    s.routing = Routing::SigmoidGroupedTopK;
    s.n_group = c.G;
    s.topk_group = c.keep;
    s.norm_topk_prob = c.renorm;
    s.routed_scaling_factor = c.scale;
    s.has_router_bias = true;
    s.validate();
    test::Rng rng(c.E * 7 + c.G);
    std::vector<float> bias(c.E);
    for (auto& b : bias) b = rng.normal() * 0.3f;
    const int64_t T = 17;
    const auto logits = test::random_logits(T, c.E, c.E + c.k, 2.0f);
    const std::string what = "grouped E=" + std::to_string(c.E) + " G=" + std::to_string(c.G);
    expect_route_equal(s, logits, bias.data(), T, what);
    expect_route_equal(s, logits, nullptr, T, what + " no bias");
    // Property: every chosen expert lies in a kept group; weights are the unbiased sigmoid (times scale).
    std::vector<int32_t> ids(T * c.k);
    std::vector<float> ws(T * c.k);
    cpu::route(s, logits.data(), bias.data(), T, ids.data(), ws.data());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int64_t> groups;
      float sum = 0;
      for (int64_t j = 0; j < c.k; ++j) {
        const int32_t id = ids[t * c.k + j];
        ASSERT_GE(id, 0);
        groups.push_back(id / (c.E / c.G));
        sum += ws[t * c.k + j];
      }
      std::sort(groups.begin(), groups.end());
      EXPECT_LE(std::unique(groups.begin(), groups.end()) - groups.begin(), c.keep) << what;
      if (c.renorm) EXPECT_NEAR(sum, c.scale, 1e-5 * c.scale) << what;
      if (!c.renorm) {
        const float l0 = logits[t * c.E + ids[t * c.k]];
        EXPECT_NEAR(ws[t * c.k], c.scale / (1 + std::exp(-l0)), 1e-6) << what;
      }
    }
  }
}

// ======================================================================= the layer against the naive one
TEST(Layer, MatchesNaiveAcrossShapes) {
  struct Shape {
    int64_t H, I, E, k;
    Activation act;
    int64_t shared;
    bool gated_shared;
  };
  const Shape shapes[] = {
      {80, 48, 6, 2, Activation::SwiGLU, 0, false},   {80, 48, 6, 3, Activation::SwiGLU, 32, false},
      {80, 48, 5, 2, Activation::SwiGLU, 48, true},   {80, 48, 6, 2, Activation::Relu2, 0, false},
      {80, 32, 7, 3, Activation::Relu2, 64, false},   {48, 16, 3, 3, Activation::SwiGLU, 0, false},
      {144, 80, 9, 4, Activation::SwiGLU, 0, false},
  };
  for (const Shape& sh : shapes)
    for (bool diff_scales : {false, true}) {
      const bool big = &sh - shapes < 3;  // T = 129 on the first three shapes (keeps the suite fast)
      const MoeSpec spec = spec_of(sh.H, sh.I, sh.E, sh.k, sh.act, sh.shared, sh.gated_shared);
      test::RandomWeightsOptions o;
      o.seed = sh.H + sh.I * 3 + sh.E * 5 + sh.k + (diff_scales ? 1000 : 0);
      o.different_gate_up_scales = diff_scales;
      const MoeWeights w = test::random_weights(spec, o);
      for (int64_t T : {0, 1, 7, 17, 129}) {
        if (T == 129 && !big) continue;
        const auto hidden = test::random_hidden_bf16(T, sh.H, T + 31);
        std::vector<int32_t> ids;
        std::vector<float> ws;
        test::random_topk(T, sh.E, sh.k, T * 13 + sh.E, &ids, &ws, 0.1f);
        for (Mode mode : {Mode::W4A16, Mode::W4A4})
          expect_matches_naive(w, mode, T, hidden, ids, ws,
                               spec.describe() + (diff_scales ? " diff-scales" : "") + " T=" + std::to_string(T) + " " +
                                   mode_name(mode));
      }
    }
}

TEST(Layer, Fp32MatchesNaive) {
  for (Activation act : {Activation::SwiGLU, Activation::Relu2}) {
    const MoeSpec spec = spec_of(80, 48, 6, 2, act, 32, act == Activation::SwiGLU);
    test::RandomWeightsOptions o;
    o.different_gate_up_scales = true;
    const MoeWeights w = test::random_weights(spec, o);
    const int64_t T = 17;
    const auto hidden = test::random_hidden_f32(T, 80, 3, 1.0f, false);
    std::vector<int32_t> ids;
    std::vector<float> ws;
    test::random_topk(T, 6, 2, 4, &ids, &ws, 0.1f);
    std::vector<float> got(T * 80);
    cpu::moe_forward_fp32(w, hidden.data(), T, ids.data(), ws.data(), got.data());
    const auto want = naive::layer(w, naive::Kind::F32, hidden, T, ids, ws);
    const Metrics m = compare(got, want, 1e-6, 1e-5);
    EXPECT_LE(m.rel_l2, 1e-6) << m.str();
    EXPECT_EQ(m.mismatches, 0u) << m.str();
  }
}

TEST(Layer, AdversarialRouting) {
  const MoeSpec spec = spec_of(80, 48, 6, 3, Activation::SwiGLU, 32, false);
  const MoeWeights w = test::random_weights(spec);
  const int64_t T = 40, K = 3;
  const auto hidden = test::random_hidden_bf16(T, 80, 9);
  std::vector<int32_t> ids(T * K);
  std::vector<float> ws(T * K, 0.5f);
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    // All tokens on one expert (slot 0 = expert 4), the others on 2 experts; experts 0, 3 and 5 empty.
    for (int64_t t = 0; t < T; ++t) {
      ids[t * K] = 4;
      ids[t * K + 1] = (t % 2) ? 1 : 2;
      ids[t * K + 2] = -1;
    }
    expect_matches_naive(w, mode, T, hidden, ids, ws, std::string("one expert ") + mode_name(mode));
    // Every slot -1 for some tokens (routed nowhere: the shared expert alone), a repeated id within a token.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) ids[t * K + j] = (t % 3 == 0) ? -1 : static_cast<int32_t>((t + j) % 6);
    ids[5 * K + 1] = ids[5 * K];
    expect_matches_naive(w, mode, T, hidden, ids, ws, std::string("unused slots ") + mode_name(mode));
    // No expert at all: output = shared expert.
    std::fill(ids.begin(), ids.end(), -1);
    expect_matches_naive(w, mode, T, hidden, ids, ws, std::string("all -1 ") + mode_name(mode));
  }
  // Without a shared expert, a token routed nowhere is exactly 0.
  const MoeWeights w2 = test::random_weights(spec_of(80, 48, 6, 3));
  std::fill(ids.begin(), ids.end(), -1);
  const auto out = run_ref(w2, Mode::W4A4, hidden, T, ids, ws);
  for (float v : out) ASSERT_EQ(v, 0.0f);
}

TEST(Layer, RefusesOutOfRangeIds) {
  const MoeWeights w = test::random_weights(spec_of(80, 48, 6, 2));
  const auto hidden = test::random_hidden_bf16(3, 80, 1);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 6};
  std::vector<float> ws(6, 0.5f), out(3 * 80);
  try {
    cpu::moe_forward(w, Mode::W4A16, hidden.data(), 3, ids.data(), ws.data(), out.data());
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("topk_ids[2, 1]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("got 6"), std::string::npos) << e.what();
  }
  ids[5] = -2;
  EXPECT_THROW(cpu::moe_forward(w, Mode::W4A4, hidden.data(), 3, ids.data(), ws.data(), out.data()), ArgumentError);
}

// ======================================================================= determinism, batch invariance
TEST(Layer, DeterministicAcrossRunsAndThreadCounts) {
  const MoeSpec spec = spec_of(256, 128, 16, 4, Activation::SwiGLU, 64, true);
  const MoeWeights w = test::random_weights(spec);
  const int64_t T = 67;
  const auto hidden = test::random_hidden_bf16(T, 256, 5);
  std::vector<int32_t> ids;
  std::vector<float> ws;
  test::random_topk(T, 16, 4, 6, &ids, &ws, 0.05f);
  const int saved = omp_get_max_threads();
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    const auto first = run_ref(w, mode, hidden, T, ids, ws);
    for (int threads : {1, 2, 3, 5, 1, 2}) {
      omp_set_num_threads(threads);
      const auto again = run_ref(w, mode, hidden, T, ids, ws);
      ASSERT_EQ(std::memcmp(again.data(), first.data(), first.size() * 4), 0) << mode_name(mode) << " threads " << threads;
    }
    omp_set_num_threads(saved);
  }
}

TEST(Layer, BatchInvariant) {
  const MoeSpec spec = spec_of(256, 128, 16, 4, Activation::SwiGLU, 64, false);
  const MoeWeights w = test::random_weights(spec);
  const int64_t H = 256, K = 4;
  const int64_t Tbig = 300;  // spans two internal chunks
  const auto hidden = test::random_hidden_bf16(Tbig, H, 8);
  std::vector<int32_t> ids;
  std::vector<float> ws;
  test::random_topk(Tbig, 16, K, 9, &ids, &ws, 0.05f);
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    const auto big = run_ref(w, mode, hidden, Tbig, ids, ws);
    // The first 7 tokens as a batch of their own.
    const std::vector<uint16_t> h7(hidden.begin(), hidden.begin() + 7 * H);
    const std::vector<int32_t> i7(ids.begin(), ids.begin() + 7 * K);
    const std::vector<float> w7(ws.begin(), ws.begin() + 7 * K);
    const auto small = run_ref(w, mode, h7, 7, i7, w7);
    ASSERT_EQ(std::memcmp(small.data(), big.data(), small.size() * 4), 0) << mode_name(mode);
    for (int64_t t : {0, 3, 6, 255, 256, 299}) {
      const std::vector<uint16_t> h1(hidden.begin() + t * H, hidden.begin() + (t + 1) * H);
      const std::vector<int32_t> i1(ids.begin() + t * K, ids.begin() + (t + 1) * K);
      const std::vector<float> w1(ws.begin() + t * K, ws.begin() + (t + 1) * K);
      const auto alone = run_ref(w, mode, h1, 1, i1, w1);
      ASSERT_EQ(std::memcmp(alone.data(), big.data() + t * H, H * 4), 0) << mode_name(mode) << " token " << t;
      if (t < 7) ASSERT_EQ(std::memcmp(alone.data(), small.data() + t * H, H * 4), 0) << mode_name(mode) << " token " << t;
    }
  }
}

// ======================================================================= accuracy against the fp32 layer
TEST(Layer, AccuracyAgainstFp32) {
  for (Activation act : {Activation::SwiGLU, Activation::Relu2}) {
    const MoeSpec spec = spec_of(512, 256, 16, 4, act, act == Activation::SwiGLU ? 256 : 0, false);
    const MoeWeights w = test::random_weights(spec);
    const int64_t T = 64;
    const auto hidden = test::random_hidden_bf16(T, 512, 10);
    const auto logits = test::random_logits(T, 16, 11);
    std::vector<int32_t> ids(T * 4);
    std::vector<float> ws(T * 4);
    cpu::route(spec, logits.data(), nullptr, T, ids.data(), ws.data());
    std::vector<float> ref(T * 512);
    cpu::moe_forward_fp32(w, test::bf16_to_f32(hidden).data(), T, ids.data(), ws.data(), ref.data());
    for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
      const Metrics m = compare(run_ref(w, mode, hidden, T, ids, ws), ref);
      std::printf("  %s %s vs fp32: cosine %.6f rel_l2 %.3e rms %.4f\n", activation_name(act), mode_name(mode),
                  m.cosine, m.rel_l2, m.rms_ratio);
      // w4a16 differs from fp32 only by the bf16 intermediate: cosine ~0.999999. w4a4 quantizes both GEMM
      // inputs; one NVFP4 quantization of Gaussian data has ~9.4% relative RMS error even with ideal block
      // scales (e2m1 grid, 16-blocks), so two of them plus SwiGLU give rel_l2 ~0.16, cosine ~0.987 (relu^2,
      // which squares the error and zeroes small values in blocks with a large max: ~0.979, rms ~0.93).
      // The thresholds sit just below those measured values.
      const double min_cos = mode == Mode::W4A16 ? 0.995 : act == Activation::SwiGLU ? 0.983 : 0.97;
      EXPECT_GE(m.cosine, min_cos) << m.str();
      EXPECT_NEAR(m.rms_ratio, 1.0, mode == Mode::W4A16 ? 0.01 : act == Activation::SwiGLU ? 0.03 : 0.1) << m.str();
    }
  }
}

// ======================================================================= calibration statistics
TEST(Layer, CalibrationStats) {
  const MoeSpec spec = spec_of(80, 48, 6, 2, Activation::SwiGLU, 32, false);
  const MoeWeights w = test::random_weights(spec);
  const int64_t T = 20;
  const auto hidden = test::random_hidden_bf16(T, 80, 12);
  std::vector<int32_t> ids;
  std::vector<float> ws;
  test::random_topk(T, 6, 2, 13, &ids, &ws);
  for (int64_t t = 0; t < T; ++t)  // expert 5 sees no tokens
    for (int j = 0; j < 2; ++j)
      if (ids[t * 2 + j] == 5) ids[t * 2 + j] = -1;
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    cpu::CalibrationStats st;
    std::vector<float> out(T * 80);
    cpu::moe_forward(w, mode, hidden.data(), T, ids.data(), ws.data(), out.data(), &st);
    std::vector<naive::Amax> am(6);
    naive::Amax sam;
    naive::layer(w, kind_of(mode), test::bf16_to_f32(hidden), T, ids, ws, &am, &sam);
    ASSERT_EQ(st.gemm1_amax.size(), 6u);
    ASSERT_EQ(st.shared_gemm1_amax.size(), 1u);
    for (int e = 0; e < 6; ++e) {
      EXPECT_EQ(st.gemm1_amax[e], am[e].g1) << e;
      EXPECT_EQ(st.gemm2_amax[e], am[e].g2) << e;
    }
    EXPECT_EQ(st.gemm1_amax[5], 0.0f);
    EXPECT_EQ(st.shared_gemm1_amax[0], sam.g1);
    EXPECT_EQ(st.shared_gemm2_amax[0], sam.g2);
    // A second forward accumulates (max): on half the tokens nothing grows.
    const auto before = st.gemm2_amax;
    cpu::moe_forward(w, mode, hidden.data(), T / 2, ids.data(), ws.data(), out.data(), &st);
    EXPECT_EQ(st.gemm2_amax, before);
  }
}

// ======================================================================= timing smoke test
TEST(Layer, Qwen3_30B_ShapeTiming) {
  MoeSpec spec = spec_of(2048, 768, 128, 8);
  test::RandomWeightsOptions o;
  o.random_codes = true;
  auto t0 = std::chrono::steady_clock::now();
  const MoeWeights w = test::random_weights(spec, o);
  const double gen = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t T = 64;
  const auto hidden = test::random_hidden_bf16(T, 2048, 1);
  const auto logits = test::random_logits(T, 128, 2);
  std::vector<int32_t> ids(T * 8);
  std::vector<float> ws(T * 8);
  cpu::route(spec, logits.data(), nullptr, T, ids.data(), ws.data());
  std::vector<float> out(T * 2048);
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    cpu::moe_forward(w, mode, hidden.data(), T, ids.data(), ws.data(), out.data());
    const double cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  qwen3-30b layer (H2048 I768 E128 k8) T=64 %s: %.2f s wall, %.2f s cpu, %d threads"
                " (weights generated in %.2f s)\n", mode_name(mode), s, cpu_s, omp_get_max_threads(), gen);
    EXPECT_LT(s, 60.0);
    for (float v : out) ASSERT_TRUE(std::isfinite(v));
  }
}

}  // namespace
}  // namespace nvfp4moe
