// Unquantized (bf16/fp16/fp32) HF MoE checkpoints quantized to NVFP4 at load (src/model/unquantized.h):
// Checkpoint::open + load_layer gives MoeWeights bitwise equal to `quantize` then load (codes, block scales,
// weight_scale_2, router, bias) for Qwen, Mixtral and DeepSeek (shared expert) naming; both equal the fmt::
// reference quantizer written here; inspect names the family; MoeLayer runs it (w4a16) and refuses w4a4 with a
// message naming `nvfp4moe quantize`; quantize streams layer by layer; bad inputs get one specific error each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>

#include "format/nvfp4.h"
#include "model/quantize.h"
#include "model/unquantized.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "support/checkpoint_files.h"
#include "support/test_support.h"

namespace fs = std::filesystem;
using namespace nvfp4moe;
using test::expect_error;
using test::FileTensor;

namespace {

constexpr int64_t H = 64, I = 32, E = 4, K = 2;

enum class Family { Qwen, Mixtral, DeepSeek };

// Values in fp32; stored as dtype (BF16 / F16 / F32; F16 and BF16 values are representable, so the stored
// tensor decodes to exactly these floats).
struct Src {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> v;
};

uint16_t f16_bits(float f) {  // exact for the values used here (|f| in f16 normal range, <= 11 significant bits)
  if (f == 0.0f) return std::signbit(f) ? 0x8000 : 0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((u >> 13) & 0x3FFu));
}
float f16_round(float f) {  // to 11 significant bits (truncation is fine: any representable value will do)
  if (f == 0.0f) return 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u &= 0xFFFFE000u;
  float r;
  std::memcpy(&r, &u, 4);
  return std::fabs(r) < 6.2e-5f ? 0.0f : r;  // keep to f16 normals
}

FileTensor to_file(const Src& s, DType dt) {
  FileTensor t{s.name, dt, s.shape, {}};
  t.bytes.resize(s.v.size() * dtype_size(dt));
  for (size_t i = 0; i < s.v.size(); ++i) {
    if (dt == DType::F32) std::memcpy(t.bytes.data() + 4 * i, &s.v[i], 4);
    const uint16_t h = dt == DType::BF16 ? fmt::bf16_from_float(s.v[i]) : f16_bits(s.v[i]);
    if (dt != DType::F32) std::memcpy(t.bytes.data() + 2 * i, &h, 2);
  }
  return t;
}

struct Model {
  std::vector<Src> src;
  nlohmann::json config;
  std::string module;  // "model.layers.L.mlp" of the MoE layers (with L replaced)
  std::string pn[3];
  const Src& get(const std::string& n) const {
    for (const auto& s : src)
      if (s.name == n) return s;
    throw std::runtime_error("no " + n);
  }
};

