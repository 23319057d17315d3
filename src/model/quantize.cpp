// `nvfp4moe quantize` / `nvfp4moe calibrate` (see quantize.h for what is computed).
#include "model/quantize.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "cpu/reference.h"
#include "model/tensor_names.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/checkpoint_format.h"
#include "nvfp4moe/checkpoint.h"
#include "model/unquantized.h"
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

// The values of a BF16 / F16 / F32 tensor as fp32 (the error names the file).
std::vector<float> to_float(const io::TensorInfo& t, const std::string& file) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
    throw FormatError(cat(file, ": tensor ", t.name, ": expected dtype BF16, F16 or F32, got ", dtype_name(t.dtype)));
  std::vector<float> v(static_cast<size_t>(t.numel()));
  tensor_to_float(t, v.data());
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

// A temp directory next to `out`, removed unless commit() renamed it to out.
class StagedDir {
 public:
  explicit StagedDir(const std::string& out) : out_(out) {
    NVFP4MOE_CHECK(!out.empty(), ArgumentError, "OUT: expected an output directory, got an empty path");
    // "OUT/" names OUT: without this the temp dir would be "OUT/.tmp-<pid>" (inside OUT) and the parent check
    // below would look at OUT itself (as synthetic.cpp does for `gen`).
    while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
    // symlink_status: a dangling symlink at OUT is an existing entry too (rename would silently replace it)
    NVFP4MOE_CHECK(!fs::exists(fs::symlink_status(out_)), ArgumentError, "OUT: ", out,
                   " already exists (expected a new directory; nothing was written)");
    const fs::path parent = fs::absolute(fs::path(out_)).parent_path();
    NVFP4MOE_CHECK(fs::is_directory(parent), ArgumentError, "OUT: ", out, ": parent directory ", parent.string(),
                   " does not exist");
    tmp_ = out_ + ".tmp-" + std::to_string(::getpid());
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
    // RENAME_NOREPLACE: OUT may have appeared while we wrote (it was checked absent up front); plain rename(2)
    // would silently replace an empty directory (or a file/symlink) there. Then fail and leave it untouched.
    int err = ::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, out_.c_str(), RENAME_NOREPLACE) == 0 ? 0 : errno;
    if (err == EINVAL) {  // a filesystem without RENAME_NOREPLACE: check, then rename (a small race remains)
      err = fs::exists(fs::symlink_status(out_)) ? EEXIST : 0;
      if (!err && ::rename(tmp_.c_str(), out_.c_str()) != 0) err = errno;
    }
    if (err != 0) {
      NVFP4MOE_CHECK(err != EEXIST, ArgumentError, "OUT: ", out_,
                     " was created by someone else while the output was being written; expected a new directory "
                     "(left it untouched, nothing was written)");
      throw Error(cat("OUT: cannot rename ", tmp_, " to ", out_, ": ", std::strerror(err)));
    }
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
    NVFP4MOE_CHECK(src.random_tokens >= 0 && src.random_tokens <= kMaxRandomCalibrationTokens, ArgumentError,
                   "--random-calibration: expected 1..", kMaxRandomCalibrationTokens, " tokens per layer, got ",
                   src.random_tokens);
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
  // discovery and validation of every layer (shapes, dtypes, spec) before anything is quantized or written
  const UnquantizedCheckpoint ck(in_dir, mc);
  const io::SafetensorsSet& files = ck.files();
  std::unique_ptr<ExpertQuantizer> quantizer =
      opt.cuda ? make_cuda_expert_quantizer(opt.cuda_device) : make_cpu_expert_quantizer();
  res.device = opt.cuda ? "cuda" : "cpu";

