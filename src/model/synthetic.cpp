// The synthetic checkpoint generator (see synthetic.h). Weights come from a counter-based hash (splitmix64) of
// (seed, layer, expert, projection, element), so any tensor can be regenerated in any order, in parallel.
#include "model/synthetic.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::model {

namespace fs = std::filesystem;
using detail::cat;

// ------------------------------------------------------------------ names
const char* style_name(ModelStyle s) {
  switch (s) {
    case ModelStyle::DeepSeekV3: return "deepseek_v3";
    case ModelStyle::Qwen3Moe: return "qwen3_moe";
    case ModelStyle::Qwen2Moe: return "qwen2_moe";
    case ModelStyle::Mixtral: return "mixtral";
    case ModelStyle::GptOss: return "gpt_oss";
    case ModelStyle::NemotronH: return "nemotron_h";
  }
  return "?";
}

bool style_from_name(const std::string& name, ModelStyle* out) {
  for (ModelStyle s : {ModelStyle::DeepSeekV3, ModelStyle::Qwen3Moe, ModelStyle::Qwen2Moe, ModelStyle::Mixtral,
                       ModelStyle::GptOss, ModelStyle::NemotronH}) {
    if (name == style_name(s)) {
      *out = s;
      return true;
    }
  }
  return false;
}

namespace {

struct Preset {
  const char* name;
  ModelStyle style;
  int64_t h, i, e, k;
  Routing routing;
  Activation act;
  int64_t shared, n_group, topk_group;
  float scale;
  bool bias;
};

// nvfp4-format.md section 8.
const Preset kPresets[] = {
    {"deepseek-v3", ModelStyle::DeepSeekV3, 7168, 2048, 256, 8, Routing::SigmoidGroupedTopK, Activation::SwiGLU, 2048, 8, 4, 2.5f, true},
    {"qwen3-235b", ModelStyle::Qwen3Moe, 4096, 1536, 128, 8, Routing::SoftmaxTopK, Activation::SwiGLU, 0, 1, 1, 1.0f, false},
    {"qwen3-30b", ModelStyle::Qwen3Moe, 2048, 768, 128, 8, Routing::SoftmaxTopK, Activation::SwiGLU, 0, 1, 1, 1.0f, false},
    {"gpt-oss-120b", ModelStyle::GptOss, 2880, 2880, 128, 4, Routing::SoftmaxTopK, Activation::SwiGLU, 0, 1, 1, 1.0f, false},
    {"nemotron-nano", ModelStyle::NemotronH, 2688, 1856, 128, 6, Routing::SigmoidGroupedTopK, Activation::Relu2, 3712, 1, 1, 2.5f, true},
    {"mixtral-8x7b", ModelStyle::Mixtral, 4096, 14336, 8, 2, Routing::SoftmaxTopK, Activation::SwiGLU, 0, 1, 1, 1.0f, false},
};

// ------------------------------------------------------------------ counter-based random numbers
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline uint64_t mix(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632BE59BD9B4E019ull)); }
// Approximately standard normal: Irwin-Hall sum of four 16-bit uniforms, scaled to unit variance.
inline float gauss(uint64_t h) {
  const float s = static_cast<float>((h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48));
  return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}
inline float uniform01(uint64_t h) { return static_cast<float>(h >> 40) * (1.0f / 16777216.0f); }

// Keys of the independent streams.
enum Stream : uint64_t { kGate = 1, kUp = 2, kDown = 3, kCalib = 4, kRouter = 5, kBias = 6, kChannels = 7, kDense = 8,
                         kSharedGate = 9 };
uint64_t expert_key(const SyntheticModel& m, int layer, int expert) {
  return mix(mix(m.seed, static_cast<uint64_t>(layer) + 1), static_cast<uint64_t>(expert + 2));
}

// Row n of a weight [N, K] (bf16 values): 0.02 * normal, with dead rows (all zero: exercises the s == 0 block
// scale), outlier rows (x8) and sparse outlier elements (x4), so block scales vary as in real checkpoints.
void weight_row(uint64_t key, int64_t n, int64_t k_dim, float* out) {
  const uint64_t rh = splitmix64(key ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(n + 1)));
  const float row_mul = (rh % 97 == 13) ? 0.0f : (rh % 61 == 7 ? 8.0f : 1.0f);
  const uint64_t base = key + static_cast<uint64_t>(n) * static_cast<uint64_t>(k_dim);
  for (int64_t k = 0; k < k_dim; ++k) {
    const uint64_t h = splitmix64(base + static_cast<uint64_t>(k));
    const float elem_mul = ((h * 0x2545F4914F6CDD1Dull) >> 56) == 0 ? 4.0f : 1.0f;
    out[k] = fmt::bf16_round(0.02f * row_mul * elem_mul * gauss(h));
  }
}