// Layers: 0 dense (not for Mixtral, whose config makes every layer MoE), then moe_layers MoE layers. Values rounded
// to what dtype stores.
Model make_model(Family f, DType dt, int moe_layers = 1, uint64_t seed = 3) {
  Model m;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  auto round = [&](float x) { return dt == DType::BF16 ? fmt::bf16_round(x) : dt == DType::F16 ? f16_round(x) : x; };
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mul = 1.0f) {
    Src s{name, shape, {}};
    int64_t n = 1;
    for (auto d : shape) n *= d;
    s.v.resize(static_cast<size_t>(n));
    for (auto& x : s.v) x = round(nd(rng) * mul);
    m.src.push_back(std::move(s));
  };
  const bool mixtral = f == Family::Mixtral;
  const std::string child = mixtral ? "block_sparse_moe" : "mlp";
  m.pn[0] = mixtral ? "w1" : "gate_proj";
  m.pn[1] = mixtral ? "w3" : "up_proj";
  m.pn[2] = mixtral ? "w2" : "down_proj";
  const int first = mixtral ? 0 : 1;
  const int L = moe_layers + first;
  add("model.embed_tokens.weight", {16, H});
  if (first) {
    add("model.layers.0.mlp.gate_proj.weight", {I, H});  // dense layer 0
    add("model.layers.0.mlp.up_proj.weight", {I, H});
    add("model.layers.0.mlp.down_proj.weight", {H, I});
  }
  for (int l = first; l < L; ++l) {
    const std::string mod = "model.layers." + std::to_string(l) + "." + child;
    add(mod + ".gate.weight", {E, H}, 50.0f);
    for (int e = 0; e < E; ++e) {
      const std::string b = mod + ".experts." + std::to_string(e) + ".";
      add(b + m.pn[0] + ".weight", {I, H}, e == 1 ? 0.25f : 1.0f);  // expert 1: up has the larger amax
      add(b + m.pn[1] + ".weight", {I, H}, e == 2 ? 0.25f : 1.0f);  // expert 2: gate has the larger amax
      add(b + m.pn[2] + ".weight", {H, I});
    }
    auto& d = m.src.back().v;  // a zero block and a zero row (block scale 1 path)
    std::fill(d.begin(), d.begin() + 16, 0.0f);
    std::fill(d.begin() + I, d.begin() + 2 * I, 0.0f);
    if (f == Family::DeepSeek) {
      for (auto [p, n, k] : {std::tuple{"gate_proj", 2 * I, H}, {"up_proj", 2 * I, H}, {"down_proj", H, 2 * I}})
        add(mod + ".shared_experts." + p + ".weight", {n, k});
      Src b{mod + ".gate.e_score_correction_bias", {E}, {0.01f, -0.02f, 0.0f, 0.03f}};
      m.src.push_back(b);
    }
  }
  if (f == Family::Qwen)
    m.config = {{"model_type", "qwen3_moe"}, {"hidden_size", H}, {"num_hidden_layers", L}, {"intermediate_size", I},
                {"moe_intermediate_size", I}, {"num_experts", E}, {"num_experts_per_tok", K},
                {"norm_topk_prob", true}, {"decoder_sparse_step", 1}, {"mlp_only_layers", {0}},
                {"hidden_act", "silu"}};
  else if (f == Family::Mixtral)
    m.config = {{"model_type", "mixtral"}, {"hidden_size", H}, {"num_hidden_layers", L}, {"intermediate_size", I},
                {"num_local_experts", E}, {"num_experts_per_tok", K}, {"hidden_act", "silu"}};
  else
    m.config = {{"model_type", "deepseek_v3"}, {"hidden_size", H}, {"num_hidden_layers", L},
                {"moe_intermediate_size", I}, {"n_routed_experts", E}, {"n_shared_experts", 2},
                {"num_experts_per_tok", K}, {"n_group", 1}, {"topk_group", 1}, {"first_k_dense_replace", 1},
                {"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}, {"routed_scaling_factor", 2.5}};
  return m;
}

std::string write_model(const std::string& name, const Model& m, DType dt) {
  const std::string dir = test::fresh_dir("quantize_at_load", name);
  std::vector<FileTensor> ts;
  for (const auto& s : m.src) ts.push_back(to_file(s, s.shape.size() == 1 ? DType::F32 : dt));
  test::write_checkpoint_dir(dir, ts, m.config, nullptr);
  return dir;
}

float amax(const std::vector<float>& v) {
  float a = 0;
  for (float x : v) a = std::max(a, std::fabs(x));
  return a;
}

using test::reference_quantize_weights;

void expect_same_stack(const StackedExperts& a, const StackedExperts& b, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(a.num_experts, b.num_experts);
  ASSERT_EQ(a.w13.size(), b.w13.size());
  EXPECT_EQ(0, std::memcmp(a.w13.data(), b.w13.data(), a.w13.size()));
  EXPECT_EQ(0, std::memcmp(a.w13_scale.data(), b.w13_scale.data(), a.w13_scale.size()));
  EXPECT_EQ(0, std::memcmp(a.w2.data(), b.w2.data(), a.w2.size()));
  EXPECT_EQ(0, std::memcmp(a.w2_scale.data(), b.w2_scale.data(), a.w2_scale.size()));
  EXPECT_EQ(a.w13_gate_scale2, b.w13_gate_scale2);
  EXPECT_EQ(a.w13_up_scale2, b.w13_up_scale2);
  EXPECT_EQ(a.w2_scale2, b.w2_scale2);
}

// at-load == quantize then load, and both == the reference quantizer, for one family / dtype
void check_family(Family f, DType dt, const std::string& tag) {
  const Model m = make_model(f, dt, 2);
  const std::string in = write_model(tag, m, dt);
  auto ck = Checkpoint::open(in);
  ASSERT_EQ(ck->format(), CheckpointFormat::Bf16);
  EXPECT_NE(ck->inspect().find("bf16, quantized to NVFP4 at load"), std::string::npos) << ck->inspect();
  const int first = f == Family::Mixtral ? 0 : 1;
  EXPECT_EQ(ck->moe_layers(), (std::vector<int>{first, first + 1}));
  if (first) {
    EXPECT_FALSE(ck->layers()[0].is_moe);
    expect_error<ArgumentError>([&] { ck->spec(0); }, {"dense layer"});
  }

  model::QuantizeOptions qo;
  qo.calibration.random_tokens = 8;
  qo.max_shard_bytes = 20000;  // several shards
  const std::string out = in + "_nvfp4";
  fs::remove_all(out);
  const model::QuantizeResult r = model::quantize_checkpoint(in, out, qo);
  EXPECT_EQ(r.layers.size(), 2u);  // streamed: each layer quantized once
  auto q = Checkpoint::open(out);
  ASSERT_EQ(q->format(), CheckpointFormat::ModelOpt);
  // names: the family's own, with the ModelOpt suffixes
  const io::SafetensorsSet files = io::SafetensorsSet::open(out);
  const std::string mod = "model.layers.1." + std::string(f == Family::Mixtral ? "block_sparse_moe" : "mlp");
  for (const char* suf : {".weight", ".weight_scale", ".weight_scale_2", ".input_scale"})
    for (const auto& p : m.pn) EXPECT_NE(files.find(mod + ".experts.3." + p + suf), nullptr) << p << suf;
  EXPECT_EQ(files.get(mod + ".experts.0." + m.pn[0] + ".weight").dtype, DType::U8);

  for (int l : {first, first + 1}) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const MoeWeights a = ck->load_layer(l);
    const MoeWeights b = q->load_layer(l);
    EXPECT_EQ(a.spec.describe(), b.spec.describe());
    expect_same_stack(a.experts, b.experts, "routed");
    expect_same_stack(a.shared, b.shared, "shared");
    EXPECT_EQ(a.router_weight, b.router_weight);
    EXPECT_EQ(a.router_bias, b.router_bias);
    for (float x : a.experts.w13_input_scale) EXPECT_TRUE(std::isnan(x));  // no activation scales at load
    for (float x : b.experts.w13_input_scale) EXPECT_GT(x, 0.0f);
    // the reference quantizer on every expert
    const std::string lm = "model.layers." + std::to_string(l) + "." +
                           (m.config["model_type"] == "mixtral" ? "block_sparse_moe" : "mlp");
    for (int e = 0; e < E; ++e) {
      const std::string base = lm + ".experts." + std::to_string(e) + ".";
      const auto& g = m.get(base + m.pn[0] + ".weight").v;
      const auto& u = m.get(base + m.pn[1] + ".weight").v;
      const auto& d = m.get(base + m.pn[2] + ".weight").v;
      const float ws13 = fmt::weight_global_scale(std::max(amax(g), amax(u)));
      EXPECT_EQ(a.experts.w13_gate_scale2[e], ws13);
      EXPECT_EQ(a.experts.w13_up_scale2[e], ws13);
      EXPECT_EQ(a.experts.w2_scale2[e], fmt::weight_global_scale(amax(d)));
      std::vector<uint8_t> p, s;
      const size_t pe = a.experts.w13_bytes_per_expert(), se = a.experts.w13_scale_bytes_per_expert();
      reference_quantize_weights(g, I, H, ws13, p, s);
      EXPECT_EQ(0, std::memcmp(a.experts.w13.data() + e * pe, p.data(), p.size()));
      EXPECT_EQ(0, std::memcmp(a.experts.w13_scale.data() + e * se, s.data(), s.size()));
      reference_quantize_weights(u, I, H, ws13, p, s);
      EXPECT_EQ(0, std::memcmp(a.experts.w13.data() + e * pe + pe / 2, p.data(), p.size()));
      EXPECT_EQ(0, std::memcmp(a.experts.w13_scale.data() + e * se + se / 2, s.data(), s.size()));
      reference_quantize_weights(d, H, I, fmt::weight_global_scale(amax(d)), p, s);
      EXPECT_EQ(0, std::memcmp(a.experts.w2.data() + e * a.experts.w2_bytes_per_expert(), p.data(), p.size()));
      EXPECT_EQ(0, std::memcmp(a.experts.w2_scale.data() + e * a.experts.w2_scale_bytes_per_expert(), s.data(),
                               s.size()));
    }
  }
  // MoeLayer from the unquantized checkpoint (CPU): w4a16 equals the layer of the quantized checkpoint bitwise
  MoeLayerOptions o;
  o.max_tokens = 8;
  auto la = MoeLayer::create(*ck, 1, o);
  auto lb = MoeLayer::create(*q, 1, o);
  std::mt19937_64 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> x(8 * H), logits(8 * E), ya(8 * H), yb(8 * H);
  for (auto& v : x) v = nd(rng);
  for (auto& v : logits) v = nd(rng);
  TensorRef hx{x.data(), DType::F32, {8, H}}, lg{logits.data(), DType::F32, {8, E}};
  TensorRef oa{ya.data(), DType::F32, {8, H}}, ob{yb.data(), DType::F32, {8, H}};
  RoutingArgs ra;
  ra.router_logits = &lg;
  la->forward(hx, ra, oa);
  lb->forward(hx, ra, ob);
  EXPECT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4));
  o.mode = Mode::W4A4;
  expect_error<ArgumentError>([&] { MoeLayer::create(*ck, 1, o); },
                              {"unquantized", "no activation input scales", "nvfp4moe quantize", "w4a4"});
  EXPECT_NO_THROW(MoeLayer::create(*q, 1, o));
  // A sharded layer on the cuda backend is refused by its options before the layer is quantized on the GPU
  // (not by the quantizer, nor after a whole-layer GPU quantization).
  o.mode = Mode::W4A16;
  o.backend = Backend::Cuda;
  o.parallel = {2, 0, 1, 0};
  expect_error<ArgumentError>([&] { MoeLayer::create(*ck, 1, o); },
                              {"MoeLayerOptions.parallel", "expected backend cpu"});
}

