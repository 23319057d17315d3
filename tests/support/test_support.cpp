#include "support/test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::test {

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
float Rng::uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
float Rng::normal() {
  const double u1 = std::max(static_cast<double>(uniform()), 1e-7), u2 = uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
int64_t Rng::below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

void quantize_weight_matrix(const float* w, int64_t rows, int64_t cols, float ws2, uint8_t* packed, uint8_t* scales) {
  uint8_t codes[fmt::kBlock];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / fmt::kBlock; ++b) {
      scales[r * (cols / 16) + b] = fmt::quantize_weight_block(w + r * cols + b * 16, 16, ws2, codes);
      for (int i = 0; i < 8; ++i)
        packed[r * (cols / 2) + b * 8 + i] = fmt::pack_e2m1x2(codes[2 * i], codes[2 * i + 1]);
    }
}

namespace {

float amax_of(const std::vector<float>& v) {
  float m = 0.0f;
  for (float x : v) m = std::fmax(m, std::fabs(x));
  return m;
}

// Random [rows, cols] with per-row magnitudes.
std::vector<float> random_matrix(Rng& rng, int64_t rows, int64_t cols, const RandomWeightsOptions& o) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  const float base = o.weight_std / std::sqrt(static_cast<float>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float m = base * rng.uniform(1.0f - o.row_spread, 1.0f);
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = rng.normal() * m;
  }
  return w;
}

void random_bytes(Rng& rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t v = rng.next();
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

void fill_experts(StackedExperts& s, int64_t E, int64_t H, int64_t I, bool gated, uint64_t seed,
                  const RandomWeightsOptions& o) {
  s.allocate(E, H, I, gated);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < E; ++e) {
    Rng rng(seed * 1000003ull + static_cast<uint64_t>(e));
    const size_t ue = static_cast<size_t>(e);
    if (o.random_codes) {
      random_bytes(rng, s.w13.data() + ue * s.w13_bytes_per_expert(), s.w13_bytes_per_expert());
      random_bytes(rng, s.w2.data() + ue * s.w2_bytes_per_expert(), s.w2_bytes_per_expert());
      uint8_t* sc = s.w13_scale.data() + ue * s.w13_scale_bytes_per_expert();
      for (size_t i = 0; i < s.w13_scale_bytes_per_expert(); ++i) sc[i] = static_cast<uint8_t>(0x28 + rng.below(25));
      sc = s.w2_scale.data() + ue * s.w2_scale_bytes_per_expert();
      for (size_t i = 0; i < s.w2_scale_bytes_per_expert(); ++i) sc[i] = static_cast<uint8_t>(0x28 + rng.below(25));
      if (gated) s.w13_gate_scale2[ue] = rng.uniform(0.5f, 1.5f) / (64.0f * std::sqrt(static_cast<float>(H)));
      s.w13_up_scale2[ue] = gated && !o.different_gate_up_scales ? s.w13_gate_scale2[ue]
                                                                 : rng.uniform(0.5f, 1.5f) / (64.0f * std::sqrt(static_cast<float>(H)));
      s.w2_scale2[ue] = rng.uniform(0.5f, 1.5f) / (64.0f * std::sqrt(static_cast<float>(I)));
      s.w13_input_scale[ue] = o.gemm1_amax * rng.uniform(0.9f, 1.3f) / fmt::kWeightScaleDenom;
      s.w2_input_scale[ue] = o.gemm2_amax * rng.uniform(0.9f, 1.3f) / fmt::kWeightScaleDenom;
      continue;
    }
    // GEMM1: gate rows 0..I-1, up rows I..2I-1 (or up only).
    std::vector<float> gate = gated ? random_matrix(rng, I, H, o) : std::vector<float>();
    std::vector<float> up = random_matrix(rng, I, H, o);
    uint8_t* w13 = s.w13.data() + ue * s.w13_bytes_per_expert();
    uint8_t* w13s = s.w13_scale.data() + ue * s.w13_scale_bytes_per_expert();
    if (gated) {
      float gs2, us2;
      if (o.different_gate_up_scales) {
        const float f = rng.uniform(0.25f, 0.75f);
        for (float& x : up) x *= f;
        gs2 = fmt::weight_global_scale(amax_of(gate));
        us2 = fmt::weight_global_scale(amax_of(up));
      } else {
        gs2 = us2 = fmt::weight_global_scale(std::fmax(amax_of(gate), amax_of(up)));
      }
      s.w13_gate_scale2[ue] = gs2;
      s.w13_up_scale2[ue] = us2;
      quantize_weight_matrix(gate.data(), I, H, gs2, w13, w13s);
      quantize_weight_matrix(up.data(), I, H, us2, w13 + I * H / 2, w13s + I * H / 16);
    } else {
      s.w13_up_scale2[ue] = fmt::weight_global_scale(amax_of(up));
      quantize_weight_matrix(up.data(), I, H, s.w13_up_scale2[ue], w13, w13s);
    }
    std::vector<float> down = random_matrix(rng, H, I, o);
    s.w2_scale2[ue] = fmt::weight_global_scale(amax_of(down));
    quantize_weight_matrix(down.data(), H, I, s.w2_scale2[ue], s.w2.data() + ue * s.w2_bytes_per_expert(),
                           s.w2_scale.data() + ue * s.w2_scale_bytes_per_expert());
    s.w13_input_scale[ue] = o.gemm1_amax * rng.uniform(0.9f, 1.3f) / fmt::kWeightScaleDenom;
    s.w2_input_scale[ue] = o.gemm2_amax * rng.uniform(0.9f, 1.3f) / fmt::kWeightScaleDenom;
  }
}

}  // namespace

