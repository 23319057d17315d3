// Helpers of the GPU suites (tests/cuda): the CUDA_OK assertion, a device buffer that owns its allocation, and
// a TensorRef over device memory. Header-only, included only by code compiled with the CUDA toolkit.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "nvfp4moe/tensor.h"

// ASSERT that a CUDA call succeeded, naming the call and the error (use inside void functions / TEST bodies).
#define CUDA_OK(x)                                                                  \
  do {                                                                              \
    cudaError_t err_ = (x);                                                         \
    ASSERT_EQ(err_, cudaSuccess) << #x << ": " << cudaGetErrorString(err_);         \
  } while (0)

namespace nvfp4moe::test {

// `count` elements of T in device memory (p == nullptr if the allocation failed; tests check it).
template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t count) : n(count) {
    if (cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  explicit DevBuf(const std::vector<T>& h) : DevBuf(h.size()) { put(h); }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  // Host -> device at element `offset`; device -> host of `count` elements from `offset` (all when omitted).
  void put(const std::vector<T>& h, size_t offset = 0) {
    if (p != nullptr && !h.empty())
      EXPECT_EQ(cudaMemcpy(p + offset, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get(size_t count, size_t offset = 0) const {
    std::vector<T> h(count);
    if (p != nullptr && count > 0)
      EXPECT_EQ(cudaMemcpy(h.data(), p + offset, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  std::vector<T> get() const { return get(n); }
};

inline TensorRef dev_tensor(void* p, DType dt, std::vector<int64_t> shape, int device_id = 0) {
  TensorRef t;
  t.data = p;
  t.dtype = dt;
  t.shape = std::move(shape);
  t.device = DeviceType::CUDA;
  t.device_id = device_id;
  return t;
}

}  // namespace nvfp4moe::test
