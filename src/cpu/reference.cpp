// The CPU reference backend (src/cpu/reference.h): nvfp4-format.md section 9, step by step.
//
// Arithmetic contract (what makes the results deterministic and batch invariant):
//   - Every dot product is an fp32 sum over k = 0, 1, ..., K-1 in that order, starting from +0.0f, of the
//     fp32 products op[k] * w[k], where w[k] = e2m1(code) * e4m3(scale) (exact) and op[k] is the bf16 value
//     (w4a16) or e2m1(q) * e4m3(sf) of the quantized activation (w4a4, exact). The loops are vectorized ACROSS
//     output rows (16 rows per tile, one lane each), never across k, so the order above holds bit for bit.
//   - The per-tensor factor alpha is applied once after the sum: alpha = weight_scale_2 (w4a16) or
//     input_scale * weight_scale_2 (w4a4, one fp32 product), gate and up each their own.
//   - Each output element is computed by exactly one thread, from data that depend only on its own token,
//     so the thread count and the other tokens of the batch never change a bit.
//   - Combine: acc = +0.0f; for j = 0..k-1 (id != -1): acc += w_j * y_j; then acc += y_shared (times
//     sigmoid(x . shared_gate) for a gated shared expert).
//
// Work layout: tokens are processed in chunks of kChunk tokens (bounds the scratch memory for any T); inside a
// chunk the (token, slot) pairs are grouped by expert (stable: token order within an expert), each expert's
// weights are dequantized (code * block scale) tile by tile into a per-thread scratch laid out [K][16], and
// all the expert's rows are multiplied against that tile. OpenMP over (expert, 16-row tile) work items.
#include "cpu/reference.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cpu {