TEST(QuantizeAtLoad, QwenBf16) { check_family(Family::Qwen, DType::BF16, "qwen_bf16"); }
TEST(QuantizeAtLoad, MixtralF16) { check_family(Family::Mixtral, DType::F16, "mixtral_f16"); }
TEST(QuantizeAtLoad, DeepSeekSharedF32) { check_family(Family::DeepSeek, DType::F32, "deepseek_f32"); }

TEST(QuantizeAtLoad, CpuQuantizerIsTheLoaderStep) {
  // load_layer == load_layer_with(the CPU ExpertQuantizer), and the progress callback reaches the total
  const Model m = make_model(Family::Qwen, DType::BF16);
  auto ck = Checkpoint::open(write_model("progress", m, DType::BF16));
  const auto* u = dynamic_cast<const model::UnquantizedCheckpoint*>(ck.get());
  ASSERT_NE(u, nullptr);
  auto cq = model::make_cpu_expert_quantizer();
  size_t last = 0, total = 0;
  const MoeWeights a = u->load_layer_with(1, *cq, [&](size_t d, size_t t) { last = d, total = t; });
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, u->layer_source_bytes(1));
  const MoeWeights b = ck->load_layer(1);
  expect_same_stack(a.experts, b.experts, "cpu quantizer");
}

