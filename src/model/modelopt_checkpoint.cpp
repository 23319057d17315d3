// Checkpoint::open for NVFP4 MoE checkpoints: config.json (Qwen3-MoE, Mixtral, DeepSeek-V3, Nemotron-H,
// gpt-oss styles), the ModelOpt quantization config, layer discovery from tensor names, validation and the
// streaming loader into MoeWeights (nvfp4-format.md sections 1, 5, 7, 11).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "model/tensor_names.h"
#include "model/checkpoint_format.h"
#include "model/unquantized.h"
#include "io/safetensors.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe {
namespace model {

namespace fs = std::filesystem;
using nlohmann::json;
using detail::cat;

// ------------------------------------------------------------------ json helpers
json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  NVFP4MOE_CHECK(in.good(), FormatError, path, ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // Strict, as for the safetensors header: a duplicate key (nlohmann keeps the last value) is refused, since
  // which of the two values the model uses would be a guess. "<path>: duplicate key "k" in the file".
  return io::parse_json_strict(text.data(), text.data() + text.size(), path, "file");
}

namespace {

std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  NVFP4MOE_CHECK(v.is_number_integer(), FormatError, file, ": field ", key, ": expected an integer, got ", v.dump());
  return v.get<int64_t>();
}
std::optional<double> opt_num(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  NVFP4MOE_CHECK(v.is_number(), FormatError, file, ": field ", key, ": expected a number, got ", v.dump());
  return v.get<double>();
}
std::optional<bool> opt_bool(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  NVFP4MOE_CHECK(v.is_boolean(), FormatError, file, ": field ", key, ": expected true/false, got ", v.dump());
  return v.get<bool>();
}
std::optional<std::string> opt_str(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const auto& v = j[key];
  NVFP4MOE_CHECK(v.is_string(), FormatError, file, ": field ", key, ": expected a string, got ", v.dump());
  return v.get<std::string>();
}
template <typename T>
T first_of(std::initializer_list<std::optional<T>> l, T dflt) {
  for (const auto& o : l)
    if (o) return *o;
  return dflt;
}

std::vector<std::string> string_list(const json& j, const char* key, const std::string& file) {
  std::vector<std::string> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  NVFP4MOE_CHECK(j[key].is_array(), FormatError, file, ": field ", key, ": expected a list of strings, got ",
                 j[key].dump());
  for (const auto& v : j[key]) {
    NVFP4MOE_CHECK(v.is_string(), FormatError, file, ": field ", key, ": expected a list of strings, got element ",
                   v.dump());
    out.push_back(v.get<std::string>());
  }
  return out;
}

}  // namespace

// ------------------------------------------------------------------ config.json
bool ModelConfig::predicted_moe(int64_t layer) const {
  if (!hybrid_pattern.empty())
    return layer < static_cast<int64_t>(hybrid_pattern.size()) && hybrid_pattern[static_cast<size_t>(layer)] == 'E';
  if (layer < first_k_dense) return false;
  if (moe_layer_freq > 1 && layer % moe_layer_freq != 0) return false;
  if (mlp_only_layers.count(layer)) return false;
  if (decoder_sparse_step > 1 && (layer + 1) % decoder_sparse_step != 0) return false;
  return true;
}

void check_layers_have_tensors(const std::string& dir, const ModelConfig& m, const std::set<int64_t>& seen) {
  if (static_cast<int64_t>(seen.size()) == m.num_layers) return;
  int64_t missing = 0;
  while (seen.count(missing)) ++missing;
  throw FormatError(cat(dir, ": layer ", missing, " has no tensors at all (config ", m.file,
                        " says num_hidden_layers = ", m.num_layers, "; ",
                        seen.empty() ? std::string("no layer has tensors")
                                     : cat("the highest layer with tensors is ", *seen.rbegin()), ")"));
}

ModelConfig parse_model_config(const json& root, const std::string& file) {
  NVFP4MOE_CHECK(root.is_object(), FormatError, file, ": expected a JSON object");
  ModelConfig c;
  c.file = file;
  // Multimodal wrappers keep the language model's fields under text_config.
  const json& j = (!root.contains("num_hidden_layers") && root.contains("text_config") && root["text_config"].is_object())
                      ? root["text_config"] : root;
  c.model_type = first_of<std::string>({opt_str(j, "model_type", file), opt_str(root, "model_type", file)}, "");
  const std::string& mt = c.model_type;
  const bool nemotron = mt == "nemotron_h";
  const bool mixtral = mt == "mixtral";
  const bool gpt_oss = mt == "gpt_oss";

  c.num_layers = first_of<int64_t>({opt_int(j, "num_hidden_layers", file)}, -1);
  NVFP4MOE_CHECK(c.num_layers > 0, FormatError, file, ": field num_hidden_layers: expected a positive integer, got ",
                 j.contains("num_hidden_layers") ? j["num_hidden_layers"].dump() : std::string("nothing (missing)"));
  c.hidden = first_of<int64_t>({opt_int(j, "hidden_size", file)}, -1);
  NVFP4MOE_CHECK(c.hidden > 0, FormatError, file, ": field hidden_size: expected a positive integer, got ",
                 j.contains("hidden_size") ? j["hidden_size"].dump() : std::string("nothing (missing)"));
  for (const char* key : {"n_routed_experts", "num_experts", "num_local_experts"})
    if (auto n = opt_int(j, key, file)) {
      c.num_experts = *n;
      c.num_experts_field = key;  // a non-positive value is refused at the MoE layers (dense configs may say 0)
      break;
    }
  c.top_k = first_of<int64_t>({opt_int(j, "num_experts_per_tok", file), opt_int(j, "experts_per_token", file),
                               opt_int(j, "moe_topk", file)}, -1);
  // Mixtral and gpt-oss use intermediate_size for the expert width; elsewhere it is the dense MLP's width.
  c.moe_intermediate = (mixtral || gpt_oss)
                           ? first_of<int64_t>({opt_int(j, "intermediate_size", file)}, -1)
                           : first_of<int64_t>({opt_int(j, "moe_intermediate_size", file)}, -1);

  const auto scoring = opt_str(j, "scoring_func", file);
  const auto topk_method = opt_str(j, "topk_method", file);
  const bool sigmoid = (scoring && *scoring == "sigmoid") || (topk_method && *topk_method == "noaux_tc") ||
                       (!scoring && (mt == "deepseek_v3" || nemotron || mt == "glm4_moe"));
  NVFP4MOE_CHECK(!scoring || *scoring == "sigmoid" || *scoring == "softmax", FormatError, file,
                 ": field scoring_func: expected \"sigmoid\" or \"softmax\", got \"", *scoring, "\"");
  if (sigmoid) {
    c.routing = Routing::SigmoidGroupedTopK;
    c.n_group = first_of<int64_t>({opt_int(j, "n_group", file)}, 1);
    c.topk_group = first_of<int64_t>({opt_int(j, "topk_group", file)}, 1);
    c.norm_topk_prob = first_of<bool>({opt_bool(j, "norm_topk_prob", file)}, true);
  } else {
    c.routing = Routing::SoftmaxTopK;
    const int64_t groups = first_of<int64_t>({opt_int(j, "n_group", file)}, 1);
    NVFP4MOE_CHECK(groups <= 1 || (topk_method && *topk_method == "greedy"), FormatError, file,
                   ": softmax routing with n_group = ", groups, " (topk_method \"",
                   topk_method ? *topk_method : std::string(""), "\") is not supported: expected n_group 1 or sigmoid "
                   "noaux_tc routing");
    c.norm_topk_prob = first_of<bool>({opt_bool(j, "norm_topk_prob", file)}, mixtral || gpt_oss);
  }
  c.routed_scaling_factor = static_cast<float>(first_of<double>({opt_num(j, "routed_scaling_factor", file)}, 1.0));
  if (gpt_oss)
    c.notes.push_back("gpt-oss: experts computed as plain SwiGLU (the model's clamped swiglu, alpha 1.702, limit 7, "
                      "and expert biases are not modelled)");

  // The expert activation. Only the spellings real checkpoints use for what the experts compute: silu (HF's
  // name for SwiGLU's gate, "swish" its alias) / swiglu, and relu2. Anything else (gelu ...) would silently
  // run as a different model.
  auto activation_of = [&](const char* field, const std::string& v) {
    if (v == "silu" || v == "swish" || v == "swiglu") return Activation::SwiGLU;
    NVFP4MOE_CHECK(v == "relu2", FormatError, file, ": field ", field,
                   ": expected \"silu\", \"swish\", \"swiglu\" or \"relu2\" (the expert activations supported), got \"",
                   v, "\"");
    return Activation::Relu2;
  };
  const auto mlp_act = opt_str(j, "mlp_hidden_act", file);
  const auto hidden_act = opt_str(j, "hidden_act", file);
  if (mlp_act) c.activation = activation_of("mlp_hidden_act", *mlp_act);
  else if (nemotron) c.activation = Activation::Relu2;
  else if (hidden_act) c.activation = activation_of("hidden_act", *hidden_act);

  // Shared expert width. A declared shared expert (width or count > 0) must have tensors (finish_layer).
  auto non_negative = [&](const char* field, int64_t v) {
    NVFP4MOE_CHECK(v >= 0, FormatError, file, ": field ", field, ": expected a non-negative integer, got ", v);
    if (v > 0) c.shared_declared_by = cat("field ", field, " = ", v);
    return v;
  };
  if (auto n = opt_int(j, "moe_shared_expert_intermediate_size", file))
    c.shared_intermediate = non_negative("moe_shared_expert_intermediate_size", *n);
  else if (auto q = opt_int(j, "shared_expert_intermediate_size", file))
    c.shared_intermediate = non_negative("shared_expert_intermediate_size", *q);
  else if (auto s = opt_int(j, "n_shared_experts", file)) {
    non_negative("n_shared_experts", *s);
    int64_t w = 0;
    NVFP4MOE_CHECK(!__builtin_mul_overflow(*s, std::max<int64_t>(c.moe_intermediate, 0), &w), FormatError, file,
                   ": field n_shared_experts = ", *s, " times moe_intermediate_size = ", c.moe_intermediate,
                   ": expected a shared expert width that fits int64, got an overflow");
    if (*s > 0 && c.moe_intermediate > 0) c.shared_intermediate = w;
    else if (*s == 0) c.shared_intermediate = 0;
  }

  // Dense/MoE layer pattern.
  if (auto p = opt_str(j, "hybrid_override_pattern", file)) {
    c.hybrid_pattern = *p;
    c.layer_rule_known = true;
  }
  if (auto f = opt_int(j, "first_k_dense_replace", file)) { c.first_k_dense = *f; c.layer_rule_known = true; }
  if (auto f = opt_int(j, "moe_layer_freq", file)) { c.moe_layer_freq = std::max<int64_t>(1, *f); c.layer_rule_known = true; }
  if (auto f = opt_int(j, "decoder_sparse_step", file)) { c.decoder_sparse_step = std::max<int64_t>(1, *f); c.layer_rule_known = true; }
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
    for (const auto& v : j["mlp_only_layers"]) {
      NVFP4MOE_CHECK(v.is_number_integer(), FormatError, file, ": field mlp_only_layers: expected integers, got ", v.dump());
      c.mlp_only_layers.insert(v.get<int64_t>());
    }
    c.layer_rule_known = true;
  }
  if (mixtral || gpt_oss) c.layer_rule_known = true;  // every layer is MoE
  return c;
}