namespace {

constexpr int64_t kTile = 16;     // output rows per work item (one SIMD lane each)
constexpr int64_t kChunk = 256;   // tokens per chunk

// Decoded e2m1 pairs of one packed byte (low nibble = even element) and decoded e4m3 codes.
struct Tables {
  float pair[256][2];
  float e4m3[256];
  Tables() {
    for (int b = 0; b < 256; ++b) {
      pair[b][0] = fmt::e2m1_decode(static_cast<uint8_t>(b & 0xF));
      pair[b][1] = fmt::e2m1_decode(static_cast<uint8_t>(b >> 4));
      e4m3[b] = fmt::e4m3_decode(static_cast<uint8_t>(b));
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

// How the GEMM operands are formed.
enum class Path { W4A16, W4A4, F32 };

// Rows of one chunk grouped by expert: rows offsets[e] .. offsets[e+1]-1 belong to expert e.
struct Groups {
  std::vector<int64_t> offsets;  // [E+1]
  std::vector<int64_t> token;    // [R] token index (global) of each row
  std::vector<int32_t> expert;   // [R]
  int64_t rows() const { return static_cast<int64_t>(token.size()); }
};

// One expert group's weights (routed experts or the fused shared expert).
struct ExpertWeights {
  const StackedExperts* s;
  int64_t n1, k1, n2, k2;
};

// C[r, n] = sum_k A[r, k] * Wdq[e(r)][n][k] over the rows of each expert, Wdq = code * block scale
// (times row_mult when given: the fp32 path folds weight_scale_2 into the dequantized weights).
// row_mult(e, n) returns the multiplier; nullptr = none.
template <typename RowMult>
void grouped_gemm(const uint8_t* w, const uint8_t* w_scale, int64_t N, int64_t K, const Groups& g,
                  const float* A, float* C, const RowMult& row_mult, bool use_mult) {
  const Tables& tb = tables();
  const int64_t E = static_cast<int64_t>(g.offsets.size()) - 1;
  const int64_t tiles = N / kTile;  // N is a multiple of 16 (validated by MoeSpec)
  std::vector<int64_t> items;
  for (int64_t e = 0; e < E; ++e)
    if (g.offsets[e + 1] > g.offsets[e])
      for (int64_t t = 0; t < tiles; ++t) items.push_back(e * tiles + t);
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (n_items == 0) return;
  const size_t row_bytes = static_cast<size_t>(K / 2), scale_row = static_cast<size_t>(K / 16);
#pragma omp parallel
  {
    // [K][kTile] dequantized weights of one tile, transposed so the 16 rows are contiguous per k.
    std::vector<float> wt(static_cast<size_t>(K * kTile));
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < n_items; ++it) {
      const int64_t e = items[it] / tiles, n0 = (items[it] % tiles) * kTile;
      for (int64_t j = 0; j < kTile; ++j) {
        const int64_t n = n0 + j;
        const uint8_t* q = w + (static_cast<size_t>(e * N + n)) * row_bytes;
        const uint8_t* sc = w_scale + (static_cast<size_t>(e * N + n)) * scale_row;
        const float m = use_mult ? row_mult(e, n) : 1.0f;
        for (int64_t b = 0; b < K / 16; ++b) {
          float s = tb.e4m3[sc[b]];
          for (int64_t i = 0; i < 8; ++i) {
            const uint8_t byte = q[b * 8 + i];
            const int64_t k = b * 16 + 2 * i;
            float v0 = tb.pair[byte][0] * s, v1 = tb.pair[byte][1] * s;
            if (use_mult) {
              v0 *= m;
              v1 *= m;
            }
            wt[static_cast<size_t>(k * kTile + j)] = v0;
            wt[static_cast<size_t>((k + 1) * kTile + j)] = v1;
          }
        }
      }
      const float* wp = wt.data();
      int64_t r = g.offsets[e];
      const int64_t r_end = g.offsets[e + 1];
      // Two rows at a time (shares the weight loads); each lane sums over k in ascending order.
      for (; r + 1 < r_end; r += 2) {
        const float* a0 = A + r * K;
        const float* a1 = a0 + K;
        float acc0[kTile] = {}, acc1[kTile] = {};
        for (int64_t k = 0; k < K; ++k) {
          const float x0 = a0[k], x1 = a1[k];
          const float* wk = wp + k * kTile;
#pragma omp simd
          for (int64_t j = 0; j < kTile; ++j) {
            acc0[j] += x0 * wk[j];
            acc1[j] += x1 * wk[j];
          }
        }
        std::memcpy(C + r * N + n0, acc0, sizeof(acc0));
        std::memcpy(C + (r + 1) * N + n0, acc1, sizeof(acc1));
      }
      if (r < r_end) {
        const float* a0 = A + r * K;
        float acc0[kTile] = {};
        for (int64_t k = 0; k < K; ++k) {
          const float x0 = a0[k];
          const float* wk = wp + k * kTile;
#pragma omp simd
          for (int64_t j = 0; j < kTile; ++j) acc0[j] += x0 * wk[j];
        }
        std::memcpy(C + r * N + n0, acc0, sizeof(acc0));
      }
    }
  }
}

// Quantizes one row of n (multiple of 16) values with global scale gs and writes the GEMM operand
// e2m1(q) * e4m3(sf) (exact), section 4.
void quantize_row_operand(const float* x, int64_t n, float gs, float* op) {
  const Tables& tb = tables();
  uint8_t codes[fmt::kBlock];
  for (int64_t b = 0; b < n; b += fmt::kBlock) {
    const uint8_t sf = fmt::quantize_activation_block(x + b, fmt::kBlock, gs, codes);
    const float s = tb.e4m3[sf];
    for (int i = 0; i < fmt::kBlock; ++i) op[b + i] = fmt::e2m1_decode(codes[i]) * s;
  }
}

float silu(float v) { return v / (1.0f + std::exp(-v)); }

// y [R, H] for the rows of g through the experts of s. hidden: bf16 bits (W4A16/W4A4) or f32 (F32 path).
// amax1/amax2 (may be null): per-expert max |GEMM1 input| (bf16 hidden) and |GEMM2 input| (bf16 intermediate).
void run_experts(const StackedExperts& s, Path path, const uint16_t* hidden_bf16, const float* hidden_f32,
                 const Groups& g, float* y, float* amax1, float* amax2) {
  const int64_t H = s.hidden, I = s.intermediate, N1 = s.n1(), R = g.rows();
  if (R == 0) return;
  const bool gated = s.gated;
  std::vector<float> a1(static_cast<size_t>(R * H));
  // GEMM1 operand rows.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = g.token[r];
    float* op = a1.data() + r * H;
    if (path == Path::F32) {
      std::memcpy(op, hidden_f32 + t * H, static_cast<size_t>(H) * 4);
      continue;
    }
    const uint16_t* x = hidden_bf16 + t * H;
    for (int64_t k = 0; k < H; ++k) op[k] = fmt::bf16_to_float(x[k]);
    if (path == Path::W4A4) {
      const float gs = fmt::activation_global_scale(s.w13_input_scale[static_cast<size_t>(g.expert[r])]);
      quantize_row_operand(op, H, gs, op);  // in place: each block is read fully before it is written
    }
  }
  if (amax1) {
    for (int64_t r = 0; r < R; ++r) {
      const uint16_t* x = hidden_bf16 + g.token[r] * H;
      float m = amax1[g.expert[r]];
      for (int64_t k = 0; k < H; ++k) m = std::fmax(m, std::fabs(fmt::bf16_to_float(x[k])));
      amax1[g.expert[r]] = m;
    }
  }
  std::vector<float> h1(static_cast<size_t>(R * N1));
  const bool fp32 = path == Path::F32;
  auto mult1 = [&](int64_t e, int64_t n) {
    const size_t ue = static_cast<size_t>(e);
    return (gated && n < I) ? s.w13_gate_scale2[ue] : s.w13_up_scale2[ue];
  };
  grouped_gemm(s.w13.data(), s.w13_scale.data(), N1, H, g, a1.data(), h1.data(), mult1, fp32);
  a1 = std::vector<float>();

  // Activation: a = bf16(silu(alpha_g * acc_g) * (alpha_u * acc_u)) or bf16(max(alpha_u * acc, 0)^2).
  std::vector<float> a2(static_cast<size_t>(R * I));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const size_t e = static_cast<size_t>(g.expert[r]);
    float alpha_g = 1.0f, alpha_u = 1.0f;
    if (!fp32) {
      const float in = path == Path::W4A4 ? s.w13_input_scale[e] : 1.0f;
      alpha_u = path == Path::W4A4 ? s.w13_up_scale2[e] * in : s.w13_up_scale2[e];
      if (gated) alpha_g = path == Path::W4A4 ? s.w13_gate_scale2[e] * in : s.w13_gate_scale2[e];
    }
    const float* h = h1.data() + r * N1;
    float* a = a2.data() + r * I;
    for (int64_t n = 0; n < I; ++n) {
      float v;
      if (gated) {
        v = silu(alpha_g * h[n]) * (alpha_u * h[I + n]);
      } else {
        const float u = std::fmax(alpha_u * h[n], 0.0f);
        v = u * u;
      }
      a[n] = fp32 ? v : fmt::bf16_round(v);
    }
  }
  h1 = std::vector<float>();
  if (amax2) {
    for (int64_t r = 0; r < R; ++r) {
      const float* a = a2.data() + r * I;
      float m = amax2[g.expert[r]];
      for (int64_t n = 0; n < I; ++n) m = std::fmax(m, std::fabs(a[n]));
      amax2[g.expert[r]] = m;
    }
  }
  if (path == Path::W4A4) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const float gs = fmt::activation_global_scale(s.w2_input_scale[static_cast<size_t>(g.expert[r])]);
      quantize_row_operand(a2.data() + r * I, I, gs, a2.data() + r * I);
    }
  }
  auto mult2 = [&](int64_t e, int64_t) { return s.w2_scale2[static_cast<size_t>(e)]; };
  grouped_gemm(s.w2.data(), s.w2_scale.data(), H, I, g, a2.data(), y, mult2, fp32);
  if (!fp32) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const size_t e = static_cast<size_t>(g.expert[r]);
      const float alpha = path == Path::W4A4 ? s.w2_scale2[e] * s.w2_input_scale[e] : s.w2_scale2[e];
      float* yr = y + r * H;
      for (int64_t n = 0; n < H; ++n) yr[n] = alpha * yr[n];
    }
  }
}