TEST(QuantizeAtLoad, Errors) {
  // not MoE: a bf16 checkpoint with no experts (and no quantization config)
  {
    Model m = make_model(Family::Qwen, DType::BF16);
    m.src.erase(std::remove_if(m.src.begin(), m.src.end(),
                               [](const Src& s) { return s.name.find(".experts.") != std::string::npos; }),
                m.src.end());
    const std::string d = write_model("dense_only", m, DType::BF16);
    expect_error<FormatError>([&] { Checkpoint::open(d); }, {"no NVFP4 quantization config"});
  }
  // an expert weight in an unsupported dtype next to bf16 ones: named
  {
    const Model m = make_model(Family::Qwen, DType::BF16);
    const std::string d = test::fresh_dir("quantize_at_load", "bad_dtype");
    std::vector<FileTensor> ts;
    for (const auto& s : m.src) {
      FileTensor t = to_file(s, s.shape.size() == 1 ? DType::F32 : DType::BF16);
      if (s.name == "model.layers.1.mlp.experts.2.down_proj.weight") {
        t.dtype = DType::I8;
        t.bytes.resize(t.bytes.size() / 2);
      }
      ts.push_back(t);
    }
    test::write_checkpoint_dir(d, ts, m.config, nullptr);
    expect_error<FormatError>([&] { Checkpoint::open(d); },
                              {"experts.2.down_proj.weight", "expected dtype BF16, F16 or F32", "I8"});
  }
  // a non-finite weight: named at load
  {
    Model m = make_model(Family::Qwen, DType::BF16);
    for (auto& s : m.src)
      if (s.name == "model.layers.1.mlp.experts.3.up_proj.weight") s.v[5] = std::numeric_limits<float>::infinity();
    auto ck = Checkpoint::open(write_model("inf", m, DType::BF16));
    expect_error<FormatError>([&] { ck->load_layer(1); }, {"layer 1 expert 3", "up_proj.weight", "expected finite"});
  }
  // a missing projection and a wrong shape
  {
    Model m = make_model(Family::Qwen, DType::BF16);
    m.src.erase(std::remove_if(m.src.begin(), m.src.end(),
                               [](const Src& s) { return s.name == "model.layers.1.mlp.experts.1.up_proj.weight"; }),
                m.src.end());
    const std::string d = write_model("missing_up", m, DType::BF16);
    expect_error<FormatError>([&] { Checkpoint::open(d); }, {"layer 1", "expert 1", "missing up"});
  }
  {
    Model m = make_model(Family::Qwen, DType::BF16);
    for (auto& s : m.src)
      if (s.name == "model.layers.1.mlp.experts.2.gate_proj.weight") {
        s.shape = {I - 16, H};
        s.v.resize(static_cast<size_t>((I - 16) * H));
      }
    const std::string d = write_model("bad_shape", m, DType::BF16);
    expect_error<FormatError>([&] { Checkpoint::open(d); }, {"experts.2.gate_proj.weight", "expected shape [32, 64]"});
  }
  // calibrate refuses an unquantized checkpoint, pointing at quantize; quantize --device cuda without CUDA
  {
    const Model m = make_model(Family::Qwen, DType::BF16);
    const std::string in = write_model("calib", m, DType::BF16);
    model::CalibrationSource cs;
    cs.random_tokens = 4;
    expect_error<FormatError>([&] { model::calibrate_checkpoint(in, in + "_cal", cs); },
                              {"no NVFP4 quantization config", "nvfp4moe quantize"});
    EXPECT_FALSE(fs::exists(in + "_cal"));
#if !defined(NVFP4MOE_WITH_CUDA)
    model::QuantizeOptions qo;
    qo.calibration.random_tokens = 4;
    qo.cuda = true;
    expect_error<ArgumentError>([&] { model::quantize_checkpoint(in, in + "_q", qo); }, {"built without CUDA"});
    EXPECT_FALSE(fs::exists(in + "_q"));
    MoeLayerOptions o;
    o.backend = Backend::Cuda;
    auto ck = Checkpoint::open(in);
    expect_error<ArgumentError>([&] { MoeLayer::create(*ck, 1, o); }, {"without CUDA"});
#endif
  }
}