// ------------------------------------------------------------------ ModelOpt quantization config
namespace {

void check_group_size(int64_t g, const std::string& file, const char* field) {
  NVFP4MOE_CHECK(g == 16, FormatError, file, ": field ", field, ": expected 16 (NVFP4 block), got ", g);
}

// config_groups.*.weights / input_activations = {num_bits 4, type float, group_size 16}.
void check_fp4_args(const json& a, const std::string& file, const std::string& field) {
  if (a.is_null()) return;
  NVFP4MOE_CHECK(a.is_object(), FormatError, file, ": field ", field, ": expected an object, got ", a.dump());
  if (a.contains("num_bits"))
    NVFP4MOE_CHECK(a["num_bits"] == 4, FormatError, file, ": field ", field, ".num_bits: expected 4, got ", a["num_bits"].dump());
  if (a.contains("type"))
    NVFP4MOE_CHECK(a["type"] == "float", FormatError, file, ": field ", field, ".type: expected \"float\", got ",
                   a["type"].dump());
  if (a.contains("group_size"))
    NVFP4MOE_CHECK(a["group_size"] == 16, FormatError, file, ": field ", field,
                   ".group_size: expected 16 (NVFP4 block), got ", a["group_size"].dump());
}

bool is_expert_module(const std::string& name) { return name.find(".experts.") != std::string::npos; }

// Accepts MIXED_PRECISION when every MoE expert layer listed in quantized_layers is NVFP4 with group 16.
void check_mixed_precision(const json& q, const std::string& file) {
  NVFP4MOE_CHECK(q.contains("quantized_layers") && q["quantized_layers"].is_object(), FormatError, file,
                 ": field quantization.quantized_layers: expected an object for quant_algo MIXED_PRECISION, got ",
                 q.contains("quantized_layers") ? q["quantized_layers"].dump() : std::string("nothing (missing)"));
  size_t experts = 0;
  for (const auto& [name, v] : q["quantized_layers"].items()) {
    if (!is_expert_module(name)) continue;
    ++experts;
    const std::string algo = v.is_object() && v.contains("quant_algo") && v["quant_algo"].is_string()
                                 ? v["quant_algo"].get<std::string>() : std::string("?");
    NVFP4MOE_CHECK(algo == "NVFP4", FormatError, file, ": field quantization.quantized_layers[\"", name,
                   "\"].quant_algo: expected \"NVFP4\" for MoE expert layers, got \"", algo, "\"");
    if (v.contains("group_size") && v["group_size"].is_number_integer())
      check_group_size(v["group_size"].get<int64_t>(), file, ("quantization.quantized_layers[\"" + name + "\"].group_size").c_str());
  }
  NVFP4MOE_CHECK(experts > 0, FormatError, file,
                 ": quant_algo MIXED_PRECISION: expected NVFP4 MoE expert layers in quantized_layers, found none");
}

}  // namespace

std::optional<QuantConfig> parse_modelopt_quant(const std::string& dir, const json& config) {
  QuantConfig qc;
  qc.format = CheckpointFormat::ModelOpt;
  const std::string hf = (fs::path(dir) / "hf_quant_config.json").string();
  if (fs::exists(hf)) {
    const json root = read_json_file(hf);
    qc.source = hf;
    NVFP4MOE_CHECK(root.is_object() && root.contains("quantization") && root["quantization"].is_object(), FormatError,
                   hf, ": field quantization: expected an object, got ",
                   root.is_object() && root.contains("quantization") ? root["quantization"].dump() : std::string("nothing"));
    if (root.contains("producer") && root["producer"].is_object()) {
      const auto& p = root["producer"];
      qc.producer = cat(p.value("name", std::string("?")), " ",
                        p.contains("version") && p["version"].is_string() ? p["version"].get<std::string>() : "");
    }
    const json& q = root["quantization"];
    const auto algo = opt_str(q, "quant_algo", hf);
    NVFP4MOE_CHECK(algo.has_value(), FormatError, hf, ": field quantization.quant_algo: expected \"NVFP4\", got nothing");
    qc.algo = *algo;
    if (qc.algo == "MIXED_PRECISION") {
      check_mixed_precision(q, hf);
    } else {
      NVFP4MOE_CHECK(qc.algo == "NVFP4", FormatError, hf, ": field quantization.quant_algo: expected \"NVFP4\" (or "
                     "MIXED_PRECISION with NVFP4 experts), got \"", qc.algo, "\"");
    }
    if (auto g = opt_int(q, "group_size", hf)) {
      qc.group_size = *g;
      check_group_size(*g, hf, "quantization.group_size");
    } else if (qc.algo == "NVFP4") {
      qc.notes.push_back("group_size missing in hf_quant_config.json; NVFP4 implies 16");
    }
    qc.exclude_modules = string_list(q, "exclude_modules", hf);
    return qc;
  }
  // config.json quantization_config with quant_method modelopt.
  if (!config.contains("quantization_config") || !config["quantization_config"].is_object()) return std::nullopt;
  const std::string file = (fs::path(dir) / "config.json").string();
  const json& q = config["quantization_config"];
  const auto method = opt_str(q, "quant_method", file);
  if (!method || *method != "modelopt") return std::nullopt;
  qc.source = file;
  qc.algo = first_of<std::string>({opt_str(q, "quant_algo", file)}, "NVFP4");
  if (qc.algo == "MIXED_PRECISION") check_mixed_precision(q, file);
  else
    NVFP4MOE_CHECK(qc.algo == "NVFP4", FormatError, file, ": field quantization_config.quant_algo: expected \"NVFP4\", got \"",
                   qc.algo, "\"");
  if (auto g = opt_int(q, "group_size", file)) {
    qc.group_size = *g;
    check_group_size(*g, file, "quantization_config.group_size");
  }
  if (q.contains("config_groups") && q["config_groups"].is_object()) {
    for (const auto& [gname, g] : q["config_groups"].items()) {
      if (!g.is_object()) continue;
      const std::string field = "quantization_config.config_groups." + gname;
      if (g.contains("weights")) check_fp4_args(g["weights"], file, field + ".weights");
      if (g.contains("input_activations")) check_fp4_args(g["input_activations"], file, field + ".input_activations");
    }
  }
  qc.exclude_modules = string_list(q, q.contains("exclude_modules") ? "exclude_modules" : "ignore", file);
  return qc;
}

