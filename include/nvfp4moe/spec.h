// MoeSpec: everything that defines one MoE layer's math, independent of where its weights live.
#pragma once

#include <cstdint>
#include <string>

namespace nvfp4moe {

enum class Activation : uint8_t { SwiGLU, Relu2 };  // Relu2: non-gated experts (Nemotron-H): relu(up x)^2
enum class Routing : uint8_t {
  SoftmaxTopK,         // Qwen3-MoE / Mixtral / gpt-oss: softmax over E, top-k, optional renormalization
  SigmoidGroupedTopK,  // DeepSeek-V3 noaux_tc: sigmoid + bias, n_group groups, keep topk_group, scale
};
enum class Mode : uint8_t { W4A16, W4A4 };

const char* activation_name(Activation a);
const char* routing_name(Routing r);
const char* mode_name(Mode m);
bool mode_from_name(const std::string& name, Mode* out);

struct MoeSpec {
  int layer = 0;                  // decoder layer index in the checkpoint
  int64_t hidden = 0;             // H
  int64_t intermediate = 0;       // I (per routed expert; gate and up are each I wide)
  int64_t num_experts = 0;        // E
  int64_t top_k = 0;              // k
  Activation activation = Activation::SwiGLU;
  Routing routing = Routing::SoftmaxTopK;
  bool norm_topk_prob = true;     // renormalize the k selected weights to sum 1
  int64_t n_group = 1;            // DeepSeek grouped routing
  int64_t topk_group = 1;
  float routed_scaling_factor = 1.0f;
  bool has_router_bias = false;   // e_score_correction_bias [E] f32 (DeepSeek)
  int64_t shared_intermediate = 0;  // width of the fused shared expert (0 = none)
  bool shared_expert_gated = false; // Qwen2-MoE / Qwen3-Next: shared output * sigmoid(x . shared_expert_gate)

  bool gated() const { return activation == Activation::SwiGLU; }
  int64_t w13_rows() const { return gated() ? 2 * intermediate : intermediate; }  // N of GEMM1
  // Throws ArgumentError naming the field when the spec is inconsistent (K % 16, top_k > E, groups ...).
  void validate() const;
  std::string describe() const;
};

}  // namespace nvfp4moe