// ------------------------------------------------------------------ untrusted config.json sizes and values
Src& src_of(Model& m, const std::string& n) {
  for (auto& s : m.src)
    if (s.name == n) return s;
  throw std::runtime_error("no " + n);
}
void drop_src(Model& m, const std::string& part) {
  m.src.erase(std::remove_if(m.src.begin(), m.src.end(),
                             [&](const Src& s) { return s.name.find(part) != std::string::npos; }),
              m.src.end());
}

TEST(QuantizeAtLoad, LayersWithoutTensorsRefused) {
  // A config with no layer rule (no decoder_sparse_step / mlp_only_layers): layers past the tensors were taken as
  // dense, and a huge num_hidden_layers pushed one summary per layer before any check (out of memory).
  for (int64_t n : {int64_t{5}, int64_t{1000000000000000}}) {
    Model m = make_model(Family::Qwen, DType::BF16);
    m.config.erase("decoder_sparse_step");
    m.config.erase("mlp_only_layers");
    m.config["num_hidden_layers"] = n;
    const std::string d = write_model("layers_" + std::to_string(n), m, DType::BF16);
    expect_error<FormatError>([&] { Checkpoint::open(d); },
                              {"layer 2 has no tensors at all", "config.json",
                               "num_hidden_layers = " + std::to_string(n), "the highest layer with tensors is 1"});
  }
  // Qwen: layer 0, dense by mlp_only_layers, has no tensors at all (was taken as dense).
  Model m = make_model(Family::Qwen, DType::BF16);
  drop_src(m, "model.layers.0.");
  const std::string d = write_model("layer0_missing", m, DType::BF16);
  expect_error<FormatError>([&] { Checkpoint::open(d); },
                            {"layer 0 has no tensors at all", "num_hidden_layers = 2",
                             "the highest layer with tensors is 1"});
}