MoeWeights clone_weights(const MoeWeights& w) {
  auto copy = [](const StackedExperts& s, StackedExperts& d) {
    if (s.num_experts == 0) return;
    d.allocate(s.num_experts, s.hidden, s.intermediate, s.gated);
    std::memcpy(d.w13.data(), s.w13.data(), s.w13.size());
    std::memcpy(d.w13_scale.data(), s.w13_scale.data(), s.w13_scale.size());
    std::memcpy(d.w2.data(), s.w2.data(), s.w2.size());
    std::memcpy(d.w2_scale.data(), s.w2_scale.data(), s.w2_scale.size());
    d.w13_gate_scale2 = s.w13_gate_scale2;
    d.w13_up_scale2 = s.w13_up_scale2;
    d.w13_input_scale = s.w13_input_scale;
    d.w2_scale2 = s.w2_scale2;
    d.w2_input_scale = s.w2_input_scale;
  };
  MoeWeights c;
  c.spec = w.spec;
  copy(w.experts, c.experts);
  copy(w.shared, c.shared);
  c.router_weight = w.router_weight;
  c.router_bias = w.router_bias;
  c.shared_gate_weight = w.shared_gate_weight;
  return c;
}

MoeWeights random_weights(const MoeSpec& spec, const RandomWeightsOptions& o) {
  spec.validate();
  MoeWeights w;
  w.spec = spec;
  Rng rng(o.seed);
  const int64_t H = spec.hidden, E = spec.num_experts;
  fill_experts(w.experts, E, H, spec.intermediate, spec.gated(), o.seed * 2 + 1, o);
  if (spec.shared_intermediate > 0)
    fill_experts(w.shared, 1, H, spec.shared_intermediate, spec.gated(), o.seed * 2 + 2, o);
  w.router_weight.resize(static_cast<size_t>(E * H));
  const float rs = o.router_std / std::sqrt(static_cast<float>(H));
  for (auto& v : w.router_weight) v = fmt::bf16_from_float(rng.normal() * rs);
  if (spec.has_router_bias) {
    w.router_bias.resize(static_cast<size_t>(E));
    for (auto& v : w.router_bias) v = rng.normal() * o.bias_std;
  }
  if (spec.shared_expert_gated) {
    w.shared_gate_weight.resize(static_cast<size_t>(H));
    for (auto& v : w.shared_gate_weight) v = fmt::bf16_from_float(rng.normal() * rs);
  }
  w.validate();
  return w;
}

std::vector<uint16_t> random_hidden_bf16(int64_t T, int64_t H, uint64_t seed, float scale) {
  Rng rng(seed ^ 0x4849444445ull);
  std::vector<uint16_t> v(static_cast<size_t>(T * H));
  for (auto& x : v) x = fmt::bf16_from_float(rng.normal() * scale);
  return v;
}

std::vector<float> random_hidden_f32(int64_t T, int64_t H, uint64_t seed, float scale, bool exact_bf16) {
  Rng rng(seed ^ 0x4849444445ull);
  std::vector<float> v(static_cast<size_t>(T * H));
  for (auto& x : v) {
    x = rng.normal() * scale;
    if (exact_bf16) x = fmt::bf16_round(x);
  }
  return v;
}

std::vector<float> bf16_to_f32(const std::vector<uint16_t>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = fmt::bf16_to_float(v[i]);
  return r;
}

std::vector<float> random_logits(int64_t T, int64_t E, uint64_t seed, float scale) {
  Rng rng(seed ^ 0x4C4F474954ull);
  std::vector<float> v(static_cast<size_t>(T * E));
  for (auto& x : v) x = rng.normal() * scale;
  return v;
}

