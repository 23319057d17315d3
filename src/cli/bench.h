// `nvfp4moe bench`: the shapes (presets), the bytes/FLOPs a layer must move and compute, the host-side
// inputs (random hidden states, near-uniform or skewed router logits) and the random-weights builder.
// Everything here is host code (no CUDA), so tests/cli/test_bench_accounting.cpp checks it on any machine.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/spec.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe::cli::bench {

// ------------------------------------------------------------------ shapes (../shared/docs/benchmarks.md)
struct Preset {
  const char* name;
  MoeSpec spec;
};

inline MoeSpec softmax_spec(int64_t H, int64_t I, int64_t E, int64_t k) {
  MoeSpec s;
  s.hidden = H;
  s.intermediate = I;
  s.num_experts = E;
  s.top_k = k;
  s.activation = Activation::SwiGLU;
  s.routing = Routing::SoftmaxTopK;
  s.norm_topk_prob = true;
  return s;
}

inline std::vector<Preset> presets() {
  std::vector<Preset> p;
  {  // DeepSeek-V3: sigmoid + bias, 8 groups keep 4, x2.5, one shared expert of I = 2048
    MoeSpec s = softmax_spec(7168, 2048, 256, 8);
    s.routing = Routing::SigmoidGroupedTopK;
    s.n_group = 8;
    s.topk_group = 4;
    s.routed_scaling_factor = 2.5f;
    s.has_router_bias = true;
    s.shared_intermediate = 2048;
    p.push_back({"deepseek-v3", s});
  }
  p.push_back({"qwen3-235b", softmax_spec(4096, 1536, 128, 8)});
  p.push_back({"qwen3-30b", softmax_spec(2048, 768, 128, 8)});
  p.push_back({"gpt-oss-120b", softmax_spec(2880, 2880, 128, 4)});
  {  // Nemotron-3 Nano (Nemotron-H MoE): relu^2 non-gated experts, sigmoid + bias routing, shared expert 3712
    MoeSpec s = softmax_spec(2688, 1856, 128, 6);
    s.activation = Activation::Relu2;
    s.routing = Routing::SigmoidGroupedTopK;
    s.n_group = 1;
    s.topk_group = 1;
    s.routed_scaling_factor = 2.5f;
    s.has_router_bias = true;
    s.shared_intermediate = 3712;
    p.push_back({"nemotron-nano", s});
  }
  return p;
}

// ------------------------------------------------------------------ what one forward must move / compute
// Bytes of the NVFP4 weights (e2m1 codes, 0.5 B/param) and e4m3 block scales (1 B / 16 params) of one expert
// of width `intermediate`: GEMM1 [N1, H] (N1 = 2I gated, I for relu2) and GEMM2 [H, I].
struct ExpertBytes {
  int64_t codes = 0;
  int64_t scales = 0;
  int64_t total() const { return codes + scales; }
};
inline ExpertBytes expert_bytes(int64_t hidden, int64_t intermediate, bool gated) {
  const int64_t n1 = gated ? 2 * intermediate : intermediate;
  ExpertBytes b;
  b.codes = n1 * hidden / 2 + hidden * intermediate / 2;
  b.scales = n1 * hidden / 16 + hidden * intermediate / 16;
  return b;
}

struct Accounting {
  int64_t tokens = 0;
  int64_t pairs = 0;            // valid (token, expert) slots (ids != -1)
  int64_t experts_touched = 0;  // distinct routed experts hit at least once
  int64_t weight_code_bytes = 0;   // e2m1 codes of the touched experts (+ the shared expert)
  int64_t weight_scale_bytes = 0;  // e4m3 block scales of the same
  int64_t shared_bytes = 0;        // of which the shared expert (codes + scales), 0 without one
  int64_t activation_bytes = 0;    // hidden in (bf16) + router logits in (f32) + out (out_bytes per value)
  int64_t bytes = 0;               // all of the above
  double flops = 0;                // 2 * pairs * (3 or 2) * H * I  (+ 2 * T * (3 or 2) * H * Is for the shared expert)
  double shared_flops = 0;
  bool includes_shared = false;
};