constexpr int64_t kParallelMin = int64_t(1) << 20;  // smaller tensors: threads cost more than they save

// Generates weight [N, K] into bf16 bits (one pass, threaded over rows); returns amax(|W|).
float generate_weight(uint64_t key, int64_t n_dim, int64_t k_dim, std::vector<uint16_t>& out) {
  out.resize(static_cast<size_t>(n_dim * k_dim));
  float amax = 0.0f;
#pragma omp parallel if (n_dim * k_dim >= kParallelMin)
  {
    std::vector<float> row(static_cast<size_t>(k_dim));
    float local = 0.0f;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_dim; ++n) {
      weight_row(key, n, k_dim, row.data());
      uint16_t* dst = out.data() + n * k_dim;
      for (int64_t k = 0; k < k_dim; ++k) {
        local = std::max(local, std::fabs(row[static_cast<size_t>(k)]));
        dst[k] = static_cast<uint16_t>(fmt::float_bits(row[static_cast<size_t>(k)]) >> 16);  // exact: bf16 values
      }
    }
#pragma omp critical
    amax = std::max(amax, local);
  }
  return amax;
}

// Quantizes weight w [N, K] (bf16 bits) with weight_scale_2 ws2 into p (section 3). When xt != nullptr (the
// calibration tokens transposed, [K, T]) also computes h[t, n] = sum_k x[t, k] * W[n, k] in k order.
void quantize_proj(const std::vector<uint16_t>& w, int64_t n_dim, int64_t k_dim, float ws2, SyntheticProj& p,
                   const float* xt, int tokens, float* h) {
  p.n = n_dim;
  p.k = k_dim;
  p.weight_scale_2 = ws2;
  p.packed.assign(static_cast<size_t>(n_dim * k_dim / 2), 0);
  p.scale.assign(static_cast<size_t>(n_dim * k_dim / fmt::kBlock), 0);
#pragma omp parallel if (n_dim * k_dim >= kParallelMin)
  {
    float blk[fmt::kBlock];
    uint8_t codes[fmt::kBlock];
    float acc[kMaxCalibrationTokens];  // a local array: no aliasing with xt, so the t loop vectorizes
#pragma omp for schedule(static)
    for (int64_t n = 0; n < n_dim; ++n) {
      const uint16_t* row = w.data() + n * k_dim;
      uint8_t* packed = p.packed.data() + n * k_dim / 2;
      uint8_t* scale = p.scale.data() + n * k_dim / fmt::kBlock;
      std::fill(acc, acc + kMaxCalibrationTokens, 0.0f);
      for (int64_t b = 0; b < k_dim / fmt::kBlock; ++b) {
        for (int i = 0; i < fmt::kBlock; ++i) blk[i] = fmt::bf16_to_float(row[b * fmt::kBlock + i]);
        scale[b] = fmt::quantize_weight_block(blk, fmt::kBlock, ws2, codes);
        for (int i = 0; i < fmt::kBlock; i += 2)
          packed[(b * fmt::kBlock + i) / 2] = fmt::pack_e2m1x2(codes[i], codes[i + 1]);
        if (xt) {
          for (int i = 0; i < fmt::kBlock; ++i) {
            const float* xk = xt + (b * fmt::kBlock + i) * tokens;
            for (int t = 0; t < tokens; ++t) acc[t] += xk[t] * blk[i];
          }
        }
      }
      if (xt)
        for (int t = 0; t < tokens; ++t) h[static_cast<int64_t>(t) * n_dim + n] = acc[t];
    }
  }
}

float scale_from_amax(float amax) { return amax > 0.0f ? amax / fmt::kWeightScaleDenom : 1.0f; }

}  // namespace

// ------------------------------------------------------------------ resolving options
std::vector<std::string> synthetic_presets() {
  std::vector<std::string> v;
  for (const auto& p : kPresets) v.push_back(p.name);
  return v;
}