// ------------------------------------------------------------------ tensor-name discovery
namespace {

std::string join_dots(const std::vector<std::string>& t, size_t b, size_t e) {
  std::string s;
  for (size_t i = b; i < e; ++i) {
    if (i > b) s += '.';
    s += t[i];
  }
  return s;
}

// The projection names of one family: (gate, up, down).
struct ProjNames {
  std::string gate, up, down;
};
const ProjNames kHfProj{"gate_proj", "up_proj", "down_proj"};
const ProjNames kMixtralProj{"w1", "w3", "w2"};

using SuffixSet = std::set<std::string>;                 // ".weight", ".weight_scale", ...
using ProjMap = std::map<std::string, SuffixSet>;        // projection -> suffixes

struct ModuleTensors {  // one "<...>.layers.L.<module>" with experts
  std::string prefix;
  std::map<int64_t, ProjMap> experts;
  std::string shared_kind;  // "shared_experts" / "shared_expert" / ""
  ProjMap shared;
  std::string router, router_bias, correction_bias, shared_gate;
  std::vector<std::string> other;  // other tensors directly under the module
};

struct LayerInfo {
  LayerSummary summary;
  MoeSpec spec;
  ModuleTensors t;
  ProjNames proj = kHfProj;
  std::vector<std::string> notes;
};

struct ProjScalars {
  float weight_scale_2 = 0, input_scale = 0;
};

// Expert scalars of one expert (routed or shared), validated.
struct ExpertScalars {
  ProjScalars gate, up, down;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string fmt_bytes(size_t b) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(2);
  if (b >= (1ull << 30)) os << b / double(1ull << 30) << " GiB";
  else if (b >= (1ull << 20)) os << b / double(1ull << 20) << " MiB";
  else if (b >= 1024) os << b / 1024.0 << " KiB";
  else os << b << " B";
  return os.str();
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// check_finite (unquantized.h) on a router, correction bias or shared gate of this format (BF16 or F32).
void check_tensor_finite(const io::TensorInfo& t, const std::string& where, bool held_as_bf16) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  tensor_to_float(t, v.data());
  check_finite(t, v.data(), held_as_bf16, where);
}

// GEMM1's input scale of a gated expert: the larger of gate's and up's. NaN (no scale, a W4A16 checkpoint) if
// either is: std::max would keep or drop a NaN depending on the argument order.
float w13_input_scale(float gate, float up) {
  return std::isnan(gate) || std::isnan(up) ? std::numeric_limits<float>::quiet_NaN() : std::max(gate, up);
}

// ------------------------------------------------------------------ the checkpoint
class Nvfp4Checkpoint final : public Checkpoint {
 public:
  Nvfp4Checkpoint(std::string dir, ModelConfig model, QuantConfig quant)
      : dir_(std::move(dir)), model_(std::move(model)), quant_(std::move(quant)),
        files_(io::SafetensorsSet::open(dir_)) {
    discover();
  }

  const std::string& path() const override { return dir_; }
  CheckpointFormat format() const override { return quant_.format; }
  const std::vector<LayerSummary>& layers() const override { return summaries_; }
  std::vector<int> moe_layers() const override {
    std::vector<int> out;
    for (const auto& s : summaries_)
      if (s.is_moe) out.push_back(s.layer);
    return out;
  }
  MoeSpec spec(int layer) const override { return info(layer).spec; }
  std::vector<std::string> exclude_modules() const override { return quant_.exclude_modules; }
  MoeWeights load_layer(int layer, const ProgressFn& progress) const override;
  MoeShard load_shard(int layer, const ParallelConfig& parallel, const ProgressFn& progress) const override;
  std::string inspect() const override;

 private:
  const LayerInfo& info(int layer) const {
    NVFP4MOE_CHECK(layer >= 0 && layer < static_cast<int>(infos_.size()), ArgumentError, "layer: expected 0..",
                   infos_.size() - 1, " (", dir_, " has ", infos_.size(), " decoder layers), got ", layer);
    const LayerInfo& li = infos_[static_cast<size_t>(layer)];
    NVFP4MOE_CHECK(li.summary.is_moe, ArgumentError, "layer: ", layer, " of ", dir_,
                   " is a dense layer, not an MoE layer (MoE layers: ", moe_list(), ")");
    return li;
  }
  std::string moe_list() const {
    std::string s;
    for (int l : moe_layers()) s += (s.empty() ? "" : ",") + std::to_string(l);
    return s.empty() ? "none" : s;
  }
  void discover();
  void finish_layer(LayerInfo& li);
  // Validation: throws FormatError naming layer/expert/tensor. Returns the scalars.
  ProjScalars check_proj(const LayerInfo& li, const std::string& base, const std::string& what, int64_t n,
                         int64_t k, const SuffixSet* suffixes) const;
  // Experts 0..E-1 all present and no other (config.json's num_experts, untrusted until then), before anything
  // is sized by E.
  void check_expert_set(const LayerInfo& li, const std::string& lname) const;
  // One expert's projections (tensors under `base`, I = width): only the layer's projection names, each checked.
  ExpertScalars check_expert(const LayerInfo& li, const std::string& base, const ProjMap& projs,
                             const std::string& what, int64_t width) const;
  float read_scalar(const std::string& name, const std::string& what, bool reciprocal) const;
  const io::TensorInfo& need(const std::string& name, const std::string& what) const;
  size_t layer_bytes(const LayerInfo& li) const;