  // where each quantized projection comes from: (layer, expert (-1 = shared), role 0 gate / 1 up / 2 down)
  struct Src {
    int layer;
    int64_t expert;
    int role;
  };
  std::map<std::string, Src> qsrc;  // by the source tensor name (".weight")
  for (int l : ck.moe_layers()) {
    const UnquantizedLayer& L = ck.layer_source(l);
    for (const auto& [e, x] : L.experts)
      for (int r = 0; r < 3; ++r)
        if (!x.name[r].empty()) qsrc[x.name[r]] = {l, e, r};
    if (L.shared)
      for (int r = 0; r < 3; ++r)
        if (!L.shared->name[r].empty()) qsrc[L.shared->name[r]] = {l, -1, r};
    res.moe_layers.push_back(l);
  }

  // Streaming: the writer calls the fills in tensor order, and the tensors are ordered by layer, so one layer is
  // quantized and calibrated when its first tensor is written and dropped when the next layer starts: peak memory
  // is one layer's MoeWeights (plus one expert of staging), whatever the checkpoint size.
  struct Current {
    int layer = -1;
    MoeWeights w;
  };
  auto cur = std::make_shared<Current>();
  auto layer_weights = [&, cur](int l) -> const MoeWeights& {
    if (cur->layer != l) {
      cur->w = MoeWeights{};  // free the previous layer first
      cur->layer = -1;
      const double q0 = now_s();
      MoeWeights w = ck.load_layer_with(l, *quantizer);
      LayerTiming lt;
      lt.layer = l;
      lt.quantize_seconds = now_s() - q0;
      lt.source_bytes = ck.layer_source_bytes(l);
      int64_t T = 0;
      const std::vector<uint16_t> hidden = calib.hidden(l, mc.hidden, &T);
      const double c0 = now_s();
      calibrate_input_scales(w, hidden.data(), T, cat(in_dir, ": layer ", l));
      lt.calibrate_seconds = now_s() - c0;
      res.layers.push_back(lt);
      res.quantize_seconds += lt.quantize_seconds;
      res.source_bytes += lt.source_bytes;
      if (opt.on_layer) opt.on_layer(lt);
      cur->w = std::move(w);
      cur->layer = l;
    }
    return cur->w;
  };
  // the bytes of one output tensor of a quantized projection: 0 packed, 1 block scales, 2 ws2, 3 input scale
  auto emit = [&layer_weights](const Src& q, int what, uint8_t* dst, size_t n) {
    const MoeWeights& w = layer_weights(q.layer);
    const StackedExperts& se = q.expert < 0 ? w.shared : w.experts;
    const size_t slot = static_cast<size_t>(q.expert < 0 ? 0 : q.expert);
    const bool second = q.role == 1 && se.gated;  // up rows follow gate rows in w13
    const uint8_t* src = nullptr;
    float v = 0;
    switch (what) {
      case 0:
        src = q.role == 2 ? se.w2.data() + slot * se.w2_bytes_per_expert()
                          : se.w13.data() + slot * se.w13_bytes_per_expert() + (second ? n : 0);
        break;
      case 1:
        src = q.role == 2 ? se.w2_scale.data() + slot * se.w2_scale_bytes_per_expert()
                          : se.w13_scale.data() + slot * se.w13_scale_bytes_per_expert() + (second ? n : 0);
        break;
      case 2:
        v = q.role == 0 ? se.w13_gate_scale2[slot] : q.role == 1 ? se.w13_up_scale2[slot] : se.w2_scale2[slot];
        break;
      default:
        v = q.role < 2 ? se.w13_input_scale[slot] : se.w2_input_scale[slot];
    }
    if (src) std::memcpy(dst, src, n);
    else std::memcpy(dst, &v, n);
  };