void check_ids(const MoeSpec& spec, const int32_t* ids, int64_t tokens) {
  const int64_t K = spec.top_k, E = spec.num_experts;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t id = ids[t * K + j];
      NVFP4MOE_CHECK(id >= -1 && id < E, ArgumentError, "topk_ids[", t, ", ", j, "]: expected -1 or an expert id in [0, ",
                     E, "), got ", id);
    }
}

// The layer over tokens [t0, t0 + n). out rows t0.. are written.
// slot_y (optional, [T, K, H]): instead of combining, write each pair's y row to slot_y[t, j] (rows of unused
// slots untouched) and the shared expert's contribution (gate * y_shared, or y_shared) to shared_y [T, H].
void forward_chunk(const MoeWeights& w, Path path, const uint16_t* hidden_bf16, const float* hidden_f32, int64_t t0,
                   int64_t n, const int32_t* ids, const float* topk_w, float* out, CalibrationStats* cal,
                   float* slot_y = nullptr, float* shared_y = nullptr) {
  const MoeSpec& spec = w.spec;
  const int64_t H = spec.hidden, K = spec.top_k, E = spec.num_experts;
  // Group the (token, slot) pairs by expert, stable in token order; pos[t*K + j] = row of the pair (or -1).
  Groups g;
  g.offsets.assign(static_cast<size_t>(E + 1), 0);
  for (int64_t t = t0; t < t0 + n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t id = ids[t * K + j];
      if (id >= 0) ++g.offsets[static_cast<size_t>(id) + 1];
    }
  for (int64_t e = 0; e < E; ++e) g.offsets[e + 1] += g.offsets[e];
  const int64_t R = g.offsets[E];
  g.token.resize(static_cast<size_t>(R));
  g.expert.resize(static_cast<size_t>(R));
  std::vector<int64_t> pos(static_cast<size_t>(n * K), -1), fill(g.offsets.begin(), g.offsets.end() - 1);
  for (int64_t t = t0; t < t0 + n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t id = ids[t * K + j];
      if (id < 0) continue;
      const int64_t r = fill[static_cast<size_t>(id)]++;
      g.token[r] = t;
      g.expert[r] = id;
      pos[(t - t0) * K + j] = r;
    }
  std::vector<float> y(static_cast<size_t>(R * H));
  run_experts(w.experts, path, hidden_bf16, hidden_f32, g, y.data(), cal ? cal->gemm1_amax.data() : nullptr,
              cal ? cal->gemm2_amax.data() : nullptr);

  std::vector<float> ys;
  if (w.has_shared()) {
    Groups sg;
    sg.offsets = {0, n};
    sg.token.resize(static_cast<size_t>(n));
    sg.expert.assign(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) sg.token[i] = t0 + i;
    ys.resize(static_cast<size_t>(n * H));
    run_experts(w.shared, path, hidden_bf16, hidden_f32, sg, ys.data(),
                cal ? cal->shared_gemm1_amax.data() : nullptr, cal ? cal->shared_gemm2_amax.data() : nullptr);
  }
  const bool gated_shared = w.has_shared() && spec.shared_expert_gated;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = t0 + i;
    float gate = 1.0f;
    if (gated_shared) {
      float d = 0.0f;
      for (int64_t k = 0; k < H; ++k) {
        const float x = path == Path::F32 ? hidden_f32[t * H + k] : fmt::bf16_to_float(hidden_bf16[t * H + k]);
        d += x * fmt::bf16_to_float(w.shared_gate_weight[static_cast<size_t>(k)]);
      }
      gate = 1.0f / (1.0f + std::exp(-d));
    }
    if (slot_y) {
      for (int64_t j = 0; j < K; ++j) {
        const int64_t r = pos[i * K + j];
        if (r >= 0) std::memcpy(slot_y + (t * K + j) * H, y.data() + r * H, static_cast<size_t>(H) * 4);
      }
      if (w.has_shared() && shared_y) {
        const float* yr = ys.data() + i * H;
        float* so = shared_y + t * H;
        for (int64_t c = 0; c < H; ++c) so[c] = gated_shared ? gate * yr[c] : yr[c];
      }
      continue;
    }
    float* o = out + t * H;
    for (int64_t c = 0; c < H; ++c) o[c] = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t r = pos[i * K + j];
      if (r < 0) continue;
      const float wj = topk_w[t * K + j];
      const float* yr = y.data() + r * H;
      for (int64_t c = 0; c < H; ++c) o[c] += wj * yr[c];
    }
    if (w.has_shared()) {
      const float* yr = ys.data() + i * H;
      if (gated_shared)
        for (int64_t c = 0; c < H; ++c) o[c] += gate * yr[c];
      else
        for (int64_t c = 0; c < H; ++c) o[c] += yr[c];
    }
  }
}