  std::string dir_;
  ModelConfig model_;
  QuantConfig quant_;
  io::SafetensorsSet files_;
  std::vector<LayerInfo> infos_;
  std::vector<LayerSummary> summaries_;
  std::vector<std::string> notes_;
};

void Nvfp4Checkpoint::discover() {
  const int64_t L = model_.num_layers;
  // Keyed by layer, not sized by L: num_hidden_layers is untrusted until every layer below it has tensors.
  std::map<int64_t, std::map<std::string, ModuleTensors>> mods;
  std::set<int64_t> seen;
  std::map<int64_t, std::string> dense_prefix;
  int64_t beyond = 0;
  for (const std::string& name : files_.names()) {
    const auto t = split_dots(name);
    size_t i = 0;
    int64_t layer = -1;
    for (; i + 1 < t.size(); ++i)
      if (t[i] == "layers" && parse_index(t[i + 1], &layer, dir_, name)) break;
    if (layer < 0 || i + 3 > t.size()) continue;
    if (layer >= L) {
      ++beyond;
      continue;
    }
    seen.insert(layer);
    if (i + 3 >= t.size()) continue;
    const std::string prefix = join_dots(t, 0, i + 3);
    const std::string& child = t[i + 3];
    ModuleTensors& m = mods[layer][prefix];
    m.prefix = prefix;
    int64_t e = -1;
    if (child == "experts" && i + 6 <= t.size() && parse_index(t[i + 4], &e, dir_, name)) {
      m.experts[e][t[i + 5]].insert("." + join_dots(t, i + 6, t.size()));
    } else if ((child == "shared_experts" || child == "shared_expert") && i + 5 <= t.size()) {
      m.shared_kind = child;
      m.shared[t[i + 4]].insert("." + join_dots(t, i + 5, t.size()));
    } else if ((child == "gate" || child == "router") && i + 5 == t.size()) {
      if (t[i + 4] == "weight") m.router = name;
      else if (t[i + 4] == "e_score_correction_bias") m.correction_bias = name;
      else if (t[i + 4] == "bias") m.router_bias = name;
      else m.other.push_back(name);
    } else if (child == "shared_expert_gate" && i + 5 == t.size() && t[i + 4] == "weight") {
      m.shared_gate = name;
    } else {
      if (child == "gate_proj" || child == "up_proj" || child == "down_proj") dense_prefix[layer] = prefix;
      m.other.push_back(name);
    }
  }
  if (beyond > 0)
    notes_.push_back(cat(beyond, " tensors of layers >= num_hidden_layers (", L, ") ignored (e.g. MTP layers)"));
  check_layers_have_tensors(dir_, model_, seen);  // before the loop below, which L sizes
  for (int64_t l = 0; l < L; ++l) {
    LayerInfo li;
    li.summary.layer = static_cast<int>(l);
    const ModuleTensors* moe = nullptr;
    for (const auto& [p, m] : mods[l]) {
      if (m.experts.empty()) continue;
      NVFP4MOE_CHECK(!moe, FormatError, dir_, ": layer ", l, " has experts under two modules: ", moe->prefix,
                     ".experts and ", p, ".experts");
      moe = &m;
    }
    if (!moe) {  // fused expert tensors (experts.gate_up_proj ...) are a layout this loader does not read
      for (const auto& [p, m] : mods[l])
        for (const auto& n : m.other)
          NVFP4MOE_CHECK(n.find(".experts.") == std::string::npos, FormatError, dir_, ": layer ", l,
                         ": tensor ", n, " looks like fused expert weights; expected one tensor per expert (",
                         p, ".experts.<e>.<proj>.weight)");
    }
    if (model_.layer_rule_known) {
      const bool want = model_.predicted_moe(l);
      NVFP4MOE_CHECK(want == (moe != nullptr), FormatError, dir_, ": layer ", l, ": ", model_.file,
                     " makes it ", want ? "an MoE layer" : "a dense layer", " but the tensors ",
                     moe ? cat("hold experts under ", moe->prefix, ".experts") : std::string("hold no experts"));
    }
    if (moe) {
      li.t = *moe;
      li.summary.is_moe = true;
      li.summary.prefix = moe->prefix;
      li.summary.experts_found = static_cast<int64_t>(moe->experts.size());
      finish_layer(li);
    } else {
      li.summary.prefix = dense_prefix[l];
    }
    summaries_.push_back(li.summary);
    infos_.push_back(std::move(li));
  }
}

// Builds the spec of one MoE layer from the config and the headers of its first expert.
void Nvfp4Checkpoint::finish_layer(LayerInfo& li) {
  const ModuleTensors& m = li.t;
  const ProjMap& first = m.experts.begin()->second;
  if (first.count("w1") || first.count("w3") || first.count("w2")) li.proj = kMixtralProj;
  const std::string where = cat(dir_, ": layer ", li.summary.layer);
  // Activation: the config when it names one, else the tensors (no gate projection = non-gated relu^2).
  const bool has_gate = first.count(li.proj.gate) > 0;
  Activation act = model_.activation ? *model_.activation : (has_gate ? Activation::SwiGLU : Activation::Relu2);
  MoeSpec s;
  s.layer = li.summary.layer;
  s.hidden = model_.hidden;
  s.activation = act;
  s.routing = model_.routing;
  s.norm_topk_prob = model_.norm_topk_prob;
  s.n_group = model_.n_group;
  s.topk_group = model_.topk_group;
  s.routed_scaling_factor = model_.routed_scaling_factor;
  NVFP4MOE_CHECK(model_.num_experts_field.empty() || model_.num_experts > 0, FormatError, model_.file, ": field ",
                 model_.num_experts_field, ": expected a positive integer, got ", model_.num_experts, " (layer ",
                 li.summary.layer, " holds ", m.experts.size(), " experts)");
  s.num_experts = model_.num_experts > 0 ? model_.num_experts : static_cast<int64_t>(m.experts.size());
  s.top_k = model_.top_k;
  NVFP4MOE_CHECK(s.top_k > 0, FormatError, model_.file, ": field num_experts_per_tok: expected a positive integer, got ",
                 s.top_k < 0 ? std::string("nothing (missing)") : std::to_string(s.top_k));
  // Expert width from the first expert's down projection header [H, I/2].
  const std::string base0 = cat(m.prefix, ".experts.", m.experts.begin()->first, ".");
  const io::TensorInfo* down = files_.find(base0 + li.proj.down + quant_.naming.weight);
  NVFP4MOE_CHECK(down, FormatError, where, ": tensor ", base0, li.proj.down, quant_.naming.weight, " not found");
  NVFP4MOE_CHECK(down->shape.size() == 2, FormatError, where, ": tensor ", down->name, ": expected rank 2, got shape ",
                 shape_str(down->shape));
  int64_t i_tensor = 0;  // a zero-size tensor may have any other dimension: 2 * it must not overflow
  NVFP4MOE_CHECK(!__builtin_mul_overflow(down->shape[1], int64_t{2}, &i_tensor), FormatError, where, ": tensor ",
                 down->name, ": expected shape [H, I/2] with I within int64, got ", shape_str(down->shape));
  if (model_.moe_intermediate > 0) {
    NVFP4MOE_CHECK(model_.moe_intermediate == i_tensor, FormatError, where, ": ", model_.file,
                   " expert intermediate size = ", model_.moe_intermediate, " but tensor ", down->name, " has shape ",
                   shape_str(down->shape), " (I = ", i_tensor, ")");
  }
  s.intermediate = i_tensor;
  s.has_router_bias = !m.correction_bias.empty();
  // Shared expert.
  if (!m.shared.empty()) {
    const std::string sp = cat(m.prefix, ".", m.shared_kind, ".");
    const io::TensorInfo* sd = files_.find(sp + li.proj.down + quant_.naming.weight);
    if (!sd) sd = files_.find(sp + "down_proj" + quant_.naming.weight);
    NVFP4MOE_CHECK(sd && sd->shape.size() == 2, FormatError, where, ": shared expert tensor ", sp, "down_proj",
                   quant_.naming.weight, sd ? cat(": expected rank 2, got shape ", shape_str(sd->shape)) : " not found");
    s.shared_intermediate = sd->shape[1];
    NVFP4MOE_CHECK(sd->dtype != DType::U8 || !__builtin_mul_overflow(sd->shape[1], int64_t{2}, &s.shared_intermediate),
                   FormatError, where, ": shared expert tensor ", sd->name,
                   ": expected shape [H, I/2] with I within int64, got ", shape_str(sd->shape));
    // Zero width would be taken as "no shared expert" below (shared_intermediate > 0 decides): refused instead.
    NVFP4MOE_CHECK(s.shared_intermediate > 0, FormatError, where, ": shared expert tensor ", sd->name,
                   ": expected shape [H, I/2] with I > 0 (a shared expert of width 0), got ", shape_str(sd->shape));
    if (model_.shared_intermediate > 0)
      NVFP4MOE_CHECK(model_.shared_intermediate == s.shared_intermediate, FormatError, where, ": ", model_.file,
                     " shared expert intermediate size = ", model_.shared_intermediate, " but tensor ", sd->name,
                     " has shape ", shape_str(sd->shape), " (I = ", s.shared_intermediate, ")");
    s.shared_expert_gated = !m.shared_gate.empty();
  } else {
    // A shared expert the config declares but the tensors lack would be silently dropped: a different model.
    NVFP4MOE_CHECK(model_.shared_declared_by.empty(), FormatError, where, ": ", model_.file, " ",
                   model_.shared_declared_by, " declares a shared expert, but there are no tensors ", m.prefix,
                   ".shared_experts.* or ", m.prefix, ".shared_expert.* (expected e.g. ", m.prefix,
                   ".shared_experts.down_proj", quant_.naming.weight, ")");
    // A gate with nothing to gate means the shared expert's tensors are missing (or misnamed): not ignored.
    NVFP4MOE_CHECK(m.shared_gate.empty(), FormatError, where, ": tensor ", m.shared_gate,
                   " gates a shared expert, but there are no tensors ", m.prefix, ".shared_experts.* or ", m.prefix,
                   ".shared_expert.*");
  }
  if (!m.router.empty())
    if (const io::TensorInfo* r = files_.find(m.router); r && r->dtype == DType::F32)
      li.notes.push_back(cat("router ", m.router, " is F32; MoeWeights.router_weight holds it rounded to bf16"));
  if (!m.router_bias.empty())
    li.notes.push_back(cat("router bias ", m.router_bias, " present (applies to logits; not part of MoeWeights)"));
  try {
    s.validate();
  } catch (const ArgumentError& e) {
    throw FormatError(cat(where, ": inconsistent MoE config (", model_.file, "): ", e.what()));
  }
  li.spec = s;
}

const io::TensorInfo& Nvfp4Checkpoint::need(const std::string& name, const std::string& what) const {
  const io::TensorInfo* t = files_.find(name);
  NVFP4MOE_CHECK(t, FormatError, dir_, ": ", what, ": missing tensor ", name);
  return *t;
}

float Nvfp4Checkpoint::read_scalar(const std::string& name, const std::string& what, bool reciprocal) const {
  const io::TensorInfo& t = need(name, what);
  NVFP4MOE_CHECK(t.dtype == DType::F32, FormatError, dir_, ": ", what, ": tensor ", name, ": expected dtype F32, got ",
                 dtype_name(t.dtype));
  NVFP4MOE_CHECK(t.shape.empty() || (t.shape.size() == 1 && t.shape[0] == 1), FormatError, dir_, ": ", what,
                 ": tensor ", name, ": expected shape [] (rank 0) or [1], got ", shape_str(t.shape));
  float v;
  std::memcpy(&v, t.data, 4);
  NVFP4MOE_CHECK(std::isfinite(v) && v > 0.0f, FormatError, dir_, ": ", what, ": tensor ", name,
                 ": expected a finite positive scale, got ", v);
  return reciprocal ? 1.0f / v : v;
}

ProjScalars Nvfp4Checkpoint::check_proj(const LayerInfo& li, const std::string& base, const std::string& what,
                                        int64_t n, int64_t k, const SuffixSet* suffixes) const {
  const TensorNaming& nm = quant_.naming;
  const std::string w_name = base + nm.weight, s_name = base + nm.weight_scale;
  const io::TensorInfo& w = need(w_name, what);
  NVFP4MOE_CHECK(w.dtype == DType::U8, FormatError, dir_, ": ", what, ": tensor ", w_name,
                 ": expected dtype U8 (packed NVFP4), got ", dtype_name(w.dtype),
                 w.dtype == DType::BF16 ? " (is this module excluded from quantization?)" : "");
  NVFP4MOE_CHECK(w.shape == (std::vector<int64_t>{n, k / 2}), FormatError, dir_, ": ", what, ": tensor ", w_name,
                 ": expected shape ", shape_str({n, k / 2}), ", got ", shape_str(w.shape));
  const io::TensorInfo& s = need(s_name, what);
  NVFP4MOE_CHECK(s.dtype == DType::F8_E4M3, FormatError, dir_, ": ", what, ": tensor ", s_name,
                 ": expected dtype F8_E4M3, got ", dtype_name(s.dtype));
  NVFP4MOE_CHECK(s.shape == (std::vector<int64_t>{n, k / 16}), FormatError, dir_, ": ", what, ": tensor ", s_name,
                 ": expected shape ", shape_str({n, k / 16}), ", got ", shape_str(s.shape));
  if (!quant_.ignore.empty()) {
    std::string pat;
    NVFP4MOE_CHECK(!quant_.ignores(base, &pat), FormatError, dir_, ": ", what, ": module ", base, " is in ",
                   quant_.source, " quantization_config.ignore (matched by \"", pat, "\"), so it is not NVFP4; "
                   "expected every MoE expert projection to be quantized");
  }
  ProjScalars r;
  r.weight_scale_2 = read_scalar(base + nm.weight_global, what, nm.global_is_reciprocal);
  if (files_.find(base + nm.input_global)) {
    r.input_scale = read_scalar(base + nm.input_global, what, nm.global_is_reciprocal);
  } else {
    r.input_scale = std::numeric_limits<float>::quiet_NaN();  // W4A16 checkpoint: no activation scale
    NVFP4MOE_CHECK(!nm.input_scale_required, FormatError, dir_, ": ", what, ": missing tensor ", base, nm.input_global,
                   " (the activation scale that W4A4 needs; this loader requires it)");
  }
  if (suffixes) {
    for (const auto& suf : *suffixes)
      NVFP4MOE_CHECK(suf == nm.weight || suf == nm.weight_scale || suf == nm.weight_global || suf == nm.input_global,
                     FormatError, dir_, ": ", what, ": unexpected tensor ", base, suf, " (expected only ", nm.weight, ", ",
                     nm.weight_scale, ", ", nm.weight_global, ", ", nm.input_global, ")");
  }
  (void)li;
  return r;
}

size_t Nvfp4Checkpoint::layer_bytes(const LayerInfo& li) const {
  size_t b = 0;
  auto add = [&](const std::string& base) {
    for (const std::string* suf : {&quant_.naming.weight, &quant_.naming.weight_scale})
      if (const io::TensorInfo* t = files_.find(base + *suf)) b += t->nbytes();
  };
  for (const auto& [e, projs] : li.t.experts)
    for (const auto& [p, sufs] : projs) add(cat(li.t.prefix, ".experts.", e, ".", p));
  for (const auto& [p, sufs] : li.t.shared) add(cat(li.t.prefix, ".", li.t.shared_kind, ".", p));
  return b;
}

void Nvfp4Checkpoint::check_expert_set(const LayerInfo& li, const std::string& lname) const {
  const int64_t E = li.spec.num_experts;
  for (const auto& [e, projs] : li.t.experts)
    NVFP4MOE_CHECK(e < E, FormatError, dir_, ": ", lname, ": extra expert ", e, " (tensors ", li.t.prefix, ".experts.", e,
                   ".*) but config ", model_.file, " says num_experts = ", E, " (expected experts 0..", E - 1, ")");
  for (int64_t e = 0; e < E; ++e)
    NVFP4MOE_CHECK(li.t.experts.count(e), FormatError, dir_, ": ", lname, ": missing expert ", e, " (no tensors ",
                   li.t.prefix, ".experts.", e, ".*; config says num_experts = ", E, ", found ",
                   li.t.experts.size(), ")");
}

ExpertScalars Nvfp4Checkpoint::check_expert(const LayerInfo& li, const std::string& base, const ProjMap& projs,
                                            const std::string& what, int64_t width) const {
  const MoeSpec& s = li.spec;
  const int64_t H = s.hidden;
  ExpertScalars x;
  for (const auto& [p, sufs] : projs) {
    const bool known = p == li.proj.up || p == li.proj.down || (s.gated() && p == li.proj.gate);
    NVFP4MOE_CHECK(known, FormatError, dir_, ": ", what, ": unexpected projection ", base, p, ".* (expected ",
                   s.gated() ? li.proj.gate + ", " : std::string(), li.proj.up, ", ", li.proj.down,
                   s.gated() ? "" : " for non-gated relu2 experts", ")");
  }
  auto sufs_of = [&](const std::string& p) -> const SuffixSet* {
    auto it = projs.find(p);
    return it == projs.end() ? nullptr : &it->second;
  };
  if (s.gated()) x.gate = check_proj(li, base + li.proj.gate, what + " " + li.proj.gate, width, H, sufs_of(li.proj.gate));
  x.up = check_proj(li, base + li.proj.up, what + " " + li.proj.up, width, H, sufs_of(li.proj.up));
  x.down = check_proj(li, base + li.proj.down, what + " " + li.proj.down, H, width, sufs_of(li.proj.down));
  return x;
}

MoeWeights Nvfp4Checkpoint::load_layer(int layer, const ProgressFn& progress) const {
  const LayerInfo& li = info(layer);
  const MoeSpec& s = li.spec;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  const std::string lname = cat("layer ", layer);

  // ---- 1. validate everything before allocating anything
  check_expert_set(li, lname);
  std::vector<ExpertScalars> scalars(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    scalars[static_cast<size_t>(e)] =
        check_expert(li, cat(li.t.prefix, ".experts.", e, "."), li.t.experts.at(e), cat(lname, " expert ", e), I);
  ExpertScalars shared_scalars;
  const std::string shared_base = cat(li.t.prefix, ".", li.t.shared_kind, ".");
  if (s.shared_intermediate > 0)
    shared_scalars = check_expert(li, shared_base, li.t.shared, lname + " shared expert", s.shared_intermediate);
  const io::TensorInfo* router = li.t.router.empty() ? nullptr : &need(li.t.router, lname + " router");
  if (router) {
    NVFP4MOE_CHECK(router->dtype == DType::BF16 || router->dtype == DType::F32, FormatError, dir_, ": ", lname,
                   ": tensor ", router->name, ": expected dtype BF16 (or F32), got ", dtype_name(router->dtype));
    NVFP4MOE_CHECK(router->shape == (std::vector<int64_t>{E, H}), FormatError, dir_, ": ", lname, ": tensor ",
                   router->name, ": expected shape ", shape_str({E, H}), ", got ", shape_str(router->shape));
    check_tensor_finite(*router, cat(dir_, ": ", lname), true);
  }
  const io::TensorInfo* bias = li.t.correction_bias.empty() ? nullptr : &need(li.t.correction_bias, lname);
  if (bias) {
    NVFP4MOE_CHECK(bias->dtype == DType::F32 || bias->dtype == DType::BF16, FormatError, dir_, ": ", lname, ": tensor ",
                   bias->name, ": expected dtype F32 (or BF16), got ", dtype_name(bias->dtype));
    NVFP4MOE_CHECK(bias->shape == (std::vector<int64_t>{E}), FormatError, dir_, ": ", lname, ": tensor ", bias->name,
                   ": expected shape ", shape_str({E}), ", got ", shape_str(bias->shape));
    check_tensor_finite(*bias, cat(dir_, ": ", lname), false);
  }
  const io::TensorInfo* sgate = li.t.shared_gate.empty() ? nullptr : &need(li.t.shared_gate, lname);
  if (sgate) {
    NVFP4MOE_CHECK(sgate->dtype == DType::BF16, FormatError, dir_, ": ", lname, ": tensor ", sgate->name,
                   ": expected dtype BF16, got ", dtype_name(sgate->dtype));
    NVFP4MOE_CHECK(sgate->shape == (std::vector<int64_t>{1, H}) || sgate->shape == (std::vector<int64_t>{H}),
                   FormatError, dir_, ": ", lname, ": tensor ", sgate->name, ": expected shape ", shape_str({1, H}),
                   ", got ", shape_str(sgate->shape));
    check_tensor_finite(*sgate, cat(dir_, ": ", lname), false);
  }

  // ---- 2. allocate the one packed copy, then stream bytes from the mapping into their slots
  MoeWeights w;
  w.spec = s;
  w.experts.allocate(E, H, I, s.gated());
  if (s.shared_intermediate > 0) w.shared.allocate(1, H, s.shared_intermediate, s.gated());
  const size_t total = w.packed_bytes();
  const double t0 = now_s();
  size_t done = 0, last_report = 0;
  bool reported = false;
  auto report = [&](bool final_call) {
    if (!progress) return;
    if (!final_call && done - last_report < (256u << 20)) return;
    if (final_call ? !reported : now_s() - t0 < 1.0) return;
    last_report = done;
    reported = true;
    progress(done, total);
  };
  const TensorNaming& nm = quant_.naming;
  auto copy_expert = [&](StackedExperts& dst, int64_t e, const std::string& base, const ExpertScalars& x) {
    const int64_t w_i = dst.intermediate;
    const size_t ue = static_cast<size_t>(e);
    uint8_t* w13 = dst.w13.data() + ue * dst.w13_bytes_per_expert();
    uint8_t* w13s = dst.w13_scale.data() + ue * dst.w13_scale_bytes_per_expert();
    const size_t half_w = static_cast<size_t>(w_i * H / 2), half_s = static_cast<size_t>(w_i * H / 16);
    size_t off = 0;
    if (dst.gated) {
      std::memcpy(w13, files_.get(base + li.proj.gate + nm.weight).data, half_w);
      std::memcpy(w13s, files_.get(base + li.proj.gate + nm.weight_scale).data, half_s);
      dst.w13_gate_scale2[ue] = x.gate.weight_scale_2;
      off = 1;
    }
    std::memcpy(w13 + off * half_w, files_.get(base + li.proj.up + nm.weight).data, half_w);
    std::memcpy(w13s + off * half_s, files_.get(base + li.proj.up + nm.weight_scale).data, half_s);
    dst.w13_up_scale2[ue] = x.up.weight_scale_2;
    dst.w13_input_scale[ue] = dst.gated ? w13_input_scale(x.gate.input_scale, x.up.input_scale) : x.up.input_scale;
    std::memcpy(dst.w2.data() + ue * dst.w2_bytes_per_expert(), files_.get(base + li.proj.down + nm.weight).data,
                dst.w2_bytes_per_expert());
    std::memcpy(dst.w2_scale.data() + ue * dst.w2_scale_bytes_per_expert(),
                files_.get(base + li.proj.down + nm.weight_scale).data, dst.w2_scale_bytes_per_expert());
    dst.w2_scale2[ue] = x.down.weight_scale_2;
    dst.w2_input_scale[ue] = x.down.input_scale;
  };
  const size_t per_expert = w.experts.w13_bytes_per_expert() + w.experts.w13_scale_bytes_per_expert() +
                            w.experts.w2_bytes_per_expert() + w.experts.w2_scale_bytes_per_expert();
  // Batches of ~256 MB copied by all threads (page faults of the mapping overlap), progress between batches.
  const int64_t batch = std::max<int64_t>(1, static_cast<int64_t>((256u << 20) / std::max<size_t>(1, per_expert)));
  std::vector<std::string> bases(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) bases[static_cast<size_t>(e)] = cat(li.t.prefix, ".experts.", e, ".");
  for (int64_t b0 = 0; b0 < E; b0 += batch) {
    const int64_t b1 = std::min(E, b0 + batch);
#pragma omp parallel for schedule(dynamic, 1) if (static_cast<size_t>(b1 - b0) * per_expert >= (16u << 20))
    for (int64_t e = b0; e < b1; ++e)
      copy_expert(w.experts, e, bases[static_cast<size_t>(e)], scalars[static_cast<size_t>(e)]);
    done += static_cast<size_t>(b1 - b0) * per_expert;
    report(false);
  }
  if (s.shared_intermediate > 0) {
    copy_expert(w.shared, 0, shared_base, shared_scalars);
    done += w.shared.packed_bytes();
  }
  if (router) {
    w.router_weight.resize(static_cast<size_t>(E * H));
    if (router->dtype == DType::BF16) {
      std::memcpy(w.router_weight.data(), router->data, router->nbytes());
    } else {  // F32 router (kept in fp32 by some exports): MoeWeights holds bf16, rounded to nearest even
      for (size_t i = 0; i < w.router_weight.size(); ++i) {
        float f;
        std::memcpy(&f, router->data + 4 * i, 4);
        w.router_weight[i] = fmt::bf16_from_float(f);
      }
    }
  }
  if (bias) {
    w.router_bias.resize(static_cast<size_t>(E));
    if (bias->dtype == DType::F32) {
      std::memcpy(w.router_bias.data(), bias->data, bias->nbytes());
    } else {
      for (int64_t e = 0; e < E; ++e) {
        uint16_t h;
        std::memcpy(&h, bias->data + 2 * e, 2);
        w.router_bias[static_cast<size_t>(e)] = fmt::bf16_to_float(h);  // exact widening
      }
    }
  }
  if (sgate) {
    w.shared_gate_weight.resize(static_cast<size_t>(H));
    std::memcpy(w.shared_gate_weight.data(), sgate->data, static_cast<size_t>(H) * 2);
  }
  done = total;
  report(true);
  try {
    // Missing input scales (a W4A16 checkpoint) are NaN in MoeWeights; validate the rest with 1 in their place.
    auto nan_slots = [](std::vector<float>& v, std::vector<size_t>& slots) {
      for (size_t i = 0; i < v.size(); ++i)
        if (std::isnan(v[i])) { slots.push_back(i); v[i] = 1.0f; }
    };
    std::vector<float>* vs[4] = {&w.experts.w13_input_scale, &w.experts.w2_input_scale, &w.shared.w13_input_scale,
                                 &w.shared.w2_input_scale};
    std::vector<size_t> slots[4];
    for (int i = 0; i < 4; ++i) nan_slots(*vs[i], slots[i]);
    w.validate();
    for (int i = 0; i < 4; ++i)
      for (size_t x : slots[i]) (*vs[i])[x] = std::numeric_limits<float>::quiet_NaN();
  } catch (const ArgumentError& e) {
    throw FormatError(cat(dir_, ": ", lname, ": loaded weights are inconsistent: ", e.what()));
  }
  return w;
}

// One EP/TP rank's shard (parallel.h): validates and reads only the rank's experts (other experts' tensors
// must exist in the index, but none of their bytes or scalars are read) and, with TP, only its rows of
// gate/up and columns of down. Bitwise equal to slice_weights(load_layer(layer), parallel).
MoeShard Nvfp4Checkpoint::load_shard(int layer, const ParallelConfig& parallel, const ProgressFn& progress) const {
  const LayerInfo& li = info(layer);
  const MoeSpec& s = li.spec;
  const int64_t E = s.num_experts, H = s.hidden, I = s.intermediate;
  const std::string lname = cat("layer ", layer);
  MoeShard shard;
  shard.spec = s;
  shard.plan = plan_shard(s, parallel);
  const ShardPlan& plan = shard.plan;
  shard.local.spec = local_spec(s, plan);
  check_expert_set(li, lname);
  const MoeSpec& ls = shard.local.spec;
  shard.local.experts.allocate(ls.num_experts, H, ls.intermediate, s.gated());
  if (plan.has_shared) shard.local.shared.allocate(1, H, ls.shared_intermediate, s.gated());
  const TensorNaming& nm = quant_.naming;
  // Rows [i0, i1) of gate and up, columns [i0, i1) of down, straight from the mapping (width = the file's I).
  auto copy_slice = [&](StackedExperts& dst, int64_t e, const std::string& base, const ExpertScalars& x, int64_t width,
                        int64_t i0, int64_t i1) {
    const size_t ue = static_cast<size_t>(e), Il = static_cast<size_t>(i1 - i0);
    const size_t row = static_cast<size_t>(H / 2), srow = static_cast<size_t>(H / 16);
    uint8_t* w13 = dst.w13.data() + ue * dst.w13_bytes_per_expert();
    uint8_t* w13s = dst.w13_scale.data() + ue * dst.w13_scale_bytes_per_expert();
    size_t half = 0;
    auto rows = [&](const std::string& p) {
      std::memcpy(w13 + half * Il * row, files_.get(base + p + nm.weight).data + i0 * row, Il * row);
      std::memcpy(w13s + half * Il * srow, files_.get(base + p + nm.weight_scale).data + i0 * srow, Il * srow);
      ++half;
    };
    if (dst.gated) {
      rows(li.proj.gate);
      dst.w13_gate_scale2[ue] = x.gate.weight_scale_2;
    }
    rows(li.proj.up);
    dst.w13_up_scale2[ue] = x.up.weight_scale_2;
    dst.w13_input_scale[ue] = dst.gated ? w13_input_scale(x.gate.input_scale, x.up.input_scale) : x.up.input_scale;
    const uint8_t* d = files_.get(base + li.proj.down + nm.weight).data;
    const uint8_t* ds = files_.get(base + li.proj.down + nm.weight_scale).data;
    uint8_t* w2 = dst.w2.data() + ue * dst.w2_bytes_per_expert();
    uint8_t* w2s = dst.w2_scale.data() + ue * dst.w2_scale_bytes_per_expert();
    for (int64_t n = 0; n < H; ++n) {
      std::memcpy(w2 + n * (Il / 2), d + n * (width / 2) + i0 / 2, Il / 2);
      std::memcpy(w2s + n * (Il / 16), ds + n * (width / 16) + i0 / 16, Il / 16);
    }
    dst.w2_scale2[ue] = x.down.weight_scale_2;
    dst.w2_input_scale[ue] = x.down.input_scale;
  };
  const size_t total = shard.local.packed_bytes();
  size_t done = 0;
  const double t0 = now_s();
  // Validate the rank's experts first (a throw must not leave an OpenMP region), then copy.
  std::vector<std::string> bases(static_cast<size_t>(ls.num_experts));
  std::vector<ExpertScalars> scalars(static_cast<size_t>(ls.num_experts));
  for (int64_t e = 0; e < ls.num_experts; ++e) {
    const int64_t g = plan.expert_begin + e;
    bases[static_cast<size_t>(e)] = cat(li.t.prefix, ".experts.", g, ".");
    scalars[static_cast<size_t>(e)] =
        check_expert(li, bases[static_cast<size_t>(e)], li.t.experts.at(g), cat(lname, " expert ", g), I);
  }
  ExpertScalars shared_x;
  const std::string shared_base = cat(li.t.prefix, ".", li.t.shared_kind, ".");
  if (plan.has_shared) shared_x = check_expert(li, shared_base, li.t.shared, lname + " shared expert", s.shared_intermediate);
#pragma omp parallel for schedule(dynamic, 1) if (total >= (16u << 20))
  for (int64_t e = 0; e < ls.num_experts; ++e)
    copy_slice(shard.local.experts, e, bases[static_cast<size_t>(e)], scalars[static_cast<size_t>(e)], I,
               plan.inter_begin, plan.inter_end);
  done += shard.local.experts.packed_bytes();
  if (plan.has_shared) {
    copy_slice(shard.local.shared, 0, shared_base, shared_x, s.shared_intermediate, plan.shared_begin, plan.shared_end);
    done += shard.local.shared.packed_bytes();
  }
  if (progress && now_s() - t0 >= 1.0) progress(done, total);
  // The router (replicated), bias and shared-expert gate: as load_layer.
  if (!li.t.router.empty()) {
    const io::TensorInfo& router = need(li.t.router, lname + " router");
    NVFP4MOE_CHECK((router.dtype == DType::BF16 || router.dtype == DType::F32) && router.shape == (std::vector<int64_t>{E, H}),
                   FormatError, dir_, ": ", lname, ": tensor ", router.name, ": expected BF16 (or F32) ",
                   shape_str({E, H}), ", got ", dtype_name(router.dtype), " ", shape_str(router.shape));
    check_tensor_finite(router, cat(dir_, ": ", lname), true);
    shard.router_weight.resize(static_cast<size_t>(E * H));
    if (router.dtype == DType::BF16) {
      std::memcpy(shard.router_weight.data(), router.data, router.nbytes());
    } else {
      for (size_t i = 0; i < shard.router_weight.size(); ++i) {
        float f;
        std::memcpy(&f, router.data + 4 * i, 4);
        shard.router_weight[i] = fmt::bf16_from_float(f);
      }
    }
  }
  if (!li.t.correction_bias.empty()) {
    const io::TensorInfo& bias = need(li.t.correction_bias, lname);
    NVFP4MOE_CHECK((bias.dtype == DType::F32 || bias.dtype == DType::BF16) && bias.shape == (std::vector<int64_t>{E}),
                   FormatError, dir_, ": ", lname, ": tensor ", bias.name, ": expected F32 (or BF16) ", shape_str({E}),
                   ", got ", dtype_name(bias.dtype), " ", shape_str(bias.shape));
    check_tensor_finite(bias, cat(dir_, ": ", lname), false);
    shard.router_bias.resize(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      if (bias.dtype == DType::F32) {
        std::memcpy(&shard.router_bias[static_cast<size_t>(e)], bias.data + 4 * e, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, bias.data + 2 * e, 2);
        shard.router_bias[static_cast<size_t>(e)] = fmt::bf16_to_float(h);
      }
    }
  }
  if (plan.has_shared && !li.t.shared_gate.empty()) {
    const io::TensorInfo& sgate = need(li.t.shared_gate, lname);
    NVFP4MOE_CHECK(sgate.dtype == DType::BF16 &&
                       (sgate.shape == (std::vector<int64_t>{1, H}) || sgate.shape == (std::vector<int64_t>{H})),
                   FormatError, dir_, ": ", lname, ": tensor ", sgate.name, ": expected BF16 ", shape_str({1, H}),
                   ", got ", dtype_name(sgate.dtype), " ", shape_str(sgate.shape));
    check_tensor_finite(sgate, cat(dir_, ": ", lname), false);
    shard.local.shared_gate_weight.resize(static_cast<size_t>(H));
    std::memcpy(shard.local.shared_gate_weight.data(), sgate.data, static_cast<size_t>(H) * 2);
  }
  try {
    validate_shard(shard);
  } catch (const ArgumentError& e) {
    throw FormatError(cat(dir_, ": ", lname, ": loaded shard is inconsistent: ", e.what()));
  }
  return shard;
}

// ------------------------------------------------------------------ inspect
struct Stat {
  std::vector<float> v;
  std::string str() const {
    if (v.empty()) return "-";
    std::vector<float> s = v;
    std::sort(s.begin(), s.end());
    std::ostringstream os;
    os.precision(4);
    os << "min " << s.front() << "  median " << s[s.size() / 2] << "  max " << s.back();
    return os.str();
  }
};

std::string Nvfp4Checkpoint::inspect() const {
  std::ostringstream os;
  os << "checkpoint: " << dir_ << "\n";
  os << "format: " << (quant_.format == CheckpointFormat::ModelOpt ? "ModelOpt" : "compressed-tensors") << " "
     << quant_.algo << " (group size " << quant_.group_size << ", from " << quant_.source << ")";
  if (!quant_.producer.empty()) os << ", producer " << quant_.producer;
  os << "\nmodel type: " << (model_.model_type.empty() ? "?" : model_.model_type) << ", hidden " << model_.hidden
     << ", " << files_.num_files() << " safetensors file(s)\n";
  const auto moe = moe_layers();
  os << "layers: " << infos_.size() << " (" << moe.size() << " MoE, " << infos_.size() - moe.size() << " dense)\n";
  std::string dense;
  for (const auto& li : infos_)
    if (!li.summary.is_moe) dense += (dense.empty() ? "" : ",") + std::to_string(li.summary.layer);
  if (!dense.empty()) os << "dense layers: " << dense << "\n";
  os << "exclude_modules: ";
  for (size_t i = 0; i < quant_.exclude_modules.size(); ++i) os << (i ? ", " : "") << quant_.exclude_modules[i];
  os << (quant_.exclude_modules.empty() ? "(none)\n" : "\n");

  Stat ws2[3], in[3];  // gate, up, down
  size_t mismatch_ws2 = 0, mismatch_in = 0, pairs = 0;
  double worst_ws2 = 1.0, worst_in = 1.0;
  size_t total = 0;
  for (const auto& li : infos_) {
    if (!li.summary.is_moe) continue;
    const MoeSpec& s = li.spec;
    const size_t bytes = layer_bytes(li);
    total += bytes;
    os << "  " << s.describe() << "  experts found " << li.summary.experts_found << ", " << li.summary.prefix
       << (li.proj.gate == "w1" ? " (Mixtral names)" : "") << ", " << fmt_bytes(bytes) << "\n";
    for (const auto& n : li.notes) os << "    note: " << n << "\n";
    try {
      for (const auto& [e, projs] : li.t.experts) {
        const std::string base = cat(li.t.prefix, ".experts.", e, ".");
        const std::string what = cat("layer ", li.summary.layer, " expert ", e);
        float g[2] = {0, 0}, u[2] = {0, 0};
        const std::string* names[3] = {&li.proj.gate, &li.proj.up, &li.proj.down};
        for (int p = 0; p < 3; ++p) {
          if (p == 0 && !s.gated()) continue;
          const std::string b = base + *names[p];
          const float a = read_scalar(b + quant_.naming.weight_global, what, quant_.naming.global_is_reciprocal);
          ws2[p].v.push_back(a);
          float c = 0;
          if (files_.find(b + quant_.naming.input_global)) {
            c = read_scalar(b + quant_.naming.input_global, what, quant_.naming.global_is_reciprocal);
            in[p].v.push_back(c);
          }
          if (p == 0) { g[0] = a; g[1] = c; }
          if (p == 1) { u[0] = a; u[1] = c; }
        }
        if (s.gated()) {
          ++pairs;
          if (g[0] != u[0]) {
            ++mismatch_ws2;
            worst_ws2 = std::max(worst_ws2, double(std::max(g[0], u[0])) / std::min(g[0], u[0]));
          }
          if (g[1] != u[1] && g[1] > 0 && u[1] > 0) {
            ++mismatch_in;
            worst_in = std::max(worst_in, double(std::max(g[1], u[1])) / std::min(g[1], u[1]));
          }
        }
      }
    } catch (const Error& e) {
      os << "    ERROR: " << e.what() << "\n";
    }
  }
  os << "total NVFP4 expert bytes (packed weights + block scales): " << fmt_bytes(total) << "\n";
  const char* pn[3] = {"gate", "up", "down"};
  os << "scale statistics (routed experts):\n";
  for (int p = 0; p < 3; ++p) {
    if (ws2[p].v.empty() && in[p].v.empty()) continue;
    const std::string name = std::string(pn[p]) + std::string(5 - std::strlen(pn[p]), ' ');
    os << "  " << name << "weight_scale_2: " << ws2[p].str() << "\n";
    os << "  " << name << "input_scale:    " << in[p].str() << "\n";
  }
  if (pairs) {
    os << "gate vs up weight_scale_2: " << mismatch_ws2 << " of " << pairs << " experts differ";
    if (mismatch_ws2) os << " (largest ratio " << worst_ws2 << "; each half keeps its own scale)";
    os << "\ngate vs up input_scale: " << mismatch_in << " of " << pairs << " experts differ";
    if (mismatch_in) os << " (largest ratio " << worst_in << "; GEMM1 uses the max)";
    os << "\n";
  }
  for (const auto& n : model_.notes) os << "note: " << n << "\n";
  for (const auto& n : quant_.notes) os << "note: " << n << "\n";
  for (const auto& n : notes_) os << "note: " << n << "\n";
  return os.str();
}

}  // namespace

std::shared_ptr<Checkpoint> open_nvfp4_checkpoint(const std::string& dir, ModelConfig model, QuantConfig quant) {
  return std::make_shared<Nvfp4Checkpoint>(dir, std::move(model), std::move(quant));
}

}  // namespace model

