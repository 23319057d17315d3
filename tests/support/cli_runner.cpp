#include "support/cli_runner.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

namespace nvfp4moe::test {

namespace fs = std::filesystem;

std::string cli_path() {
  const char* p = std::getenv("NVFP4MOE_CLI");
  return p ? p : "";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TempDir::TempDir() {
  std::string tmpl = (fs::temp_directory_path() / "nvfp4moe-cli-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

CliResult cli(const std::string& args) {
  static TempDir io_dir;
  static int n = 0;
  const std::string o = io_dir / ("out" + std::to_string(n)), e = io_dir / ("err" + std::to_string(n));
  ++n;
  const std::string cmd = "'" + cli_path() + "' " + args + " >'" + o + "' 2>'" + e + "' </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(o);
  r.err = slurp(e);
  return r;
}

void expect_cli_error(const CliResult& r, int code, const std::string& needle) {
  EXPECT_EQ(r.code, code) << r.all();
  const std::string prefix = "nvfp4moe: error: ";
  EXPECT_EQ(r.err.compare(0, prefix.size(), prefix), 0) << r.all();
  ASSERT_FALSE(r.err.empty()) << r.all();
  EXPECT_EQ(r.err.back(), '\n') << r.all();
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "error must be ONE line\n" << r.all();
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in the error\n" << r.all();
}

}  // namespace nvfp4moe::test