void forward_impl(const MoeWeights& w, Path path, const uint16_t* hidden_bf16, const float* hidden_f32, int64_t tokens,
                  const int32_t* ids, const float* topk_w, float* out, CalibrationStats* cal,
                  float* slot_y = nullptr, float* shared_y = nullptr) {
  NVFP4MOE_CHECK(tokens >= 0, ArgumentError, "tokens: expected >= 0, got ", tokens);
  if (tokens == 0) return;
  check_ids(w.spec, ids, tokens);
  if (cal) {
    auto fit = [](std::vector<float>& v, int64_t n) {
      if (v.size() != static_cast<size_t>(n)) v.assign(static_cast<size_t>(n), 0.0f);
    };
    fit(cal->gemm1_amax, w.spec.num_experts);
    fit(cal->gemm2_amax, w.spec.num_experts);
    fit(cal->shared_gemm1_amax, w.has_shared() ? 1 : 0);
    fit(cal->shared_gemm2_amax, w.has_shared() ? 1 : 0);
  }
  for (int64_t t0 = 0; t0 < tokens; t0 += kChunk)
    forward_chunk(w, path, hidden_bf16, hidden_f32, t0, std::min(kChunk, tokens - t0), ids, topk_w, out, cal, slot_y,
                  shared_y);
}

