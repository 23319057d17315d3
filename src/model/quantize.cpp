// `nvfp4moe quantize` / `nvfp4moe calibrate` (see quantize.h for what is computed).
#include "model/quantize.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "cpu/reference.h"
#include "model/tensor_names.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/checkpoint_format.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::model {

namespace fs = std::filesystem;
using detail::cat;
using nlohmann::json;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// IEEE half -> float (exact).
float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return fmt::bits_float(sign | 0x7F800000u | (man << 13));
  return fmt::bits_float(sign | ((exp + 112) << 23) | (man << 13));
}

// The values of a BF16 / F16 / F32 tensor as fp32.
std::vector<float> to_float(const io::TensorInfo& t, const std::string& file) {
  const size_t n = static_cast<size_t>(t.numel());
  std::vector<float> v(n);
  if (t.dtype == DType::F32) {
    std::memcpy(v.data(), t.data, n * 4);
  } else if (t.dtype == DType::BF16 || t.dtype == DType::F16) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t.data + 2 * i, 2);
      v[i] = t.dtype == DType::BF16 ? fmt::bf16_to_float(h) : f16_to_float(h);
    }
  } else {
    throw FormatError(cat(file, ": tensor ", t.name, ": expected dtype BF16, F16 or F32, got ", dtype_name(t.dtype)));
  }
  return v;
}
std::vector<uint16_t> to_bf16(const io::TensorInfo& t, const std::string& file) {
  if (t.dtype == DType::BF16) {
    std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 2);
    return v;
  }
  const auto f = to_float(t, file);
  std::vector<uint16_t> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = fmt::bf16_from_float(f[i]);
  return v;
}

float amax_of(const std::vector<float>& v, const std::string& what) {
  float a = 0.0f;
  for (float x : v) {
    NVFP4MOE_CHECK(std::isfinite(x), FormatError, what, ": expected finite weights, got ", x);
    a = std::max(a, std::fabs(x));
  }
  return a;
}

// A temp directory next to `out`, removed unless commit() renamed it to out.
class StagedDir {
 public:
  explicit StagedDir(const std::string& out) : out_(out) {
    NVFP4MOE_CHECK(!out.empty(), ArgumentError, "OUT: expected an output directory, got an empty path");
    NVFP4MOE_CHECK(!fs::exists(out), ArgumentError, "OUT: ", out,
                   " already exists (expected a new directory; nothing was written)");
    const fs::path parent = fs::absolute(fs::path(out)).parent_path();
    NVFP4MOE_CHECK(fs::is_directory(parent), ArgumentError, "OUT: ", out, ": parent directory ", parent.string(),
                   " does not exist");
    tmp_ = out + ".tmp-" + std::to_string(::getpid());
    fs::remove_all(tmp_);
    fs::create_directories(tmp_);
  }
  ~StagedDir() {
    if (!committed_) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    }
  }
  const std::string& path() const { return tmp_; }
  void commit() {
    fs::rename(tmp_, out_);
    committed_ = true;
  }

 private:
  std::string out_, tmp_;
  bool committed_ = false;
};

void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p);
  f << j.dump(2) << "\n";
  NVFP4MOE_CHECK(f.good(), FormatError, p.string(), ": write failed");
}

// Every file of in_dir except the safetensors data and the files we rewrite.
void copy_side_files(const std::string& in_dir, const std::string& out_dir) {
  for (const auto& e : fs::directory_iterator(in_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string n = e.path().filename().string();
    if (n == "config.json" || n == "hf_quant_config.json" || n == "model.safetensors.index.json") continue;
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) continue;
    fs::copy_file(e.path(), fs::path(out_dir) / n);
  }
}

