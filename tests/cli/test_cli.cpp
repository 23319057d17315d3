// The `nvfp4moe` command end to end: it runs the binary at $NVFP4MOE_CLI in temporary directories.
//   - gen + inspect + run --backend cpu for every preset (reduced sizes, the preset's routing and activation)
//   - odd shapes (H=80, I=48, E=5)
//   - run --input/--output: the written `out` equals cpu::moe_forward on the loaded weights, bit for bit
//   - bad arguments and bad files: exit code 1 or 2 (never a crash), ONE line "nvfp4moe: error: <specific>",
//     and no output file left behind
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/synthetic.h"
#include "support/cli_runner.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"

namespace fs = std::filesystem;
using namespace nvfp4moe;

namespace {

using test::cli;
using test::cli_path;
using test::slurp;
using test::TempDir;
using Result = test::CliResult;
void expect_error(const Result& r, int code, const std::string& needle) { test::expect_cli_error(r, code, needle); }

// "cosine 0.997" -> 0.997 from run's accuracy line; NaN when absent.
double parse_cosine(const std::string& out) {
  std::smatch m;
  static const std::regex re("cosine ([0-9.eE+-]+|nan)");
  if (!std::regex_search(out, m, re)) return NAN;
  return std::strtod(m[1].str().c_str(), nullptr);
}
double parse_rel_l2(const std::string& out) {
  std::smatch m;
  static const std::regex re("rel L2 ([0-9.eE+-]+|nan)");
  if (!std::regex_search(out, m, re)) return NAN;
  return std::strtod(m[1].str().c_str(), nullptr);
}

double parse_rms_ratio(const std::string& out) {
  std::smatch m;
  static const std::regex re("rms ratio ([0-9.eE+-]+|nan)");
  if (!std::regex_search(out, m, re)) return NAN;
  return std::strtod(m[1].str().c_str(), nullptr);
}

io::TensorToWrite tensor(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data) {
  io::TensorToWrite t;
  t.name = name;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.fill = [data](uint8_t* dst, size_t nbytes) { std::memcpy(dst, data, nbytes); };
  return t;
}

std::vector<float> read_out(const std::string& path, int64_t tokens, int64_t hidden) {
  auto f = io::SafetensorsFile::open(path);
  const io::TensorInfo* t = f->find("out");
  EXPECT_NE(t, nullptr);
  if (!t) return {};
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{tokens, hidden}));
  std::vector<float> v(static_cast<size_t>(t->numel()));
  std::memcpy(v.data(), t->data, v.size() * sizeof(float));
  return v;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cli_path().empty()) GTEST_SKIP() << "NVFP4MOE_CLI is not set (run through ctest)";
  }
};

// ------------------------------------------------------------------ every preset, reduced
struct PresetCase {
  const char* preset;
  const char* reduce;  // extra gen flags that keep the test fast; the preset's routing/activation stay
  int moe_layer;
};

class PresetTest : public ::testing::TestWithParam<PresetCase> {
 protected:
  void SetUp() override {
    if (cli_path().empty()) GTEST_SKIP() << "NVFP4MOE_CLI is not set (run through ctest)";
  }
};

