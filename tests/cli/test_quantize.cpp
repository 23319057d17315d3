// `nvfp4moe quantize` and `nvfp4moe calibrate` end to end (CPU): a bf16 HF MoE checkpoint written here ->
// quantize -> load: codes, block scales and weight_scale_2 bitwise equal to quantizing here with the fmt::
// reference functions (nvfp4-format.md section 3); input scales equal to a calibration pass computed here;
// non-expert tensors copied byte for byte; `run` works on the result; bad input: one error line, no output left.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <tuple>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/quantize.h"
#include "support/cli_runner.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace nvfp4moe;

namespace {

using test::cli;
using test::cli_path;
using test::slurp;
using test::TempDir;
using Result = test::CliResult;
void expect_error(const Result& r, int code, const std::string& needle) { test::expect_cli_error(r, code, needle); }

constexpr int64_t H = 64, I = 32, E = 4, K = 2, L = 2;

struct Bf16Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<uint16_t> v;
};

std::vector<Bf16Tensor> make_bf16_model() {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<Bf16Tensor> ts;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mul = 1.0f) {
    Bf16Tensor t{name, shape, {}};
    t.v.resize(static_cast<size_t>(shape[0] * shape[1]));
    for (auto& x : t.v) x = fmt::bf16_from_float(nd(rng) * mul);
    ts.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", {16, H});
  add("lm_head.weight", {16, H});
  for (int l = 0; l < L; ++l) add("model.layers." + std::to_string(l) + ".self_attn.q_proj.weight", {H, H});
  add("model.layers.0.mlp.gate_proj.weight", {I, H});  // dense layer 0
  add("model.layers.0.mlp.up_proj.weight", {I, H});
  add("model.layers.0.mlp.down_proj.weight", {H, I});
  add("model.layers.1.mlp.gate.weight", {E, H}, 50.0f);
  for (int e = 0; e < E; ++e) {
    const std::string b = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    add(b + "gate_proj.weight", {I, H}, e == 1 ? 0.25f : 1.0f);  // expert 1: up has the larger amax
    add(b + "up_proj.weight", {I, H}, e == 2 ? 0.25f : 1.0f);    // expert 2: gate has the larger amax
    add(b + "down_proj.weight", {H, I});
  }
  // a zero block (block scale 1 path) and a zero row in expert 3's down projection
  auto& d = ts.back().v;
  std::fill(d.begin(), d.begin() + 16, uint16_t(0));
  std::fill(d.begin() + I, d.begin() + 2 * I, uint16_t(0));
  return ts;
}

void write_bf16_checkpoint(const std::string& dir, const std::vector<Bf16Tensor>& ts) {
  fs::create_directories(dir);
  std::vector<io::TensorToWrite> w;
  for (const auto& t : ts) {
    io::TensorToWrite x;
    x.name = t.name;
    x.dtype = DType::BF16;
    x.shape = t.shape;
    const Bf16Tensor* p = &t;
    x.fill = [p](uint8_t* dst, size_t n) { std::memcpy(dst, p->v.data(), n); };
    w.push_back(std::move(x));
  }
  io::write_safetensors(dir + "/model.safetensors", w);
  nlohmann::json c = {{"model_type", "qwen3_moe"}, {"architectures", {"Qwen3MoeForCausalLM"}},
                      {"hidden_size", H}, {"num_hidden_layers", L}, {"intermediate_size", I},
                      {"moe_intermediate_size", I}, {"num_experts", E}, {"num_experts_per_tok", K},
                      {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {0}},
                      {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}};
  std::ofstream(dir + "/config.json") << c.dump(2);
  std::ofstream(dir + "/tokenizer.json") << "{\"dummy\": true}";
}

void write_calibration(const std::string& path, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto v = std::make_shared<std::vector<float>>(static_cast<size_t>(n * H));
  for (auto& x : *v) x = nd(rng);
  io::TensorToWrite t;
  t.name = "layer.1.hidden";
  t.dtype = DType::F32;
  t.shape = {n, H};
  t.fill = [v](uint8_t* dst, size_t nb) { std::memcpy(dst, v->data(), nb); };
  io::write_safetensors(path, {t});
}

