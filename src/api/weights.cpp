#include "nvfp4moe/weights.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "api/weights_internal.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe {

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
}

void HostBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

void StackedExperts::allocate(int64_t experts, int64_t h, int64_t i, bool is_gated) {
  num_experts = experts;
  hidden = h;
  intermediate = i;
  gated = is_gated;
  const size_t e = static_cast<size_t>(experts);
  w13 = HostBuffer(e * w13_bytes_per_expert());
  w13_scale = HostBuffer(e * w13_scale_bytes_per_expert());
  w2 = HostBuffer(e * w2_bytes_per_expert());
  w2_scale = HostBuffer(e * w2_scale_bytes_per_expert());
  w13_gate_scale2.assign(gated ? e : 0, 0.0f);
  w13_up_scale2.assign(e, 0.0f);
  w13_input_scale.assign(e, 0.0f);
  w2_scale2.assign(e, 0.0f);
  w2_input_scale.assign(e, 0.0f);
}

size_t StackedExperts::packed_bytes() const { return w13.size() + w13_scale.size() + w2.size() + w2_scale.size(); }

namespace weights_detail {

void check_stacked_experts(const StackedExperts& s, const char* what, int64_t e, int64_t h, int64_t i, bool gated,
                           NanInputScales nan_input_scales) {
  NVFP4MOE_CHECK(s.num_experts == e, ArgumentError, what, ".num_experts: expected ", e, ", got ", s.num_experts);
  NVFP4MOE_CHECK(s.hidden == h, ArgumentError, what, ".hidden: expected ", h, ", got ", s.hidden);
  NVFP4MOE_CHECK(s.intermediate == i, ArgumentError, what, ".intermediate: expected ", i, ", got ", s.intermediate);
  NVFP4MOE_CHECK(s.gated == gated, ArgumentError, what, ".gated: expected ", gated, ", got ", s.gated);
  const size_t ue = static_cast<size_t>(e);
  auto size_is = [&](const char* field, size_t actual, size_t expected) {
    NVFP4MOE_CHECK(actual == expected, ArgumentError, what, ".", field, ": expected ", expected, " bytes, got ", actual);
  };
  size_is("w13", s.w13.size(), ue * s.w13_bytes_per_expert());
  size_is("w13_scale", s.w13_scale.size(), ue * s.w13_scale_bytes_per_expert());
  size_is("w2", s.w2.size(), ue * s.w2_bytes_per_expert());
  size_is("w2_scale", s.w2_scale.size(), ue * s.w2_scale_bytes_per_expert());
  auto len_is = [&](const char* field, size_t actual, size_t expected) {
    NVFP4MOE_CHECK(actual == expected, ArgumentError, what, ".", field, ": expected ", expected, " values, got ", actual);
  };
  len_is("w13_gate_scale2", s.w13_gate_scale2.size(), gated ? ue : 0);
  len_is("w13_up_scale2", s.w13_up_scale2.size(), ue);
  len_is("w13_input_scale", s.w13_input_scale.size(), ue);
  len_is("w2_scale2", s.w2_scale2.size(), ue);
  len_is("w2_input_scale", s.w2_input_scale.size(), ue);
  auto positive = [&](const char* field, const std::vector<float>& v, bool nan_ok) {
    for (size_t x = 0; x < v.size(); ++x)
      NVFP4MOE_CHECK((nan_ok && std::isnan(v[x])) || (v[x] > 0.0f && v[x] < 3.4e38f), ArgumentError, what, ".",
                     field, "[", x, "] must be finite and > 0, got ", v[x]);
  };
  const bool nan_ok = nan_input_scales == NanInputScales::Allowed;
  positive("w13_gate_scale2", s.w13_gate_scale2, false);
  positive("w13_up_scale2", s.w13_up_scale2, false);
  positive("w13_input_scale", s.w13_input_scale, nan_ok);
  positive("w2_scale2", s.w2_scale2, false);
  positive("w2_input_scale", s.w2_input_scale, nan_ok);
}

void validate_moe_weights(const MoeWeights& w, NanInputScales nan_input_scales) {
  const MoeSpec& spec = w.spec;
  spec.validate();
  check_stacked_experts(w.experts, "MoeWeights.experts", spec.num_experts, spec.hidden, spec.intermediate,
                        spec.gated(), nan_input_scales);
  if (spec.shared_intermediate > 0)
    check_stacked_experts(w.shared, "MoeWeights.shared", 1, spec.hidden, spec.shared_intermediate, spec.gated(),
                          nan_input_scales);
  else
    NVFP4MOE_CHECK(w.shared.num_experts == 0, ArgumentError,
                   "MoeWeights.shared: spec has no shared expert but shared.num_experts = ", w.shared.num_experts);
  const size_t eh = static_cast<size_t>(spec.num_experts * spec.hidden);
  NVFP4MOE_CHECK(w.router_weight.empty() || w.router_weight.size() == eh, ArgumentError,
                 "MoeWeights.router_weight: expected [E, H] = ", eh, " values, got ", w.router_weight.size());
  NVFP4MOE_CHECK(w.router_bias.size() == (spec.has_router_bias ? static_cast<size_t>(spec.num_experts) : 0u),
                 ArgumentError, "MoeWeights.router_bias: expected ", spec.has_router_bias ? spec.num_experts : 0,
                 " values, got ", w.router_bias.size());
  NVFP4MOE_CHECK(w.shared_gate_weight.size() == (spec.shared_expert_gated ? static_cast<size_t>(spec.hidden) : 0u),
                 ArgumentError, "MoeWeights.shared_gate_weight: expected ", spec.shared_expert_gated ? spec.hidden : 0,
                 " values, got ", w.shared_gate_weight.size());
}

}  // namespace weights_detail

void MoeWeights::validate() const {
  weights_detail::validate_moe_weights(*this, weights_detail::NanInputScales::Refused);
}

void use_shared_max_input_scales(MoeWeights& w) {
  auto to_max = [](std::vector<float>& v) {
    if (v.empty()) return;
    const float m = *std::max_element(v.begin(), v.end());
    std::fill(v.begin(), v.end(), m);
  };
  to_max(w.experts.w13_input_scale);
  to_max(w.experts.w2_input_scale);
}

}  // namespace nvfp4moe
