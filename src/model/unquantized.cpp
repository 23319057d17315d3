// Unquantized HF MoE checkpoints quantized to NVFP4 at load (see unquantized.h).
#include "model/unquantized.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>

#include "format/nvfp4.h"
#include "model/tensor_names.h"
#include "nvfp4moe/error.h"
#if defined(NVFP4MOE_WITH_CUDA)
#include "cuda/weight_quant.h"
#endif

namespace nvfp4moe::model {

using detail::cat;

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool is_float_dtype(DType d) { return d == DType::BF16 || d == DType::F16 || d == DType::F32; }

// Role of a projection name: 0 gate, 1 up, 2 down, -1 other.
int proj_role(const std::string& p) {
  if (p == "gate_proj" || p == "w1") return 0;
  if (p == "up_proj" || p == "w3") return 1;
  if (p == "down_proj" || p == "w2") return 2;
  return -1;
}

std::string fmt_bytes(size_t b) {
  std::ostringstream os;
  os.precision(3);
  if (b >= (size_t(1) << 30)) os << b / double(size_t(1) << 30) << " GiB";
  else os << b / double(size_t(1) << 20) << " MiB";
  return os.str();
}

class CpuExpertQuantizer final : public ExpertQuantizer {
 public:
  void quantize(const ExpertSource& src, StackedExperts& dst, int64_t slot) override {
    std::vector<float> v[3];
    float amax[3] = {0, 0, 0};
    for (int r = 0; r < 3; ++r) {
      const io::TensorInfo* t = src.proj[r];
      if (!t) continue;
      v[r].resize(static_cast<size_t>(t->numel()));
      tensor_to_float(*t, v[r].data());
      float a = 0.0f;
      for (float x : v[r]) {
        NVFP4MOE_CHECK(std::isfinite(x), FormatError, src.what, ": tensor ", t->name, ": expected finite weights, got ", x);
        a = std::max(a, std::fabs(x));
      }
      amax[r] = a;
    }
    const float ws13 = fmt::weight_global_scale(std::max(amax[0], amax[1]));  // gate and up share one amax
    const float ws2[3] = {ws13, ws13, fmt::weight_global_scale(amax[2])};
    const size_t us = static_cast<size_t>(slot);
    const bool gated = src.proj[0] != nullptr;
    for (int r = 0; r < 3; ++r) {
      const io::TensorInfo* t = src.proj[r];
      if (!t) continue;
      const int64_t n = t->shape[0], k = t->shape[1];
      uint8_t *packed, *scales;
      if (r < 2) {
        const size_t off = (r == 1 && gated) ? static_cast<size_t>(n * k / 2) : 0;
        const size_t soff = (r == 1 && gated) ? static_cast<size_t>(n * k / 16) : 0;
        packed = dst.w13.data() + us * dst.w13_bytes_per_expert() + off;
        scales = dst.w13_scale.data() + us * dst.w13_scale_bytes_per_expert() + soff;
        if (r == 0) dst.w13_gate_scale2[us] = ws2[r];
        else dst.w13_up_scale2[us] = ws2[r];
      } else {
        packed = dst.w2.data() + us * dst.w2_bytes_per_expert();
        scales = dst.w2_scale.data() + us * dst.w2_scale_bytes_per_expert();
        dst.w2_scale2[us] = ws2[r];
      }
      const float* w = v[r].data();
      const float s2 = ws2[r];
#pragma omp parallel for schedule(static) if (n * k >= (1 << 20))
      for (int64_t row = 0; row < n; ++row) {
        uint8_t codes[fmt::kBlock];
        for (int64_t b = 0; b < k / fmt::kBlock; ++b) {
          const float* blk = w + row * k + b * fmt::kBlock;
          scales[row * (k / fmt::kBlock) + b] = fmt::quantize_weight_block(blk, fmt::kBlock, s2, codes);
          for (int i = 0; i < fmt::kBlock; i += 2)
            packed[row * (k / 2) + b * (fmt::kBlock / 2) + i / 2] = fmt::pack_e2m1x2(codes[i], codes[i + 1]);
        }
      }
    }
  }
  const char* device_name() const override { return "cpu"; }
};

}  // namespace

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return fmt::bits_float(sign | 0x7F800000u | (man << 13));
  return fmt::bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

