// ExpertQuantizer: the per-expert step of quantizing an unquantized MoE layer to NVFP4 (nvfp4-format.md
// section 3), with a CPU and a CUDA implementation (src/cuda/weight_quant.h) that produce the same bits. Kept free
// of the config/json headers so nvcc can include it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/safetensors.h"
#include "nvfp4moe/weights.h"

namespace nvfp4moe::model {

// One expert's source tensors: proj[0] gate (nullptr when not gated), proj[1] up, proj[2] down. Shapes and
// dtypes (BF16/F16/F32) are validated before a quantizer sees them.
struct ExpertSource {
  const io::TensorInfo* proj[3] = {nullptr, nullptr, nullptr};
  std::string what;  // "DIR: layer L expert E" for messages
};

// Quantizes one expert into slot `slot` of dst: w13 rows [gate (I rows); up (I rows)], w13_scale, gate/up
// scale2 (equal: the shared amax), w2, w2_scale, w2_scale2. Throws FormatError naming the tensor for a
// non-finite weight. A quantizer may finish an expert asynchronously (the GPU one overlaps the copy of the next
// expert with the kernels of this one): dst and the source bytes must stay valid until finish() returns, and
// only after finish() is every slot written (and every error thrown).
class ExpertQuantizer {
 public:
  virtual ~ExpertQuantizer() = default;
  virtual void quantize(const ExpertSource& src, StackedExperts& dst, int64_t slot) = 0;
  virtual void finish() {}
  virtual const char* device_name() const = 0;  // "cpu" / "cuda"
};
std::unique_ptr<ExpertQuantizer> make_cpu_expert_quantizer();
// The GPU quantizer on `device` (throws ArgumentError in a build without CUDA or without a device).
std::unique_ptr<ExpertQuantizer> make_cuda_expert_quantizer(int device);

}  // namespace nvfp4moe::model