TEST_P(PresetTest, GenInspectRunBothModes) {
  const PresetCase& c = GetParam();
  TempDir tmp;
  const std::string dir = tmp / "ckpt";
  Result g = cli(std::string("gen --preset ") + c.preset + " " + c.reduce + " --seed 7 --calibration-tokens 64 --out '" +
                 dir + "'");
  ASSERT_EQ(g.code, 0) << g.all();
  ASSERT_TRUE(fs::exists(dir + "/config.json")) << g.all();
  ASSERT_TRUE(fs::exists(dir + "/hf_quant_config.json")) << g.all();

  Result i = cli("inspect '" + dir + "'");
  ASSERT_EQ(i.code, 0) << i.all();
  EXPECT_FALSE(i.out.empty());

  // Both modes at T = 9 (not a power of two), against the unquantized fp32 layer over the same routing.
  // w4a16 differs from it only by the bf16 rounding of the intermediate: tight bounds. w4a4 adds the NVFP4
  // activation quantization with the synthetic checkpoint's calibrated input scales: looser, but garbage fails.
  for (const char* mode : {"w4a16", "w4a4"}) {
    Result r = cli("run '" + dir + "' --layer " + std::to_string(c.moe_layer) + " --mode " + mode +
                   " --tokens 9 --seed 3 --backend cpu");
    ASSERT_EQ(r.code, 0) << r.all();
    const double cosine = parse_cosine(r.out), rel = parse_rel_l2(r.out), rms = parse_rms_ratio(r.out);
    std::printf("[ preset ] %-14s %-5s cosine %.6f rel L2 %.4f rms ratio %.4f\n", c.preset, mode, cosine, rel, rms);
    if (std::string(mode) == "w4a16") {
      EXPECT_GT(cosine, 0.9999) << r.all();
      EXPECT_LT(rel, 1e-2) << r.all();
      EXPECT_NEAR(rms, 1.0, 0.01) << r.all();
    } else {
      EXPECT_GT(cosine, 0.95) << r.all();
      EXPECT_LT(rel, 0.35) << r.all();
      EXPECT_NEAR(rms, 1.0, 0.15) << r.all();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllPresets, PresetTest,
    ::testing::Values(
        // 7168/2048/256 -> 256/128/16 experts in 8 groups (2 per group), 1 dense layer, shared expert I=128
        PresetCase{"deepseek-v3", "--hidden 256 --intermediate 128 --experts 16 --shared-intermediate 128 "
                                  "--layers 2 --dense-layers 1", 1},
        PresetCase{"qwen3-235b", "--hidden 256 --intermediate 128 --experts 16", 0},
        // qwen3-30b at its real H and I, with 8 experts
        PresetCase{"qwen3-30b", "--experts 8", 0},
        PresetCase{"gpt-oss-120b", "--hidden 288 --intermediate 288 --experts 12", 0},
        // 2688/1856 are not multiples of 64; keep that property at 1/8 of the size
        PresetCase{"nemotron-nano", "--hidden 336 --intermediate 240 --shared-intermediate 464 --experts 12", 0},
        PresetCase{"mixtral-8x7b", "--hidden 256 --intermediate 512", 0}),
    [](const ::testing::TestParamInfo<PresetCase>& info) {
      std::string s = info.param.preset;
      for (char& ch : s)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      return s;
    });

// ------------------------------------------------------------------ odd shapes
TEST_F(CliTest, OddShapes) {
  TempDir tmp;
  struct Case {
    const char* flags;
  } cases[] = {
      {"--hidden 80 --intermediate 48 --experts 5 --top-k 2"},
      {"--hidden 80 --intermediate 48 --experts 5 --top-k 3 --activation relu2 --routing deepseek --n-group 1 "
       "--topk-group 1 --scaling 2.5 --shared-intermediate 32"},
      {"--hidden 80 --intermediate 48 --experts 6 --top-k 2 --routing deepseek --n-group 3 --topk-group 2 "
       "--shared-intermediate 48"},
  };
  int n = 0;
  for (const auto& c : cases) {
    const std::string dir = tmp / ("c" + std::to_string(n++));
    Result g = cli(std::string("gen ") + c.flags + " --seed 5 --out '" + dir + "' --shard-mb 0.01");
    ASSERT_EQ(g.code, 0) << c.flags << "\n" << g.all();
    Result i = cli("inspect '" + dir + "'");
    ASSERT_EQ(i.code, 0) << i.all();
    for (const char* mode : {"w4a16", "w4a4"}) {
      Result r = cli("run '" + dir + "' --layer 0 --mode " + mode + " --tokens 7");
      ASSERT_EQ(r.code, 0) << c.flags << "\n" << r.all();
      // w4a4 on 8-token calibrated scales can clip heavy relu^2 tails: only a sanity bound there.
      EXPECT_GT(parse_cosine(r.out), std::string(mode) == "w4a16" ? 0.9999 : 0.5) << c.flags << "\n" << r.all();
    }
    // --routing-from logits: random logits instead of hidden . router^T
    Result r = cli("run '" + dir + "' --layer 0 --mode w4a4 --tokens 3 --routing-from logits --seed 11");
    ASSERT_EQ(r.code, 0) << r.all();
  }
}

// ------------------------------------------------------------------ a shared small checkpoint for the rest
class CliFixture : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (cli_path().empty()) return;
    tmp_ = new TempDir();
    dir_ = *tmp_ / "ckpt";
    // DeepSeek style: layer 0 dense, layer 1 MoE (H=80, I=48, E=6 in 3 groups, shared expert).
    Result g = cli("gen --hidden 80 --intermediate 48 --experts 6 --top-k 2 --routing deepseek --n-group 3 "
                   "--topk-group 2 --shared-intermediate 32 --layers 2 --dense-layers 1 --seed 9 --out '" + dir_ + "'");
    ASSERT_EQ(g.code, 0) << g.all();
  }
  static void TearDownTestSuite() {
    delete tmp_;
    tmp_ = nullptr;
  }
  void SetUp() override {
    if (cli_path().empty()) GTEST_SKIP() << "NVFP4MOE_CLI is not set (run through ctest)";
    ASSERT_TRUE(fs::exists(dir_ + "/config.json"));
  }
  // run on the fixture checkpoint's MoE layer, with an output file that must not exist on failure
  Result run(const std::string& extra, const std::string& out) {
    return cli("run '" + dir_ + "' --layer 1 " + extra + (out.empty() ? "" : " --output '" + out + "'"));
  }
  static constexpr int64_t H = 80, E = 6, K = 2;
  static TempDir* tmp_;
  static std::string dir_;
};
TempDir* CliFixture::tmp_ = nullptr;
std::string CliFixture::dir_;

