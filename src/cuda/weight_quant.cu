// The GPU weight quantizer (see weight_quant.h).
#include "cuda/weight_quant.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda/sm90_nvfp4_weight_quant.cuh"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"

namespace nvfp4moe::cuda {

namespace {

int grid_for(int64_t blocks) {
  int dev = 0, sms = 132;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int64_t want = (blocks + kernels::kWeightQuantThreads - 1) / kernels::kWeightQuantThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(sms) * 8)));
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw Error(detail::cat("cuda weight quantizer: ", what, ": ", cudaGetErrorString(e)));
}

// Parallel memcpy (the source is a file mapping: page-ins and copies spread over the host cores).
void copy_par(uint8_t* dst, const uint8_t* src, size_t n) {
  const size_t chunk = size_t(8) << 20;
  const unsigned hw = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const size_t parts = std::min<size_t>(hw, (n + chunk - 1) / chunk);
  if (parts <= 1) {
    std::memcpy(dst, src, n);
    return;
  }
  const size_t per = (n + parts - 1) / parts;
  std::vector<std::thread> th;
  for (size_t p = 0; p < parts; ++p)
    th.emplace_back([=] {
      const size_t b = p * per;
      if (b < n) std::memcpy(dst + b, src + b, std::min(per, n - b));
    });
  for (auto& t : th) t.join();
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

class CudaExpertQuantizer final : public model::ExpertQuantizer {
 public:
  CudaExpertQuantizer(int device, WeightQuantStats* stats) : device_(device), stats_(stats) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    NVFP4MOE_CHECK(e == cudaSuccess && count > 0, ArgumentError,
                   "device: expected a CUDA device for quantizing on the GPU, got none (",
                   e != cudaSuccess ? cudaGetErrorString(e) : "0 devices", ")");
    NVFP4MOE_CHECK(device >= 0 && device < count, ArgumentError, "device: expected 0..", count - 1, ", got ", device);
    check(cudaSetDevice(device_), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~CudaExpertQuantizer() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    for (Slot& s : slots_) free_slot(s);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void quantize(const model::ExpertSource& src, StackedExperts& dst, int64_t slot) override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    Slot& s = slots_[next_];
    next_ ^= 1;
    complete(s);  // the expert this slot held two calls ago
    // layout of one expert in the staging area: sources (256-byte aligned), packed w13|w2, scales w13|w2
    size_t src_off[3] = {0, 0, 0}, src_bytes = 0;
    int64_t elems[3] = {0, 0, 0};
    for (int r = 0; r < 3; ++r) {
      if (!src.proj[r]) continue;
      src_off[r] = src_bytes;
      src_bytes = align_up(src_bytes + src.proj[r]->nbytes(), 256);
      elems[r] = src.proj[r]->numel();
    }
    const size_t p13 = dst.w13_bytes_per_expert(), s13 = dst.w13_scale_bytes_per_expert();
    const size_t p2 = dst.w2_bytes_per_expert(), s2 = dst.w2_scale_bytes_per_expert();
    const size_t out_bytes = align_up(p13 + p2, 256) + s13 + s2 + 256;
    reserve(s, src_bytes, out_bytes);
    // host copy into pinned memory (overlaps the GPU work of the other slot)
    const double t0 = now_s();
    for (int r = 0; r < 3; ++r)
      if (src.proj[r]) copy_par(s.h_src + src_off[r], src.proj[r]->data, src.proj[r]->nbytes());
    if (stats_) {
      stats_->host_copy_s += now_s() - t0;
      for (int r = 0; r < 3; ++r)
        if (src.proj[r]) stats_->source_bytes += src.proj[r]->nbytes();
    }
    uint8_t* d_packed = s.d_out;
    uint8_t* d_scales = s.d_out + align_up(p13 + p2, 256);
    uint32_t* d_misc = reinterpret_cast<uint32_t*>(d_scales + align_up(s13 + s2, 16));  // amax[3], bad[2], ws2[3]
    check(cudaMemcpyAsync(s.d_src, s.h_src, src_bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
    check(cudaMemsetAsync(d_misc, 0, 8 * sizeof(uint32_t), stream_), "memset");
    for (int r = 0; r < 3; ++r)
      if (src.proj[r])
        check(launch_weight_amax(s.d_src + src_off[r], src.proj[r]->dtype, elems[r], d_misc + r, d_misc + 3, stream_),
              "amax kernel");
    const bool gated = src.proj[0] != nullptr;
    for (int r = 0; r < 3; ++r) {
      if (!src.proj[r]) continue;
      // gate and up: max of both amax (one shared ws2); an ungated expert's up alone; down alone
      const uint32_t* a = d_misc + (r == 2 ? 2 : (gated ? 0 : 1));
      const uint32_t* b = d_misc + (r == 2 ? 2 : 1);
      const size_t po = r == 2 ? p13 : (r == 1 && gated ? p13 / 2 : 0);
      const size_t so = r == 2 ? s13 : (r == 1 && gated ? s13 / 2 : 0);
      check(launch_weight_quantize(s.d_src + src_off[r], src.proj[r]->dtype, elems[r], a, b, d_packed + po,
                                   d_scales + so, reinterpret_cast<float*>(d_misc + 5 + r), stream_),
            "quantize kernel");
    }
    check(cudaMemcpyAsync(s.h_out, d_packed, p13 + p2, cudaMemcpyDeviceToHost, stream_), "copy packed");
    check(cudaMemcpyAsync(s.h_out + align_up(p13 + p2, 256), d_scales, s13 + s2, cudaMemcpyDeviceToHost, stream_),
          "copy scales");
    check(cudaMemcpyAsync(s.h_misc, d_misc, 8 * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream_), "copy scalars");
    check(cudaEventRecord(s.done, stream_), "event");
    s.pending = true;
    s.dst = &dst;
    s.slot = slot;
    s.gated = gated;
    s.what = src.what;
    for (int r = 0; r < 3; ++r) s.name[r] = src.proj[r] ? src.proj[r]->name : std::string();
    s.p13 = p13;
    s.s13 = s13;
    s.p2 = p2;
    s.s2 = s2;
  }

  const char* device_name() const override { return "cuda"; }

  void finish() override {
    check(cudaSetDevice(device_), "cudaSetDevice");
    // the older slot first (errors in expert order)
    complete(slots_[next_]);
    complete(slots_[next_ ^ 1]);
  }

 private:
  struct Slot {
    uint8_t *h_src = nullptr, *h_out = nullptr, *d_src = nullptr, *d_out = nullptr;
    uint32_t* h_misc = nullptr;
    size_t src_cap = 0, out_cap = 0;
    cudaEvent_t done = nullptr;
    bool pending = false;
    StackedExperts* dst = nullptr;
    int64_t slot = 0;
    bool gated = true;
    std::string what, name[3];
    size_t p13 = 0, s13 = 0, p2 = 0, s2 = 0;
  };

  void free_slot(Slot& s) {
    cudaFreeHost(s.h_src);
    cudaFreeHost(s.h_out);
    cudaFreeHost(s.h_misc);
    cudaFree(s.d_src);
    cudaFree(s.d_out);
    if (s.done) cudaEventDestroy(s.done);
    s = Slot{};
  }

  void reserve(Slot& s, size_t src_bytes, size_t out_bytes) {
    if (!s.done) {
      check(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaMallocHost(reinterpret_cast<void**>(&s.h_misc), 8 * sizeof(uint32_t)), "cudaMallocHost");
    }
    if (src_bytes > s.src_cap) {
      cudaFreeHost(s.h_src);
      cudaFree(s.d_src);
      s.h_src = s.d_src = nullptr;
      s.src_cap = 0;
      check(cudaMallocHost(reinterpret_cast<void**>(&s.h_src), src_bytes), "cudaMallocHost (staging)");
      check(cudaMalloc(reinterpret_cast<void**>(&s.d_src), src_bytes), "cudaMalloc (staging)");
      s.src_cap = src_bytes;
    }
    if (out_bytes > s.out_cap) {
      cudaFreeHost(s.h_out);
      cudaFree(s.d_out);
      s.h_out = s.d_out = nullptr;
      s.out_cap = 0;
      check(cudaMallocHost(reinterpret_cast<void**>(&s.h_out), out_bytes), "cudaMallocHost (output)");
      check(cudaMalloc(reinterpret_cast<void**>(&s.d_out), out_bytes), "cudaMalloc (output)");
      s.out_cap = out_bytes;
    }
  }

  // Waits for the slot's expert and moves its result into MoeWeights.
  void complete(Slot& s) {
    if (!s.pending) return;
    s.pending = false;
    const double t0 = now_s();
    check(cudaEventSynchronize(s.done), "quantizing an expert");
    if (stats_) stats_->wait_s += now_s() - t0;
    const uint32_t* m = s.h_misc;
    if (m[3]) {
      std::string name;
      for (int r = 0; r < 3 && name.empty(); ++r) name = s.name[r];
      throw FormatError(detail::cat(s.what, ": tensor ", name, " (or another projection of this expert): expected "
                                    "finite weights, got ", fmt::bits_float(m[4])));
    }
    StackedExperts& d = *s.dst;
    const size_t us = static_cast<size_t>(s.slot);
    std::memcpy(d.w13.data() + us * s.p13, s.h_out, s.p13);
    std::memcpy(d.w2.data() + us * s.p2, s.h_out + s.p13, s.p2);
    const uint8_t* sc = s.h_out + align_up(s.p13 + s.p2, 256);
    std::memcpy(d.w13_scale.data() + us * s.s13, sc, s.s13);
    std::memcpy(d.w2_scale.data() + us * s.s2, sc + s.s13, s.s2);
    float ws2[3];
    std::memcpy(ws2, m + 5, sizeof ws2);
    if (s.gated) d.w13_gate_scale2[us] = ws2[0];
    d.w13_up_scale2[us] = ws2[1];
    d.w2_scale2[us] = ws2[2];
  }

  int device_ = 0;
  WeightQuantStats* stats_ = nullptr;
  cudaStream_t stream_ = nullptr;
  Slot slots_[2];
  int next_ = 0;
};

}  // namespace

cudaError_t launch_weight_amax(const void* src, DType dtype, int64_t n, uint32_t* amax_bits, uint32_t* bad,
                               cudaStream_t stream) {
  if (n % fmt::kBlock != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = n / fmt::kBlock;
  if (blocks == 0) return cudaSuccess;
  const int grid = grid_for(blocks);
  switch (dtype) {
    case DType::BF16:
      kernels::weight_amax_kernel<kernels::kSrcBf16><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(src, blocks, amax_bits, bad);
      break;
    case DType::F16:
      kernels::weight_amax_kernel<kernels::kSrcF16><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(src, blocks, amax_bits, bad);
      break;
    case DType::F32:
      kernels::weight_amax_kernel<kernels::kSrcF32><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(src, blocks, amax_bits, bad);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_weight_quantize(const void* src, DType dtype, int64_t n, const uint32_t* amax_a,
                                   const uint32_t* amax_b, uint8_t* packed, uint8_t* scales, float* ws2_out,
                                   cudaStream_t stream) {
  if (n % fmt::kBlock != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || reinterpret_cast<uintptr_t>(packed) % 8 != 0)
    return cudaErrorInvalidValue;
  const int64_t blocks = n / fmt::kBlock;
  if (blocks == 0) return cudaSuccess;
  const int grid = grid_for(blocks);
  switch (dtype) {
    case DType::BF16:
      kernels::weight_quantize_kernel<kernels::kSrcBf16><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(
          src, blocks, amax_a, amax_b, packed, scales, ws2_out);
      break;
    case DType::F16:
      kernels::weight_quantize_kernel<kernels::kSrcF16><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(
          src, blocks, amax_a, amax_b, packed, scales, ws2_out);
      break;
    case DType::F32:
      kernels::weight_quantize_kernel<kernels::kSrcF32><<<grid, kernels::kWeightQuantThreads, 0, stream>>>(
          src, blocks, amax_a, amax_b, packed, scales, ws2_out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

std::unique_ptr<model::ExpertQuantizer> make_weight_quantizer(int device, WeightQuantStats* stats) {
  return std::make_unique<CudaExpertQuantizer>(device, stats);
}

}  // namespace nvfp4moe::cuda
