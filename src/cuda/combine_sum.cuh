// combine_sum.cuh: the one term of the MoE combine, shared by combine_kernel (sm90_nvfp4_combine.cuh) and the
// combine folded into the warp-streaming GEMM2 (sm90_nvfp4_warp_stream_gemm.cuh), so both sum the same bits:
// acc = fma(w, y, acc) per slot in slot order from +0, then the shared expert's term with its gate (or 1).
#pragma once

#include <cuda_runtime.h>

namespace nvfp4moe::cuda {

__device__ __forceinline__ float combine_fma(float w, float y, float acc) { return fmaf(w, y, acc); }

}  // namespace nvfp4moe::cuda
