// NVFP4 weight quantization on the GPU (kernels: sm90_nvfp4_weight_quant.cuh), bitwise equal to the CPU
// quantizer (model::make_cpu_expert_quantizer). Two levels:
//   - launchers over device pointers (what the GPU test and the timing use);
//   - make_weight_quantizer(): a model::ExpertQuantizer that quantizes an unquantized checkpoint's layer expert by
//     expert into the host MoeWeights, through a bounded pinned + device staging area (two slots of one expert
//     each: the host copy of expert e+1 overlaps the transfer and kernels of expert e). The packed result lands in
//     MoeWeights, so the cuda runner prepares it like any checkpoint's weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

#include "model/expert_quantizer.h"
#include "nvfp4moe/tensor.h"

namespace nvfp4moe::cuda {

// amax(|x|) of n (a multiple of 16) BF16/F16/F32 elements at src (16-byte aligned) folded into *amax_bits (float
// bits, atomicMax; zero it first). bad[0] = 1 and bad[1] = bits of a non-finite element when there is one.
cudaError_t launch_weight_amax(const void* src, DType dtype, int64_t n, uint32_t* amax_bits, uint32_t* bad,
                               cudaStream_t stream);
// Quantizes n elements (a row-major [N, K] weight, K % 16 == 0, n = N*K) with ws2 = weight_global_scale(
// max(*amax_a, *amax_b)): packed [n/2] bytes (8-byte aligned), scales [n/16] e4m3; *ws2_out (may be null) = ws2.
cudaError_t launch_weight_quantize(const void* src, DType dtype, int64_t n, const uint32_t* amax_a,
                                   const uint32_t* amax_b, uint8_t* packed, uint8_t* scales, float* ws2_out,
                                   cudaStream_t stream);

// Per-call statistics of the GPU quantizer (for `nvfp4moe quantize --device cuda` and the timing test).
struct WeightQuantStats {
  size_t source_bytes = 0;    // unquantized bytes read
  double host_copy_s = 0;     // source -> pinned staging (host memcpy)
  double wait_s = 0;          // waiting for the GPU (transfers + kernels)
};

// The GPU ExpertQuantizer on `device`. Throws nvfp4moe::Error when the device is not usable.
std::unique_ptr<model::ExpertQuantizer> make_weight_quantizer(int device, WeightQuantStats* stats = nullptr);

}  // namespace nvfp4moe::cuda