  // ---- write
  StagedDir out(out_dir);
  std::vector<io::TensorToWrite> tensors;
  std::vector<std::string> excluded;
  std::vector<std::string> names = files.names();
  std::set<std::string> routers;  // router and shared-expert gate weights of the MoE layers
  for (int l : ck.moe_layers()) {
    const UnquantizedLayer& L = ck.layer_source(l);
    for (const std::string* n : {&L.router, &L.shared_gate})
      if (!n->empty()) routers.insert(*n);
  }
  auto layer_of = [&](const std::string& n) {
    auto it = qsrc.find(n);
    return it == qsrc.end() ? -1 : it->second.layer;
  };
  std::stable_sort(names.begin(), names.end(),
                   [&](const std::string& x, const std::string& y) { return layer_of(x) < layer_of(y); });
  for (const std::string& name : names) {
    auto it = qsrc.find(name);
    const io::TensorInfo& t = files.get(name);
    if (it == qsrc.end()) {
      io::TensorToWrite x;
      x.name = name;
      x.dtype = t.dtype;
      x.shape = t.shape;
      const uint8_t* src = t.data;
      x.fill = [src](uint8_t* dst, size_t n) { std::memcpy(dst, src, n); };
      if (t.dtype == DType::F16 && routers.count(name)) {  // the NVFP4 loader reads routers as BF16 (or F32)
        x.dtype = DType::BF16;
        const io::TensorInfo* ti = &t;
        x.fill = [ti](uint8_t* dst, size_t n) {
          std::vector<float> f(static_cast<size_t>(ti->numel()));
          tensor_to_float(*ti, f.data());
          for (size_t i = 0; i < f.size() && 2 * i < n; ++i) {
            const uint16_t h = fmt::bf16_from_float(f[i]);
            std::memcpy(dst + 2 * i, &h, 2);
          }
        };
      }
      tensors.push_back(std::move(x));
      ++res.copied_tensors;
      if (t.shape.size() == 2 && name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0)
        excluded.push_back(name.substr(0, name.size() - 7));
      continue;
    }
    const std::string base = name.substr(0, name.size() - 7);  // drop ".weight"
    const Src q = it->second;
    const std::pair<std::string, std::pair<DType, std::vector<int64_t>>> outs[4] = {
        {name, {DType::U8, {t.shape[0], t.shape[1] / 2}}},
        {base + ".weight_scale", {DType::F8_E4M3, {t.shape[0], t.shape[1] / 16}}},
        {base + ".weight_scale_2", {DType::F32, {}}},
        {base + ".input_scale", {DType::F32, {}}}};
    for (int k = 0; k < 4; ++k) {
      io::TensorToWrite x;
      x.name = outs[k].first;
      x.dtype = outs[k].second.first;
      x.shape = outs[k].second.second;
      x.fill = [emit, q, k](uint8_t* dst, size_t n) { emit(q, k, dst, n); };
      tensors.push_back(std::move(x));
    }
    ++res.quantized_projections;
  }
  io::write_sharded_safetensors(out.path(), tensors, opt.max_shard_bytes);
  cur->w = MoeWeights{};
  cur->layer = -1;
  json qcfg = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"group_size", 16},
               {"exclude_modules", excluded},
               {"producer", cat("nvfp4moe quantize (", res.device, ", nvfp4-format.md section 3)")}};
  config["quantization_config"] = qcfg;
  write_json(fs::path(out.path()) / "config.json", config);
  json hf = {{"producer", {{"name", "nvfp4moe"}, {"version", "0.1.0"}}},
             {"quantization",
              {{"quant_algo", "NVFP4"}, {"kv_cache_quant_algo", nullptr}, {"group_size", 16},
               {"exclude_modules", excluded}}}};
  write_json(fs::path(out.path()) / "hf_quant_config.json", hf);
  copy_side_files(in_dir, out.path());
  // the result must open and load as an NVFP4 checkpoint before it is published (one layer at a time)
  {
    auto back = Checkpoint::open(out.path());
    for (int l : back->moe_layers()) back->load_layer(l);
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
  NVFP4MOE_CHECK(ck->format() != CheckpointFormat::Bf16, FormatError, in_dir,
                 ": no NVFP4 quantization config: an unquantized (bf16/fp16/fp32) checkpoint; expected an NVFP4 one "
                 "(quantize it with `nvfp4moe quantize IN OUT --calibration FILE`, which measures the input scales)");
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