TEST(QuantizeAtLoad, NonPositiveNumExpertsRefused) {
  for (auto [f, field] : {std::pair{Family::Qwen, "num_experts"}, {Family::Mixtral, "num_local_experts"},
                          {Family::DeepSeek, "n_routed_experts"}})
    for (int v : {0, -5}) {
      Model m = make_model(f, DType::BF16);
      m.config[field] = v;
      const std::string d = write_model(std::string(field) + "_" + std::to_string(v), m, DType::BF16);
      const int l = f == Family::Mixtral ? 0 : 1;
      expect_error<FormatError>([&] { Checkpoint::open(d); },
                                {"config.json", std::string("field ") + field, "expected a positive integer",
                                 "got " + std::to_string(v), "layer " + std::to_string(l) + " holds 4 experts"});
    }
}

TEST(QuantizeAtLoad, DeclaredSharedExpertWithoutTensorsRefused) {
  // DeepSeek: n_shared_experts = 2 but no shared_experts.* tensors (was: loaded without its shared expert).
  Model ds = make_model(Family::DeepSeek, DType::BF16);
  drop_src(ds, ".shared_experts.");
  const std::string d = write_model("ds_no_shared", ds, DType::BF16);
  expect_error<FormatError>([&] { Checkpoint::open(d); },
                            {"layer 1", "config.json", "field n_shared_experts = 2", "declares a shared expert",
                             "no tensors model.layers.1.mlp.shared_experts.*",
                             "model.layers.1.mlp.shared_experts.down_proj.weight"});
  // Qwen2 style width on a checkpoint without a shared expert; 0 declares none.
  Model qw = make_model(Family::Qwen, DType::BF16);
  qw.config["shared_expert_intermediate_size"] = 32;
  expect_error<FormatError>([&] { Checkpoint::open(write_model("qw_no_shared", qw, DType::BF16)); },
                            {"field shared_expert_intermediate_size = 32", "declares a shared expert"});
  qw.config["shared_expert_intermediate_size"] = 0;
  EXPECT_EQ(Checkpoint::open(write_model("qw_shared_0", qw, DType::BF16))->spec(1).shared_intermediate, 0);
}

