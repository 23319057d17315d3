// `nvfp4moe run --ep N --tp M` (src/cli/run_parallel.cpp): every rank's shard on the CPU, the comparison with
// the unsharded layer, --output = the ranks' fixed-order combine, and the refusals.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "support/cli_runner.h"

namespace nvfp4moe::test {
namespace {

class RunParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cli_path().empty()) GTEST_SKIP() << "NVFP4MOE_CLI not set";
    dir_ = new TempDir();
    const CliResult r = cli("gen --preset deepseek-v3 --hidden 128 --intermediate 128 --experts 8 --n-group 4 "
                            "--topk-group 2 --top-k 3 --shared-intermediate 64 --out " + (*dir_ / "ck"));
    ASSERT_EQ(r.code, 0) << r.all();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string ck() { return *dir_ / "ck"; }
  static std::vector<uint8_t> out_bytes(const std::string& path) {
    auto f = io::SafetensorsFile::open(path);
    const io::TensorInfo* t = f->find("out");
    return std::vector<uint8_t>(t->data, t->data + t->nbytes());
  }
  static TempDir* dir_;
};
TempDir* RunParallel::dir_ = nullptr;

TEST_F(RunParallel, ExpertParallelIsBitwiseAndTensorParallelIsClose) {
  for (const char* mode : {"w4a16", "w4a4"}) {
    const std::string base = ck() + " --layer 0 --tokens 24 --mode " + mode;
    const CliResult plain = cli("run " + base + " --output " + (*dir_ / "plain.safetensors"));
    ASSERT_EQ(plain.code, 0) << plain.all();
    const CliResult ep = cli("run " + base + " --ep 4 --output " + (*dir_ / "ep.safetensors"));
    ASSERT_EQ(ep.code, 0) << ep.all();
    EXPECT_NE(ep.out.find("parallel: ep 4 x tp 1 = 4 ranks"), std::string::npos) << ep.out;
    EXPECT_NE(ep.out.find("fixed-order combine (EP dispatch/combine) vs unsharded: bitwise equal"), std::string::npos)
        << ep.out;
    EXPECT_EQ(out_bytes(*dir_ / "ep.safetensors"), out_bytes(*dir_ / "plain.safetensors"));
    const CliResult tp = cli("run " + base + " --ep 2 --tp 2");
    ASSERT_EQ(tp.code, 0) << tp.all();
    EXPECT_NE(tp.out.find("parallel: ep 2 x tp 2 = 4 ranks"), std::string::npos) << tp.out;
    EXPECT_NE(tp.out.find("(TP splits GEMM2's K sum)"), std::string::npos) << tp.out;
    EXPECT_NE(tp.out.find("cosine 1.000000"), std::string::npos) << tp.out;
  }
}

TEST_F(RunParallel, Refusals) {
  const std::string base = "run " + ck() + " --layer 0 --mode w4a16";
  expect_cli_error(cli(base + " --tp 16"), 1, "cannot split intermediate (I) = 128 into 16 equal slices");
  expect_cli_error(cli(base + " --ep 9"), 1, "ParallelConfig.ep_size = 9: expected <= num_experts = 8");
  expect_cli_error(cli(base + " --ep 2 --backend cuda"), 1, "not built yet (issue 6");
  expect_cli_error(cli(base + " --ep 0"), 2, "--ep");
}

}  // namespace
}  // namespace nvfp4moe::test