// Random bf16 hidden and either routing form.
struct InputData {
  int64_t T;
  std::vector<uint16_t> hidden_bf16;
  std::vector<float> hidden_f32, logits, weights;
  std::vector<int32_t> ids;
};
InputData make_input(int64_t T, int64_t H, int64_t E, int64_t K) {
  InputData d;
  d.T = T;
  uint64_t s = 12345;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  };
  for (int64_t i = 0; i < T * H; ++i) {
    d.hidden_f32.push_back(2.0f * next());
    d.hidden_bf16.push_back(fmt::bf16_from_float(d.hidden_f32.back()));
  }
  for (int64_t i = 0; i < T * E; ++i) d.logits.push_back(next());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      // token t uses experts (t + 2j) % E; the last token leaves its second slot unused
      d.ids.push_back(t == T - 1 && j == 1 ? -1 : static_cast<int32_t>((t + 2 * j) % E));
      d.weights.push_back(0.25f + 0.5f * static_cast<float>(j));
    }
  }
  return d;
}

TEST_F(CliFixture, InputOutputRoundTripMatchesReference) {
  TempDir tmp;
  const int64_t T = 11;
  InputData d = make_input(T, H, E, K);
  auto ckpt = Checkpoint::open(dir_);
  MoeWeights w = ckpt->load_layer(1);

  for (const char* mode_s : {"w4a16", "w4a4"}) {
    Mode mode;
    ASSERT_TRUE(mode_from_name(mode_s, &mode));
    // 1. topk_ids + topk_weights: out must be cpu::moe_forward on the same weights, bit for bit.
    const std::string in1 = tmp / (std::string("in_topk_") + mode_s + ".safetensors");
    io::write_safetensors(in1, {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                                tensor("topk_ids", DType::I32, {T, K}, d.ids.data()),
                                tensor("topk_weights", DType::F32, {T, K}, d.weights.data())});
    const std::string out1 = tmp / (std::string("out_topk_") + mode_s + ".safetensors");
    Result r = run(std::string("--mode ") + mode_s + " --input '" + in1 + "'", out1);
    ASSERT_EQ(r.code, 0) << r.all();
    std::vector<float> got = read_out(out1, T, H);
    std::vector<float> want(static_cast<size_t>(T * H));
    cpu::moe_forward(w, mode, d.hidden_bf16.data(), T, d.ids.data(), d.weights.data(), want.data());
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << mode_s;
    EXPECT_FALSE(fs::exists(out1 + ".tmp"));

    // 2. router_logits, F32 hidden: routed with cpu::route, hidden rounded to bf16 first.
    const std::string in2 = tmp / (std::string("in_logits_") + mode_s + ".safetensors");
    io::write_safetensors(in2, {tensor("hidden", DType::F32, {T, H}, d.hidden_f32.data()),
                                tensor("router_logits", DType::F32, {T, E}, d.logits.data())});
    const std::string out2 = tmp / (std::string("out_logits_") + mode_s + ".safetensors");
    r = run(std::string("--mode ") + mode_s + " --input '" + in2 + "'", out2);
    ASSERT_EQ(r.code, 0) << r.all();
    got = read_out(out2, T, H);
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<float> wts(static_cast<size_t>(T * K));
    cpu::route(w.spec, d.logits.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(), T, ids.data(),
               wts.data());
    cpu::moe_forward(w, mode, d.hidden_bf16.data(), T, ids.data(), wts.data(), want.data());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << mode_s;
  }
}