TEST(QuantizeAtLoad, ZeroSizeExpertTensorWithHugeDimRefused) {
  // A zero-size tensor may have any other dimension (valid safetensors); I is taken only once [H, I] matched, so
  // no product of it is formed before the shape check.
  Model m = make_model(Family::Qwen, DType::BF16);
  Src& s = src_of(m, "model.layers.1.mlp.experts.0.down_proj.weight");
  s.shape = {0, int64_t{1} << 62};
  s.v.clear();
  expect_error<FormatError>([&] { Checkpoint::open(write_model("down_2p62", m, DType::BF16)); },
                            {"layer 1", "experts.0.down_proj.weight", "expected shape [64, I]",
                             "[0, 4611686018427387904]"});
}

TEST(QuantizeAtLoad, NonFiniteRouterBiasOrSharedGateRefused) {
  const std::string router = "model.layers.1.mlp.gate.weight";
  auto expect_refused = [](const std::string& dir, std::initializer_list<std::string> parts) {
    auto ck = Checkpoint::open(dir);
    expect_error<FormatError>([&] { ck->load_layer(1); }, parts);
    expect_error<FormatError>([&] { ck->load_shard(1, ParallelConfig{}); }, parts);
  };
  {  // a BF16 router NaN: the tokens' logits NaN, top-k selects nothing sensible
    Model m = make_model(Family::Qwen, DType::BF16);
    src_of(m, router).v[70] = std::numeric_limits<float>::quiet_NaN();
    expect_refused(write_model("router_nan", m, DType::BF16),
                   {"layer 1", "tensor " + router, "expected finite values", "got nan", "index 70 ([1, 6])"});
  }
  {  // an F32 router finite in fp32 but inf once rounded to the bf16 MoeWeights holds
    Model m = make_model(Family::Qwen, DType::F32);
    src_of(m, router).v[2] = 3.4e38f;
    expect_refused(write_model("router_f32_big", m, DType::F32),
                   {"tensor " + router, "expected finite values", "index 2 ([0, 2])", "inf once rounded to bf16"});
  }
  {  // DeepSeek's correction bias (F32): an Inf would put expert 3 in every token's top-k
    Model m = make_model(Family::DeepSeek, DType::BF16);
    src_of(m, "model.layers.1.mlp.gate.e_score_correction_bias").v[3] = std::numeric_limits<float>::infinity();
    expect_refused(write_model("bias_inf", m, DType::BF16),
                   {"tensor model.layers.1.mlp.gate.e_score_correction_bias", "expected finite values",
                    "got inf at index 3"});
  }
  {  // Qwen2's shared expert gate [1, H] (BF16)
    Model m = make_model(Family::Qwen, DType::BF16);
    m.config["shared_expert_intermediate_size"] = I;
    const std::string mod = "model.layers.1.mlp.";
    for (auto [p, n, k] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}})
      m.src.push_back(Src{mod + "shared_expert." + p + ".weight", {n, k}, std::vector<float>(size_t(n * k), 0.01f)});
    m.src.push_back(Src{mod + "shared_expert_gate.weight", {1, H}, std::vector<float>(size_t(H), 0.5f)});
    const MoeWeights ok = Checkpoint::open(write_model("shared_gate_ok", m, DType::BF16))->load_layer(1);
    EXPECT_EQ(ok.shared_gate_weight.size(), size_t(H));
    src_of(m, mod + "shared_expert_gate.weight").v[7] = -std::numeric_limits<float>::infinity();
    expect_refused(write_model("shared_gate_ninf", m, DType::BF16),
                   {"tensor " + mod + "shared_expert_gate.weight", "expected finite values", "got -inf at index 7"});
  }
}