SyntheticModel resolve_synthetic(const SyntheticOptions& o) {
  SyntheticModel m;
  MoeSpec& s = m.spec;
  const Preset* preset = nullptr;
  if (!o.preset.empty()) {
    for (const auto& p : kPresets)
      if (o.preset == p.name) preset = &p;
    if (!preset) {
      std::string names;
      for (const auto& n : synthetic_presets()) names += (names.empty() ? "" : ", ") + n;
      throw ArgumentError(cat("preset: expected one of ", names, ", got \"", o.preset, "\""));
    }
    m.preset = preset->name;
  }
  auto need = [&](const std::optional<int64_t>& v, int64_t from_preset, const char* name) -> int64_t {
    if (v) return *v;
    NVFP4MOE_CHECK(preset, ArgumentError, name, ": required without a preset (presets: deepseek-v3, qwen3-235b, ...)");
    return from_preset;
  };
  s.hidden = need(o.hidden, preset ? preset->h : 0, "hidden");
  s.intermediate = need(o.intermediate, preset ? preset->i : 0, "intermediate");
  s.num_experts = need(o.experts, preset ? preset->e : 0, "experts");
  s.top_k = need(o.top_k, preset ? std::min(preset->k, s.num_experts) : 0, "top_k");
  s.routing = o.routing ? *o.routing : (preset ? preset->routing : Routing::SoftmaxTopK);
  s.activation = o.activation ? *o.activation : (preset ? preset->act : Activation::SwiGLU);
  s.norm_topk_prob = o.norm_topk_prob.value_or(true);
  s.shared_intermediate = o.shared_intermediate.value_or(preset ? preset->shared : 0);
  s.routed_scaling_factor = o.routed_scaling_factor.value_or(preset ? preset->scale : 1.0f);
  // config.json cannot hold inf (JSON writes null, which loads as the default 1.0: a different model).
  NVFP4MOE_CHECK(std::isfinite(s.routed_scaling_factor) && s.routed_scaling_factor > 0, ArgumentError,
                 "routed_scaling_factor: expected a finite value > 0, got ", s.routed_scaling_factor);
  if (s.routing == Routing::SigmoidGroupedTopK) {
    s.n_group = o.n_group.value_or(preset ? preset->n_group : 1);
    if (!o.n_group)
      while (s.n_group > 1 && s.num_experts % s.n_group != 0) --s.n_group;  // fit a reduced expert count
    s.topk_group = o.topk_group.value_or(preset ? preset->topk_group : 1);
    if (!o.topk_group) {
      s.topk_group = std::min(s.topk_group, s.n_group);
      const int64_t per = std::max<int64_t>(1, s.num_experts / std::max<int64_t>(1, s.n_group));
      if (s.top_k > s.topk_group * per) s.topk_group = std::min(s.n_group, (s.top_k + per - 1) / per);
    }
    s.has_router_bias = o.router_bias.value_or(preset ? preset->bias : true);
  } else {
    NVFP4MOE_CHECK(!o.n_group || *o.n_group == 1, ArgumentError, "n_group: expected 1 for softmax routing, got ", *o.n_group);
    s.has_router_bias = o.router_bias.value_or(false);
    NVFP4MOE_CHECK(!s.has_router_bias, ArgumentError, "router_bias: only sigmoid (DeepSeek) routing has a bias");
  }
  if (o.style) m.style = *o.style;
  else if (preset) m.style = preset->style;
  else if (s.activation == Activation::Relu2) m.style = ModelStyle::NemotronH;
  else if (s.routing == Routing::SigmoidGroupedTopK) m.style = ModelStyle::DeepSeekV3;
  else m.style = s.shared_intermediate > 0 ? ModelStyle::Qwen2Moe : ModelStyle::Qwen3Moe;
  s.shared_expert_gated = m.style == ModelStyle::Qwen2Moe && s.shared_intermediate > 0;

  m.layers = o.layers;
  m.first_dense_layers = o.first_dense_layers;
  m.dense_intermediate = o.dense_intermediate;
  m.seed = o.seed;
  m.calibration_tokens = o.calibration_tokens;
  m.max_shard_bytes = o.max_shard_bytes;
  NVFP4MOE_CHECK(m.layers >= 1, ArgumentError, "layers: expected >= 1, got ", m.layers);
  NVFP4MOE_CHECK(m.first_dense_layers >= 0 && m.first_dense_layers < m.layers, ArgumentError,
                 "first_dense_layers: expected 0..layers-1 = ", m.layers - 1, ", got ", m.first_dense_layers);
  NVFP4MOE_CHECK(m.dense_intermediate > 0 && m.dense_intermediate % 16 == 0, ArgumentError,
                 "dense_intermediate: expected a positive multiple of 16, got ", m.dense_intermediate);
  NVFP4MOE_CHECK(m.calibration_tokens >= 1 && m.calibration_tokens <= kMaxCalibrationTokens, ArgumentError,
                 "calibration_tokens: expected 1..", kMaxCalibrationTokens, ", got ", m.calibration_tokens);
  NVFP4MOE_CHECK(m.max_shard_bytes >= 1, ArgumentError, "max_shard_bytes: expected > 0");
  const bool no_extras = m.style == ModelStyle::Mixtral || m.style == ModelStyle::GptOss;
  NVFP4MOE_CHECK(!no_extras || (m.first_dense_layers == 0 && s.shared_intermediate == 0), ArgumentError, "style ",
                 style_name(m.style), ": has no dense layers or shared experts (first_dense_layers = ",
                 m.first_dense_layers, ", shared_intermediate = ", s.shared_intermediate, ")");
  NVFP4MOE_CHECK(!no_extras || s.routing == Routing::SoftmaxTopK, ArgumentError, "style ", style_name(m.style),
                 ": routing must be softmax_topk, got ", routing_name(s.routing));
  NVFP4MOE_CHECK((m.style == ModelStyle::NemotronH) == (s.activation == Activation::Relu2) ||
                     m.style == ModelStyle::DeepSeekV3 || m.style == ModelStyle::Qwen3Moe,
                 ArgumentError, "activation: style ", style_name(m.style), " does not support ",
                 activation_name(s.activation));
  if (m.style == ModelStyle::NemotronH || m.style == ModelStyle::DeepSeekV3)
    NVFP4MOE_CHECK(s.routing == Routing::SigmoidGroupedTopK, ArgumentError, "routing: style ", style_name(m.style),
                   " writes sigmoid routing, got ", routing_name(s.routing));
  s.layer = m.first_dense_layers;
  s.validate();
  return m;
}