TEST_F(CliFixture, RandomRunIsDeterministic) {
  TempDir tmp;
  Result a = run("--mode w4a4 --tokens 5 --seed 4", tmp / "a.safetensors");
  Result b = run("--mode w4a4 --tokens 5 --seed 4", tmp / "b.safetensors");
  ASSERT_EQ(a.code, 0) << a.all();
  ASSERT_EQ(b.code, 0) << b.all();
  EXPECT_EQ(slurp(tmp / "a.safetensors").size(), slurp(tmp / "b.safetensors").size());
  EXPECT_EQ(read_out(tmp / "a.safetensors", 5, H), read_out(tmp / "b.safetensors", 5, H));
  Result c = run("--mode w4a4 --tokens 5 --seed 5", tmp / "c.safetensors");
  ASSERT_EQ(c.code, 0) << c.all();
  EXPECT_NE(read_out(tmp / "a.safetensors", 5, H), read_out(tmp / "c.safetensors", 5, H));
}

// --backend cuda (on a machine with a device): the same input gives the CPU result to relative L2 <= 1e-3.
TEST_F(CliFixture, CudaBackendMatchesCpu) {
  if (!cuda_backend_available()) GTEST_SKIP() << "no CUDA backend/device: --backend cuda is checked for its error";
  TempDir tmp;
  const int64_t T = 13;
  InputData d = make_input(T, H, E, K);
  const std::string in = tmp / "in.safetensors";
  io::write_safetensors(in, {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                             tensor("router_logits", DType::F32, {T, E}, d.logits.data())});
  for (const char* mode : {"w4a16", "w4a4"}) {
    const std::string oc = tmp / (std::string("cpu_") + mode), og = tmp / (std::string("cuda_") + mode);
    Result rc = run(std::string("--mode ") + mode + " --backend cpu --input '" + in + "'", oc);
    Result rg = run(std::string("--mode ") + mode + " --backend cuda --input '" + in + "'", og);
    ASSERT_EQ(rc.code, 0) << rc.all();
    ASSERT_EQ(rg.code, 0) << rg.all();
    const std::vector<float> a = read_out(oc, T, H), b = read_out(og, T, H);
    double dd = 0, rr = 0;
    for (size_t i = 0; i < a.size(); ++i) dd += double(a[i] - b[i]) * (a[i] - b[i]), rr += double(a[i]) * a[i];
    EXPECT_LE(std::sqrt(dd / rr), 1e-3) << mode;
  }
}