// topk_ids [T, k] (-1 = unused slot, as cpu::route and the layer API use them). out_bytes: 2 (bf16) or 4 (f32).
inline Accounting account(const MoeSpec& spec, int64_t tokens, const int32_t* topk_ids, int out_bytes = 2) {
  Accounting a;
  a.tokens = tokens;
  const int64_t E = spec.num_experts, k = spec.top_k, H = spec.hidden;
  std::vector<char> hit(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < tokens * k; ++i) {
    const int32_t id = topk_ids[i];
    if (id < 0 || id >= E) continue;
    ++a.pairs;
    hit[static_cast<size_t>(id)] = 1;
  }
  for (char h : hit) a.experts_touched += h;
  const bool gated = spec.gated();
  const double mm = gated ? 3.0 : 2.0;  // GEMMs per expert: gate + up + down, or up + down
  const ExpertBytes eb = expert_bytes(H, spec.intermediate, gated);
  a.weight_code_bytes = a.experts_touched * eb.codes;
  a.weight_scale_bytes = a.experts_touched * eb.scales;
  a.flops = 2.0 * static_cast<double>(a.pairs) * mm * static_cast<double>(H) * static_cast<double>(spec.intermediate);
  if (spec.shared_intermediate > 0 && tokens > 0) {
    const ExpertBytes sb = expert_bytes(H, spec.shared_intermediate, gated);
    a.includes_shared = true;
    a.shared_bytes = sb.total();
    a.weight_code_bytes += sb.codes;
    a.weight_scale_bytes += sb.scales;
    a.shared_flops = 2.0 * static_cast<double>(tokens) * mm * static_cast<double>(H) *
                     static_cast<double>(spec.shared_intermediate);
    a.flops += a.shared_flops;
  }
  a.activation_bytes = tokens * H * 2 + tokens * E * 4 + tokens * H * out_bytes;
  a.bytes = a.weight_code_bytes + a.weight_scale_bytes + a.activation_bytes;
  return a;
}

// ------------------------------------------------------------------ random numbers and inputs
// SplitMix64: counter-based, so every chunk of a buffer can be filled by any thread from (seed, chunk index)
// and the contents do not depend on the thread count.
inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform: random logits (near-uniform expected load, each expert's count varies around T k / E). Skewed: a few
// hot experts. Balanced: token t's top-k are the k experts (t k + j) mod E, j < k, so every expert gets exactly
// T k / E rows when T is a multiple of E / gcd(E, k): the load of a perfectly balanced deployment, and the case
// without partial token tiles (what uniform's tails cost is the difference between the two).
enum class RoutingKind { Uniform, Skewed, Balanced };
inline const char* routing_kind_name(RoutingKind r) {
  return r == RoutingKind::Uniform ? "uniform" : r == RoutingKind::Skewed ? "skewed" : "balanced";
}

// The skewed case: logits of experts 0..kHotExperts-1 get +kHotBoost (what bench/torch_baseline.py does, so
// the baseline sees the same kind of load).
inline constexpr int kHotExperts = 4;
inline constexpr float kHotBoost = 4.0f;

// router logits [T, E] f32: N(0, 1) (near-uniform expected load), + kHotBoost on the hot experts if skewed;
// balanced: token t's experts (t top_k + j) mod E get kBalancedLogit + N(0, 1) / 4, the rest N(0, 1) -
// kBalancedLogit (a gap that also survives DeepSeek's sigmoid, its router bias and its group scores).
inline constexpr float kBalancedLogit = 10.0f;
std::vector<float> random_logits(int64_t tokens, int64_t experts, RoutingKind kind, uint64_t seed,
                                 int64_t top_k = 1);
// hidden [T, H] bf16 bits: uniform in [-sqrt(3), sqrt(3)) (unit variance), never exactly zero.
std::vector<uint16_t> random_hidden(int64_t tokens, int64_t hidden, uint64_t seed);

// A complete, valid MoeWeights for `spec` from random bytes: every e2m1 code pair is valid FP4, block scales
// are e4m3 codes in [0x28, 0x40] (0.25 .. 2), per-expert weight_scale_2 ~ U(0.5, 1.5) / (64 sqrt(K)) and
// input scales of a typical activation amax / 2688 (so w4a4 quantizes sanely); router bias N(0, 0.01) when
// the spec has one; no router weight (the bench passes logits). Threaded (OpenMP) over 1 MiB chunks;
// deterministic in `seed`. validate()s the result.
MoeWeights random_bench_weights(const MoeSpec& spec, uint64_t seed);
// The router bias random_bench_weights(spec, seed) draws (so --dry-run routes exactly like the real run).
std::vector<float> random_router_bias(int64_t experts, uint64_t seed);

}  // namespace nvfp4moe::cli::bench