void tensor_to_float(const io::TensorInfo& t, float* v) {
  const size_t n = static_cast<size_t>(t.numel());
  if (t.dtype == DType::F32) {
    std::memcpy(v, t.data, n * 4);
    return;
  }
  NVFP4MOE_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16, FormatError, "tensor ", t.name,
                 ": expected dtype BF16, F16 or F32, got ", dtype_name(t.dtype));
  const bool bf = t.dtype == DType::BF16;
#pragma omp parallel for schedule(static) if (n >= (1 << 20))
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i) {
    uint16_t h;
    std::memcpy(&h, t.data + 2 * i, 2);
    v[i] = bf ? fmt::bf16_to_float(h) : half_to_float(h);
  }
}

void check_finite(const io::TensorInfo& t, const float* values, bool held_as_bf16, const std::string& where) {
  const int64_t n = t.numel(), cols = t.shape.size() == 2 ? t.shape[1] : 0;
  for (int64_t i = 0; i < n; ++i) {
    const float f = values[i], held = held_as_bf16 ? fmt::bf16_to_float(fmt::bf16_from_float(f)) : f;
    if (std::isfinite(held)) continue;
    throw FormatError(cat(where, ": tensor ", t.name, ": expected finite values, got ", f, " at index ", i,
                          cols ? cat(" ([", i / cols, ", ", i % cols, "])") : std::string(),
                          std::isfinite(f) ? " (inf once rounded to bf16, as MoeWeights holds it)" : ""));
  }
}

std::unique_ptr<ExpertQuantizer> make_cpu_expert_quantizer() { return std::make_unique<CpuExpertQuantizer>(); }

std::unique_ptr<ExpertQuantizer> make_cuda_expert_quantizer(int device) {
#if defined(NVFP4MOE_WITH_CUDA)
  return cuda::make_weight_quantizer(device);
#else
  (void)device;
  throw ArgumentError("device: expected cpu, got cuda (this nvfp4moe was built without CUDA)");
#endif
}