// ------------------------------------------------------------------ bad arguments
TEST_F(CliFixture, BadArguments) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  expect_error(run("--mode w4a8", out), 2, "w4a8");
  expect_error(run("--mode w4a16 --backend tpu", out), 2, "tpu");
  expect_error(run("--mode w4a16 --tokens 0", out), 2, "--tokens");
  expect_error(run("", out), 2, "--mode");
  expect_error(cli("run '" + dir_ + "' --mode w4a16 --layer 7 --output '" + out + "'"), 1, "out of range");
  expect_error(cli("run '" + dir_ + "' --mode w4a16 --layer -1 --output '" + out + "'"), 1, "out of range");
  expect_error(cli("run '" + dir_ + "' --mode w4a16 --layer 0 --output '" + out + "'"), 1, "dense layer");
  expect_error(run("--mode w4a16", tmp / "no/such/dir/out.safetensors"), 1, "does not exist");
  expect_error(run("--mode w4a16", tmp.path()), 1, "is a directory");
  expect_error(run("--mode w4a16 --input '" + tmp / "missing.safetensors" + "' --tokens 3", out), 2, "--tokens");
  expect_error(cli("frobnicate"), 2, "frobnicate");
  expect_error(cli(""), 2, "subcommand");
  expect_error(cli("gen --preset qwen9 --out '" + (tmp / "g") + "'"), 2, "qwen9");
  expect_error(cli("gen --hidden 64 --out '" + (tmp / "g") + "'"), 1, "--preset");
  expect_error(cli("gen --hidden 72 --intermediate 48 --experts 4 --top-k 2 --out '" + (tmp / "g") + "'"), 1, "72");
  expect_error(cli("gen --hidden 64 --intermediate 48 --experts 4 --top-k 5 --out '" + (tmp / "g") + "'"), 1, "top_k");
  EXPECT_FALSE(fs::exists(tmp / "g"));
  // gen refuses a non-empty directory unless --force
  expect_error(cli("gen --preset qwen3-30b --experts 4 --hidden 64 --intermediate 32 --out '" + dir_ + "'"), 1,
               "not empty");
  EXPECT_TRUE(fs::exists(dir_ + "/config.json"));
  if (!cuda_backend_available()) expect_error(run("--mode w4a16 --backend cuda", out), 1, "--backend cuda");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(fs::exists(out + ".tmp"));
}

