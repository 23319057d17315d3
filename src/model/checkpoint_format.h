// Internal pieces of the checkpoint loader that a second on-disk format plugs into: the parsed model config
// (config.json, model-family aware), the quantization config, and the tensor-naming / scale-conversion policy.
// ModelOpt is implemented in modelopt_checkpoint.cpp; compressed-tensors (nvfp4-format.md section 10) provides
// its own parse_compressed_tensors_quant() (compressed_tensors.cpp) and reuses everything else.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/spec.h"

namespace nvfp4moe::model {

// How one quantized Linear's tensors are named and how its global scales are stored.
struct TensorNaming {
  std::string weight = ".weight";                // U8 [N, K/2]
  std::string weight_scale = ".weight_scale";    // F8_E4M3 [N, K/16]
  std::string weight_global = ".weight_scale_2"; // F32 [] or [1]
  std::string input_global = ".input_scale";     // F32 [] or [1]
  bool global_is_reciprocal = false;  // true: the file stores 1/scale (compressed-tensors *_global_scale)
  bool input_scale_required = true;   // W4A4 needs it; a W4A16-only format may lack it (MoeWeights: NaN scales)
};

// The quantization config, whatever file it came from.
struct QuantConfig {
  CheckpointFormat format = CheckpointFormat::ModelOpt;
  std::string source;        // the file it was read from (for messages and inspect)
  std::string producer;      // "modelopt 0.23.0" when known
  std::string algo;          // "NVFP4" / "MIXED_PRECISION"
  int64_t group_size = 16;
  std::vector<std::string> exclude_modules;
  // compressed-tensors `ignore`: module names and "re:" regexes (matched like Python re.match). A module it
  // names is not quantized, so an MoE expert it names is refused.
  std::vector<std::string> ignore;
  bool ignores(const std::string& module, std::string* matched = nullptr) const;
  TensorNaming naming;
  std::vector<std::string> notes;  // shown by inspect
};

// config.json, reduced to what the MoE layers need.
struct ModelConfig {
  std::string file;
  std::string model_type;
  int64_t num_layers = -1;
  int64_t hidden = -1;
  int64_t moe_intermediate = -1;       // -1: take it from the tensors
  int64_t num_experts = -1;            // -1: take it from the tensors
  std::string num_experts_field;       // the key num_experts came from ("" when config.json has none)
  int64_t top_k = -1;
  Routing routing = Routing::SoftmaxTopK;
  bool norm_topk_prob = false;
  int64_t n_group = 1, topk_group = 1;
  float routed_scaling_factor = 1.0f;
  std::optional<Activation> activation;    // when the config names it
  int64_t shared_intermediate = -1;        // -1: unknown (tensors decide), 0: none
  std::string shared_declared_by;          // "field n_shared_experts = 1" when config.json declares one, else ""
  // Which layers are MoE according to the config (when it says): first_k_dense_replace / moe_layer_freq
  // (DeepSeek), mlp_only_layers / decoder_sparse_step (Qwen), hybrid_override_pattern 'E' (Nemotron-H).
  bool layer_rule_known = false;
  int64_t first_k_dense = 0, moe_layer_freq = 1, decoder_sparse_step = 1;
  std::set<int64_t> mlp_only_layers;
  std::string hybrid_pattern;
  std::vector<std::string> notes;
  bool predicted_moe(int64_t layer) const;
};
// Both loaders: every layer below num_hidden_layers must have tensors (`seen`: the layers below it that have
// any). Checked before anything is sized by num_hidden_layers, which is untrusted until then; FormatError naming
// the first missing layer and the highest present one.
void check_layers_have_tensors(const std::string& dir, const ModelConfig& m, const std::set<int64_t>& seen);

// FormatError naming the file on failure: not valid JSON, or a duplicate key (named; io::parse_json_strict).
nlohmann::json read_json_file(const std::string& path);
ModelConfig parse_model_config(const nlohmann::json& config, const std::string& file);

// Quantization-config parsers. Each returns nullopt when the checkpoint is not of its format, and throws
// FormatError when it is but something is unsupported (group size, algorithm ...).
std::optional<QuantConfig> parse_modelopt_quant(const std::string& dir, const nlohmann::json& config);
std::optional<QuantConfig> parse_compressed_tensors_quant(const std::string& dir, const nlohmann::json& config);

// The shared loader over a parsed config: layer discovery, spec, validation, streaming load, inspect.
std::shared_ptr<Checkpoint> open_nvfp4_checkpoint(const std::string& dir, ModelConfig model, QuantConfig quant);

}  // namespace nvfp4moe::model