// Sample hidden states of one layer, bf16 [T, H].
class Calibration {
 public:
  explicit Calibration(const CalibrationSource& src) : src_(src) {
    NVFP4MOE_CHECK(!src.file.empty() || src.random_tokens > 0, ArgumentError,
                   "calibration: w4a4 input scales need sample activations: expected --calibration FILE.safetensors "
                   "or --random-calibration N (N > 0), got neither");
    NVFP4MOE_CHECK(src.file.empty() || src.random_tokens == 0, ArgumentError,
                   "calibration: expected one of --calibration and --random-calibration, got both");
    if (!src.file.empty()) {
      NVFP4MOE_CHECK(fs::is_regular_file(src.file), ArgumentError, "--calibration: ", src.file,
                     ": expected a safetensors file of hidden states (layer.L.hidden [N, H]), it does not exist");
      set_ = std::make_unique<io::SafetensorsSet>(io::SafetensorsSet::open(src.file));
    }
  }
  std::vector<uint16_t> hidden(int layer, int64_t H, int64_t* tokens) const {
    if (set_) {
      const std::string name = cat("layer.", layer, ".hidden");
      const io::TensorInfo* t = set_->find(name);
      NVFP4MOE_CHECK(t, FormatError, src_.file, ": missing tensor ", name, " (sample hidden states [N, ", H,
                     "] for MoE layer ", layer, ")");
      NVFP4MOE_CHECK(t->shape.size() == 2 && t->shape[1] == H && t->shape[0] > 0, FormatError, src_.file, ": tensor ",
                     name, ": expected shape [N, ", H, "] with N > 0, got ", shape_str(t->shape));
      *tokens = t->shape[0];
      auto v = to_bf16(*t, src_.file);
      for (uint16_t h : v)
        NVFP4MOE_CHECK(std::isfinite(fmt::bf16_to_float(h)), FormatError, src_.file, ": tensor ", name,
                       ": expected finite hidden states, got ", fmt::bf16_to_float(h));
      return v;
    }
    *tokens = src_.random_tokens;
    std::mt19937_64 rng(src_.seed * 1000003u + static_cast<uint64_t>(layer));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> v(static_cast<size_t>(src_.random_tokens * H));
    for (auto& h : v) h = fmt::bf16_from_float(nd(rng));
    return v;
  }

 private:
  CalibrationSource src_;
  std::unique_ptr<io::SafetensorsSet> set_;
};

// ---- discovery of expert tensors in an unquantized checkpoint
// Role of a projection name: 0 gate, 1 up, 2 down, -1 other.
int proj_role(const std::string& p) {
  if (p == "gate_proj" || p == "w1") return 0;
  if (p == "up_proj" || p == "w3") return 1;
  if (p == "down_proj" || p == "w2") return 2;
  return -1;
}

struct ExpertSrc {  // one expert (routed e >= 0, shared e = -1): tensor names by role
  std::string name[3];
  std::string base;  // "<module>.experts.E." / "<module>.shared_experts."
};
struct LayerSrc {
  int layer = 0;
  std::string module;  // "model.layers.L.mlp"
  std::map<int64_t, ExpertSrc> experts;
  std::optional<ExpertSrc> shared;
  std::string router, bias, shared_gate;
};

struct QuantProj {
  std::vector<uint8_t> packed, scale;
  float ws2 = 1.0f, input_scale = 1.0f;
};

}  // namespace

void quantize_weight(const float* w, int64_t n, int64_t k, float ws2, uint8_t* packed, uint8_t* scales) {
  NVFP4MOE_CHECK(k % fmt::kBlock == 0, ArgumentError, "quantize_weight: k: expected a multiple of 16, got ", k);
#pragma omp parallel for schedule(static) if (n * k >= (1 << 20))
  for (int64_t r = 0; r < n; ++r) {
    uint8_t codes[fmt::kBlock];
    for (int64_t b = 0; b < k / fmt::kBlock; ++b) {
      const float* blk = w + r * k + b * fmt::kBlock;
      scales[r * (k / fmt::kBlock) + b] = fmt::quantize_weight_block(blk, fmt::kBlock, ws2, codes);
      for (int i = 0; i < fmt::kBlock; i += 2)
        packed[r * (k / 2) + b * (fmt::kBlock / 2) + i / 2] = fmt::pack_e2m1x2(codes[i], codes[i + 1]);
    }
  }
}

