// Errors: the API and CLI throw nvfp4moe::Error with a message naming the argument, the expected and the
// actual value. Kernel launchers return cudaError_t; the runner turns those into Error at its boundary.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace nvfp4moe {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Argument errors (wrong dtype/shape/device/value): bindings map these to ValueError/TypeError.
class ArgumentError : public Error {
 public:
  using Error::Error;
};

// Malformed or unsupported files (safetensors, config, checkpoint layout).
class FormatError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace nvfp4moe

// NVFP4MOE_CHECK(cond, ExceptionType, message parts...): throws ExceptionType(message) when cond is false.
#define NVFP4MOE_CHECK(cond, Exc, ...)                                  \
  do {                                                                  \
    if (!(cond)) throw Exc(::nvfp4moe::detail::cat(__VA_ARGS__));        \
  } while (0)
