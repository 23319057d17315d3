#include "nvfp4moe/tensor.h"

#include <sstream>

namespace nvfp4moe {

namespace {
struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::U8, "U8", 1},     {DType::I8, "I8", 1},     {DType::F8_E4M3, "F8_E4M3", 1},
    {DType::F8_E5M2, "F8_E5M2", 1}, {DType::BF16, "BF16", 2}, {DType::F16, "F16", 2},
    {DType::F32, "F32", 4},   {DType::I32, "I32", 4},   {DType::I64, "I64", 8},
    {DType::BOOL, "BOOL", 1},
};
}  // namespace

size_t dtype_size(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i.size;
  return 0;
}

const char* dtype_name(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i.name;
  return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
  for (const auto& i : kDTypes) {
    if (name == i.name) {
      *out = i.dtype;
      return true;
    }
  }
  return false;
}

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool TensorRef::is_contiguous() const {
  if (strides.empty()) return true;
  if (strides.size() != shape.size()) return false;
  int64_t expect = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string TensorRef::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype) << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "] on " << (device == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(device_id));
  if (!is_contiguous()) os << " (non-contiguous)";
  return os.str();
}

}  // namespace nvfp4moe