void calibrate_input_scales(MoeWeights& w, const uint16_t* hidden, int64_t T, const std::string& what) {
  NVFP4MOE_CHECK(!w.router_weight.empty(), FormatError, what,
                 ": no router weight (mlp.gate.weight), so calibration tokens cannot be routed to experts");
  const MoeSpec& s = w.spec;
  for (auto* v : {&w.experts.w13_input_scale, &w.experts.w2_input_scale, &w.shared.w13_input_scale,
                  &w.shared.w2_input_scale})
    for (float& x : *v)
      if (!(x > 0.0f) || !std::isfinite(x)) x = 1.0f;  // unused by the w4a16 calibration pass
  std::vector<float> logits(static_cast<size_t>(T * s.num_experts)), tw(static_cast<size_t>(T * s.top_k)),
      out(static_cast<size_t>(T * s.hidden));
  std::vector<int32_t> ids(static_cast<size_t>(T * s.top_k));
  cpu::router_logits(w, hidden, T, logits.data());
  cpu::route(s, logits.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(), T, ids.data(), tw.data());
  cpu::CalibrationStats st;
  cpu::moe_forward(w, Mode::W4A16, hidden, T, ids.data(), tw.data(), out.data(), &st);
  auto apply = [&](const std::vector<float>& amax, std::vector<float>& scale, const char* gemm) {
    if (scale.empty()) return;
    NVFP4MOE_CHECK(amax.size() == scale.size(), ArgumentError, what, ": calibration stats size mismatch");
    const float mx = *std::max_element(amax.begin(), amax.end());
    NVFP4MOE_CHECK(mx > 0.0f, ArgumentError, what, ": calibration: the ", gemm, " inputs of all ", T,
                   " sample tokens are zero (expected non-zero hidden states)");
    for (size_t e = 0; e < scale.size(); ++e) scale[e] = (amax[e] > 0.0f ? amax[e] : mx) / fmt::kWeightScaleDenom;
  };
  apply(st.gemm1_amax, w.experts.w13_input_scale, "GEMM1");
  apply(st.gemm2_amax, w.experts.w2_input_scale, "GEMM2");
  if (w.has_shared()) {
    apply(st.shared_gemm1_amax, w.shared.w13_input_scale, "shared GEMM1");
    apply(st.shared_gemm2_amax, w.shared.w2_input_scale, "shared GEMM2");
  }
}