// ------------------------------------------------------------------ discovery
UnquantizedCheckpoint::UnquantizedCheckpoint(const std::string& dir, ModelConfig mc)
    : dir_(dir), model_(std::move(mc)), files_(io::SafetensorsSet::open(dir)) {
  const ModelConfig& m = model_;
  const std::string& cfg_path = m.file;
  std::string decoder_prefix;  // "model.layers." (text before the index)
  std::string module_child;    // "mlp"
  std::set<int64_t> seen;      // layers below num_hidden_layers with any tensor
  for (const std::string& name : files_.names()) {
    const auto t = split_dots(name);
    size_t i = 0;
    int64_t layer = -1;
    for (; i + 1 < t.size(); ++i)
      if (t[i] == "layers" && parse_index(t[i + 1], &layer, dir, name)) break;
    if (layer < 0 || layer >= m.num_layers) continue;
    seen.insert(layer);
    if (i + 4 >= t.size()) continue;
    std::string module;
    for (size_t j = 0; j <= i + 2; ++j) module += (j ? "." : "") + t[j];
    const std::string& child = t[i + 3];
    UnquantizedLayer& L = moe_[static_cast<int>(layer)];
    int64_t e = -1;
    if (child == "experts" && t.size() == i + 7 && parse_index(t[i + 4], &e, dir, name) && t[i + 6] == "weight" &&
        proj_role(t[i + 5]) >= 0) {
      UnquantizedExpert& x = L.experts[e];
      x.base = cat(module, ".experts.", e, ".");
      x.name[proj_role(t[i + 5])] = name;
    } else if ((child == "shared_experts" || child == "shared_expert") && t.size() == i + 6 && t[i + 5] == "weight" &&
               proj_role(t[i + 4]) >= 0) {
      if (!L.shared) L.shared = UnquantizedExpert{};
      L.shared->base = cat(module, ".", child, ".");
      L.shared->name[proj_role(t[i + 4])] = name;
    } else if ((child == "gate" || child == "router") && t.size() == i + 5) {
      if (t[i + 4] == "weight") L.router = name;
      if (t[i + 4] == "e_score_correction_bias") L.bias = name;
      continue;
    } else if (child == "shared_expert_gate" && t.size() == i + 5 && t[i + 4] == "weight") {
      L.shared_gate = name;
      continue;
    } else {
      continue;
    }
    L.layer = static_cast<int>(layer);
    L.module = module;
    if (decoder_prefix.empty()) {
      for (size_t j = 0; j <= i; ++j) decoder_prefix += t[j] + ".";
      module_child = t[i + 2];
    }
  }
  for (auto it = moe_.begin(); it != moe_.end();)
    it = it->second.experts.empty() ? moe_.erase(it) : std::next(it);
  NVFP4MOE_CHECK(!moe_.empty(), FormatError, dir, ": no MoE expert weights found (expected tensors like "
                 "model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight)");

  for (auto& [l, L] : moe_) {
    const std::string what = cat(dir, ": layer ", l);
    const int64_t H = m.hidden;
    const int64_t E = static_cast<int64_t>(L.experts.size());
    NVFP4MOE_CHECK(L.experts.rbegin()->first == E - 1, FormatError, what, ": experts are not numbered 0..", E - 1,
                   " (found ", E, " experts, the largest index ", L.experts.rbegin()->first, ")");
    // A count config.json gives must be positive where there are experts (a dense config may say 0).
    NVFP4MOE_CHECK(m.num_experts_field.empty() || m.num_experts > 0, FormatError, cfg_path, ": field ",
                   m.num_experts_field, ": expected a positive integer, got ", m.num_experts, " (layer ", l, " holds ",
                   E, " experts)");
    if (m.num_experts > 0)
      NVFP4MOE_CHECK(m.num_experts == E, FormatError, what, ": ", cfg_path, " says num_experts = ", m.num_experts,
                     " but the tensors hold ", E, " experts");
    // shapes and dtypes of one expert; returns its width and whether it is gated
    auto check_expert = [&](const UnquantizedExpert& x, const std::string& ew, int64_t want_width, bool want_gated) {
      const bool gated = !x.name[0].empty();
      NVFP4MOE_CHECK(!x.name[1].empty() && !x.name[2].empty(), FormatError, what, ": ", ew, ": expected ", x.base,
                     "{up_proj|w3}.weight and {down_proj|w2}.weight, missing ", x.name[1].empty() ? "up" : "down");
      if (want_width > 0)
        NVFP4MOE_CHECK(gated == want_gated, FormatError, what, ": ", ew, ": ",
                       want_gated ? "missing the gate projection " : "unexpected gate projection ", x.base,
                       want_gated ? "{gate_proj|w1}.weight" : "");
      const io::TensorInfo& d = files_.get(x.name[2]);
      NVFP4MOE_CHECK(d.shape.size() == 2 && d.shape[0] == H, FormatError, what, ": tensor ", d.name,
                     ": expected shape [", H, ", I], got ", shape_str(d.shape));
      const int64_t I = d.shape[1];
      if (want_width > 0)
        NVFP4MOE_CHECK(I == want_width, FormatError, what, ": tensor ", d.name, ": expected shape ",
                       shape_str({H, want_width}), ", got ", shape_str(d.shape));
      for (int r = 0; r < 3; ++r) {
        if (x.name[r].empty()) continue;
        const io::TensorInfo& g = files_.get(x.name[r]);
        const std::vector<int64_t> want = r == 2 ? std::vector<int64_t>{H, I} : std::vector<int64_t>{I, H};
        NVFP4MOE_CHECK(g.shape == want, FormatError, what, ": tensor ", g.name, ": expected shape ", shape_str(want),
                       ", got ", shape_str(g.shape));
        NVFP4MOE_CHECK(is_float_dtype(g.dtype), FormatError, what, ": tensor ", g.name,
                       ": expected dtype BF16, F16 or F32 (unquantized), got ", dtype_name(g.dtype));
      }
      NVFP4MOE_CHECK(H % 16 == 0 && I % 16 == 0, FormatError, what, ": ", ew,
                     ": NVFP4 needs H and I multiples of 16, got H = ", H, ", I = ", I);
      return std::make_pair(I, gated);
    };
    const auto [I, gated] = check_expert(L.experts.begin()->second, "expert 0", 0, false);
    for (const auto& [e, x] : L.experts) check_expert(x, cat("expert ", e), I, gated);
    // The config's expert width must match the tensors (as the NVFP4 loader's finish_layer requires).
    if (m.moe_intermediate > 0)
      NVFP4MOE_CHECK(m.moe_intermediate == I, FormatError, what, ": ", cfg_path, " expert intermediate size = ",
                     m.moe_intermediate, " but tensor ", L.experts.begin()->second.name[2], " has shape ",
                     shape_str({H, I}), " (I = ", I, ")");
    MoeSpec s;
    s.layer = l;
    s.hidden = H;
    s.intermediate = I;
    s.num_experts = E;
    s.top_k = m.top_k;
    s.activation = m.activation ? *m.activation : (gated ? Activation::SwiGLU : Activation::Relu2);
    s.routing = m.routing;
    s.norm_topk_prob = m.norm_topk_prob;
    s.n_group = m.n_group;
    s.topk_group = m.topk_group;
    s.routed_scaling_factor = m.routed_scaling_factor;
    s.has_router_bias = !L.bias.empty();
    if (L.shared) {
      const int64_t sw = check_expert(*L.shared, "shared expert", 0, false).first;
      // Zero width would pass the checks below and then be taken as "no shared expert": refused instead.
      NVFP4MOE_CHECK(sw > 0, FormatError, what, ": tensor ", L.shared->name[2], ": expected shape [", H,
                     ", I] with I > 0 (a shared expert of width 0), got ", shape_str({H, sw}));
      check_expert(*L.shared, "shared expert", sw, gated);
      if (m.shared_intermediate > 0)
        NVFP4MOE_CHECK(m.shared_intermediate == sw, FormatError, what, ": ", cfg_path,
                       " shared expert intermediate size = ", m.shared_intermediate, " but tensor ",
                       L.shared->name[2], " has shape ", shape_str({H, sw}), " (I = ", sw, ")");
      s.shared_intermediate = sw;
    } else {
      // A shared expert the config declares but the tensors lack would be silently dropped: a different model.
      NVFP4MOE_CHECK(m.shared_declared_by.empty(), FormatError, what, ": ", cfg_path, " ", m.shared_declared_by,
                     " declares a shared expert, but there are no tensors ", L.module, ".shared_experts.* or ",
                     L.module, ".shared_expert.* (expected e.g. ", L.module, ".shared_experts.down_proj.weight)");
      // A gate with nothing to gate means the shared expert's tensors are missing (or misnamed): not ignored.
      NVFP4MOE_CHECK(L.shared_gate.empty(), FormatError, what, ": tensor ", L.shared_gate,
                     " gates a shared expert, but there are no tensors ", L.module, ".shared_experts.* or ",
                     L.module, ".shared_expert.*");
    }
    s.shared_expert_gated = !L.shared_gate.empty();
    NVFP4MOE_CHECK(s.gated() == gated, FormatError, what, ": activation ", activation_name(s.activation),
                   gated ? " is not gated but the experts have gate projections" : " needs gate projections");
    try {
      s.validate();
    } catch (const ArgumentError& e) {
      throw FormatError(cat(what, ": inconsistent MoE config (", cfg_path, "): ", e.what()));
    }
    if (!L.router.empty()) {
      const io::TensorInfo& r = files_.get(L.router);
      NVFP4MOE_CHECK(r.shape == (std::vector<int64_t>{E, H}), FormatError, what, ": tensor ", r.name,
                     ": expected shape ", shape_str({E, H}), ", got ", shape_str(r.shape));
      NVFP4MOE_CHECK(is_float_dtype(r.dtype), FormatError, what, ": tensor ", r.name,
                     ": expected dtype BF16, F16 or F32, got ", dtype_name(r.dtype));
    }
    if (!L.bias.empty()) {
      const io::TensorInfo& b = files_.get(L.bias);
      NVFP4MOE_CHECK(b.shape == (std::vector<int64_t>{E}) && is_float_dtype(b.dtype), FormatError, what, ": tensor ",
                     b.name, ": expected a BF16/F16/F32 tensor of shape [", E, "], got ", dtype_name(b.dtype), " ",
                     shape_str(b.shape));
    }
    if (s.shared_expert_gated) {
      const io::TensorInfo& g = files_.get(L.shared_gate);
      NVFP4MOE_CHECK(g.numel() == H && is_float_dtype(g.dtype), FormatError, what, ": tensor ", g.name,
                     ": expected a BF16/F16/F32 tensor of ", H, " elements, got ", dtype_name(g.dtype), " ",
                     shape_str(g.shape));
    }
    L.spec = s;
  }
  check_layers_have_tensors(dir, m, seen);  // before the loop below, which num_hidden_layers sizes
  for (int64_t l = 0; l < m.num_layers; ++l) {
    const auto mit = moe_.find(static_cast<int>(l));
    if (m.layer_rule_known) {  // the same rule as the NVFP4 loader, so quantize's output opens the same way
      const bool want = m.predicted_moe(l);
      NVFP4MOE_CHECK(want == (mit != moe_.end()), FormatError, dir, ": layer ", l, ": ", m.file, " makes it ",
                     want ? "an MoE layer" : "a dense layer", " but the tensors ",
                     mit != moe_.end() ? cat("hold experts under ", mit->second.module, ".experts")
                                       : std::string("hold no experts"));
    }
    LayerSummary ls;
    ls.layer = static_cast<int>(l);
    auto it = moe_.find(static_cast<int>(l));
    ls.is_moe = it != moe_.end();
    ls.prefix = ls.is_moe ? it->second.module : cat(decoder_prefix, l, ".", module_child);
    ls.experts_found = ls.is_moe ? static_cast<int64_t>(it->second.experts.size()) : 0;
    summaries_.push_back(ls);
  }
}

