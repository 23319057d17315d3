#include "nvfp4moe/spec.h"

#include <cmath>
#include <sstream>

#include "nvfp4moe/error.h"

namespace nvfp4moe {

const char* activation_name(Activation a) { return a == Activation::SwiGLU ? "swiglu" : "relu2"; }
const char* routing_name(Routing r) {
  return r == Routing::SoftmaxTopK ? "softmax_topk" : "sigmoid_grouped_topk";
}
const char* mode_name(Mode m) { return m == Mode::W4A16 ? "w4a16" : "w4a4"; }
bool mode_from_name(const std::string& name, Mode* out) {
  if (name == "w4a16") *out = Mode::W4A16;
  else if (name == "w4a4") *out = Mode::W4A4;
  else return false;
  return true;
}

void MoeSpec::validate() const {
  NVFP4MOE_CHECK(hidden > 0 && hidden % 16 == 0, ArgumentError,
                 "MoeSpec.hidden must be a positive multiple of 16 (the NVFP4 block), got ", hidden);
  NVFP4MOE_CHECK(intermediate > 0 && intermediate % 16 == 0, ArgumentError,
                 "MoeSpec.intermediate must be a positive multiple of 16 (the NVFP4 block), got ", intermediate);
  NVFP4MOE_CHECK(num_experts > 0, ArgumentError, "MoeSpec.num_experts must be > 0, got ", num_experts);
  NVFP4MOE_CHECK(top_k >= 1 && top_k <= num_experts, ArgumentError, "MoeSpec.top_k must be in [1, num_experts=",
                 num_experts, "], got ", top_k);
  if (routing == Routing::SigmoidGroupedTopK) {
    NVFP4MOE_CHECK(n_group >= 1 && num_experts % n_group == 0, ArgumentError, "MoeSpec.n_group must divide num_experts=",
                   num_experts, ", got ", n_group);
    NVFP4MOE_CHECK(topk_group >= 1 && topk_group <= n_group, ArgumentError, "MoeSpec.topk_group must be in [1, n_group=",
                   n_group, "], got ", topk_group);
    NVFP4MOE_CHECK(top_k <= topk_group * (num_experts / n_group), ArgumentError,
                   "MoeSpec.top_k=", top_k, " exceeds the experts in the kept groups (topk_group * E / n_group = ",
                   topk_group * (num_experts / n_group), ")");
  }
  NVFP4MOE_CHECK(shared_intermediate >= 0 && shared_intermediate % 16 == 0, ArgumentError,
                 "MoeSpec.shared_intermediate must be a non-negative multiple of 16, got ", shared_intermediate);
  NVFP4MOE_CHECK(std::isfinite(routed_scaling_factor) && routed_scaling_factor > 0.0f, ArgumentError,
                 "MoeSpec.routed_scaling_factor must be finite and > 0, got ", routed_scaling_factor);
}

std::string MoeSpec::describe() const {
  std::ostringstream os;
  os << "layer " << layer << ": H=" << hidden << " I=" << intermediate << " E=" << num_experts << " top_k=" << top_k
     << " " << activation_name(activation) << " " << routing_name(routing);
  if (routing == Routing::SigmoidGroupedTopK)
    os << "(groups " << n_group << ", keep " << topk_group << ", scale " << routed_scaling_factor << ")";
  os << (norm_topk_prob ? " renormalized" : "");
  if (shared_intermediate > 0) os << " shared I=" << shared_intermediate << (shared_expert_gated ? " (gated)" : "");
  return os.str();
}

}  // namespace nvfp4moe