// Size flags have real upper bounds (CLI11 alone saturates an out-of-range integer and wraps a negative seed);
// each refusal names the flag, the range and the value given.
TEST_F(CliFixture, SizeFlagsAreBounded) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  expect_error(run("--mode w4a16 --tokens 0", out), 2, "--tokens: Value 0 not in range 1 to 65536");
  expect_error(run("--mode w4a16 --tokens 65537", out), 2, "--tokens: Value 65537 not in range 1 to 65536");
  expect_error(run("--mode w4a16 --tokens 99999999999999999999", out), 2,
               "--tokens: Value 99999999999999999999 not in range 1 to 65536");
  // ep x tp overflowed int and ran unsharded
  expect_error(run("--mode w4a16 --ep 65536 --tp 65536", out), 2, "--ep: Value 65536 not in range 1 to 4096");
  expect_error(run("--mode w4a16 --ep 2147483647 --tp 2", out), 2, "--ep: Value 2147483647 not in range 1 to 4096");
  expect_error(run("--mode w4a16 --tp 0", out), 2, "--tp: Value 0 not in range 1 to 4096");
  expect_error(run("--mode w4a16 --seed -1", out), 2,
               "--seed: expected an integer in [0, 18446744073709551615], got '-1'");
  expect_error(run("--mode w4a16 --seed 18446744073709551616", out), 2, "got '18446744073709551616'");
  EXPECT_FALSE(fs::exists(out));
  const std::string g = tmp / "g";
  const std::string gen = "gen --hidden 64 --intermediate 32 --experts 4 --top-k 2 --out '" + g + "' ";
  expect_error(cli(gen + "--layers 1025"), 2, "--layers: Value 1025 not in range 1 to 1024");
  expect_error(cli(gen + "--layers 0"), 2, "--layers: Value 0 not in range 1 to 1024");
  expect_error(cli(gen + "--calibration-tokens 65"), 2, "--calibration-tokens: Value 65 not in range 1 to 64");
  expect_error(cli(gen + "--seed -1"), 2, "--seed: expected an integer");
  expect_error(cli("gen --hidden 64 --intermediate 32 --experts 4097 --top-k 2 --out '" + g + "'"), 2,
               "--experts: Value 4097 not in range 1 to 4096");
  expect_error(cli("gen --hidden 99999999999999999999 --intermediate 32 --experts 4 --top-k 2 --out '" + g + "'"), 2,
               "--hidden: Value 99999999999999999999 not in range 1 to 65536");
  expect_error(cli("gen --hidden 64 --intermediate 4611686018427387904 --experts 4 --top-k 2 --out '" + g + "'"), 2,
               "--intermediate: Value 4611686018427387904 not in range 1 to 65536");
  // --shard-mb: finite and > 0; a value past 2^64 bytes is no limit (one shard), not a wrong refusal
  expect_error(cli(gen + "--shard-mb nan"), 1, "--shard-mb: expected a finite size in MB > 0, got nan");
  expect_error(cli(gen + "--shard-mb -5"), 1, "--shard-mb: expected a finite size in MB > 0, got -5");
  expect_error(cli(gen + "--shard-mb 0"), 1, "--shard-mb: expected a finite size in MB > 0, got 0");
  EXPECT_FALSE(fs::exists(g));
  Result r = cli(gen + "--shard-mb 1e300");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(fs::exists(g + "/config.json"));
}

// gen --scaling: inf (or a value past the float range) was written to config.json as null, which loads as 1.0.
TEST_F(CliFixture, GenRefusesNonFiniteScaling) {
  TempDir tmp;
  const std::string g = tmp / "g";
  const std::string gen =
      "gen --hidden 64 --intermediate 32 --experts 4 --top-k 2 --routing deepseek --out '" + g + "'";
  expect_error(cli(gen + " --scaling inf"), 1, "--scaling: expected a finite routed_scaling_factor > 0");
  expect_error(cli(gen + " --scaling inf"), 1, "got inf");
  expect_error(cli(gen + " --scaling 1e39"), 1, "got 1e+39");
  expect_error(cli(gen + " --scaling nan"), 1, "--scaling");
  expect_error(cli(gen + " --scaling -1"), 1, "got -1");
  EXPECT_FALSE(fs::exists(g));
  // the library refuses it too (Python's generate_checkpoint goes there)
  model::SyntheticOptions o;
  o.hidden = 64;
  o.intermediate = 32;
  o.experts = 4;
  o.top_k = 2;
  o.routing = Routing::SigmoidGroupedTopK;
  o.routed_scaling_factor = INFINITY;
  try {
    model::resolve_synthetic(o);
    ADD_FAILURE() << "routed_scaling_factor = inf was accepted";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("routed_scaling_factor: expected a finite value > 0, got inf"),
              std::string::npos)
        << e.what();
  }
}

