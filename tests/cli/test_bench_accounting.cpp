// `nvfp4moe bench`: the bytes / FLOPs accounting against hand counts, the random weights and inputs it builds,
// and the command's argument checks and its refusal without a GPU (through the CLI binary, NVFP4MOE_CLI).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "cli/bench.h"
#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/moe.h"

// The builder is CLI code (src/cli is not a library): compile its one translation unit into this test.
#include "cli/bench_weights.cpp"

namespace nvfp4moe::cli::bench {
namespace {

MoeSpec tiny(int64_t H, int64_t I, int64_t E, int64_t k) { return softmax_spec(H, I, E, k); }

TEST(BenchAccounting, GatedHandCount) {
  // H=64, I=32, E=4, k=2; T=3 with one unused slot: pairs 5, experts {0, 1, 2} touched.
  const MoeSpec s = tiny(64, 32, 4, 2);
  const std::vector<int32_t> ids = {0, 1, 1, 2, -1, 0};
  const Accounting a = account(s, 3, ids.data(), /*out_bytes=*/2);
  // per expert: codes 64*64/2 (w13, N1 = 2I = 64) + 64*32/2 (w2) = 2048 + 1024; scales 256 + 128
  EXPECT_EQ(expert_bytes(64, 32, true).codes, 3072);
  EXPECT_EQ(expert_bytes(64, 32, true).scales, 384);
  EXPECT_EQ(a.pairs, 5);
  EXPECT_EQ(a.experts_touched, 3);
  EXPECT_EQ(a.weight_code_bytes, 3 * 3072);
  EXPECT_EQ(a.weight_scale_bytes, 3 * 384);
  EXPECT_EQ(a.shared_bytes, 0);
  EXPECT_FALSE(a.includes_shared);
  // hidden 3*64*2 + logits 3*4*4 + out bf16 3*64*2
  EXPECT_EQ(a.activation_bytes, 384 + 48 + 384);
  EXPECT_EQ(a.bytes, 9216 + 1152 + 816);
  EXPECT_DOUBLE_EQ(a.flops, 2.0 * 5 * 3 * 64 * 32);  // 61440
}

TEST(BenchAccounting, Relu2WithSharedExpertHandCount) {
  // H=32, I=16, E=8, k=1, relu2 (N1 = I), shared expert Is=48; T=2 both on expert 3; f32 out.
  MoeSpec s = tiny(32, 16, 8, 1);
  s.activation = Activation::Relu2;
  s.shared_intermediate = 48;
  const std::vector<int32_t> ids = {3, 3};
  const Accounting a = account(s, 2, ids.data(), /*out_bytes=*/4);
  EXPECT_EQ(a.experts_touched, 1);
  // routed: codes 16*32/2 + 32*16/2 = 512, scales 32 + 32 = 64; shared: codes 768 + 768, scales 96 + 96
  EXPECT_EQ(a.shared_bytes, 1536 + 192);
  EXPECT_EQ(a.weight_code_bytes, 512 + 1536);
  EXPECT_EQ(a.weight_scale_bytes, 64 + 192);
  EXPECT_EQ(a.activation_bytes, 2 * 32 * 2 + 2 * 8 * 4 + 2 * 32 * 4);  // 448
  EXPECT_EQ(a.bytes, 2048 + 256 + 448);
  EXPECT_TRUE(a.includes_shared);
  EXPECT_DOUBLE_EQ(a.shared_flops, 2.0 * 2 * 2 * 32 * 48);
  EXPECT_DOUBLE_EQ(a.flops, 2.0 * 2 * 2 * 32 * 16 + 2.0 * 2 * 2 * 32 * 48);  // 16384
}

TEST(BenchAccounting, DeepSeekV3DecodeStep) {
  // One token on 8 distinct experts + the shared expert: 9 x 24.77 MB (benchmarks.md: 198 MB for the 8 routed).
  MoeSpec s;
  for (const auto& p : presets())
    if (std::string(p.name) == "deepseek-v3") s = p.spec;
  ASSERT_EQ(s.hidden, 7168);
  const std::vector<int32_t> ids = {0, 9, 17, 33, 64, 100, 200, 255};
  const Accounting a = account(s, 1, ids.data());
  const int64_t per = (4096 * 7168 + 7168 * 2048) / 2 + (4096 * 7168 + 7168 * 2048) / 16;
  EXPECT_EQ(per, 24772608);
  EXPECT_EQ(a.bytes, 9 * per + 7168 * 2 + 256 * 4 + 7168 * 2);
  EXPECT_EQ(a.weight_code_bytes + a.weight_scale_bytes - a.shared_bytes, 8 * per);
  EXPECT_NEAR((8 * per) / 1e6, 198.2, 0.1);
  EXPECT_DOUBLE_EQ(a.flops, 2.0 * 8 * 3 * 7168 * 2048 + 2.0 * 1 * 3 * 7168 * 2048);
}

TEST(BenchAccounting, PresetsAreTheProtocolShapes) {
  const auto ps = presets();
  ASSERT_EQ(ps.size(), 5u);
  struct Want { const char* name; int64_t H, I, E, k, Is; bool gated; };
  const Want want[] = {{"deepseek-v3", 7168, 2048, 256, 8, 2048, true},  {"qwen3-235b", 4096, 1536, 128, 8, 0, true},
                       {"qwen3-30b", 2048, 768, 128, 8, 0, true},        {"gpt-oss-120b", 2880, 2880, 128, 4, 0, true},
                       {"nemotron-nano", 2688, 1856, 128, 6, 3712, false}};
  for (size_t i = 0; i < ps.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(std::string(ps[i].name), want[i].name);
    EXPECT_EQ(ps[i].spec.hidden, want[i].H);
    EXPECT_EQ(ps[i].spec.intermediate, want[i].I);
    EXPECT_EQ(ps[i].spec.num_experts, want[i].E);
    EXPECT_EQ(ps[i].spec.top_k, want[i].k);
    EXPECT_EQ(ps[i].spec.shared_intermediate, want[i].Is);
    EXPECT_EQ(ps[i].spec.gated(), want[i].gated);
    EXPECT_NO_THROW(ps[i].spec.validate());
  }
}

TEST(BenchWeights, ValidDeterministicAndUsable) {
  MoeSpec s = tiny(64, 32, 8, 2);
  s.routing = Routing::SigmoidGroupedTopK;
  s.n_group = 2;
  s.topk_group = 1;
  s.has_router_bias = true;
  s.shared_intermediate = 16;
  const MoeWeights a = random_bench_weights(s, 7);
  const MoeWeights b = random_bench_weights(s, 7);
  const MoeWeights c = random_bench_weights(s, 8);
  EXPECT_NO_THROW(a.validate());
  ASSERT_EQ(a.experts.w13.size(), b.experts.w13.size());
  EXPECT_EQ(0, std::memcmp(a.experts.w13.data(), b.experts.w13.data(), a.experts.w13.size()));
  EXPECT_NE(0, std::memcmp(a.experts.w13.data(), c.experts.w13.data(), a.experts.w13.size()));
  for (const HostBuffer* sc : {&a.experts.w13_scale, &a.experts.w2_scale, &a.shared.w13_scale, &a.shared.w2_scale})
    for (size_t i = 0; i < sc->size(); ++i) {
      ASSERT_GE(sc->data()[i], 0x28);
      ASSERT_LE(sc->data()[i], 0x40);
    }
  std::set<int> codes;
  for (size_t i = 0; i < a.experts.w2.size(); ++i) codes.insert(a.experts.w2.data()[i]);
  EXPECT_GT(codes.size(), 200u);  // random bytes, not a constant
  for (float v : a.experts.w13_up_scale2) EXPECT_GT(v, 0.0f);
  for (float v : a.experts.w2_input_scale) EXPECT_GT(v, 0.0f);
  EXPECT_EQ(a.router_bias, random_router_bias(8, 7));

  // The layer runs on it: finite, non-zero outputs in both modes on the CPU reference.
  const int64_t T = 5;
  const std::vector<uint16_t> hidden = random_hidden(T, 64, 3);
  const std::vector<float> logits = random_logits(T, 8, RoutingKind::Uniform, 3);
  std::vector<int32_t> ids(T * 2);
  std::vector<float> wts(T * 2);
  cpu::route(s, logits.data(), a.router_bias.data(), T, ids.data(), wts.data());
  for (Mode m : {Mode::W4A16, Mode::W4A4}) {
    std::vector<float> out(T * 64, 0.0f);
    cpu::moe_forward(a, m, hidden.data(), T, ids.data(), wts.data(), out.data());
    double sq = 0;
    for (float v : out) {
      ASSERT_TRUE(std::isfinite(v));
      sq += double(v) * v;
    }
    EXPECT_GT(sq, 0.0) << mode_name(m);
  }
}

TEST(BenchInputs, HiddenNeverZeroLogitsSkewed) {
  const std::vector<uint16_t> h = random_hidden(33, 160, 1);
  double sum2 = 0;
  for (uint16_t v : h) {
    ASSERT_NE(v & 0x7FFF, 0);
    const float f = fmt::bf16_to_float(v);
    ASSERT_LE(std::fabs(f), 1.75f);
    sum2 += double(f) * f;
  }
  EXPECT_NEAR(sum2 / h.size(), 1.0, 0.05);  // unit variance

  const int64_t T = 512, E = 64, k = 4;
  const MoeSpec s = tiny(64, 32, E, k);
  std::vector<int32_t> ids(T * k);
  std::vector<float> w(T * k);
  auto hot_share = [&](RoutingKind r) {
    const std::vector<float> lg = random_logits(T, E, r, 5);
    cpu::route(s, lg.data(), nullptr, T, ids.data(), w.data());
    int64_t hot = 0;
    for (int32_t id : ids) hot += id < kHotExperts;
    return double(hot) / double(ids.size());
  };
  EXPECT_LT(hot_share(RoutingKind::Uniform), 0.15);  // ~4/64 of the slots when uniform
  EXPECT_GT(hot_share(RoutingKind::Skewed), 0.9);    // k = 4 = kHotExperts: nearly every slot is hot
  EXPECT_EQ(random_logits(3, 8, RoutingKind::Uniform, 9), random_logits(3, 8, RoutingKind::Uniform, 9));
}

// Balanced routing: every expert exactly T k / E rows, through the softmax and through DeepSeek's grouped sigmoid
// with its router bias (the k chosen experts of a token are consecutive, so inside one group when the group size
// is a multiple of k); token t's slots hold the experts (t k + j) mod E.
TEST(BenchInputs, BalancedLogitsGiveEqualCounts) {
  struct Case { int64_t E, k, groups, topk_groups; bool grouped; };
  for (const Case c : {Case{64, 4, 1, 1, false}, Case{256, 8, 8, 4, true}, Case{128, 6, 1, 1, false}}) {
    MoeSpec s = tiny(64, 32, c.E, c.k);
    if (c.grouped) {
      s.routing = Routing::SigmoidGroupedTopK;
      s.n_group = c.groups;
      s.topk_group = c.topk_groups;
      s.has_router_bias = true;
    }
    const int64_t period = c.E / std::gcd(c.E, c.k), T = 4 * period;
    const std::vector<float> lg = random_logits(T, c.E, RoutingKind::Balanced, 11, c.k);
    const std::vector<float> bias = random_router_bias(c.E, 3);
    std::vector<int32_t> ids(T * c.k);
    std::vector<float> w(T * c.k);
    cpu::route(s, lg.data(), c.grouped ? bias.data() : nullptr, T, ids.data(), w.data());
    std::vector<int64_t> count(c.E, 0);
    for (int64_t t = 0; t < T; ++t) {
      std::set<int32_t> mine;
      for (int64_t j = 0; j < c.k; ++j) {
        const int32_t id = ids[t * c.k + j];
        ASSERT_GE(id, 0);
        ++count[id];
        mine.insert(id);
      }
      std::set<int32_t> want;
      for (int64_t j = 0; j < c.k; ++j) want.insert(static_cast<int32_t>((t * c.k + j) % c.E));
      EXPECT_EQ(mine, want) << "token " << t << " E " << c.E;
    }
    for (int64_t e = 0; e < c.E; ++e) EXPECT_EQ(count[e], T * c.k / c.E) << "expert " << e << " E " << c.E;
  }
  EXPECT_THROW(random_logits(2, 8, RoutingKind::Balanced, 1, 9), ArgumentError);
}

// ------------------------------------------------------------------ through the binary
struct CliResult {
  int rc = -1;
  std::string out;  // stdout + stderr
};

CliResult run_cli(const std::string& args) {
  const char* cli = std::getenv("NVFP4MOE_CLI");
  CliResult r;
  if (!cli) return r;
  const std::string cmd = std::string("'") + cli + "' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

#define REQUIRE_CLI()                                                          \
  if (!std::getenv("NVFP4MOE_CLI")) GTEST_SKIP() << "NVFP4MOE_CLI is not set"

TEST(BenchCli, ArgumentErrorsNameTheArgument) {
  REQUIRE_CLI();
  struct Case { const char* args; const char* expect; };
  const Case cases[] = {
      {"bench --preset nope", "--preset: unknown preset 'nope'"},
      {"bench --preset qwen3-30b --hidden 64", "exclude each other"},
      {"bench --hidden 64 --experts 8", "give --preset NAME or all of"},
      {"bench --preset qwen3-30b --tokens 1,0", "--tokens: expected"},
      {"bench --preset qwen3-30b --tokens 4,abc", "got 'abc'"},
      {"bench --preset qwen3-30b --mode w4a8", "--mode: expected w4a16 and/or w4a4"},
      {"bench --preset qwen3-30b --routing hot", "--routing: expected uniform, skewed and/or balanced"},
      {"bench --preset qwen3-30b --layers 2", "--layers: the protocol needs >= 8"},
      {"bench --preset qwen3-30b --layers 257", "--layers: expected 8..256 distinct layers per replay, got 257"},
      {"bench --preset qwen3-30b --layers 0 --profile-eager", "(so the L2 cannot hold what a replay reads; with "
                                                             "--profile-eager >= 1), got 0"},
      {"bench --preset qwen3-30b --layers 257 --profile-eager",
       "--layers: expected 1..256 distinct layers per replay, got 257"},
      {"bench --preset qwen3-30b --iters 2000000000", "--iters: expected at most 100000 timed replays, got 2000000000"},
      {"bench --preset qwen3-30b --warmup 2000000000", "--warmup: expected 1..10000, got 2000000000"},
      {"bench --preset qwen3-30b --seed -1", "--seed: expected an integer in [0, 18446744073709551615]"},
      {"bench --hidden 64 --intermediate 32 --experts 1000000000000 --top-k 2",
       "--experts: Value 1000000000000 not in range 1 to 4096"},
      {"bench --hidden 99999999999999999999 --intermediate 32 --experts 8 --top-k 2",
       "--hidden: Value 99999999999999999999 not in range 1 to 65536"},
      {"bench --hidden 64 --intermediate 65552 --experts 8 --top-k 2",
       "--intermediate: Value 65552 not in range 1 to 65536"},
      {"bench --preset qwen3-30b --iters 0", "--iters: expected >= 1"},
      {"bench --preset qwen3-30b --json /nonexistent-dir/x.json", "directory '/nonexistent-dir' does not exist"},
      {"bench --hidden 72 --intermediate 32 --experts 8 --top-k 2", "hidden must be a positive multiple of 16"},
      {"bench --hidden 64 --intermediate 32 --experts 8 --top-k 9", "top_k must be in [1, num_experts=8]"},
      // --scaling is named (was refused only by MoeSpec, naming routed_scaling_factor; 1e39 became inf as a float)
      {"bench --hidden 64 --intermediate 32 --experts 8 --top-k 2 --routing-fn sigmoid-grouped --scaling inf",
       "--scaling: expected a finite routed_scaling_factor > 0 (at most 3.40282e+38, a float), got inf"},
      {"bench --hidden 64 --intermediate 32 --experts 8 --top-k 2 --routing-fn sigmoid-grouped --scaling 1e39",
       "--scaling: expected a finite routed_scaling_factor > 0 (at most 3.40282e+38, a float), got 1e+39"},
      {"bench --hidden 64 --intermediate 32 --experts 8 --top-k 2 --routing-fn sigmoid-grouped --scaling 0",
       "--scaling: expected a finite routed_scaling_factor > 0 (at most 3.40282e+38, a float), got 0"},
      {"bench --hidden 64 --intermediate 32 --experts 8 --top-k 2 --routing-fn sigmoid-grouped --scaling nan",
       "--scaling: expected a finite routed_scaling_factor > 0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    const CliResult r = run_cli(c.args);
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("nvfp4moe: error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
  }
}

TEST(BenchCli, WithoutGpuExitsWithAClearError) {
  REQUIRE_CLI();
  if (cuda_backend_available()) GTEST_SKIP() << "a CUDA device is present";
  const CliResult r = run_cli("bench --preset qwen3-30b --tokens 1 --mode w4a16");
  EXPECT_EQ(r.rc, 1) << r.out;
#ifdef NVFP4MOE_WITH_CUDA
  EXPECT_NE(r.out.find("bench: no usable CUDA device is present"), std::string::npos) << r.out;
#else
  EXPECT_NE(r.out.find("built without the CUDA backend"), std::string::npos) << r.out;
#endif
}

TEST(BenchCli, DryRunWritesTheAccountingRows) {
  REQUIRE_CLI();
  const std::string path = ::testing::TempDir() + "nvfp4moe-bench-dry.json";
  // `bench <args> --dry-run --json path`, its JSON document (null when the run or the file failed).
  auto dry_run = [&](const std::string& args) {
    std::remove(path.c_str());
    const CliResult r = run_cli("bench " + args + " --dry-run --json " + path);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::ifstream f(path);
    nlohmann::json doc = f.good() ? nlohmann::json::parse(f) : nlohmann::json();
    std::remove(path.c_str());
    return doc;
  };
  const nlohmann::json doc =
      dry_run("--preset deepseek-v3 --tokens 1,4 --mode w4a16,w4a4 --routing uniform,skewed --git-sha abc1234");
  ASSERT_FALSE(doc.is_null());
  EXPECT_EQ(doc["git_sha"], "abc1234");
  ASSERT_EQ(doc["rows"].size(), 8u);  // 2 modes x 2 routings x 2 T
  const auto& row = doc["rows"][0];
  EXPECT_EQ(row["preset"], "deepseek-v3");
  EXPECT_EQ(row["tokens"], 1);
  EXPECT_EQ(row["layers"], 8);
  EXPECT_DOUBLE_EQ(row["experts_touched"].get<double>(), 8.0);  // k distinct experts for one token
  EXPECT_DOUBLE_EQ(row["bytes"].get<double>(), 9.0 * 24772608 + 7168 * 2 + 256 * 4 + 7168 * 2);
  EXPECT_TRUE(row["shared_expert_included"].get<bool>());
  EXPECT_TRUE(row["us_per_layer"].is_null());
  EXPECT_FALSE(doc["shared_max_input_scale"].get<bool>());
  // --shared-max-input-scale (the layers' MoeLayerOptions::shared_max_input_scale) is recorded with the numbers.
  const nlohmann::json shared = dry_run("--preset qwen3-30b --tokens 4096 --mode w4a4 --shared-max-input-scale");
  ASSERT_FALSE(shared.is_null());
  EXPECT_TRUE(shared["shared_max_input_scale"].get<bool>());
  // Fewer than 8 layers only with --profile-eager, and then the document says the timings are outside the protocol.
  EXPECT_FALSE(doc.contains("layers_below_protocol"));
  const nlohmann::json profiled = dry_run("--preset qwen3-30b --tokens 4096 --layers 1 --profile-eager");
  ASSERT_FALSE(profiled.is_null());
  EXPECT_TRUE(profiled["layers_below_protocol"].get<bool>());
  EXPECT_EQ(profiled["layers_requested"], 1);
}

}  // namespace
}  // namespace nvfp4moe::cli::bench