// Index of the largest v[i] over i with ok[i], ties to the lower index; -1 when none (NaN never wins).
int64_t argmax(const float* v, const uint8_t* ok, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!ok[i] || v[i] != v[i]) continue;
    if (best < 0 || v[i] > v[best]) best = i;
  }
  return best;
}

}  // namespace

void route(const MoeSpec& spec, const float* logits, const float* bias, int64_t tokens, int32_t* topk_ids,
           float* topk_weights) {
  const int64_t E = spec.num_experts, K = spec.top_k;
  NVFP4MOE_CHECK(K >= 1 && K <= E, ArgumentError, "MoeSpec.top_k must be in [1, ", E, "], got ", K);
#pragma omp parallel
  {
    std::vector<float> key(static_cast<size_t>(E)), aux(static_cast<size_t>(E));
    std::vector<uint8_t> ok(static_cast<size_t>(E));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      const float* l = logits + t * E;
      int32_t* ids = topk_ids + t * K;
      float* ws = topk_weights + t * K;
      if (spec.routing == Routing::SoftmaxTopK) {
        // p = exp(l - max) / sum_e exp(l - max), the sum over e ascending. The selection is on the logits
        // (softmax is monotonic; as the cuda kernel does), ties to the lower id.
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t e = 0; e < E; ++e) mx = std::fmax(mx, l[e]);
        float z = 0.0f;
        for (int64_t e = 0; e < E; ++e) z += std::exp(l[e] - mx);
        for (int64_t e = 0; e < E; ++e) ok[e] = 1;
        float wsum = 0.0f;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t id = argmax(l, ok.data(), E);
          ids[j] = static_cast<int32_t>(id);
          ws[j] = id >= 0 ? std::exp(l[id] - mx) / z : 0.0f;
          wsum += ws[j];
          if (id >= 0) ok[id] = 0;
        }
        if (spec.norm_topk_prob && wsum > 0.0f)
          for (int64_t j = 0; j < K; ++j) ws[j] = ws[j] / wsum;
        continue;
      }
      // DeepSeek-V3 noaux_tc.
      for (int64_t e = 0; e < E; ++e) {
        aux[e] = 1.0f / (1.0f + std::exp(-l[e]));
        key[e] = aux[e] + (bias ? bias[e] : 0.0f);
        ok[e] = 1;
      }
      const int64_t G = spec.n_group;
      if (G > 1) {
        const int64_t gsize = E / G;
        std::vector<float> gscore(static_cast<size_t>(G));
        std::vector<uint8_t> gok(static_cast<size_t>(G), 1), kept(static_cast<size_t>(G), 0);
        for (int64_t gi = 0; gi < G; ++gi) {
          // The sum of the group's two largest keys, walked in key order from -FLT_MAX: NaN and -inf keys never
          // rise above that start, so a group with fewer than two keys above -inf scores -FLT_MAX + its best
          // (or -inf). The CUDA routing computes the same (route_rank.h, group_top2_sum).
          const float* kv = key.data() + gi * gsize;
          float t1 = -std::numeric_limits<float>::max(), t2 = t1;
          for (int64_t i = 0; i < gsize; ++i) {
            if (kv[i] > t1) {
              t2 = t1;
              t1 = kv[i];
            } else if (kv[i] > t2) {
              t2 = kv[i];
            }
          }
          gscore[gi] = gsize >= 2 ? t1 + t2 : t1;
          // A score of -inf (the sum overflowed: no key above -inf, or keys near -FLT_MAX) is never kept, nor NaN
          // (none arises: neither start is -inf); topk_group argmax passes over the rest, ties to the lower group.
          gok[gi] = (gscore[gi] != gscore[gi] || gscore[gi] == -std::numeric_limits<float>::infinity()) ? 0 : 1;
        }
        for (int64_t r = 0; r < spec.topk_group; ++r) {
          const int64_t gi = argmax(gscore.data(), gok.data(), G);
          if (gi < 0) break;
          gok[gi] = 0;
          kept[gi] = 1;
        }
        for (int64_t e = 0; e < E; ++e) ok[e] = kept[e / gsize];
      }
      float wsum = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t id = argmax(key.data(), ok.data(), E);
        ids[j] = static_cast<int32_t>(id);
        ws[j] = id >= 0 ? aux[id] : 0.0f;
        wsum += ws[j];
        if (id >= 0) ok[id] = 0;
      }
      for (int64_t j = 0; j < K; ++j) {
        float v = ws[j];
        if (spec.norm_topk_prob && wsum > 0.0f) v = v / wsum;
        ws[j] = v * spec.routed_scaling_factor;
      }
    }
  }
}