// A failed gen removes the parent directories it created (and only those).
TEST(GenCleanup, FailedGenRemovesTheParentsItCreated) {
  TempDir tmp;
  fs::create_directories(tmp / "keep");
  std::ofstream(tmp / "keep/file.txt") << "x";
  model::SyntheticOptions o;
  o.hidden = 16;
  o.intermediate = int64_t(1) << 62;  // passes the option checks, fails in the writer (size overflows int64)
  o.experts = 1;
  o.top_k = 1;
  EXPECT_THROW(model::generate_synthetic_checkpoint(tmp / "keep/a/b/ck", o), Error);
  EXPECT_FALSE(fs::exists(tmp / "keep/a"));
  EXPECT_TRUE(fs::exists(tmp / "keep/file.txt"));
  EXPECT_THROW(model::generate_synthetic_checkpoint(tmp / "np/a/b/ck", o), Error);
  EXPECT_FALSE(fs::exists(tmp / "np"));
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);  // only keep/
}

TEST_F(CliFixture, GenForceReplaces) {
  TempDir tmp;
  const std::string dir = tmp / "g";
  fs::create_directories(dir);
  std::ofstream(dir + "/junk.txt") << "x";
  expect_error(cli("gen --hidden 64 --intermediate 32 --experts 4 --top-k 2 --out '" + dir + "'"), 1, "--force");
  Result g = cli("gen --hidden 64 --intermediate 32 --experts 4 --top-k 2 --force --out '" + dir + "'");
  ASSERT_EQ(g.code, 0) << g.all();
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  EXPECT_FALSE(fs::exists(dir + "/junk.txt"));
}

// ------------------------------------------------------------------ bad input files
TEST_F(CliFixture, BadInputFiles) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  const int64_t T = 4;
  InputData d = make_input(T, H, E, K);
  std::vector<int64_t> ids64(d.ids.begin(), d.ids.end());
  std::vector<uint16_t> wrong_h(static_cast<size_t>(T * (H + 16)), 0);
  std::vector<int32_t> bad_ids = d.ids;
  bad_ids[3] = static_cast<int32_t>(E);
  std::vector<float> logits_wrong_e(static_cast<size_t>(T * (E + 1)), 0.f);
  std::vector<float> logits_nan = d.logits, logits_inf = d.logits;
  logits_nan[1 * E + 2] = NAN;
  logits_inf[3 * E + 5] = -INFINITY;

  struct Case {
    const char* name;
    std::vector<io::TensorToWrite> tensors;
    const char* needle;
  };
  std::vector<Case> cases;
  cases.push_back({"wrong_h",
                   {tensor("hidden", DType::BF16, {T, H + 16}, wrong_h.data()),
                    tensor("router_logits", DType::F32, {T, E}, d.logits.data())},
                   "'hidden' must have shape [T, H=80]"});
  cases.push_back({"hidden_dtype",
                   {tensor("hidden", DType::F16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E}, d.logits.data())},
                   "'hidden' must be BF16 or F32, got F16"});
  cases.push_back({"no_hidden", {tensor("router_logits", DType::F32, {T, E}, d.logits.data())}, "'hidden'"});
  cases.push_back({"ids_dtype",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("topk_ids", DType::I64, {T, K}, ids64.data()),
                    tensor("topk_weights", DType::F32, {T, K}, d.weights.data())},
                   "'topk_ids' must be I32, got I64"});
  cases.push_back({"ids_shape",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("topk_ids", DType::I32, {T, 1}, d.ids.data()),
                    tensor("topk_weights", DType::F32, {T, K}, d.weights.data())},
                   "'topk_ids' must have shape [T=4, k=2]"});
  cases.push_back({"ids_range",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("topk_ids", DType::I32, {T, K}, bad_ids.data()),
                    tensor("topk_weights", DType::F32, {T, K}, d.weights.data())},
                   "topk_ids[1, 1] = 6"});
  cases.push_back({"no_weights",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("topk_ids", DType::I32, {T, K}, d.ids.data())},
                   "without 'topk_weights'"});
  cases.push_back({"no_routing", {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data())}, "routing is missing"});
  cases.push_back({"both_routings",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E}, d.logits.data()),
                    tensor("topk_ids", DType::I32, {T, K}, d.ids.data()),
                    tensor("topk_weights", DType::F32, {T, K}, d.weights.data())},
                   "not both"});
  cases.push_back({"logits_shape",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E + 1}, logits_wrong_e.data())},
                   "'router_logits' must have shape [T=4, E=6]"});
  cases.push_back({"logits_nan",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E}, logits_nan.data())},
                   "router_logits[1, 2] is not finite (nan)"});
  cases.push_back({"logits_inf",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E}, logits_inf.data())},
                   "router_logits[3, 5] is not finite (-inf)"});
  cases.push_back({"extra_tensor",
                   {tensor("hidden", DType::BF16, {T, H}, d.hidden_bf16.data()),
                    tensor("router_logits", DType::F32, {T, E}, d.logits.data()),
                    tensor("bias", DType::F32, {E}, d.logits.data())},
                   "unexpected tensor 'bias'"});
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string in = tmp / (std::string(c.name) + ".safetensors");
    io::write_safetensors(in, c.tensors);
    expect_error(run("--mode w4a4 --input '" + in + "'", out), 1, c.needle);
    EXPECT_FALSE(fs::exists(out));
  }

  // Not a safetensors file at all, and a missing one.
  const std::string garbage = tmp / "garbage.safetensors";
  std::ofstream(garbage, std::ios::binary) << "this is not a safetensors file";
  Result r = run("--mode w4a16 --input '" + garbage + "'", out);
  expect_error(r, 1, "garbage.safetensors");
  r = run("--mode w4a16 --input '" + (tmp / "missing.safetensors") + "'", out);
  expect_error(r, 1, "missing.safetensors");
  EXPECT_FALSE(fs::exists(out));
}