using test::reference_quantize_weights;

std::vector<float> as_float(const Bf16Tensor& t) {
  std::vector<float> f(t.v.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = fmt::bf16_to_float(t.v[i]);
  return f;
}
float amax(const std::vector<float>& v) {
  float a = 0;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}
const Bf16Tensor& find(const std::vector<Bf16Tensor>& ts, const std::string& n) {
  for (const auto& t : ts)
    if (t.name == n) return t;
  throw std::runtime_error("no tensor " + n);
}

// Input scales as a calibration pass over `hidden` computes them (amax / 2688; unseen experts get the max).
void expected_input_scales(MoeWeights w, const std::vector<uint16_t>& hidden, std::vector<float>* s13,
                           std::vector<float>* s2) {
  const int64_t T = static_cast<int64_t>(hidden.size()) / H;
  for (auto* v : {&w.experts.w13_input_scale, &w.experts.w2_input_scale}) std::fill(v->begin(), v->end(), 1.0f);
  std::vector<float> logits(static_cast<size_t>(T * E)), tw(static_cast<size_t>(T * K)), out(static_cast<size_t>(T * H));
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  cpu::router_logits(w, hidden.data(), T, logits.data());
  cpu::route(w.spec, logits.data(), nullptr, T, ids.data(), tw.data());
  cpu::CalibrationStats st;
  cpu::moe_forward(w, Mode::W4A16, hidden.data(), T, ids.data(), tw.data(), out.data(), &st);
  auto fin = [](const std::vector<float>& a, std::vector<float>* s) {
    const float mx = *std::max_element(a.begin(), a.end());
    s->clear();
    for (float x : a) s->push_back((x > 0 ? x : mx) / (6.0f * 448.0f));
  };
  fin(st.gemm1_amax, s13);
  fin(st.gemm2_amax, s2);
}

std::vector<uint16_t> calibration_bf16(const std::string& path) {
  const auto set = io::SafetensorsSet::open(path);
  const auto& t = set.get("layer.1.hidden");
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    float f;
    std::memcpy(&f, t.data + 4 * i, 4);
    v[i] = fmt::bf16_from_float(f);
  }
  return v;
}

bool has_tmp_sibling(const std::string& out) {
  const fs::path p(out);
  for (const auto& e : fs::directory_iterator(p.parent_path()))
    if (e.path().filename().string().rfind(p.filename().string() + ".tmp", 0) == 0) return true;
  return false;
}

class Quantize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cli_path().empty()) GTEST_SKIP() << "NVFP4MOE_CLI is not set (run through ctest)";
  }
};