void router_logits(const MoeWeights& w, const uint16_t* hidden_bf16, int64_t tokens, float* logits) {
  const int64_t E = w.spec.num_experts, H = w.spec.hidden;
  NVFP4MOE_CHECK(w.router_weight.size() == static_cast<size_t>(E * H), ArgumentError,
                 "router_logits: MoeWeights.router_weight: expected [E, H] = ", E * H, " values, got ",
                 w.router_weight.size());
  // Transposed [H][Ep] fp32 copy so 16 experts run in SIMD lanes; each lane sums over k ascending.
  const int64_t Ep = (E + kTile - 1) / kTile * kTile;
  std::vector<float> wt(static_cast<size_t>(H * Ep), 0.0f);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t k = 0; k < H; ++k) wt[k * Ep + e] = fmt::bf16_to_float(w.router_weight[e * H + k]);
#pragma omp parallel
  {
    std::vector<float> x(static_cast<size_t>(H));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t k = 0; k < H; ++k) x[k] = fmt::bf16_to_float(hidden_bf16[t * H + k]);
      for (int64_t e0 = 0; e0 < Ep; e0 += kTile) {
        float acc[kTile] = {};
        for (int64_t k = 0; k < H; ++k) {
          const float xk = x[k];
          const float* wk = wt.data() + k * Ep + e0;
#pragma omp simd
          for (int64_t j = 0; j < kTile; ++j) acc[j] += xk * wk[j];
        }
        for (int64_t j = 0; j < kTile && e0 + j < E; ++j) logits[t * E + e0 + j] = acc[j];
      }
    }
  }
}

void moe_forward(const MoeWeights& w, Mode mode, const uint16_t* hidden_bf16, int64_t tokens, const int32_t* topk_ids,
                 const float* topk_weights, float* out, CalibrationStats* calibration) {
  forward_impl(w, mode == Mode::W4A4 ? Path::W4A4 : Path::W4A16, hidden_bf16, nullptr, tokens, topk_ids, topk_weights,
               out, calibration);
}

void moe_forward_fp32(const MoeWeights& w, const float* hidden, int64_t tokens, const int32_t* topk_ids,
                      const float* topk_weights, float* out) {
  forward_impl(w, Path::F32, nullptr, hidden, tokens, topk_ids, topk_weights, out, nullptr);
}

void moe_forward_slots(const MoeWeights& w, Mode mode, const uint16_t* hidden_bf16, int64_t tokens,
                       const int32_t* topk_ids, float* slot_y, float* shared_y) {
  NVFP4MOE_CHECK(slot_y != nullptr || tokens == 0, ArgumentError, "moe_forward_slots: slot_y is null");
  forward_impl(w, mode == Mode::W4A4 ? Path::W4A4 : Path::W4A16, hidden_bf16, nullptr, tokens, topk_ids, nullptr,
               nullptr, nullptr, slot_y, shared_y);
}

}  // namespace nvfp4moe::cpu
