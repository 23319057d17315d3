// Helpers for picking checkpoint tensor names apart ("model.layers.3.mlp.experts.17.up_proj.weight"), shared by
// the NVFP4 loader and the quantizer of unquantized checkpoints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nvfp4moe/error.h"

namespace nvfp4moe::model {

// A decimal layer/expert index of at most 9 digits (no sign, no leading '+'); false otherwise. A zero-padded
// one ("007", "01") is refused with a FormatError naming the tensor (`dir`: tensor `name`): read as 7 it would
// alias "experts.7", and skipped as not-an-index the tensor would be dropped silently.
inline bool parse_index(const std::string& s, int64_t* out, const std::string& dir, const std::string& name) {
  if (s.empty() || s.size() > 9) return false;
  int64_t v = 0;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
    v = v * 10 + (ch - '0');
  }
  NVFP4MOE_CHECK(s.size() == 1 || s[0] != '0', FormatError, dir, ": tensor ", name, ": index \"", s,
                 "\" has a leading zero (expected \"", v, "\"; indices are written without padding)");
  *out = v;
  return true;
}

// "a.b.c" -> {"a", "b", "c"} (empty fields kept).
inline std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    const size_t e = s.find('.', b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  return out;
}

}  // namespace nvfp4moe::model