std::string SyntheticModel::moe_prefix(int layer) const {
  switch (style) {
    case ModelStyle::NemotronH: return cat("backbone.layers.", layer, ".mixer");
    case ModelStyle::Mixtral: return cat("model.layers.", layer, ".block_sparse_moe");
    default: return cat("model.layers.", layer, ".mlp");
  }
}

std::string SyntheticModel::describe() const {
  return cat(preset.empty() ? std::string("custom") : preset, " (", style_name(style), " style): ", spec.describe(),
             "; ", layers, " layer(s), ", first_dense_layers, " dense; seed ", seed);
}

// ------------------------------------------------------------------ expert synthesis
SyntheticExpert synthesize_expert(const SyntheticModel& m, int layer, int expert) {
  const MoeSpec& s = m.spec;
  NVFP4MOE_CHECK(m.is_moe_layer(layer), ArgumentError, "layer: expected an MoE layer in ", m.first_dense_layers, "..",
                 m.layers - 1, ", got ", layer);
  NVFP4MOE_CHECK(expert >= -1 && expert < s.num_experts && (expert >= 0 || s.shared_intermediate > 0), ArgumentError,
                 "expert: expected 0..", s.num_experts - 1, s.shared_intermediate > 0 ? " or -1 (shared)" : "", ", got ",
                 expert);
  const int64_t H = s.hidden, I = expert < 0 ? s.shared_intermediate : s.intermediate;
  const int T = m.calibration_tokens;
  const uint64_t ek = expert_key(m, layer, expert);
  // Calibration tokens: bf16 hidden states with per-layer outlier channels, stored transposed [H, T].
  std::vector<float> xt(static_cast<size_t>(T * H));
  const uint64_t ck = mix(mix(m.seed, static_cast<uint64_t>(layer) + 1), kChannels);
  const uint64_t xk = mix(ek, kCalib);
  float x_amax = 0.0f;
  for (int64_t k = 0; k < H; ++k) {
    const float ch = splitmix64(ck + static_cast<uint64_t>(k)) % 32 == 5 ? 4.0f : 1.0f;
    for (int t = 0; t < T; ++t) {
      const float v = fmt::bf16_round(ch * gauss(splitmix64(xk + static_cast<uint64_t>(t * H + k))));
      xt[static_cast<size_t>(k * T + t)] = v;
      x_amax = std::max(x_amax, std::fabs(v));
    }
  }
  SyntheticExpert out;
  std::vector<float> hg, hu(static_cast<size_t>(T * I));
  const uint64_t gk = mix(ek, kGate), uk = mix(ek, kUp), dk = mix(ek, kDown);
  std::vector<uint16_t> wg, wu, wd;
  // Gate and up share one amax (what the exporter does), so their weight_scale_2 are equal.
  float amax = generate_weight(uk, I, H, wu);
  if (s.gated()) amax = std::max(amax, generate_weight(gk, I, H, wg));
  const float ws13 = fmt::weight_global_scale(amax);
  const float in13 = scale_from_amax(x_amax);
  if (s.gated()) {
    hg.resize(static_cast<size_t>(T * I));
    quantize_proj(wg, I, H, ws13, out.gate, xt.data(), T, hg.data());
    out.gate.input_scale = in13;
    wg = {};
  }
  quantize_proj(wu, I, H, ws13, out.up, xt.data(), T, hu.data());
  out.up.input_scale = in13;
  wu = {};
  float a_amax = 0.0f;
  for (size_t j = 0; j < hu.size(); ++j) {
    float a;
    if (s.gated()) {
      const float g = hg[j];
      a = g / (1.0f + std::exp(-g)) * hu[j];
    } else {
      const float r = std::max(hu[j], 0.0f);
      a = r * r;
    }
    a_amax = std::max(a_amax, std::fabs(fmt::bf16_round(a)));
  }
  const float down_amax = generate_weight(dk, H, I, wd);
  quantize_proj(wd, H, I, fmt::weight_global_scale(down_amax), out.down, nullptr, 0, nullptr);
  out.down.input_scale = scale_from_amax(a_amax);
  return out;
}