// ------------------------------------------------------------------ quantize
QuantizeResult quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& opt) {
  const double t0 = now_s();
  QuantizeResult res;
  NVFP4MOE_CHECK(fs::is_directory(in_dir), ArgumentError, "IN: ", in_dir,
                 ": expected a checkpoint directory (config.json, *.safetensors), ",
                 fs::exists(in_dir) ? "got a file" : "it does not exist");
  const std::string cfg_path = (fs::path(in_dir) / "config.json").string();
  NVFP4MOE_CHECK(fs::exists(cfg_path), FormatError, cfg_path, ": missing (every checkpoint needs config.json)");
  json config = read_json_file(cfg_path);
  NVFP4MOE_CHECK(!(config.is_object() && config.contains("quantization_config")) &&
                     !fs::exists(fs::path(in_dir) / "hf_quant_config.json"),
                 FormatError, in_dir, ": already quantized (has ",
                 fs::exists(fs::path(in_dir) / "hf_quant_config.json") ? "hf_quant_config.json"
                                                                       : "config.json quantization_config",
                 "); expected an unquantized bf16/fp16/fp32 checkpoint (use `nvfp4moe calibrate` for new input scales)");
  const ModelConfig mc = parse_model_config(config, cfg_path);
  const Calibration calib(opt.calibration);
  const io::SafetensorsSet files = io::SafetensorsSet::open(in_dir);

  // ---- find the experts
  std::map<int, LayerSrc> layers;
  std::set<std::string> expert_tensors;
  for (const std::string& name : files.names()) {
    const auto t = split_dots(name);
    size_t i = 0;
    int64_t layer = -1;
    for (; i + 1 < t.size(); ++i)
      if (t[i] == "layers" && parse_index(t[i + 1], &layer)) break;
    if (layer < 0 || layer >= mc.num_layers || i + 4 >= t.size()) continue;
    std::string module;
    for (size_t j = 0; j <= i + 2; ++j) module += (j ? "." : "") + t[j];
    const std::string& child = t[i + 3];
    LayerSrc& L = layers[static_cast<int>(layer)];
    int64_t e = -1;
    if (child == "experts" && t.size() == i + 7 && parse_index(t[i + 4], &e) && t[i + 6] == "weight" &&
        proj_role(t[i + 5]) >= 0) {
      ExpertSrc& x = L.experts[e];
      x.base = cat(module, ".experts.", e, ".");
      x.name[proj_role(t[i + 5])] = name;
    } else if ((child == "shared_experts" || child == "shared_expert") && t.size() == i + 6 && t[i + 5] == "weight" &&
               proj_role(t[i + 4]) >= 0) {
      if (!L.shared) L.shared = ExpertSrc{};
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
  }
  for (auto it = layers.begin(); it != layers.end();)
    it = it->second.experts.empty() ? layers.erase(it) : std::next(it);
  NVFP4MOE_CHECK(!layers.empty(), FormatError, in_dir, ": no MoE expert weights found (expected tensors like "
                 "model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight)");

  // ---- quantize and calibrate, layer by layer
  std::map<std::string, QuantProj> quant;  // by the source tensor name (".weight")
  for (auto& [l, L] : layers) {
    const std::string what = cat(in_dir, ": layer ", l);
    const int64_t H = mc.hidden;
    const int64_t E = static_cast<int64_t>(L.experts.size());
    NVFP4MOE_CHECK(L.experts.rbegin()->first == E - 1, FormatError, what, ": experts are not numbered 0..", E - 1,
                   " (found ", E, " experts, the largest index ", L.experts.rbegin()->first, ")");
    if (mc.num_experts > 0)
      NVFP4MOE_CHECK(mc.num_experts == E, FormatError, what, ": ", cfg_path, " says num_experts = ", mc.num_experts,
                     " but the tensors hold ", E, " experts");
    auto width_of = [&](const ExpertSrc& x, const std::string& ew) {
      bool gated = !x.name[0].empty();
      NVFP4MOE_CHECK(!x.name[1].empty() && !x.name[2].empty(), FormatError, what, ": ", ew, ": expected ",
                     x.base, "{up_proj|w3}.weight and {down_proj|w2}.weight, missing ",
                     x.name[1].empty() ? "up" : "down");
      const io::TensorInfo& d = files.get(x.name[2]);
      NVFP4MOE_CHECK(d.shape.size() == 2 && d.shape[0] == H, FormatError, what, ": tensor ", d.name,
                     ": expected shape [", H, ", I], got ", shape_str(d.shape));
      const int64_t I = d.shape[1];
      for (int r = 0; r < 2; ++r) {
        if (r == 0 && !gated) continue;
        const io::TensorInfo& g = files.get(x.name[r]);
        NVFP4MOE_CHECK(g.shape == (std::vector<int64_t>{I, H}), FormatError, what, ": tensor ", g.name,
                       ": expected shape ", shape_str({I, H}), ", got ", shape_str(g.shape));
      }
      NVFP4MOE_CHECK(H % 16 == 0 && I % 16 == 0, FormatError, what, ": ", ew, ": NVFP4 needs H and I multiples of 16, "
                     "got H = ", H, ", I = ", I);
      return std::make_pair(I, gated);
    };
    const auto [I, gated] = width_of(L.experts.begin()->second, "expert 0");
    MoeSpec s;
    s.layer = l;
    s.hidden = H;
    s.intermediate = I;
    s.num_experts = E;
    s.top_k = mc.top_k;
    s.activation = mc.activation ? *mc.activation : (gated ? Activation::SwiGLU : Activation::Relu2);
    s.routing = mc.routing;
    s.norm_topk_prob = mc.norm_topk_prob;
    s.n_group = mc.n_group;
    s.topk_group = mc.topk_group;
    s.routed_scaling_factor = mc.routed_scaling_factor;
    s.has_router_bias = !L.bias.empty();
    if (L.shared) s.shared_intermediate = width_of(*L.shared, "shared expert").first;
    s.shared_expert_gated = !L.shared_gate.empty() && L.shared;
    NVFP4MOE_CHECK(s.gated() == gated, FormatError, what, ": activation ", activation_name(s.activation),
                   gated ? " is not gated but the experts have gate projections" : " needs gate projections");
    try {
      s.validate();
    } catch (const ArgumentError& e) {
      throw FormatError(cat(what, ": inconsistent MoE config (", cfg_path, "): ", e.what()));
    }

    MoeWeights w;
    w.spec = s;
    w.experts.allocate(E, H, I, gated);
    if (L.shared) w.shared.allocate(1, H, s.shared_intermediate, gated);
    auto quantize_expert = [&](const ExpertSrc& x, StackedExperts& dst, int64_t slot, int64_t width,
                               const std::string& ew) {
      NVFP4MOE_CHECK(gated == !x.name[0].empty(), FormatError, what, ": ", ew, ": ",
                     gated ? "missing the gate projection " : "unexpected gate projection ", x.base,
                     gated ? "{gate_proj|w1}.weight" : "");
      for (int r = 1; r < 3; ++r)
        NVFP4MOE_CHECK(!x.name[r].empty(), FormatError, what, ": ", ew, ": missing tensor ", x.base,
                       r == 1 ? "{up_proj|w3}.weight" : "{down_proj|w2}.weight");
      std::vector<float> v[3];
      float amax[3] = {0, 0, 0};
      for (int r = 0; r < 3; ++r) {
        if (x.name[r].empty()) continue;
        const io::TensorInfo& t = files.get(x.name[r]);
        const std::vector<int64_t> want = r == 2 ? std::vector<int64_t>{H, width} : std::vector<int64_t>{width, H};
        NVFP4MOE_CHECK(t.shape == want, FormatError, what, ": tensor ", t.name, ": expected shape ", shape_str(want),
                       ", got ", shape_str(t.shape));
        NVFP4MOE_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32, FormatError, what,
                       ": tensor ", t.name, ": expected dtype BF16, F16 or F32 (unquantized), got ", dtype_name(t.dtype));
        v[r] = to_float(t, in_dir);
        amax[r] = amax_of(v[r], cat(what, ": tensor ", t.name));
      }
      const float ws13 = fmt::weight_global_scale(std::max(amax[0], amax[1]));  // gate and up share one amax
      const float ws2[3] = {ws13, ws13, fmt::weight_global_scale(amax[2])};
      for (int r = 0; r < 3; ++r) {
        if (x.name[r].empty()) continue;
        const int64_t n = r == 2 ? H : width, k = r == 2 ? width : H;
        QuantProj& q = quant[x.name[r]];
        q.packed.resize(static_cast<size_t>(n * k / 2));
        q.scale.resize(static_cast<size_t>(n * k / 16));
        q.ws2 = ws2[r];
        quantize_weight(v[r].data(), n, k, q.ws2, q.packed.data(), q.scale.data());
        ++res.quantized_projections;
        const size_t us = static_cast<size_t>(slot);
        if (r < 2) {
          const size_t off = (r == 1 && gated) ? q.packed.size() : 0, soff = (r == 1 && gated) ? q.scale.size() : 0;
          std::memcpy(dst.w13.data() + us * dst.w13_bytes_per_expert() + off, q.packed.data(), q.packed.size());
          std::memcpy(dst.w13_scale.data() + us * dst.w13_scale_bytes_per_expert() + soff, q.scale.data(), q.scale.size());
          if (r == 0) dst.w13_gate_scale2[us] = q.ws2;
          else dst.w13_up_scale2[us] = q.ws2;
        } else {
          std::memcpy(dst.w2.data() + us * dst.w2_bytes_per_expert(), q.packed.data(), q.packed.size());
          std::memcpy(dst.w2_scale.data() + us * dst.w2_scale_bytes_per_expert(), q.scale.data(), q.scale.size());
          dst.w2_scale2[us] = q.ws2;
        }
      }
    };
    for (const auto& [e, x] : L.experts) quantize_expert(x, w.experts, e, I, cat("expert ", e));
    if (L.shared) quantize_expert(*L.shared, w.shared, 0, s.shared_intermediate, "shared expert");
    if (!L.router.empty()) {
      const io::TensorInfo& r = files.get(L.router);
      NVFP4MOE_CHECK(r.shape == (std::vector<int64_t>{E, H}), FormatError, what, ": tensor ", r.name,
                     ": expected shape ", shape_str({E, H}), ", got ", shape_str(r.shape));
      w.router_weight = to_bf16(r, in_dir);
    }
    if (!L.bias.empty()) w.router_bias = to_float(files.get(L.bias), in_dir);
    if (s.shared_expert_gated) w.shared_gate_weight = to_bf16(files.get(L.shared_gate), in_dir);
    int64_t T = 0;
    const std::vector<uint16_t> hidden = calib.hidden(l, H, &T);
    calibrate_input_scales(w, hidden.data(), T, what);
    for (const auto& [e, x] : L.experts)
      for (int r = 0; r < 3; ++r)
        if (!x.name[r].empty())
          quant[x.name[r]].input_scale = r < 2 ? w.experts.w13_input_scale[static_cast<size_t>(e)]
                                               : w.experts.w2_input_scale[static_cast<size_t>(e)];
    if (L.shared)
      for (int r = 0; r < 3; ++r)
        if (!L.shared->name[r].empty())
          quant[L.shared->name[r]].input_scale = r < 2 ? w.shared.w13_input_scale[0] : w.shared.w2_input_scale[0];
    res.moe_layers.push_back(l);
  }

  // ---- write
  StagedDir out(out_dir);
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::string> excluded;
  auto scalar = [](const std::string& name, const float* v) {
    io::TensorToWrite t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = {};
    t.fill = [v](uint8_t* dst, size_t n) { std::memcpy(dst, v, n); };
    return t;
  };
  for (const std::string& name : files.names()) {
    auto it = quant.find(name);
    if (it == quant.end()) {
      const io::TensorInfo& t = files.get(name);
      io::TensorToWrite x;
      x.name = name;
      x.dtype = t.dtype;
      x.shape = t.shape;
      const uint8_t* src = t.data;
      x.fill = [src](uint8_t* dst, size_t n) { std::memcpy(dst, src, n); };
      tensors.push_back(std::move(x));
      ++res.copied_tensors;
      if (t.shape.size() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0)
        excluded.push_back(name.substr(0, name.size() - 7));
      continue;
    }
    const std::string base = name.substr(0, name.size() - 7);  // drop ".weight"
    const QuantProj& q = it->second;
    const io::TensorInfo& t = files.get(name);
    io::TensorToWrite pw;
    pw.name = name;
    pw.dtype = DType::U8;
    pw.shape = {t.shape[0], t.shape[1] / 2};
    pw.fill = [&q](uint8_t* dst, size_t n) { std::memcpy(dst, q.packed.data(), n); };
    tensors.push_back(std::move(pw));
    io::TensorToWrite sw;
    sw.name = base + ".weight_scale";
    sw.dtype = DType::F8_E4M3;
    sw.shape = {t.shape[0], t.shape[1] / 16};
    sw.fill = [&q](uint8_t* dst, size_t n) { std::memcpy(dst, q.scale.data(), n); };
    tensors.push_back(std::move(sw));
    tensors.push_back(scalar(base + ".weight_scale_2", &q.ws2));
    tensors.push_back(scalar(base + ".input_scale", &q.input_scale));
  }
  io::write_sharded_safetensors(out.path(), tensors, opt.max_shard_bytes);
  json qcfg = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
               {"exclude_modules", excluded}, {"producer", "nvfp4moe quantize (CPU, nvfp4-format.md section 3)"}};
  config["quantization_config"] = qcfg;
  write_json(fs::path(out.path()) / "config.json", config);
  json hf = {{"producer", {{"name", "nvfp4moe"}, {"version", "0.1.0"}}},
             {"quantization",
              {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
               {"exclude_modules", excluded}}}};
  write_json(fs::path(out.path()) / "hf_quant_config.json", hf);
  copy_side_files(in_dir, out.path());
  // the result must open and load as an NVFP4 checkpoint before it is published
  {
    auto ck = Checkpoint::open(out.path());
    for (int l : ck->moe_layers()) ck->load_layer(l);
  }
  out.commit();
  res.seconds = now_s() - t0;
  return res;
}

