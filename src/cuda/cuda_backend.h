// Entry points of the CUDA backend that the backend-independent code (src/api) calls. Only declared when the
// library is built with CUDA (NVFP4MOE_WITH_CUDA).
#pragma once

#include <memory>

#include "nvfp4moe/moe.h"

namespace nvfp4moe::cuda {

bool device_available();  // a CUDA device is present and usable
std::unique_ptr<MoeLayer> create_cuda_moe_layer(MoeWeights weights, const MoeLayerOptions& options);

}  // namespace nvfp4moe::cuda
