// Synthetic NVFP4 MoE checkpoints for `nvfp4moe gen`, tests and benchmarks: random weights quantized exactly
// as ModelOpt's exporter does (nvfp4-format.md section 3; gate and up of an expert share one amax), input
// scales calibrated on random activations, written in the style of a real model family (config.json,
// hf_quant_config.json, sharded safetensors) so Checkpoint::open reads them like the real thing.
//
// Everything is a pure function of (resolved options, seed): any expert can be regenerated bit-exactly with
// synthesize_expert(), which is what the tests compare loaded MoeWeights against. Tensors are generated one
// expert at a time while the writer streams them, so a multi-GB checkpoint never sits in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/spec.h"

namespace nvfp4moe::model {

// The config.json / tensor-naming style written.
enum class ModelStyle : uint8_t {
  DeepSeekV3,  // deepseek_v3: n_routed_experts, sigmoid noaux_tc, mlp.shared_experts, first_k_dense_replace
  Qwen3Moe,    // qwen3_moe: num_experts, softmax, mlp_only_layers
  Qwen2Moe,    // qwen2_moe: like Qwen3 plus mlp.shared_expert + mlp.shared_expert_gate (gated shared expert)
  Mixtral,     // mixtral: block_sparse_moe.experts.E.{w1,w3,w2}, num_local_experts (no dense/shared layers)
  GptOss,      // gpt_oss: num_local_experts, mlp.router.weight (no dense/shared layers)
  NemotronH,   // nemotron_h: backbone.layers.L.mixer.*, relu2 non-gated, hybrid_override_pattern
};
const char* style_name(ModelStyle s);                          // "deepseek_v3", "qwen3_moe", ...
bool style_from_name(const std::string& name, ModelStyle* out);

constexpr int kMaxCalibrationTokens = 64;  // SyntheticOptions::calibration_tokens: 1..64

// Every field left unset takes the preset's value (or, without a preset, a documented default).
struct SyntheticOptions {
  std::string preset;                    // one of synthetic_presets(); "" = explicit fields (hidden, I, E, k needed)
  std::optional<ModelStyle> style;       // default: the preset's, else derived from routing/activation/shared
  std::optional<int64_t> hidden;         // H
  std::optional<int64_t> intermediate;   // I
  std::optional<int64_t> experts;        // E (a reduced count for a preset: top_k / groups are adjusted to fit
                                         //    unless given explicitly)
  std::optional<int64_t> top_k;
  std::optional<Routing> routing;
  std::optional<Activation> activation;
  std::optional<bool> norm_topk_prob;
  std::optional<int64_t> shared_intermediate;  // 0 = no shared expert
  std::optional<int64_t> n_group;
  std::optional<int64_t> topk_group;
  std::optional<float> routed_scaling_factor;
  std::optional<bool> router_bias;       // e_score_correction_bias (default: on for sigmoid routing)
  int layers = 1;                        // num_hidden_layers
  int first_dense_layers = 0;            // layers 0..n-1 are dense (bf16 MLP), the rest MoE
  int64_t dense_intermediate = 64;       // width of the small dense MLPs
  uint64_t seed = 1;
  size_t max_shard_bytes = size_t(4) << 30;
  int calibration_tokens = 8;            // random tokens per expert for the input_scale calibration (1..64)
  bool overwrite = false;                // replace an existing non-empty directory
};

// Options resolved against the preset: what will be (or was) written.
struct SyntheticModel {
  std::string preset;
  ModelStyle style = ModelStyle::Qwen3Moe;
  MoeSpec spec;                // of every MoE layer (spec.layer = the first MoE layer)
  int layers = 1;
  int first_dense_layers = 0;
  int64_t dense_intermediate = 64;
  uint64_t seed = 1;
  int calibration_tokens = 8;
  size_t max_shard_bytes = size_t(4) << 30;

  bool is_moe_layer(int layer) const { return layer >= first_dense_layers && layer < layers; }
  std::string moe_prefix(int layer) const;   // "model.layers.3.mlp", "backbone.layers.3.mixer", ...
  std::string describe() const;              // one line
  size_t checkpoint_bytes() const;           // sum of all tensor bytes that will be written
};

std::vector<std::string> synthetic_presets();  // deepseek-v3, qwen3-235b, qwen3-30b, gpt-oss-120b, nemotron-nano, mixtral-8x7b
// Resolves and validates (ArgumentError naming the option, expected and actual value).
SyntheticModel resolve_synthetic(const SyntheticOptions& options);

struct SyntheticResult {
  std::string dir;
  SyntheticModel model;
  size_t bytes = 0;    // tensor bytes written
  size_t tensors = 0;
  double seconds = 0;
};
// Writes the checkpoint into dir (via dir.tmp-XXXX renamed at the end; a failure leaves nothing behind).
// progress: (bytes written, total) at most every ~256 MB / second.
SyntheticResult generate_synthetic_checkpoint(const std::string& dir, const SyntheticOptions& options,
                                              const ProgressFn& progress = {});

// One projection exactly as written: packed codes [n, k/2], block scales [n, k/16], and the scalars.
struct SyntheticProj {
  int64_t n = 0, k = 0;
  std::vector<uint8_t> packed;
  std::vector<uint8_t> scale;
  float weight_scale_2 = 0;
  float input_scale = 0;
};
struct SyntheticExpert {
  SyntheticProj gate, up, down;  // gate empty (n = 0) for relu2 experts
};
// Regenerates routed expert `expert` (or the shared expert with expert = -1) of MoE layer `layer`.
SyntheticExpert synthesize_expert(const SyntheticModel& model, int layer, int expert);
// The router weight [E, H] (bf16 bits) and e_score_correction_bias [E] of a layer as written.
std::vector<uint16_t> synthesize_router(const SyntheticModel& model, int layer);
std::vector<float> synthesize_router_bias(const SyntheticModel& model, int layer);

}  // namespace nvfp4moe::model
