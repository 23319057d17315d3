// Device buffers for `run --backend cuda`: copies the host inputs to the layer's device, runs forward (one
// warm-up, then timed), copies `out` back. Built with the CUDA runtime only when the library has CUDA.
#include <cstring>
#include <string>
#include <vector>

#include "cli/cli_common.h"
#include "nvfp4moe/error.h"

#ifdef NVFP4MOE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace nvfp4moe::cli {

#ifdef NVFP4MOE_WITH_CUDA
namespace {

void check_cuda(cudaError_t e, const char* what) {
  NVFP4MOE_CHECK(e == cudaSuccess, Error, "CUDA ", what, " failed: ", cudaGetErrorName(e), " (",
                 cudaGetErrorString(e), ")");
}

// One device allocation, freed on scope exit (also when forward throws).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (bytes) check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  void upload(const void* src, size_t bytes) {
    if (bytes) check_cuda(cudaMemcpy(ptr_, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
  }
  void download(void* dst, size_t bytes) const {
    if (bytes) check_cuda(cudaMemcpy(dst, ptr_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }

 private:
  void* ptr_ = nullptr;
};

}  // namespace

void forward_on_cuda(MoeLayer& layer, const std::vector<uint16_t>& hidden_bf16, int64_t tokens, int64_t hidden,
                     const std::vector<int32_t>& topk_ids, const std::vector<float>& topk_weights, int64_t top_k,
                     std::vector<float>& out, double* seconds) {
  const int device = layer.options().device;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  DeviceBuffer d_hidden(hidden_bf16.size() * sizeof(uint16_t));
  DeviceBuffer d_ids(topk_ids.size() * sizeof(int32_t));
  DeviceBuffer d_weights(topk_weights.size() * sizeof(float));
  DeviceBuffer d_out(out.size() * sizeof(float));
  d_hidden.upload(hidden_bf16.data(), hidden_bf16.size() * sizeof(uint16_t));
  d_ids.upload(topk_ids.data(), topk_ids.size() * sizeof(int32_t));
  d_weights.upload(topk_weights.data(), topk_weights.size() * sizeof(float));

  TensorRef h{d_hidden.get(), DType::BF16, {tokens, hidden}, {}, DeviceType::CUDA, device};
  TensorRef ids{d_ids.get(), DType::I32, {tokens, top_k}, {}, DeviceType::CUDA, device};
  TensorRef wts{d_weights.get(), DType::F32, {tokens, top_k}, {}, DeviceType::CUDA, device};
  TensorRef o{d_out.get(), DType::F32, {tokens, hidden}, {}, DeviceType::CUDA, device};
  RoutingArgs routing;
  routing.topk_ids = &ids;
  routing.topk_weights = &wts;

  // The first forward pays for module loading; time the mean of the following ones.
  layer.forward(h, routing, o, nullptr);
  check_cuda(cudaDeviceSynchronize(), "forward (warm-up)");
  constexpr int kIters = 10;
  const double t0 = now_seconds();
  for (int i = 0; i < kIters; ++i) layer.forward(h, routing, o, nullptr);
  check_cuda(cudaDeviceSynchronize(), "forward");
  *seconds = (now_seconds() - t0) / kIters;
  d_out.download(out.data(), out.size() * sizeof(float));
}

#else

void forward_on_cuda(MoeLayer&, const std::vector<uint16_t>&, int64_t, int64_t, const std::vector<int32_t>&,
                     const std::vector<float>&, int64_t, std::vector<float>&, double*) {
  throw ArgumentError(
      "--backend cuda: this nvfp4moe was built without the CUDA backend (rebuild where nvcc is present with "
      "-DNVFP4MOE_CUDA=ON, or use --backend cpu)");
}

#endif

}  // namespace nvfp4moe::cli