std::shared_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  namespace fs = std::filesystem;
  NVFP4MOE_CHECK(fs::is_directory(dir), FormatError, dir, ": expected a checkpoint directory (config.json, "
                 "hf_quant_config.json, *.safetensors), ", fs::exists(dir) ? "got a file" : "it does not exist");
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  NVFP4MOE_CHECK(fs::exists(cfg_path), FormatError, cfg_path, ": missing (every checkpoint needs config.json)");
  const nlohmann::json cfg = model::read_json_file(cfg_path);
  model::ModelConfig mc = model::parse_model_config(cfg, cfg_path);
  std::optional<model::QuantConfig> qc = model::parse_compressed_tensors_quant(dir, cfg);
  if (!qc) qc = model::parse_modelopt_quant(dir, cfg);
  if (!qc && !cfg.contains("quantization_config"))  // an unquantized checkpoint: quantized to NVFP4 at load
    if (auto ck = model::open_unquantized_checkpoint(dir, mc)) return ck;
  if (!qc) {
    std::string method = "nothing";
    if (cfg.contains("quantization_config") && cfg["quantization_config"].is_object() &&
        cfg["quantization_config"].contains("quant_method"))
      method = cfg["quantization_config"]["quant_method"].dump();
    throw FormatError(detail::cat(dir, ": no NVFP4 quantization config: expected hf_quant_config.json or ", cfg_path,
                                  " quantization_config.quant_method \"modelopt\" or \"compressed-tensors\", got ", method));
  }
  return model::open_nvfp4_checkpoint(dir, std::move(mc), std::move(*qc));
}

}  // namespace nvfp4moe