// ------------------------------------------------------------------ bad checkpoints
TEST_F(CliFixture, BadCheckpoints) {
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  // missing directory
  expect_error(cli("inspect '" + (tmp / "nope") + "'"), 1, "nope");
  expect_error(cli("run '" + (tmp / "nope") + "' --layer 1 --mode w4a16 --output '" + out + "'"), 1, "nope");
  // a copy with a truncated shard
  const std::string bad = tmp / "bad";
  fs::copy(dir_, bad, fs::copy_options::recursive);
  std::string shard;
  for (const auto& e : fs::directory_iterator(bad))
    if (e.path().extension() == ".safetensors") shard = e.path().string();
  ASSERT_FALSE(shard.empty());
  fs::resize_file(shard, fs::file_size(shard) / 2);
  Result r = cli("run '" + bad + "' --layer 1 --mode w4a16 --output '" + out + "'");
  expect_error(r, 1, fs::path(shard).filename().string());
  // config.json that is not JSON
  const std::string bad2 = tmp / "bad2";
  fs::copy(dir_, bad2, fs::copy_options::recursive);
  std::ofstream(bad2 + "/config.json", std::ios::trunc) << "{ not json";
  r = cli("inspect '" + bad2 + "'");
  expect_error(r, 1, "config.json");
  EXPECT_FALSE(fs::exists(out));
}

// ------------------------------------------------------------------ demo and help
TEST_F(CliTest, Demo) {
  Result r = cli("demo --backend cpu --tokens 8");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("w4a16"), std::string::npos) << r.all();
  EXPECT_NE(r.out.find("w4a4"), std::string::npos) << r.all();
  EXPECT_GT(parse_cosine(r.out), 0.99) << r.all();
}

TEST_F(CliTest, HelpAndVersion) {
  Result r = cli("--help");
  EXPECT_EQ(r.code, 0) << r.all();
  for (const char* sub : {"gen", "inspect", "run", "demo"}) EXPECT_NE(r.out.find(sub), std::string::npos) << r.all();
  r = cli("run --help");
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("--mode"), std::string::npos) << r.all();
  r = cli("--version");
  EXPECT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("nvfp4moe"), std::string::npos) << r.all();
}

}  // namespace
