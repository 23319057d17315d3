// Tensor descriptions at the API boundary: raw pointers with dtype, shape, strides and device, laid out like
// DLPack's DLTensor so bindings convert without copying. The library never owns what a TensorRef points to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace nvfp4moe {

enum class DType : uint8_t { U8, I8, F8_E4M3, F8_E5M2, BF16, F16, F32, I32, I64, BOOL };

size_t dtype_size(DType d);
const char* dtype_name(DType d);  // safetensors spelling: "U8", "F8_E4M3", "BF16", ...
bool dtype_from_name(const std::string& name, DType* out);

enum class DeviceType : uint8_t { CPU, CUDA };

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements; empty = contiguous row-major
  DeviceType device = DeviceType::CPU;
  int device_id = 0;

  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string describe() const;  // "BF16[17, 2048] on cuda:0" for error messages
};

}  // namespace nvfp4moe