// ------------------------------------------------------------------ config widths, index spelling, shared-expert tensors
TEST(QuantizeAtLoad, ConfigWidthsMustMatchTheTensors) {
  // The config's expert width (moe_intermediate_size; Mixtral: intermediate_size) was not compared with the tensors.
  Model qw = make_model(Family::Qwen, DType::BF16);
  qw.config["moe_intermediate_size"] = 48;
  expect_error<FormatError>([&] { Checkpoint::open(write_model("moe_width_48", qw, DType::BF16)); },
                            {"layer 1", "config.json expert intermediate size = 48",
                             "tensor model.layers.1.mlp.experts.0.down_proj.weight has shape [64, 32] (I = 32)"});
  Model mx = make_model(Family::Mixtral, DType::BF16);
  mx.config["intermediate_size"] = 48;
  expect_error<FormatError>([&] { Checkpoint::open(write_model("mixtral_width_48", mx, DType::BF16)); },
                            {"layer 0", "expert intermediate size = 48", "block_sparse_moe.experts.0.w2.weight"});
  // Shared expert: DeepSeek's n_shared_experts x moe_intermediate_size, and Qwen2's explicit width.
  Model ds = make_model(Family::DeepSeek, DType::BF16);
  ds.config["n_shared_experts"] = 1;
  expect_error<FormatError>([&] { Checkpoint::open(write_model("ds_shared_1", ds, DType::BF16)); },
                            {"layer 1", "config.json shared expert intermediate size = 32",
                             "tensor model.layers.1.mlp.shared_experts.down_proj.weight has shape [64, 64] (I = 64)"});
  ds.config.erase("n_shared_experts");
  ds.config["shared_expert_intermediate_size"] = 96;
  expect_error<FormatError>([&] { Checkpoint::open(write_model("ds_shared_96", ds, DType::BF16)); },
                            {"shared expert intermediate size = 96", "(I = 64)"});
  ds.config["shared_expert_intermediate_size"] = 2 * I;  // matching widths still load
  EXPECT_EQ(Checkpoint::open(write_model("ds_shared_ok", ds, DType::BF16))->spec(1).shared_intermediate, 2 * I);
}

TEST(QuantizeAtLoad, ZeroPaddedIndexRefused) {
  // "experts.03" / "layers.01" were read as 3 / 1, aliasing the unpadded names.
  Model m = make_model(Family::Qwen, DType::BF16);
  src_of(m, "model.layers.1.mlp.experts.3.up_proj.weight").name = "model.layers.1.mlp.experts.03.up_proj.weight";
  expect_error<FormatError>([&] { Checkpoint::open(write_model("padded_expert", m, DType::BF16)); },
                            {"tensor model.layers.1.mlp.experts.03.up_proj.weight", "index \"03\" has a leading zero",
                             "expected \"3\""});
  Model l = make_model(Family::Qwen, DType::BF16);
  src_of(l, "model.layers.1.mlp.gate.weight").name = "model.layers.01.mlp.gate.weight";
  expect_error<FormatError>([&] { Checkpoint::open(write_model("padded_layer", l, DType::BF16)); },
                            {"tensor model.layers.01.mlp.gate.weight", "index \"01\" has a leading zero"});
}

TEST(QuantizeAtLoad, SharedGateWithoutSharedExpertOrZeroWidthRefused) {
  const std::string mod = "model.layers.1.mlp.";
  {  // a shared_expert_gate with no shared expert was ignored
    Model m = make_model(Family::Qwen, DType::BF16);
    m.src.push_back(Src{mod + "shared_expert_gate.weight", {1, H}, std::vector<float>(size_t(H), 0.5f)});
    expect_error<FormatError>([&] { Checkpoint::open(write_model("gate_no_shared", m, DType::BF16)); },
                              {"layer 1", "tensor " + mod + "shared_expert_gate.weight",
                               "gates a shared expert, but there are no tensors " + mod + "shared_experts.*"});
  }
  {  // a shared expert of width 0 ([0, H] / [H, 0]) was taken as none
    Model m = make_model(Family::Qwen, DType::BF16);
    for (auto [p, n, k] : {std::tuple{"gate_proj", int64_t{0}, H}, {"up_proj", int64_t{0}, H}, {"down_proj", H, int64_t{0}}})
      m.src.push_back(Src{mod + "shared_expert." + p + ".weight", {n, k}, {}});
    expect_error<FormatError>([&] { Checkpoint::open(write_model("shared_width_0", m, DType::BF16)); },
                              {"layer 1", "tensor " + mod + "shared_expert.down_proj.weight", "I > 0",
                               "got [64, 0]"});
  }
}

}  // namespace
