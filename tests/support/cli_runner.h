// Test helpers for suites that run the built `nvfp4moe` binary ($NVFP4MOE_CLI, set by CTest): run it with
// stdout/stderr captured, check the one-line error contract, and own temporary folders.
#pragma once

#include <string>

namespace nvfp4moe::test {

std::string cli_path();                       // $NVFP4MOE_CLI, or "" when unset
std::string slurp(const std::string& path);   // a whole file's bytes

struct CliResult {
  int code = -1;
  std::string out, err;
  std::string all() const { return "exit " + std::to_string(code) + "\n--- stdout\n" + out + "--- stderr\n" + err; }
};

// A fresh mkdtemp folder, removed with everything in it when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs `nvfp4moe ARGS` (ARGS already shell-quoted) with stdout and stderr captured separately.
CliResult cli(const std::string& args);

// The error contract: the given exit code and exactly one line on stderr, "nvfp4moe: error: ...", containing
// `needle`.
void expect_cli_error(const CliResult& r, int code, const std::string& needle);

}  // namespace nvfp4moe::test
