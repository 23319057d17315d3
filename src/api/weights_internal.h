// The checks of MoeWeights::validate() (src/api/weights.cpp) that the sharding (src/api/parallel.cpp) shares.
#pragma once

#include <cstdint>

#include "nvfp4moe/weights.h"

namespace nvfp4moe::weights_detail {

// How a check treats a NaN input scale: none (a W4A16 checkpoint, which MoeLayer::create handles per mode) or an
// error (MoeWeights::validate(): weights a layer is built from carry real scales or were given them).
enum class NanInputScales { Refused, Allowed };

// x holds e experts of [H = h, I = i] (gated or not): buffer sizes, scale counts, every scale finite and > 0.
// `what` names x in the errors ("MoeWeights.experts").
void check_stacked_experts(const StackedExperts& x, const char* what, int64_t e, int64_t h, int64_t i, bool gated,
                           NanInputScales nan_input_scales);

// MoeWeights::validate() with the input scales' NaN policy chosen.
void validate_moe_weights(const MoeWeights& w, NanInputScales nan_input_scales);

}  // namespace nvfp4moe::weights_detail
