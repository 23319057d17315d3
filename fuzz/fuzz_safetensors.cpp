// libFuzzer target: any byte string given to SafetensorsFile::from_memory either parses into tensors that lie
// inside the input, or throws nvfp4moe::Error. Anything else (another exception, a sanitizer report, a
// tensor pointing outside the input) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "io/safetensors.h"
#include "nvfp4moe/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = nvfp4moe::io::SafetensorsFile::from_memory(data, size, "fuzz");
    uint64_t prev_end = 0;
    unsigned sum = 0;
    for (const auto& t : f->tensors()) {
      // Tensors are in offset order and tile the data section, which ends at the end of the input.
      if (t.begin != prev_end || t.end < t.begin || t.data < data || t.data + t.nbytes() > data + size) abort();
      if (static_cast<size_t>(t.numel()) * nvfp4moe::dtype_size(t.dtype) != t.nbytes()) abort();
      if (f->find(t.name) == nullptr) abort();
      for (size_t i = 0; i < t.nbytes(); ++i) sum += t.data[i];  // ASan checks each byte is in the input
      prev_end = t.end;
    }
    if (!f->tensors().empty() && f->tensors().back().data + f->tensors().back().nbytes() != data + size) abort();
    volatile unsigned sink = sum;
    (void)sink;
  } catch (const nvfp4moe::Error&) {
  }
  return 0;
}