std::vector<int> UnquantizedCheckpoint::moe_layers() const {
  std::vector<int> out;
  for (const auto& [l, L] : moe_) out.push_back(l);
  return out;
}

const UnquantizedLayer& UnquantizedCheckpoint::info(int layer) const {
  NVFP4MOE_CHECK(layer >= 0 && layer < static_cast<int>(summaries_.size()), ArgumentError, "layer: expected 0..",
                 static_cast<int64_t>(summaries_.size()) - 1, " (", dir_, " has ", summaries_.size(),
                 " decoder layers), got ", layer);
  auto it = moe_.find(layer);
  if (it == moe_.end()) {
    std::string s;
    for (int l : moe_layers()) s += (s.empty() ? "" : ",") + std::to_string(l);
    throw ArgumentError(cat("layer: ", layer, " of ", dir_, " is a dense layer, not an MoE layer (MoE layers: ",
                            s.empty() ? "none" : s, ")"));
  }
  return it->second;
}

size_t UnquantizedCheckpoint::layer_source_bytes(int layer) const {
  const UnquantizedLayer& L = info(layer);
  size_t b = 0;
  for (const auto& [e, x] : L.experts)
    for (const auto& n : x.name)
      if (!n.empty()) b += files_.get(n).nbytes();
  if (L.shared)
    for (const auto& n : L.shared->name)
      if (!n.empty()) b += files_.get(n).nbytes();
  return b;
}