std::vector<uint16_t> synthesize_router(const SyntheticModel& m, int layer) {
  const int64_t n = m.spec.num_experts * m.spec.hidden;
  std::vector<uint16_t> r(static_cast<size_t>(n));
  const uint64_t key = mix(mix(m.seed, static_cast<uint64_t>(layer) + 1), kRouter);
  for (int64_t i = 0; i < n; ++i)
    r[static_cast<size_t>(i)] = fmt::bf16_from_float(0.02f * gauss(splitmix64(key + static_cast<uint64_t>(i))));
  return r;
}

std::vector<float> synthesize_router_bias(const SyntheticModel& m, int layer) {
  std::vector<float> b(static_cast<size_t>(m.spec.num_experts));
  const uint64_t key = mix(mix(m.seed, static_cast<uint64_t>(layer) + 1), kBias);
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * (uniform01(splitmix64(key + i)) - 0.5f);
  return b;
}

// ------------------------------------------------------------------ the tensor plan
namespace {

enum class Kind : uint8_t { ExpertWeight, ExpertScale, ExpertScale2, ExpertInput, Router, Bias, SharedGate, Dense };

struct Planned {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Kind kind;
  int layer = 0, expert = 0, proj = 0;  // proj: 0 gate, 1 up, 2 down
  uint64_t key = 0;                      // dense weights
};

size_t planned_bytes(const Planned& p) {
  size_t n = dtype_size(p.dtype);
  for (int64_t d : p.shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<Planned> plan(const SyntheticModel& m) {
  const MoeSpec& s = m.spec;
  const int64_t H = s.hidden;
  const bool mixtral = m.style == ModelStyle::Mixtral;
  const char* pn[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
  std::vector<Planned> out;
  for (int l = 0; l < m.layers; ++l) {
    if (!m.is_moe_layer(l)) {
      const std::string p = m.style == ModelStyle::NemotronH ? cat("backbone.layers.", l, ".mixer.")
                                                             : cat("model.layers.", l, ".mlp.");
      const int64_t D = m.dense_intermediate;
      const uint64_t lk = mix(mix(m.seed, static_cast<uint64_t>(l) + 1), kDense);
      if (s.gated()) out.push_back({p + "gate_proj.weight", DType::BF16, {D, H}, Kind::Dense, l, 0, 0, mix(lk, 0)});
      out.push_back({p + "up_proj.weight", DType::BF16, {D, H}, Kind::Dense, l, 0, 1, mix(lk, 1)});
      out.push_back({p + "down_proj.weight", DType::BF16, {H, D}, Kind::Dense, l, 0, 2, mix(lk, 2)});
      continue;
    }
    const std::string pre = m.moe_prefix(l) + ".";
    out.push_back({pre + (m.style == ModelStyle::GptOss ? "router.weight" : "gate.weight"), DType::BF16,
                   {s.num_experts, H}, Kind::Router, l});
    if (s.has_router_bias)
      out.push_back({pre + "gate.e_score_correction_bias", DType::F32, {s.num_experts}, Kind::Bias, l});
    auto add_expert = [&](const std::string& base, int e, int64_t I) {
      for (int p = s.gated() ? 0 : 1; p < 3; ++p) {
        const int64_t n = p == 2 ? H : I, k = p == 2 ? I : H;
        const std::string b = base + pn[p];
        out.push_back({b + ".weight", DType::U8, {n, k / 2}, Kind::ExpertWeight, l, e, p});
        out.push_back({b + ".weight_scale", DType::F8_E4M3, {n, k / 16}, Kind::ExpertScale, l, e, p});
        out.push_back({b + ".weight_scale_2", DType::F32, {}, Kind::ExpertScale2, l, e, p});
        out.push_back({b + ".input_scale", DType::F32, {}, Kind::ExpertInput, l, e, p});
      }
    };
    if (s.shared_intermediate > 0) {
      const bool qwen2 = m.style == ModelStyle::Qwen2Moe;
      if (qwen2) out.push_back({pre + "shared_expert_gate.weight", DType::BF16, {1, H}, Kind::SharedGate, l});
      add_expert(pre + (qwen2 ? "shared_expert." : "shared_experts."), -1, s.shared_intermediate);
    }
    for (int e = 0; e < s.num_experts; ++e) add_expert(cat(pre, "experts.", e, "."), e, s.intermediate);
  }
  return out;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  NVFP4MOE_CHECK(f.good(), Error, path.string(), ": write failed");
}

nlohmann::json config_json(const SyntheticModel& m) {
  const MoeSpec& s = m.spec;
  nlohmann::json c;
  c["torch_dtype"] = "bfloat16";
  c["hidden_size"] = s.hidden;
  c["num_hidden_layers"] = m.layers;
  c["num_experts_per_tok"] = s.top_k;
  c["norm_topk_prob"] = s.norm_topk_prob;
  std::vector<int> dense;
  for (int l = 0; l < m.first_dense_layers; ++l) dense.push_back(l);
  switch (m.style) {
    case ModelStyle::DeepSeekV3:
      c["architectures"] = {"DeepseekV3ForCausalLM"};
      c["model_type"] = "deepseek_v3";
      c["intermediate_size"] = m.dense_intermediate;
      c["moe_intermediate_size"] = s.intermediate;
      c["n_routed_experts"] = s.num_experts;
      if (s.shared_intermediate % s.intermediate == 0) {
        c["n_shared_experts"] = s.shared_intermediate / s.intermediate;
      } else {  // not n * I: one shared expert of an explicit width (the Nemotron-H key; the loader reads it)
        c["n_shared_experts"] = 1;
        c["moe_shared_expert_intermediate_size"] = s.shared_intermediate;
      }
      c["n_group"] = s.n_group;
      c["topk_group"] = s.topk_group;
      c["routed_scaling_factor"] = s.routed_scaling_factor;
      c["scoring_func"] = "sigmoid";
      c["topk_method"] = "noaux_tc";
      c["first_k_dense_replace"] = m.first_dense_layers;
      c["moe_layer_freq"] = 1;
      c["hidden_act"] = "silu";
      if (!s.gated()) c["mlp_hidden_act"] = "relu2";
      break;
    case ModelStyle::Qwen3Moe:
    case ModelStyle::Qwen2Moe:
      c["architectures"] = {m.style == ModelStyle::Qwen3Moe ? "Qwen3MoeForCausalLM" : "Qwen2MoeForCausalLM"};
      c["model_type"] = style_name(m.style);
      c["intermediate_size"] = m.dense_intermediate;
      c["moe_intermediate_size"] = s.intermediate;
      c["num_experts"] = s.num_experts;
      c["decoder_sparse_step"] = 1;
      c["mlp_only_layers"] = dense;
      c["hidden_act"] = "silu";
      if (!s.gated()) c["mlp_hidden_act"] = "relu2";
      if (m.style == ModelStyle::Qwen2Moe) c["shared_expert_intermediate_size"] = s.shared_intermediate;
      break;
    case ModelStyle::Mixtral:
      c["architectures"] = {"MixtralForCausalLM"};
      c["model_type"] = "mixtral";
      c["intermediate_size"] = s.intermediate;
      c["num_local_experts"] = s.num_experts;
      c["hidden_act"] = "silu";
      break;
    case ModelStyle::GptOss:
      c["architectures"] = {"GptOssForCausalLM"};
      c["model_type"] = "gpt_oss";
      c["intermediate_size"] = s.intermediate;
      c["num_local_experts"] = s.num_experts;
      c["experts_per_token"] = s.top_k;
      c["hidden_act"] = "silu";
      break;
    case ModelStyle::NemotronH: {
      c["architectures"] = {"NemotronHForCausalLM"};
      c["model_type"] = "nemotron_h";
      c["intermediate_size"] = m.dense_intermediate;
      c["moe_intermediate_size"] = s.intermediate;
      c["moe_shared_expert_intermediate_size"] = s.shared_intermediate;
      c["n_routed_experts"] = s.num_experts;
      c["n_group"] = s.n_group;
      c["topk_group"] = s.topk_group;
      c["routed_scaling_factor"] = s.routed_scaling_factor;
      c["mlp_hidden_act"] = "relu2";
      std::string pattern;
      for (int l = 0; l < m.layers; ++l) pattern += m.is_moe_layer(l) ? 'E' : '-';
      c["hybrid_override_pattern"] = pattern;
      break;
    }
  }
  c["nvfp4moe_synthetic"] = {{"preset", m.preset}, {"seed", m.seed}, {"calibration_tokens", m.calibration_tokens},
                             {"describe", m.describe()}};
  return c;
}

nlohmann::json quant_json(const SyntheticModel& m) {
  std::vector<std::string> exclude = {"lm_head"};
  exclude.push_back(m.style == ModelStyle::NemotronH ? "*.mixer.gate"
                    : m.style == ModelStyle::Mixtral ? "*.block_sparse_moe.gate"
                    : m.style == ModelStyle::GptOss  ? "*.mlp.router"
                                                     : "*.mlp.gate");
  if (m.style == ModelStyle::Qwen2Moe) exclude.push_back("*.mlp.shared_expert_gate");
  for (int l = 0; l < m.first_dense_layers; ++l)
    exclude.push_back(m.style == ModelStyle::NemotronH ? cat("backbone.layers.", l, ".mixer*")
                                                       : cat("model.layers.", l, ".mlp*"));
  nlohmann::json q;
  q["producer"] = {{"name", "modelopt"}, {"version", "nvfp4moe-synthetic"}};
  q["quantization"] = {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
                       {"exclude_modules", exclude}};
  return q;
}

std::string random_suffix() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << ::getpid() << "-" << (static_cast<uint64_t>(rd()) << 32 | rd());
  return os.str();
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

size_t SyntheticModel::checkpoint_bytes() const {
  size_t b = 0;
  for (const auto& p : plan(*this)) b += planned_bytes(p);
  return b;
}

SyntheticResult generate_synthetic_checkpoint(const std::string& dir, const SyntheticOptions& options,
                                              const ProgressFn& progress) {
  const double t0 = now_s();
  SyntheticResult res;
  res.dir = dir;
  res.model = resolve_synthetic(options);
  const SyntheticModel& m = res.model;
  NVFP4MOE_CHECK(!dir.empty(), ArgumentError, "dir: expected an output directory, got \"\"");
  fs::path target = fs::path(dir);
  if (target.has_filename() == false) target = target.parent_path();
  const bool exists = fs::exists(target);
  NVFP4MOE_CHECK(!exists || fs::is_directory(target), ArgumentError, "dir: ", dir, " exists and is not a directory");
  const bool non_empty = exists && !fs::is_empty(target);
  NVFP4MOE_CHECK(!non_empty || options.overwrite, ArgumentError, "dir: ", dir,
                 " exists and is not empty (pass overwrite to replace it)");
  std::vector<Planned> planned = plan(m);
  // The missing parent directories, deepest first: created here and, on failure, removed again (only those, and
  // only while empty).
  std::vector<fs::path> created;
  for (fs::path p = target.parent_path(); !p.empty() && !fs::exists(p); p = p.parent_path()) {
    created.push_back(p);
    if (p == p.parent_path()) break;
  }
  const fs::path tmp = target.string() + ".tmp-" + random_suffix();
  try {
    if (!created.empty()) fs::create_directories(target.parent_path());
    fs::create_directories(tmp);
    write_text(tmp / "config.json", config_json(m).dump(2) + "\n");
    write_text(tmp / "hf_quant_config.json", quant_json(m).dump(2) + "\n");

    size_t total = 0;
    for (const auto& p : planned) total += planned_bytes(p);
    size_t done = 0, last = 0;
    bool reported = false;
    std::mutex mu;
    int cached_layer = -1000, cached_expert = -1000;
    SyntheticExpert cached;
    auto expert = [&](int l, int e) -> const SyntheticExpert& {
      if (l != cached_layer || e != cached_expert) {
        cached = synthesize_expert(m, l, e);
        cached_layer = l;
        cached_expert = e;
      }
      return cached;
    };
    std::vector<io::TensorToWrite> tensors;
    tensors.reserve(planned.size());
    for (const Planned& p : planned) {
      io::TensorToWrite t;
      t.name = p.name;
      t.dtype = p.dtype;
      t.shape = p.shape;
      t.fill = [&, pp = &p](uint8_t* dst, size_t nbytes) {
        std::lock_guard<std::mutex> lock(mu);
        const Planned& q = *pp;
        NVFP4MOE_CHECK(nbytes == planned_bytes(q), Error, "synthetic: tensor ", q.name, ": writer asked for ", nbytes,
                       " bytes, expected ", planned_bytes(q));
        auto proj = [&]() -> const SyntheticProj& {
          const SyntheticExpert& x = expert(q.layer, q.expert);
          return q.proj == 0 ? x.gate : q.proj == 1 ? x.up : x.down;
        };
        switch (q.kind) {
          case Kind::ExpertWeight: std::memcpy(dst, proj().packed.data(), nbytes); break;
          case Kind::ExpertScale: std::memcpy(dst, proj().scale.data(), nbytes); break;
          case Kind::ExpertScale2: std::memcpy(dst, &proj().weight_scale_2, 4); break;
          case Kind::ExpertInput: std::memcpy(dst, &proj().input_scale, 4); break;
          case Kind::Router: {
            const auto r = synthesize_router(m, q.layer);
            std::memcpy(dst, r.data(), nbytes);
            break;
          }
          case Kind::Bias: {
            const auto b = synthesize_router_bias(m, q.layer);
            std::memcpy(dst, b.data(), nbytes);
            break;
          }
          case Kind::SharedGate:
          case Kind::Dense: {
            const uint64_t key = q.kind == Kind::Dense ? q.key : mix(mix(m.seed, static_cast<uint64_t>(q.layer) + 1), kSharedGate);
            const size_t n = nbytes / 2;
            for (size_t i = 0; i < n; ++i) {
              const uint16_t h = fmt::bf16_from_float(0.02f * gauss(splitmix64(key + i)));
              std::memcpy(dst + 2 * i, &h, 2);
            }
            break;
          }
        }
        done += nbytes;
        if (progress && (done == total ? reported : (done - last >= (256u << 20) && now_s() - t0 >= 1.0))) {
          last = done;
          reported = true;
          progress(done, total);
        }
      };
      tensors.push_back(std::move(t));
    }
    io::write_sharded_safetensors(tmp.string(), tensors, m.max_shard_bytes);
    res.bytes = total;
    res.tensors = tensors.size();
    // Publish: move an existing (empty or overwritten) target away, rename, then delete the old one.
    if (exists) {
      const fs::path old = target.string() + ".old-" + random_suffix();
      fs::rename(target, old);
      try {
        fs::rename(tmp, target);
      } catch (...) {
        std::error_code ec;
        fs::rename(old, target, ec);  // put the existing target back: nothing lost when publishing fails
        throw;
      }
      fs::remove_all(old);
    } else {
      fs::rename(tmp, target);
    }
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    for (const fs::path& p : created) fs::remove(p, ec);  // fails (and stops nothing) where p is not empty
    throw;
  }
  res.seconds = now_s() - t0;
  return res;
}

}  // namespace nvfp4moe::model