TEST_F(Quantize, Bf16ToNvfp4BitwiseEqualsReferenceQuantizer) {
  TempDir tmp;
  const auto model = make_bf16_model();
  const std::string in = tmp / "bf16", out = tmp / "nvfp4";
  write_bf16_checkpoint(in, model);
  const Result r = cli("quantize '" + in + "' '" + out + "' --random-calibration 32 --shard-mb 0.02");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("quantized 12 expert projections in MoE layers 1"), std::string::npos) << r.all();
  EXPECT_TRUE(fs::exists(out + "/hf_quant_config.json"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_FALSE(has_tmp_sibling(out));
  auto ck = Checkpoint::open(out);
  EXPECT_EQ(ck->format(), CheckpointFormat::ModelOpt);
  EXPECT_EQ(ck->moe_layers(), (std::vector<int>{1}));
  EXPECT_FALSE(ck->layers()[0].is_moe);
  const MoeWeights w = ck->load_layer(1);
  for (int e = 0; e < E; ++e) {
    SCOPED_TRACE("expert " + std::to_string(e));
    const std::string b = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    const auto g = as_float(find(model, b + "gate_proj.weight")), u = as_float(find(model, b + "up_proj.weight")),
               d = as_float(find(model, b + "down_proj.weight"));
    const float ws13 = fmt::weight_global_scale(std::max(amax(g), amax(u))), ws2 = fmt::weight_global_scale(amax(d));
    EXPECT_EQ(w.experts.w13_gate_scale2[e], ws13);
    EXPECT_EQ(w.experts.w13_up_scale2[e], ws13);
    EXPECT_EQ(w.experts.w2_scale2[e], ws2);
    std::vector<uint8_t> p, s;
    const size_t half = static_cast<size_t>(I * H / 2), halfs = static_cast<size_t>(I * H / 16);
    reference_quantize_weights(g, I, H, ws13, p, s);
    EXPECT_EQ(0, std::memcmp(w.experts.w13.data() + e * 2 * half, p.data(), half));
    EXPECT_EQ(0, std::memcmp(w.experts.w13_scale.data() + e * 2 * halfs, s.data(), halfs));
    reference_quantize_weights(u, I, H, ws13, p, s);
    EXPECT_EQ(0, std::memcmp(w.experts.w13.data() + e * 2 * half + half, p.data(), half));
    EXPECT_EQ(0, std::memcmp(w.experts.w13_scale.data() + e * 2 * halfs + halfs, s.data(), halfs));
    reference_quantize_weights(d, H, I, ws2, p, s);
    EXPECT_EQ(0, std::memcmp(w.experts.w2.data() + e * half, p.data(), half));
    EXPECT_EQ(0, std::memcmp(w.experts.w2_scale.data() + e * halfs, s.data(), halfs));
    if (e == 3) EXPECT_EQ(s[0], fmt::e4m3_encode(1.0f));  // the zero block
    EXPECT_GT(w.experts.w13_input_scale[e], 0.0f);
    EXPECT_GT(w.experts.w2_input_scale[e], 0.0f);
  }
  // everything that is not an expert projection: byte-identical
  const auto a = io::SafetensorsSet::open(in), q = io::SafetensorsSet::open(out);
  size_t copied = 0;
  for (const auto& n : a.names()) {
    if (n.find(".experts.") != std::string::npos) continue;
    const auto& x = a.get(n);
    const io::TensorInfo* y = q.find(n);
    ASSERT_TRUE(y) << n;
    EXPECT_EQ(y->dtype, x.dtype) << n;
    EXPECT_EQ(y->shape, x.shape) << n;
    EXPECT_EQ(0, std::memcmp(x.data, y->data, x.nbytes())) << n;
    ++copied;
  }
  EXPECT_EQ(copied, 8u);
  // run works on the result, both modes
  for (const char* mode : {"w4a16", "w4a4"}) {
    const Result rr = cli("run '" + out + "' --layer 1 --mode " + mode + " --tokens 8");
    EXPECT_EQ(rr.code, 0) << rr.all();
  }
}

TEST_F(Quantize, CalibrationFileAndCalibrateCommand) {
  TempDir tmp;
  const auto model = make_bf16_model();
  const std::string in = tmp / "bf16", calib = tmp / "calib.safetensors", calib2 = tmp / "calib2.safetensors";
  write_bf16_checkpoint(in, model);
  write_calibration(calib, 48, 1);
  write_calibration(calib2, 40, 2);
  const std::string q1 = tmp / "q_calib", q2 = tmp / "q_calib2", re = tmp / "recalibrated";
  ASSERT_EQ(cli("quantize '" + in + "' '" + q1 + "' --calibration '" + calib + "'").code, 0);
  ASSERT_EQ(cli("quantize '" + in + "' '" + q2 + "' --calibration '" + calib2 + "'").code, 0);
  const MoeWeights w1 = Checkpoint::open(q1)->load_layer(1), w2 = Checkpoint::open(q2)->load_layer(1);
  std::vector<float> s13, s2;
  expected_input_scales(Checkpoint::open(q1)->load_layer(1), calibration_bf16(calib), &s13, &s2);
  EXPECT_EQ(w1.experts.w13_input_scale, s13);
  EXPECT_EQ(w1.experts.w2_input_scale, s2);
  EXPECT_NE(w1.experts.w13_input_scale, w2.experts.w13_input_scale);
  // calibrate q1 with calib2: the input scales become q2's, every other byte stays q1's
  const Result r = cli("calibrate '" + q1 + "' '" + re + "' --calibration '" + calib2 + "'");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_NE(r.out.find("calibrated 12 input scales"), std::string::npos) << r.all();
  const MoeWeights w3 = Checkpoint::open(re)->load_layer(1);
  EXPECT_EQ(w3.experts.w13_input_scale, w2.experts.w13_input_scale);
  EXPECT_EQ(w3.experts.w2_input_scale, w2.experts.w2_input_scale);
  EXPECT_EQ(0, std::memcmp(w3.experts.w13.data(), w1.experts.w13.data(), w1.experts.w13.size()));
  EXPECT_EQ(0, std::memcmp(w3.experts.w2_scale.data(), w1.experts.w2_scale.data(), w1.experts.w2_scale.size()));
  EXPECT_EQ(w3.experts.w13_up_scale2, w1.experts.w13_up_scale2);
}

TEST_F(Quantize, BadInputOneErrorNoOutput) {
  TempDir tmp;
  const auto model = make_bf16_model();
  const std::string in = tmp / "bf16", out = tmp / "out";
  write_bf16_checkpoint(in, model);
  expect_error(cli("quantize '" + in + "' '" + out + "'"), 1, "--random-calibration");
  EXPECT_FALSE(fs::exists(out));
  expect_error(cli("quantize '" + tmp / "nope" + "' '" + out + "' --random-calibration 4"), 1, "does not exist");
  const std::string calib = tmp / "wrong.safetensors";
  {
    io::TensorToWrite t;
    t.name = "layer.7.hidden";
    t.dtype = DType::F32;
    t.shape = {2, H};
    t.fill = [](uint8_t* d, size_t n) { std::memset(d, 0, n); };
    io::write_safetensors(calib, {t});
  }
  expect_error(cli("quantize '" + in + "' '" + out + "' --calibration '" + calib + "'"), 1, "missing tensor layer.1.hidden");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(has_tmp_sibling(out));
  ASSERT_EQ(cli("quantize '" + in + "' '" + out + "' --random-calibration 8").code, 0);
  expect_error(cli("quantize '" + in + "' '" + out + "' --random-calibration 8"), 1, "already exists");
  expect_error(cli("quantize '" + out + "' '" + tmp / "again" + "' --random-calibration 8"), 1, "already quantized");
  expect_error(cli("calibrate '" + in + "' '" + tmp / "cal" + "' --random-calibration 8"), 1, "no NVFP4 quantization config");
  EXPECT_FALSE(fs::exists(tmp / "cal"));
  // an expert in fp8 / int dtype is refused naming the tensor
  auto bad = model;
  const std::string in2 = tmp / "bf16_missing_up";
  bad.erase(std::remove_if(bad.begin(), bad.end(),
                           [](const Bf16Tensor& t) { return t.name == "model.layers.1.mlp.experts.2.up_proj.weight"; }),
            bad.end());
  write_bf16_checkpoint(in2, bad);
  expect_error(cli("quantize '" + in2 + "' '" + tmp / "o2" + "' --random-calibration 8"), 1, "expert 2");
  EXPECT_FALSE(fs::exists(tmp / "o2"));
}

// --random-calibration and --shard-mb are checked (naming the flag, the range and the value) before anything is
// written; a --shard-mb past 2^64 bytes means no limit.
TEST_F(Quantize, CalibrationAndShardFlagsAreBounded) {
  TempDir tmp;
  const auto model = make_bf16_model();
  const std::string in = tmp / "bf16", out = tmp / "out";
  write_bf16_checkpoint(in, model);
  for (const char* cmd : {"quantize", "calibrate"}) {
    SCOPED_TRACE(cmd);
    const std::string base = std::string(cmd) + " '" + in + "' '" + out + "' ";
    expect_error(cli(base + "--random-calibration -5"), 2, "--random-calibration: Value -5 not in range 1 to 65536");
    expect_error(cli(base + "--random-calibration 4611686018427387904"), 2,
                 "--random-calibration: Value 4611686018427387904 not in range 1 to 65536");
    expect_error(cli(base + "--random-calibration 8 --seed -1"), 2, "--seed: expected an integer");
  }
  const std::string q = "quantize '" + in + "' '" + out + "' --random-calibration 8 ";
  expect_error(cli(q + "--shard-mb -5"), 1, "--shard-mb: expected a finite size in MB > 0, got -5");
  expect_error(cli(q + "--shard-mb nan"), 1, "--shard-mb: expected a finite size in MB > 0, got nan");
  EXPECT_FALSE(fs::exists(out));
  EXPECT_FALSE(has_tmp_sibling(out));
  const Result r = cli(q + "--shard-mb 1e300");
  ASSERT_EQ(r.code, 0) << r.all();
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  // the library says which number it got (it said "got neither" for a negative count)
  for (int64_t n : {int64_t{-5}, int64_t{65537}}) {
    model::QuantizeOptions o;
    o.calibration.random_tokens = n;
    try {
      model::quantize_checkpoint(in, tmp / "lib", o);
      ADD_FAILURE() << "random_tokens = " << n << " was accepted";
    } catch (const ArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("--random-calibration: expected 1..65536 tokens per layer, got " +
                                           std::to_string(n)),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_FALSE(fs::exists(tmp / "lib"));
}

// run --mode w4a4 on an unquantized checkpoint: refused before the load, with the real reason.
TEST_F(Quantize, RunW4a4OnUnquantizedIsRefusedUpFront) {
  TempDir tmp;
  const std::string in = tmp / "bf16", out = tmp / "out.safetensors";
  write_bf16_checkpoint(in, make_bf16_model());
  const Result r = cli("run '" + in + "' --layer 1 --mode w4a4 --tokens 4 --output '" + out + "'");
  expect_error(r, 1, "--mode w4a4: layer 1 of " + in + " is unquantized (bf16, quantized to NVFP4 at load)");
  expect_error(r, 1, "expected --mode w4a16, or w4a4 on a checkpoint with input scales");
  EXPECT_FALSE(fs::exists(out));
  const Result ok = cli("run '" + in + "' --layer 1 --mode w4a16 --tokens 4");
  EXPECT_EQ(ok.code, 0) << ok.all();
}

// DeepSeek-style: F32 expert weights, a shared expert (mlp.shared_experts.*) and e_score_correction_bias.
TEST_F(Quantize, DeepSeekSharedExpertAndF32Weights) {
  TempDir tmp;
  const std::string in = tmp / "ds", out = tmp / "ds_nvfp4";
  fs::create_directories(in);
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<std::pair<std::string, std::vector<int64_t>>> specs = {{"model.layers.0.mlp.gate.weight", {E, H}}};
  for (int e = 0; e < E; ++e)
    for (auto [p, n, k] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}})
      specs.push_back({"model.layers.0.mlp.experts." + std::to_string(e) + "." + p + ".weight", {n, k}});
  for (auto [p, n, k] : {std::tuple{"gate_proj", 2 * I, H}, {"up_proj", 2 * I, H}, {"down_proj", H, 2 * I}})
    specs.push_back({std::string("model.layers.0.mlp.shared_experts.") + p + ".weight", {n, k}});
  std::map<std::string, std::vector<float>> vals;
  std::vector<io::TensorToWrite> w;
  for (const auto& [name, shape] : specs) {
    auto& v = vals[name];
    v.resize(static_cast<size_t>(shape[0] * shape[1]));
    for (auto& x : v) x = nd(rng) * (name.find(".gate.") != std::string::npos ? 50.0f : 1.0f);
    io::TensorToWrite t;
    t.name = name;
    t.dtype = DType::F32;
    t.shape = shape;
    const float* d = v.data();
    t.fill = [d](uint8_t* dst, size_t n) { std::memcpy(dst, d, n); };
    w.push_back(std::move(t));
  }
  auto& bias = vals["model.layers.0.mlp.gate.e_score_correction_bias"];
  bias = {0.01f, -0.02f, 0.0f, 0.03f};
  io::TensorToWrite b;
  b.name = "model.layers.0.mlp.gate.e_score_correction_bias";
  b.dtype = DType::F32;
  b.shape = {E};
  b.fill = [&bias](uint8_t* dst, size_t n) { std::memcpy(dst, bias.data(), n); };
  w.push_back(std::move(b));
  io::write_safetensors(in + "/model.safetensors", w);
  nlohmann::json c = {{"model_type", "deepseek_v3"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                      {"moe_intermediate_size", I}, {"n_routed_experts", E}, {"n_shared_experts", 2},
                      {"num_experts_per_tok", K}, {"n_group", 1}, {"topk_group", 1}, {"first_k_dense_replace", 0},
                      {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}, {"routed_scaling_factor", 2.5}};
  std::ofstream(in + "/config.json") << c.dump(2);
  const Result r = cli("quantize '" + in + "' '" + out + "' --random-calibration 16");
  ASSERT_EQ(r.code, 0) << r.all();
  auto ck = Checkpoint::open(out);
  const MoeWeights mw = ck->load_layer(0);
  ASSERT_TRUE(mw.has_shared());
  EXPECT_EQ(mw.spec.shared_intermediate, 2 * I);
  EXPECT_EQ(mw.router_bias, bias);
  const std::string sb = "model.layers.0.mlp.shared_experts.";
  const auto& g = vals[sb + "gate_proj.weight"];
  const auto& u = vals[sb + "up_proj.weight"];
  const auto& d = vals[sb + "down_proj.weight"];
  const float ws13 = fmt::weight_global_scale(std::max(amax(g), amax(u)));
  std::vector<uint8_t> p, s;
  reference_quantize_weights(u, 2 * I, H, ws13, p, s);
  EXPECT_EQ(mw.shared.w13_up_scale2[0], ws13);
  EXPECT_EQ(0, std::memcmp(mw.shared.w13.data() + p.size(), p.data(), p.size()));
  EXPECT_EQ(0, std::memcmp(mw.shared.w13_scale.data() + s.size(), s.data(), s.size()));
  reference_quantize_weights(d, H, 2 * I, fmt::weight_global_scale(amax(d)), p, s);
  EXPECT_EQ(0, std::memcmp(mw.shared.w2.data(), p.data(), p.size()));
  EXPECT_GT(mw.shared.w13_input_scale[0], 0.0f);
  const Result rr = cli("run '" + out + "' --layer 0 --mode w4a4 --tokens 4");
  EXPECT_EQ(rr.code, 0) << rr.all();
}

}  // namespace

// OUT publishing: "OUT/" names OUT (it used to be refused as "parent directory OUT does not exist"); a dangling
// symlink at OUT is an existing entry; an OUT that appears while the output is written is neither replaced nor
// merged into (rename(2) used to replace an empty directory silently), and no temp dir is left.
TEST_F(Quantize, OutTrailingSlashSymlinkAndOutCreatedDuringWrite) {
  TempDir tmp;
  const auto model = make_bf16_model();
  const std::string in = tmp / "bf16";
  write_bf16_checkpoint(in, model);
  model::QuantizeOptions opt;
  opt.calibration.random_tokens = 8;
  const std::string slash = tmp / "slash";
  EXPECT_NO_THROW(model::quantize_checkpoint(in, slash + "/", opt));
  EXPECT_TRUE(fs::is_regular_file(fs::path(slash) / "model.safetensors.index.json"));
  EXPECT_FALSE(has_tmp_sibling(slash));
  if (fs::exists(slash)) EXPECT_NO_THROW(Checkpoint::open(slash)->load_layer(1));

  const std::string link = tmp / "dangling";
  fs::create_symlink(tmp / "nowhere", link);
  EXPECT_THROW(model::quantize_checkpoint(in, link, opt), ArgumentError);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_FALSE(fs::exists(tmp / "nowhere"));

  const std::string racy = tmp / "racy";
  opt.on_layer = [&](const model::LayerTiming&) { fs::create_directory(racy); };
  try {
    model::quantize_checkpoint(in, racy, opt);
    ADD_FAILURE() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("was created by someone else"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_directory(racy));
  EXPECT_TRUE(fs::is_empty(racy));
  EXPECT_FALSE(has_tmp_sibling(racy));
}