// ------------------------------------------------------------------ calibrate
CalibrateResult calibrate_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                     const CalibrationSource& source) {
  const double t0 = now_s();
  CalibrateResult res;
  auto ck = Checkpoint::open(in_dir);
  // ModelOpt: input_scale tensors rewritten. compressed-tensors: input_global_scale = 1.0f / input_scale written
  // (added where a W4A16 checkpoint has none, and config_groups.*.input_activations set to NVFP4 dynamic "local").
  const bool ct = ck->format() == CheckpointFormat::CompressedTensors;
  const std::string in_suffix = ct ? ".input_global_scale" : ".input_scale", w_suffix = ct ? ".weight_packed" : ".weight";
  const Calibration calib(source);
  const io::SafetensorsSet files = io::SafetensorsSet::open(in_dir);
  std::map<std::string, float> new_scale;  // input_scale tensor name -> value
  for (int l : ck->moe_layers()) {
    MoeWeights w = ck->load_layer(l);
    int64_t T = 0;
    const std::vector<uint16_t> hidden = calib.hidden(l, w.spec.hidden, &T);
    calibrate_input_scales(w, hidden.data(), T, cat(in_dir, ": layer ", l));
    const std::string prefix = ck->layers()[static_cast<size_t>(l)].prefix;
    const bool mixtral = files.find(cat(prefix, ".experts.0.w2.weight")) != nullptr;
    const std::string pn[3] = {mixtral ? "w1" : "gate_proj", mixtral ? "w3" : "up_proj", mixtral ? "w2" : "down_proj"};
    auto set = [&](const std::string& base, float s13, float s2) {
      for (int r = 0; r < 3; ++r) {
        if (!files.find(base + pn[r] + w_suffix)) continue;
        const float v = r < 2 ? s13 : s2;
        new_scale[base + pn[r] + in_suffix] = ct ? 1.0f / v : v;
      }
    };
    for (int64_t e = 0; e < w.spec.num_experts; ++e)
      set(cat(prefix, ".experts.", e, "."), w.experts.w13_input_scale[static_cast<size_t>(e)],
          w.experts.w2_input_scale[static_cast<size_t>(e)]);
    if (w.has_shared())
      for (const char* kind : {".shared_experts.", ".shared_expert."})
        set(prefix + kind, w.shared.w13_input_scale[0], w.shared.w2_input_scale[0]);
    res.moe_layers.push_back(l);
  }
  StagedDir out(out_dir);
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::string> names = files.names();
  for (const auto& [n, v] : new_scale)
    if (!files.find(n)) names.push_back(n);  // a W4A16 compressed-tensors checkpoint had none
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (!files.find(name)) {
      io::TensorToWrite x;
      x.name = name;
      x.dtype = DType::F32;
      x.shape = {1};
      const float* v = &new_scale.at(name);
      x.fill = [v](uint8_t* dst, size_t n) { std::memcpy(dst, v, n); };
      ++res.input_scales_written;
      tensors.push_back(std::move(x));
      continue;
    }
    const io::TensorInfo& t = files.get(name);
    io::TensorToWrite x;
    x.name = name;
    x.dtype = t.dtype;
    x.shape = t.shape;
    auto it = new_scale.find(name);
    if (it != new_scale.end()) {
      const float* v = &it->second;
      x.fill = [v](uint8_t* dst, size_t n) { std::memcpy(dst, v, n); };
      ++res.input_scales_written;
    } else {
      const uint8_t* src = t.data;
      x.fill = [src](uint8_t* dst, size_t n) { std::memcpy(dst, src, n); };
    }
    tensors.push_back(std::move(x));
  }
  size_t total = 0;
  for (const auto& name : files.names()) total += files.get(name).nbytes();
  const size_t shard = std::max<size_t>(total / std::max<size_t>(1, files.num_files()) + 1, size_t(1) << 20);
  io::write_sharded_safetensors(out.path(), tensors, shard);
  if (ct) {
    json config = read_json_file((fs::path(in_dir) / "config.json").string());
    json in_args = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16},
                    {"symmetric", true}, {"dynamic", "local"}};
    for (auto& [gname, g] : config["quantization_config"]["config_groups"].items())
      if (!g.contains("input_activations") || g["input_activations"].is_null()) g["input_activations"] = in_args;
    write_json(fs::path(out.path()) / "config.json", config);
  } else {
    fs::copy_file(fs::path(in_dir) / "config.json", fs::path(out.path()) / "config.json");
  }
  if (fs::exists(fs::path(in_dir) / "hf_quant_config.json"))
    fs::copy_file(fs::path(in_dir) / "hf_quant_config.json", fs::path(out.path()) / "hf_quant_config.json");
  copy_side_files(in_dir, out.path());
  Checkpoint::open(out.path());
  out.commit();
  res.seconds = now_s() - t0;
  return res;
}

}  // namespace nvfp4moe::model