void random_topk(int64_t T, int64_t E, int64_t k, uint64_t seed, std::vector<int32_t>* ids, std::vector<float>* weights,
                 float unused_prob) {
  NVFP4MOE_CHECK(k >= 1 && k <= E, ArgumentError, "random_topk: k must be in [1, E=", E, "], got ", k);
  Rng rng(seed ^ 0x544F504Bull);
  ids->assign(static_cast<size_t>(T * k), -1);
  weights->assign(static_cast<size_t>(T * k), 0.0f);
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) perm[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < k; ++j) {  // partial Fisher-Yates: k distinct ids
      const int64_t p = j + rng.below(E - j);
      std::swap(perm[j], perm[p]);
      (*weights)[t * k + j] = rng.uniform(0.05f, 1.0f);
      (*ids)[t * k + j] = rng.uniform() < unused_prob ? -1 : perm[j];
    }
  }
}

Metrics compare(const float* got, const float* ref, size_t n, double atol, double rtol) {
  Metrics m;
  double d2 = 0, r2 = 0, g2 = 0, gr = 0;
  for (size_t i = 0; i < n; ++i) {
    const double g = got[i], r = ref[i], d = g - r;
    if (!std::isfinite(g) && std::isfinite(r)) ++m.nonfinite;
    d2 += d * d;
    r2 += r * r;
    g2 += g * g;
    gr += g * r;
    m.max_abs = std::max(m.max_abs, std::fabs(d));
    if (!(std::fabs(d) <= atol + rtol * std::fabs(r))) ++m.mismatches;
  }
  m.rel_l2 = r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
  m.rms_ratio = r2 > 0 ? std::sqrt(g2 / r2) : (g2 == 0 ? 1.0 : 0.0);
  m.cosine = (r2 > 0 && g2 > 0) ? gr / std::sqrt(r2 * g2) : (r2 == 0 && g2 == 0 ? 1.0 : 0.0);
  return m;
}

std::string Metrics::str() const {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "rel_l2=%.3e rms=%.5f max_abs=%.3e cos=%.6f mismatches=%zu", rel_l2, rms_ratio,
                max_abs, cosine, mismatches);
  return buf;
}

TensorRef cpu_tensor(const void* data, DType dtype, std::vector<int64_t> shape) {
  TensorRef t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.device = DeviceType::CPU;
  return t;
}

MoeSpec small_spec(int64_t H, int64_t I, int64_t E, int64_t k) {
  MoeSpec s;
  s.hidden = H;
  s.intermediate = I;
  s.num_experts = E;
  s.top_k = k;
  return s;
}

RoutedTokens round_robin_tokens(const MoeSpec& s, int64_t t, uint64_t seed) {
  RoutedTokens k;
  k.t = t;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  k.hidden.resize(static_cast<size_t>(t * s.hidden));
  for (auto& h : k.hidden) h = fmt::bf16_from_float(nd(rng));
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j < s.top_k; ++j) {
      k.ids.push_back(static_cast<int32_t>((i + j) % s.num_experts));
      k.weights.push_back(1.0f / static_cast<float>(s.top_k));
    }
  return k;
}

std::vector<float> cpu_forward(const MoeWeights& w, Mode mode, const RoutedTokens& k) {
  std::vector<float> out(static_cast<size_t>(k.t * w.spec.hidden));
  cpu::moe_forward(w, mode, k.hidden.data(), k.t, k.ids.data(), k.weights.data(), out.data());
  return out;
}

void reference_quantize_weights(const std::vector<float>& w, int64_t n, int64_t k, float ws2,
                                std::vector<uint8_t>& packed, std::vector<uint8_t>& scales) {
  packed.assign(static_cast<size_t>(n * k / 2), 0);
  scales.assign(static_cast<size_t>(n * k / 16), 0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / 16; ++b) {
      float amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(w[static_cast<size_t>(r * k + b * 16 + i)]));
      const uint8_t s8 = fmt::weight_block_scale(amax, ws2);
      scales[static_cast<size_t>(r * (k / 16) + b)] = s8;
      const float denom = fmt::e4m3_decode(s8) * ws2;
      for (int i = 0; i < 16; i += 2) {
        const uint8_t lo = fmt::e2m1_encode(w[static_cast<size_t>(r * k + b * 16 + i)] / denom);
        const uint8_t hi = fmt::e2m1_encode(w[static_cast<size_t>(r * k + b * 16 + i + 1)] / denom);
        packed[static_cast<size_t>(r * (k / 2) + b * 8 + i / 2)] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
}

}  // namespace nvfp4moe::test
