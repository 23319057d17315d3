// Shared test helpers: #include "support/test_support.h" (library nvfp4moe_test_support, which every test
// executable links; CPU-only code, usable from tests/cuda too):
//   - Rng: a small deterministic counter-based generator (same seed, same numbers, on every platform).
//   - random_weights(spec, options): a complete MoeWeights for any valid MoeSpec, built in memory by
//     quantizing random fp32 weights with the fmt:: quantizer exactly as the ModelOpt exporter does
//     (nvfp4-format.md section 3: gate and up of an expert share one amax unless asked otherwise), random
//     positive input scales, router weight / bias / shared gate weight as the spec asks. validate()s it.
//   - random_hidden_bf16 / random_hidden_f32 / random_logits / random_topk: inputs.
//   - compare(got, ref, n): rel_l2, rms_ratio, max_abs, cosine (testing.md: element-wise + rel L2 + RMS ratio).
//   - cpu_tensor(...): a TensorRef over host memory.
//   - round_robin_tokens / cpu_forward: fixed tokens through cpu::moe_forward (checkpoint-equivalence tests).
//   - reference_quantize_weights: the section-3 weight quantizer written out from fmt:: primitives.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/spec.h"
#include "nvfp4moe/tensor.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe::test {

// SplitMix64. uniform() in [0, 1) with 24 bits; normal() by Box-Muller.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next();
  float uniform();
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  float normal();
  int64_t below(int64_t n);  // uniform integer in [0, n)

 private:
  uint64_t s_;
};

struct RandomWeightsOptions {
  uint64_t seed = 1;
  // Weights are N(0, 1) * weight_std / sqrt(K) per row (K = the reduction dim), so GEMM outputs are O(1) for
  // O(1) inputs. Each row also gets a random magnitude in [1 - row_spread, 1] so block scales vary.
  float weight_std = 1.0f;
  float row_spread = 0.5f;
  // false: gate and up share one amax (equal weight_scale_2, as ModelOpt exports). true: up's weights are
  // scaled by a random factor in [0.25, 0.75] and quantized with their own amax (different scales).
  bool different_gate_up_scales = false;
  // input_scale = amax * U(0.9, 1.3) / 2688 with these typical activation amax values (GEMM1 input: the
  // hidden states of random_hidden_* with scale 1; GEMM2 input: the intermediate).
  float gemm1_amax = 4.5f;
  float gemm2_amax = 4.0f;
  // true: fill codes and block scales with random bytes (block scale codes in [0x28, 0x40]) instead of
  // quantizing random weights: valid NVFP4, much faster, for timing tests of full-size shapes.
  bool random_codes = false;
  float router_std = 1.0f;   // router weight N(0, router_std / sqrt(H)), rounded to bf16
  float bias_std = 0.1f;     // e_score_correction_bias N(0, bias_std) when spec.has_router_bias
};

// A valid MoeWeights for `spec` (which must itself be valid). Deterministic in options.seed (each expert has
// its own generator, so the result does not depend on the OpenMP thread count).
MoeWeights random_weights(const MoeSpec& spec, const RandomWeightsOptions& options = {});
// A deep copy (MoeWeights is move-only: one packed copy per layer), for tests that build two layers from one set.
MoeWeights clone_weights(const MoeWeights& w);

// Quantizes one fp32 weight matrix w [rows, cols] (cols % 16 == 0) with the given weight_scale_2 into packed
// codes [rows, cols/2] and block scales [rows, cols/16] (the exporter's section-3 quantizer).
void quantize_weight_matrix(const float* w, int64_t rows, int64_t cols, float weight_scale_2, uint8_t* packed,
                            uint8_t* scales);

// hidden [T, H]: N(0, 1) * scale; the f32 variant's values are exact bf16 values unless exact_bf16 = false.
std::vector<uint16_t> random_hidden_bf16(int64_t T, int64_t H, uint64_t seed, float scale = 1.0f);
std::vector<float> random_hidden_f32(int64_t T, int64_t H, uint64_t seed, float scale = 1.0f, bool exact_bf16 = true);
std::vector<float> bf16_to_f32(const std::vector<uint16_t>& v);
// router logits [T, E]: N(0, 1) * scale.
std::vector<float> random_logits(int64_t T, int64_t E, uint64_t seed, float scale = 1.0f);
// Random top-k routing [T, k]: k distinct ids per token, weights U(0.05, 1); each slot is -1 with
// probability unused_prob.
void random_topk(int64_t T, int64_t E, int64_t k, uint64_t seed, std::vector<int32_t>* ids, std::vector<float>* weights,
                 float unused_prob = 0.0f);

struct Metrics {
  double rel_l2 = 0;     // ||got - ref|| / ||ref|| (||got - ref|| when ref is all zero)
  double rms_ratio = 0;  // rms(got) / rms(ref) (1 when both are zero)
  double max_abs = 0;    // max |got - ref|
  double cosine = 0;     // got . ref / (||got|| ||ref||) (1 when both are zero)
  size_t mismatches = 0; // elements with |got - ref| > atol + rtol |ref| (see compare)
  size_t nonfinite = 0;  // NaN/Inf in got where ref is finite
  std::string str() const;  // "rel_l2=1.2e-07 rms=1.00000 max_abs=3e-06 cos=1.000000"
};
// All in double. atol/rtol define `mismatches`.
Metrics compare(const float* got, const float* ref, size_t n, double atol = 0.0, double rtol = 0.0);
inline Metrics compare(const std::vector<float>& got, const std::vector<float>& ref, double atol = 0.0,
                       double rtol = 0.0) {
  return compare(got.data(), ref.data(), std::min(got.size(), ref.size()), atol, rtol);
}

// A contiguous TensorRef over host memory.
TensorRef cpu_tensor(const void* data, DType dtype, std::vector<int64_t> shape);

// A small valid spec: softmax top-k, SwiGLU, renormalized.
MoeSpec small_spec(int64_t H, int64_t I, int64_t E, int64_t k);

// T tokens for tests that compare two loads of one layer: N(0, 1) bf16 hidden states (std::mt19937_64 from seed),
// token i routed to experts (i + j) % E, j < k, each with weight 1 / k. cpu_forward: cpu::moe_forward of them.
struct RoutedTokens {
  int64_t t = 0;
  std::vector<uint16_t> hidden;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
RoutedTokens round_robin_tokens(const MoeSpec& spec, int64_t t, uint64_t seed);
std::vector<float> cpu_forward(const MoeWeights& w, Mode mode, const RoutedTokens& tokens);

// The section-3 weight quantizer written out from fmt:: primitives (the block's amax, weight_block_scale, each
// value divided by sf * ws2 and e2m1-encoded), independently of fmt::quantize_weight_block and of the library's
// quantizers that the quantize / quantize-at-load tests check against it: w [n, k] -> packed codes [n, k / 2]
// (element 2i in the low nibble), block scales [n, k / 16].
void reference_quantize_weights(const std::vector<float>& w, int64_t n, int64_t k, float ws2,
                                std::vector<uint8_t>& packed, std::vector<uint8_t>& scales);

}  // namespace nvfp4moe::test
