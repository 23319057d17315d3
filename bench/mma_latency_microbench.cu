// Latency of the dependent MMA chain that bounds the sm90 GEMM at one tile per CTA (CMake target
// mma_latency_microbench, not in `all`). Every output of the GEMM sums its K / 16 k16 products in one fixed order
// into one fp32 accumulator (design.md rule 3), so at decode (one tile per CTA, one accumulator chain per
// warpgroup in the half-unit tiles) a k-tile costs at least 4 dependent MMAs. This measures, with clock64 on one
// CTA, the cycles per k-tile of the engine's instruction patterns on the engine's own PTX wrappers
// (sm90_nvfp4_grouped_gemm.cuh), with the A fragment in registers and the B tile in shared memory as there:
//   wgmma_1chain   4 x wgmma.m64n16k16 on one accumulator, commit, wait<0>       (the half tile's k-tile)
//   wgmma_2chains  8 x wgmma.m64n16k16 alternating two accumulators, commit, wait<0>  (whole-unit tile, NB = 2)
//   mma_1chain     4 x mma.sync.m16n8k16 on one accumulator, per warp              (the *_sync consumer, NB = 1)
//   mma_2chains    8 x mma.sync.m16n8k16 alternating two accumulators
// and prints one JSON line per pattern: cycles per k-tile and per k16 step (median over 8 runs of 4096 k-tiles).
// By hand: nvcc -std=c++20 -O3 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//            bench/mma_latency_microbench.cu -o mma_latency_microbench
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda/sm90_nvfp4_grouped_gemm.cuh"

namespace nvfp4moe::cuda {
bool pdl_enabled() { return false; }  // the header's launch helper refers to it; nothing here uses PDL
}  // namespace nvfp4moe::cuda

namespace sm90 = nvfp4moe::cuda::sm90;

enum Pattern : int { kWgmma1 = 0, kWgmma2 = 1, kMma1 = 2, kMma2 = 3 };

template <int P>
__global__ void __launch_bounds__(128, 1) chain_kernel(long long* cycles, float* sink, int ktiles) {
  __shared__ alignas(1024) uint8_t b_tile[16 * 128];  // 16 token rows x 64 bf16, 128-byte swizzled (zeros)
  for (int i = threadIdx.x; i < 16 * 128; i += blockDim.x) b_tile[i] = 0;
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // generic writes before the async proxy reads
  __syncthreads();
  const uint64_t desc = sm90::make_b_desc(sm90::smem_u32(b_tile));
  // bf16 1.0 pairs; the A value does not change the latency. Loaded through the sink so that ptxas cannot fold.
  const uint32_t one = __float_as_uint(sink[0]) | 0x3F803F80u;
  const uint32_t a[4] = {one, one, one, one};
  float acc0[8] = {}, acc1[8] = {};
  const uint32_t b0 = one, b1 = one;
  __syncwarp();
  const long long t0 = clock64();
  for (int kt = 0; kt < ktiles; ++kt) {
    if constexpr (P == kWgmma1 || P == kWgmma2) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sm90::reg_fence(acc0[i]);
        sm90::reg_fence(acc1[i]);
      }
      sm90::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sm90::Wgmma<16>::mma(acc0, a, desc + 2 * j);
        if constexpr (P == kWgmma2) sm90::Wgmma<16>::mma(acc1, a, desc + 2 * j);
      }
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        sm90::reg_fence(acc0[i]);
        sm90::reg_fence(acc1[i]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        sm90::mma_16816(acc0, a, b0, b1);
        if constexpr (P == kMma2) sm90::mma_16816(acc1, a, b0, b1);
      }
    }
  }
  const long long t1 = clock64();
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += acc0[i] + acc1[i];
  sink[1 + threadIdx.x] = s;
  if (threadIdx.x == 0) cycles[0] = t1 - t0;
}

int main() {
  int dev = 0, clock_khz = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, dev);
  long long* cycles = nullptr;
  float* sink = nullptr;
  if (cudaMalloc(&cycles, sizeof(long long)) != cudaSuccess || cudaMalloc(&sink, 256 * sizeof(float)) != cudaSuccess) {
    std::fprintf(stderr, "mma_latency_microbench: cudaMalloc failed\n");
    return 1;
  }
  cudaMemset(sink, 0, 256 * sizeof(float));
  const int ktiles = 4096;
  const char* names[4] = {"wgmma_1chain", "wgmma_2chains", "mma_1chain", "mma_2chains"};
  void (*kernels[4])(long long*, float*, int) = {chain_kernel<kWgmma1>, chain_kernel<kWgmma2>, chain_kernel<kMma1>,
                                                 chain_kernel<kMma2>};
  for (int p = 0; p < 4; ++p) {
    std::vector<double> per_ktile;
    for (int run = 0; run < 9; ++run) {
      kernels[p]<<<1, 128>>>(cycles, sink, ktiles);
      long long c = 0;
      if (cudaMemcpy(&c, cycles, sizeof(c), cudaMemcpyDeviceToHost) != cudaSuccess) {
        std::fprintf(stderr, "mma_latency_microbench: %s failed: %s\n", names[p], cudaGetErrorString(cudaGetLastError()));
        return 1;
      }
      if (run > 0) per_ktile.push_back(static_cast<double>(c) / ktiles);  // run 0: warm-up
    }
    std::sort(per_ktile.begin(), per_ktile.end());
    const double med = per_ktile[per_ktile.size() / 2];
    const int chains = (p == kWgmma2 || p == kMma2) ? 2 : 1;
    std::printf("{\"pattern\": \"%s\", \"cycles_per_ktile\": %.1f, \"cycles_per_k16_step\": %.1f, \"chains\": %d, "
                "\"ns_per_k16_step_at_max_clock\": %.2f, \"max_clock_mhz\": %d}\n",
                names[p], med, med / 4, chains, med / 4 / (clock_khz / 1e6), clock_khz / 1000);
  }
  return 0;
}
