// The host-side steps both CPU layers (the whole layer in moe_layer.cpp, one rank of a sharded layer in
// parallel.cpp) run around their reference forward, with the buffers they keep between calls.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/moe.h"

namespace nvfp4moe::cpu_layer_detail {

// F32 hidden rounded to bf16 (as the GPU backend reads it), routing from router logits (or the caller's ids and
// weights), the f32 result rounded into a BF16 out. The buffers only grow: a layer reused at one T allocates once.
// Not thread-safe: the owning layer holds its mutex around run() and bytes().
class CpuForwardScratch {
 public:
  size_t bytes() const {
    return hidden_.capacity() * 2 + ids_.capacity() * 4 + weights_.capacity() * 4 + out_.capacity() * 4;
  }

  // Calls compute(x, T, ids, weights, y): x bf16 [T, H], ids I32 / weights F32 [T, top_k], y F32 [T, H].
  // The arguments were validated by validate_forward_args; T > 0.
  template <class Compute>
  void run(const MoeSpec& spec, const std::vector<float>& router_bias, const TensorRef& hidden,
           const RoutingArgs& routing, const TensorRef& out, Compute&& compute) {
    const int64_t T = hidden.dim(0);
    const size_t th = static_cast<size_t>(T * spec.hidden), tk = static_cast<size_t>(T * spec.top_k);
    const uint16_t* x = static_cast<const uint16_t*>(hidden.data);
    if (hidden.dtype == DType::F32) {
      hidden_.resize(std::max(hidden_.size(), th));
      const float* src = static_cast<const float*>(hidden.data);
      for (size_t i = 0; i < th; ++i) hidden_[i] = fmt::bf16_from_float(src[i]);
      x = hidden_.data();
    }
    const int32_t* ids = static_cast<const int32_t*>(routing.topk_ids ? routing.topk_ids->data : nullptr);
    const float* ws = static_cast<const float*>(routing.topk_weights ? routing.topk_weights->data : nullptr);
    if (routing.router_logits) {
      ids_.resize(std::max(ids_.size(), tk));
      weights_.resize(std::max(weights_.size(), tk));
      cpu::route(spec, static_cast<const float*>(routing.router_logits->data),
                 router_bias.empty() ? nullptr : router_bias.data(), T, ids_.data(), weights_.data());
      ids = ids_.data();
      ws = weights_.data();
    }
    float* y = static_cast<float*>(out.data);
    if (out.dtype == DType::BF16) {
      out_.resize(std::max(out_.size(), th));
      y = out_.data();
    }
    compute(x, T, ids, ws, y);
    if (out.dtype == DType::BF16) {
      uint16_t* o = static_cast<uint16_t*>(out.data);
      for (size_t i = 0; i < th; ++i) o[i] = fmt::bf16_from_float(out_[i]);
    }
  }

 private:
  std::vector<uint16_t> hidden_;  // F32 hidden rounded to bf16
  std::vector<int32_t> ids_;      // routing from logits
  std::vector<float> weights_;
  std::vector<float> out_;        // f32 result before a BF16 out
};

}  // namespace nvfp4moe::cpu_layer_detail