MoeWeights UnquantizedCheckpoint::load_layer(int layer, const ProgressFn& progress) const {
  auto q = make_cpu_expert_quantizer();
  return load_layer_with(layer, *q, progress);
}

MoeWeights UnquantizedCheckpoint::load_layer_with(int layer, ExpertQuantizer& q, const ProgressFn& progress) const {
  const UnquantizedLayer& L = info(layer);
  const MoeSpec& s = L.spec;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  MoeWeights w;
  w.spec = s;
  // The router, its bias and the shared gate, checked finite (check_finite) before the experts are quantized.
  const std::string where = cat(dir_, ": layer ", layer);
  auto to_bf16 = [&](const std::string& name) {
    const io::TensorInfo& t = files_.get(name);
    std::vector<float> f(static_cast<size_t>(t.numel()));
    tensor_to_float(t, f.data());
    check_finite(t, f.data(), true, where);
    std::vector<uint16_t> v(f.size());
    if (t.dtype == DType::BF16) {
      std::memcpy(v.data(), t.data, v.size() * 2);
    } else {
      for (size_t i = 0; i < f.size(); ++i) v[i] = fmt::bf16_from_float(f[i]);
    }
    return v;
  };
  if (!L.router.empty()) w.router_weight = to_bf16(L.router);
  if (!L.bias.empty()) {
    const io::TensorInfo& t = files_.get(L.bias);
    w.router_bias.resize(static_cast<size_t>(t.numel()));
    tensor_to_float(t, w.router_bias.data());
    check_finite(t, w.router_bias.data(), false, where);
  }
  if (s.shared_expert_gated) w.shared_gate_weight = to_bf16(L.shared_gate);
  w.experts.allocate(s.num_experts, s.hidden, s.intermediate, s.gated());
  if (L.shared) w.shared.allocate(1, s.hidden, s.shared_intermediate, s.gated());
  const size_t total = layer_source_bytes(layer);
  size_t done = 0;
  auto run = [&](const UnquantizedExpert& x, StackedExperts& dst, int64_t slot, const std::string& ew) {
    ExpertSource src;
    src.what = cat(dir_, ": layer ", layer, " ", ew);
    for (int r = 0; r < 3; ++r) {
      if (x.name[r].empty()) continue;
      src.proj[r] = &files_.get(x.name[r]);
      done += src.proj[r]->nbytes();
    }
    q.quantize(src, dst, slot);
    if (progress) progress(done, total);
  };
  for (const auto& [e, x] : L.experts) run(x, w.experts, e, cat("expert ", e));
  if (L.shared) run(*L.shared, w.shared, 0, "shared expert");
  q.finish();
  // no activation scales in an unquantized checkpoint (see unquantized.h)
  for (StackedExperts* se : {&w.experts, &w.shared}) {
    std::fill(se->w13_input_scale.begin(), se->w13_input_scale.end(), nan);
    std::fill(se->w2_input_scale.begin(), se->w2_input_scale.end(), nan);
  }
  // (no w.validate(): it refuses the NaN input scales, which MoeLayer::create handles)
  return w;
}

std::string UnquantizedCheckpoint::inspect() const {
  std::ostringstream os;
  os << "checkpoint: " << dir_ << "\n";
  os << "format: bf16, quantized to NVFP4 at load (no quantization config; experts quantized as nvfp4-format.md "
        "section 3 when a layer is loaded, on the GPU for the cuda backend; no input scales: w4a16 only, or "
        "`nvfp4moe quantize IN OUT --calibration FILE` for w4a4)\n";
  std::set<std::string> dtypes;
  for (const auto& [l, L] : moe_)
    for (const auto& n : L.experts.begin()->second.name)
      if (!n.empty()) dtypes.insert(dtype_name(files_.get(n).dtype));
  std::string dts;
  for (const auto& d : dtypes) dts += (dts.empty() ? "" : "/") + d;
  os << "model type: " << (model_.model_type.empty() ? "?" : model_.model_type) << ", hidden " << model_.hidden
     << ", " << files_.num_files() << " safetensors file(s), expert weights " << dts << "\n";
  const auto moe = moe_layers();
  os << "layers: " << summaries_.size() << " (" << moe.size() << " MoE, " << summaries_.size() - moe.size()
     << " dense)\n";
  std::string dense;
  for (const auto& ls : summaries_)
    if (!ls.is_moe) dense += (dense.empty() ? "" : ",") + std::to_string(ls.layer);
  if (!dense.empty()) os << "dense layers: " << dense << "\n";
  for (const auto& [l, L] : moe_) {
    const bool mixtral = L.experts.begin()->second.name[2].size() > 9 &&
                         L.experts.begin()->second.name[2].find(".w2.weight") != std::string::npos;
    StackedExperts probe;
    probe.num_experts = L.spec.num_experts;
    probe.hidden = L.spec.hidden;
    probe.intermediate = L.spec.intermediate;
    probe.gated = L.spec.gated();
    size_t nvfp4 = static_cast<size_t>(probe.num_experts) * (probe.w13_bytes_per_expert() +
                   probe.w13_scale_bytes_per_expert() + probe.w2_bytes_per_expert() + probe.w2_scale_bytes_per_expert());
    os << "  " << L.spec.describe() << "  experts found " << L.experts.size() << ", " << L.module
       << (mixtral ? " (Mixtral names)" : "") << ", " << fmt_bytes(layer_source_bytes(l)) << " unquantized -> "
       << fmt_bytes(nvfp4) << " NVFP4 routed\n";
  }
  return os.str();
}

std::shared_ptr<Checkpoint> open_unquantized_checkpoint(const std::string& dir, ModelConfig mc) {
  // Unquantized only when some expert weight is a float tensor; a quantized checkpoint that lost its config
  // (U8 weights) is left to the caller's "no NVFP4 quantization config" error.
  {
    const io::SafetensorsSet files = io::SafetensorsSet::open(dir);
    bool any = false;  // some expert weight is a float tensor (a mix is refused below, naming the tensor)
    for (const std::string& name : files.names()) {
      if (name.find(".experts.") == std::string::npos && name.find(".shared_expert") == std::string::npos) continue;
      const size_t n = name.size();
      if (n < 7 || name.compare(n - 7, 7, ".weight") != 0) continue;
      if (is_float_dtype(files.get(name).dtype)) any = true;
    }
    if (!any) return nullptr;
  }
  return std::make_shared<UnquantizedCheckpoint>(dir, std::move(mc));
}

}  // namespace nvfp4moe::model
