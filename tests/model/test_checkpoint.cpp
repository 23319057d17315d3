// Checkpoint discovery, validation and loading (src/model), against the synthetic generator and crafted
// checkpoints that break one rule each.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/synthetic.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "support/checkpoint_files.h"

namespace nvfp4moe {
namespace {

namespace fs = std::filesystem;
using model::SyntheticOptions;

// A per-process scratch directory, removed at exit (the object owns its path, so destruction order is safe).
struct TempRoot {
  fs::path path;
  TempRoot() : path(fs::temp_directory_path() / ("nvfp4moe_test_model_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
const fs::path& temp_root() {
  static TempRoot root;
  return root.path;
}

std::string fresh_dir(const std::string& name) {
  const fs::path p = temp_root() / name;
  fs::remove_all(p);
  return p.string();
}

model::SyntheticResult gen(const std::string& name, const SyntheticOptions& o) {
  return model::generate_synthetic_checkpoint(fresh_dir(name), o);
}

// Expects `fn` to throw E whose message contains every one of `parts`.
template <typename E>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception containing \"" << *parts.begin() << "\"";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

// ------------------------------------------------------------------ checking loaded weights
void expect_expert_equal(const StackedExperts& s, int64_t slot, const model::SyntheticExpert& x, bool gated,
                         const std::string& what) {
  SCOPED_TRACE(what);
  const size_t e = static_cast<size_t>(slot);
  const uint8_t* w13 = s.w13.data() + e * s.w13_bytes_per_expert();
  const uint8_t* w13s = s.w13_scale.data() + e * s.w13_scale_bytes_per_expert();
  size_t off = 0, off_s = 0;
  if (gated) {
    ASSERT_EQ(x.gate.packed.size() + x.up.packed.size(), s.w13_bytes_per_expert());
    EXPECT_EQ(0, std::memcmp(w13, x.gate.packed.data(), x.gate.packed.size()));
    EXPECT_EQ(0, std::memcmp(w13s, x.gate.scale.data(), x.gate.scale.size()));
    EXPECT_EQ(s.w13_gate_scale2[e], x.gate.weight_scale_2);
    off = x.gate.packed.size();
    off_s = x.gate.scale.size();
  } else {
    EXPECT_EQ(x.gate.n, 0);
    EXPECT_TRUE(s.w13_gate_scale2.empty());
  }
  ASSERT_EQ(off + x.up.packed.size(), s.w13_bytes_per_expert());
  EXPECT_EQ(0, std::memcmp(w13 + off, x.up.packed.data(), x.up.packed.size()));
  EXPECT_EQ(0, std::memcmp(w13s + off_s, x.up.scale.data(), x.up.scale.size()));
  EXPECT_EQ(s.w13_up_scale2[e], x.up.weight_scale_2);
  EXPECT_EQ(s.w13_input_scale[e], gated ? std::max(x.gate.input_scale, x.up.input_scale) : x.up.input_scale);
  ASSERT_EQ(x.down.packed.size(), s.w2_bytes_per_expert());
  EXPECT_EQ(0, std::memcmp(s.w2.data() + e * s.w2_bytes_per_expert(), x.down.packed.data(), x.down.packed.size()));
  EXPECT_EQ(0, std::memcmp(s.w2_scale.data() + e * s.w2_scale_bytes_per_expert(), x.down.scale.data(),
                           x.down.scale.size()));
  EXPECT_EQ(s.w2_scale2[e], x.down.weight_scale_2);
  EXPECT_EQ(s.w2_input_scale[e], x.down.input_scale);
}

// Properties of the exporter's quantization that hold whatever the random weights (section 3): the tensor amax
// maps to block scale 448 (0x7E) in some block; gate and up share weight_scale_2 and input_scale.
void expect_exporter_properties(const model::SyntheticExpert& x, bool gated) {
  auto max_code = [](const std::vector<uint8_t>& v) { return *std::max_element(v.begin(), v.end()); };
  EXPECT_EQ(max_code(x.down.scale), 0x7E);
  uint8_t m13 = max_code(x.up.scale);
  if (gated) {
    m13 = std::max(m13, max_code(x.gate.scale));
    EXPECT_EQ(x.gate.weight_scale_2, x.up.weight_scale_2);
    EXPECT_EQ(x.gate.input_scale, x.up.input_scale);
  }
  EXPECT_EQ(m13, 0x7E);
  for (const auto* p : {&x.up, &x.down}) {
    EXPECT_GT(p->weight_scale_2, 0.0f);
    EXPECT_GT(p->input_scale, 0.0f);
    EXPECT_TRUE(std::isfinite(p->input_scale));
  }
}

// Full check of a generated checkpoint: open, spec, every expert bit-equal to the generator, router, bias,
// and the bytes of two experts straight from the files.
void check_generated(const model::SyntheticResult& g) {
  const model::SyntheticModel& m = g.model;
  auto ck = Checkpoint::open(g.dir);
  ASSERT_EQ(ck->format(), CheckpointFormat::ModelOpt);
  ASSERT_EQ(static_cast<int>(ck->layers().size()), m.layers);
  std::vector<int> want_moe;
  for (int l = 0; l < m.layers; ++l) {
    EXPECT_EQ(ck->layers()[static_cast<size_t>(l)].is_moe, m.is_moe_layer(l)) << "layer " << l;
    if (m.is_moe_layer(l)) want_moe.push_back(l);
  }
  ASSERT_EQ(ck->moe_layers(), want_moe);
  for (int l = 0; l < m.first_dense_layers; ++l) EXPECT_THROW(ck->spec(l), ArgumentError);
  const auto files = io::SafetensorsSet::open(g.dir);
  for (int l : want_moe) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const MoeSpec s = ck->spec(l);
    const MoeSpec& w = m.spec;
    EXPECT_EQ(s.layer, l);
    EXPECT_EQ(s.hidden, w.hidden);
    EXPECT_EQ(s.intermediate, w.intermediate);
    EXPECT_EQ(s.num_experts, w.num_experts);
    EXPECT_EQ(s.top_k, w.top_k);
    EXPECT_EQ(s.activation, w.activation);
    EXPECT_EQ(s.routing, w.routing);
    EXPECT_EQ(s.norm_topk_prob, w.norm_topk_prob);
    if (w.routing == Routing::SigmoidGroupedTopK) {
      EXPECT_EQ(s.n_group, w.n_group);
      EXPECT_EQ(s.topk_group, w.topk_group);
      EXPECT_EQ(s.routed_scaling_factor, w.routed_scaling_factor);
    }
    EXPECT_EQ(s.has_router_bias, w.has_router_bias);
    EXPECT_EQ(s.shared_intermediate, w.shared_intermediate);
    EXPECT_EQ(s.shared_expert_gated, w.shared_expert_gated);
    EXPECT_EQ(ck->layers()[static_cast<size_t>(l)].experts_found, w.num_experts);
    EXPECT_EQ(ck->layers()[static_cast<size_t>(l)].prefix, m.moe_prefix(l));

    const MoeWeights mw = ck->load_layer(l);
    EXPECT_NO_THROW(mw.validate());
    for (int e = 0; e < w.num_experts; ++e) {
      const auto x = model::synthesize_expert(m, l, e);
      expect_expert_equal(mw.experts, e, x, w.gated(), "expert " + std::to_string(e));
      if (e == 0) expect_exporter_properties(x, w.gated());
    }
    if (w.shared_intermediate > 0) {
      ASSERT_TRUE(mw.has_shared());
      expect_expert_equal(mw.shared, 0, model::synthesize_expert(m, l, -1), w.gated(), "shared expert");
    } else {
      EXPECT_FALSE(mw.has_shared());
    }
    EXPECT_EQ(mw.router_weight, model::synthesize_router(m, l));
    if (w.has_router_bias) EXPECT_EQ(mw.router_bias, model::synthesize_router_bias(m, l));
    else EXPECT_TRUE(mw.router_bias.empty());
    EXPECT_EQ(mw.shared_gate_weight.size(), w.shared_expert_gated ? static_cast<size_t>(w.hidden) : 0u);

    // Straight from the files: the last expert's up and down bytes.
    const bool mixtral = m.style == model::ModelStyle::Mixtral;
    const int64_t e = w.num_experts - 1;
    const std::string base = m.moe_prefix(l) + ".experts." + std::to_string(e) + ".";
    const auto& up = files.get(base + (mixtral ? "w3" : "up_proj") + ".weight");
    const auto& down_s = files.get(base + (mixtral ? "w2" : "down_proj") + ".weight_scale");
    const size_t ue = static_cast<size_t>(e);
    const size_t up_off = w.gated() ? up.nbytes() : 0;
    EXPECT_EQ(0, std::memcmp(mw.experts.w13.data() + ue * mw.experts.w13_bytes_per_expert() + up_off, up.data,
                             up.nbytes()));
    EXPECT_EQ(0, std::memcmp(mw.experts.w2_scale.data() + ue * mw.experts.w2_scale_bytes_per_expert(), down_s.data,
                             down_s.nbytes()));
  }
  const std::string report = ck->inspect();
  EXPECT_NE(report.find("exclude_modules: lm_head"), std::string::npos) << report;
  EXPECT_NE(report.find("MoE"), std::string::npos) << report;
}

// ------------------------------------------------------------------ generated checkpoints, every preset
TEST(GeneratedCheckpoint, DeepSeekV3Reduced) {
  SyntheticOptions o;
  o.preset = "deepseek-v3";
  o.hidden = 128;
  o.intermediate = 32;
  o.shared_intermediate = 64;  // n_shared_experts = 2
  o.experts = 16;              // 8 groups of 2, keep 4 groups, top-8
  o.layers = 3;
  o.first_dense_layers = 1;
  o.seed = 7;
  const auto g = gen("dsv3", o);
  EXPECT_EQ(g.model.spec.n_group, 8);
  EXPECT_EQ(g.model.spec.topk_group, 4);
  EXPECT_EQ(g.model.spec.top_k, 8);
  check_generated(g);
}

TEST(GeneratedCheckpoint, DeepSeekV3FewExpertsAdjustsGroups) {
  SyntheticOptions o;
  o.preset = "deepseek-v3";
  o.hidden = 64;
  o.intermediate = 32;
  o.shared_intermediate = 48;  // not a multiple of I: written as an explicit shared width
  o.experts = 6;  // n_group 8 -> 6, top_k 8 -> 6
  const auto m = model::resolve_synthetic(o);
  EXPECT_EQ(m.spec.n_group, 6);
  EXPECT_EQ(m.spec.top_k, 6);
  EXPECT_EQ(m.spec.topk_group, 6);
  check_generated(gen("dsv3_small", o));
}

TEST(GeneratedCheckpoint, Qwen3_235bReduced) {
  SyntheticOptions o;
  o.preset = "qwen3-235b";
  o.hidden = 64;
  o.intermediate = 48;
  o.experts = 10;
  o.layers = 2;
  o.first_dense_layers = 1;
  o.max_shard_bytes = 20000;  // several shards
  const auto g = gen("q235", o);
  EXPECT_GT(io::SafetensorsSet::open(g.dir).num_files(), 2u);
  check_generated(g);
}

TEST(GeneratedCheckpoint, Qwen3_30bReduced) {
  SyntheticOptions o;
  o.preset = "qwen3-30b";
  o.hidden = 32;
  o.intermediate = 16;
  o.experts = 9;
  o.layers = 2;
  check_generated(gen("q30", o));
}

TEST(GeneratedCheckpoint, GptOssReduced) {
  SyntheticOptions o;
  o.preset = "gpt-oss-120b";
  o.hidden = 48;
  o.intermediate = 48;
  o.experts = 5;
  const auto g = gen("gptoss", o);
  check_generated(g);
  EXPECT_NE(Checkpoint::open(g.dir)->inspect().find("gpt-oss"), std::string::npos);
}

TEST(GeneratedCheckpoint, NemotronNanoReducedRelu2) {
  SyntheticOptions o;
  o.preset = "nemotron-nano";
  o.hidden = 96;
  o.intermediate = 32;
  o.shared_intermediate = 64;
  o.experts = 12;
  o.layers = 3;
  o.first_dense_layers = 1;
  const auto g = gen("nemo", o);
  EXPECT_EQ(g.model.spec.activation, Activation::Relu2);
  check_generated(g);
  // Non-gated: no gate_proj anywhere.
  for (const auto& n : io::SafetensorsSet::open(g.dir).names()) EXPECT_EQ(n.find("gate_proj"), std::string::npos) << n;
}

TEST(GeneratedCheckpoint, MixtralNames) {
  SyntheticOptions o;
  o.preset = "mixtral-8x7b";
  o.hidden = 64;
  o.intermediate = 32;
  o.experts = 4;
  o.layers = 2;
  const auto g = gen("mixtral", o);
  EXPECT_TRUE(io::SafetensorsSet::open(g.dir).find("model.layers.1.block_sparse_moe.experts.3.w3.weight"));
  check_generated(g);
}

TEST(GeneratedCheckpoint, QwenSharedExpertGated) {
  SyntheticOptions o;
  o.hidden = 48;
  o.intermediate = 32;
  o.experts = 4;
  o.top_k = 2;
  o.shared_intermediate = 80;
  const auto g = gen("qwen2shared", o);
  EXPECT_EQ(g.model.style, model::ModelStyle::Qwen2Moe);
  EXPECT_TRUE(g.model.spec.shared_expert_gated);
  check_generated(g);
}

TEST(GeneratedCheckpoint, OddShapes) {
  SyntheticOptions o;
  o.hidden = 80;
  o.intermediate = 48;
  o.experts = 5;
  o.top_k = 3;
  o.norm_topk_prob = false;
  o.seed = 12345;
  o.layers = 2;
  check_generated(gen("odd", o));
}

TEST(GeneratedCheckpoint, DeterministicFromSeed) {
  SyntheticOptions o;
  o.hidden = 32;
  o.intermediate = 16;
  o.experts = 3;
  o.top_k = 2;
  const auto a = gen("det_a", o), b = gen("det_b", o);
  o.seed = 2;
  const auto c = gen("det_c", o);
  auto bytes = [](const std::string& dir) {
    std::ifstream f(fs::path(dir) / "model.safetensors", std::ios::binary);
    if (!f) f.open(fs::path(dir) / "model-00001-of-00001.safetensors", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const auto sa = io::SafetensorsSet::open(a.dir), sb = io::SafetensorsSet::open(b.dir),
             sc = io::SafetensorsSet::open(c.dir);
  ASSERT_EQ(sa.names(), sb.names());
  bool any_diff = false;
  for (const auto& n : sa.names()) {
    const auto &ta = sa.get(n), &tb = sb.get(n), &tc = sc.get(n);
    ASSERT_EQ(ta.nbytes(), tb.nbytes());
    EXPECT_EQ(0, std::memcmp(ta.data, tb.data, ta.nbytes())) << n;
    any_diff = any_diff || std::memcmp(ta.data, tc.data, ta.nbytes()) != 0;
  }
  EXPECT_TRUE(any_diff);
  (void)bytes;
}

TEST(GeneratedCheckpoint, RefusesNonEmptyDirAndLeavesNoTemp) {
  SyntheticOptions o;
  o.hidden = 32;
  o.intermediate = 16;
  o.experts = 2;
  o.top_k = 1;
  const auto g = gen("atomic", o);
  const auto before = fs::last_write_time(fs::path(g.dir) / "config.json");
  expect_error<ArgumentError>([&] { model::generate_synthetic_checkpoint(g.dir, o); }, {"not empty", "overwrite"});
  EXPECT_EQ(before, fs::last_write_time(fs::path(g.dir) / "config.json"));
  o.overwrite = true;
  o.experts = 3;
  model::generate_synthetic_checkpoint(g.dir, o);
  EXPECT_EQ(Checkpoint::open(g.dir)->spec(0).num_experts, 3);
  for (const auto& ent : fs::directory_iterator(temp_root()))
    EXPECT_EQ(ent.path().filename().string().find(".tmp-"), std::string::npos) << ent.path();
  // Options refused before anything is written.
  SyntheticOptions bad = o;
  bad.hidden = 40;  // not a multiple of 16
  const std::string d = fresh_dir("never");
  EXPECT_THROW(model::generate_synthetic_checkpoint(d, bad), ArgumentError);
  EXPECT_FALSE(fs::exists(d));
  bad = o;
  bad.preset = "nope";
  expect_error<ArgumentError>([&] { model::resolve_synthetic(bad); }, {"preset", "deepseek-v3", "nope"});
}

TEST(GeneratedCheckpoint, PresetsResolveAtFullSize) {
  for (const auto& p : model::synthetic_presets()) {
    SyntheticOptions o;
    o.preset = p;
    const auto m = model::resolve_synthetic(o);
    EXPECT_NO_THROW(m.spec.validate()) << p;
    EXPECT_GT(m.checkpoint_bytes(), 0u);
  }
  SyntheticOptions o;
  o.preset = "deepseek-v3";
  const auto m = model::resolve_synthetic(o);
  EXPECT_EQ(m.spec.hidden, 7168);
  EXPECT_EQ(m.spec.num_experts, 256);
  EXPECT_EQ(m.spec.shared_intermediate, 2048);
  EXPECT_TRUE(m.spec.has_router_bias);
  o.preset = "nemotron-nano";
  const auto n = model::resolve_synthetic(o);
  EXPECT_EQ(n.spec.activation, Activation::Relu2);
  EXPECT_EQ(n.spec.shared_intermediate, 3712);
  EXPECT_EQ(n.spec.top_k, 6);
}

// ------------------------------------------------------------------ crafted checkpoints
using Tensor = test::FileTensor;
std::vector<Tensor> read_all(const std::string& dir) { return test::read_all_tensors(dir); }
using test::read_json;
using test::write_json;

// A small base checkpoint (qwen3 style, H 32, I 32, E 3, one layer) rewritten with one mutation.
class Crafted : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    SyntheticOptions o;
    o.hidden = 32;
    o.intermediate = 32;
    o.experts = 3;
    o.top_k = 2;
    base_ = new model::SyntheticResult(gen("crafted_base", o));
    SyntheticOptions d = o;
    d.preset = "deepseek-v3";
    d.hidden = 32;
    d.intermediate = 16;
    d.shared_intermediate = 16;
    d.experts = 8;
    ds_ = new model::SyntheticResult(gen("crafted_ds", d));
  }
  static void TearDownTestSuite() {
    delete base_;
    delete ds_;
  }

  // Writes dir = base with the tensors and json files mutated.
  std::string craft(const std::string& name, const std::function<void(std::vector<Tensor>&)>& mutate,
                    const std::function<void(nlohmann::json& config, nlohmann::json& quant)>& mutate_json = {},
                    const model::SyntheticResult* from = nullptr) {
    const model::SyntheticResult& src = from ? *from : *base_;
    const std::string dir = fresh_dir(name);
    fs::create_directories(dir);
    auto tensors = read_all(src.dir);
    if (mutate) mutate(tensors);
    std::vector<io::TensorToWrite> w;
    for (const auto& t : tensors) {
      io::TensorToWrite x;
      x.name = t.name;
      x.dtype = t.dtype;
      x.shape = t.shape;
      const Tensor* tp = &t;
      x.fill = [tp](uint8_t* dst, size_t n) { std::memcpy(dst, tp->bytes.data(), n); };
      w.push_back(std::move(x));
    }
    io::write_safetensors((fs::path(dir) / "model.safetensors").string(), w);
    nlohmann::json config = read_json(fs::path(src.dir) / "config.json");
    nlohmann::json quant = read_json(fs::path(src.dir) / "hf_quant_config.json");
    if (mutate_json) mutate_json(config, quant);
    write_json(fs::path(dir) / "config.json", config);
    if (!quant.is_null()) write_json(fs::path(dir) / "hf_quant_config.json", quant);
    return dir;
  }

  static Tensor* find(std::vector<Tensor>& ts, const std::string& name) {
    for (auto& t : ts)
      if (t.name == name) return &t;
    ADD_FAILURE() << "no tensor " << name;
    static Tensor dummy;
    return &dummy;
  }
  static void erase_if(std::vector<Tensor>& ts, const std::function<bool(const std::string&)>& pred) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const Tensor& t) { return pred(t.name); }), ts.end());
  }
  static void expect_load_error(const std::string& dir, std::initializer_list<std::string> parts) {
    auto ck = Checkpoint::open(dir);
    expect_error<FormatError>([&] { ck->load_layer(0); }, parts);
  }

  static model::SyntheticResult* base_;
  static model::SyntheticResult* ds_;
};
model::SyntheticResult* Crafted::base_ = nullptr;
model::SyntheticResult* Crafted::ds_ = nullptr;

const std::string kE = "model.layers.0.mlp.experts.";

TEST_F(Crafted, UnchangedCopyLoads) {
  const std::string dir = craft("copy", {});
  check_generated({dir, base_->model, 0, 0, 0});
}

TEST_F(Crafted, MissingExpert) {
  const std::string dir = craft("missing_expert", [](auto& ts) {
    erase_if(ts, [](const std::string& n) { return n.rfind(kE + "1.", 0) == 0; });
  });
  auto ck = Checkpoint::open(dir);
  EXPECT_EQ(ck->layers()[0].experts_found, 2);
  expect_load_error(dir, {"layer 0", "missing expert 1", "num_experts = 3"});
}

TEST_F(Crafted, ExtraExpert) {
  const std::string dir = craft("extra_expert", [](auto& ts) {
    std::vector<Tensor> add;
    for (const auto& t : ts)
      if (t.name.rfind(kE + "0.", 0) == 0) {
        Tensor c = t;
        c.name = kE + "3." + t.name.substr(kE.size() + 2);
        add.push_back(c);
      }
    ts.insert(ts.end(), add.begin(), add.end());
  });
  expect_load_error(dir, {"layer 0", "extra expert 3", "num_experts = 3"});
}

TEST_F(Crafted, ScaleWithWrongShape) {
  const std::string dir = craft("scale_shape", [](auto& ts) { find(ts, kE + "2.gate_proj.weight_scale")->shape = {2, 32}; });
  expect_load_error(dir, {"expert 2", "gate_proj.weight_scale", "expected shape [32, 2]", "got [2, 32]"});
}

TEST_F(Crafted, WeightWithWrongDtype) {
  const std::string dir = craft("weight_dtype", [](auto& ts) { find(ts, kE + "1.down_proj.weight")->dtype = DType::I8; });
  expect_load_error(dir, {"expert 1", "down_proj.weight", "expected dtype U8", "got I8"});
}

TEST_F(Crafted, ScaleWithWrongDtype) {
  const std::string dir = craft("scale_dtype", [](auto& ts) { find(ts, kE + "0.up_proj.weight_scale")->dtype = DType::U8; });
  expect_load_error(dir, {"up_proj.weight_scale", "expected dtype F8_E4M3", "got U8"});
}

TEST_F(Crafted, MissingInputScale) {
  const std::string dir = craft("no_input_scale", [](auto& ts) {
    erase_if(ts, [](const std::string& n) { return n == kE + "2.down_proj.input_scale"; });
  });
  expect_load_error(dir, {"expert 2", "missing tensor", "down_proj.input_scale", "W4A4"});
}

TEST_F(Crafted, WeightScale2Rank2) {
  const std::string dir = craft("ws2_rank2", [](auto& ts) { find(ts, kE + "0.gate_proj.weight_scale_2")->shape = {1, 1}; });
  expect_load_error(dir, {"gate_proj.weight_scale_2", "expected shape [] (rank 0) or [1]", "got [1, 1]"});
}

TEST_F(Crafted, WeightScale2Shape1Accepted) {
  const std::string dir = craft("ws2_shape1", [](auto& ts) {
    for (auto& t : ts)
      if (t.name.find("weight_scale_2") != std::string::npos || t.name.find("input_scale") != std::string::npos)
        t.shape = {1};
  });
  check_generated({dir, base_->model, 0, 0, 0});
}

TEST_F(Crafted, NonPositiveScale) {
  const std::string dir = craft("neg_scale", [](auto& ts) {
    const float v = -1.0f;
    std::memcpy(find(ts, kE + "1.up_proj.input_scale")->bytes.data(), &v, 4);
  });
  expect_load_error(dir, {"up_proj.input_scale", "finite positive", "-1"});
  const std::string nan = craft("nan_scale", [](auto& ts) {
    const float v = std::nanf("");
    std::memcpy(find(ts, kE + "1.down_proj.weight_scale_2")->bytes.data(), &v, 4);
  });
  expect_load_error(nan, {"down_proj.weight_scale_2", "finite positive"});
}

TEST_F(Crafted, UnexpectedExpertTensor) {
  const std::string dir = craft("bias", [](auto& ts) {
    Tensor b = *find(ts, kE + "0.up_proj.input_scale");
    b.name = kE + "0.up_proj.bias";
    ts.push_back(b);
  });
  expect_load_error(dir, {"unexpected tensor", "up_proj.bias"});
}

TEST_F(Crafted, GroupSize32Refused) {
  const std::string dir = craft("gs32", {}, [](auto&, auto& q) { q["quantization"]["group_size"] = 32; });
  expect_error<FormatError>([&] { Checkpoint::open(dir); },
                            {"hf_quant_config.json", "group_size", "expected 16", "got 32"});
}

TEST_F(Crafted, QuantAlgoFp8Refused) {
  const std::string dir = craft("fp8", {}, [](auto&, auto& q) { q["quantization"]["quant_algo"] = "FP8"; });
  expect_error<FormatError>([&] { Checkpoint::open(dir); }, {"hf_quant_config.json", "quant_algo", "NVFP4", "\"FP8\""});
}

TEST_F(Crafted, MixedPrecision) {
  const std::string ok = craft("mixed_ok", {}, [](auto&, auto& q) {
    q["quantization"]["quant_algo"] = "MIXED_PRECISION";
    q["quantization"]["quantized_layers"] = {
        {"model.layers.0.self_attn.q_proj", {{"quant_algo", "FP8"}}},
        {kE + "0.gate_proj", {{"quant_algo", "NVFP4"}, {"group_size", 16}}},
        {kE + "0.down_proj", {{"quant_algo", "NVFP4"}, {"group_size", 16}}}};
  });
  EXPECT_NO_THROW(Checkpoint::open(ok)->load_layer(0));
  const std::string bad = craft("mixed_bad", {}, [](auto&, auto& q) {
    q["quantization"]["quant_algo"] = "MIXED_PRECISION";
    q["quantization"]["quantized_layers"] = {{kE + "1.up_proj", {{"quant_algo", "FP8"}}}};
  });
  expect_error<FormatError>([&] { Checkpoint::open(bad); }, {"quantized_layers", "experts.1.up_proj", "NVFP4", "FP8"});
  const std::string none = craft("mixed_none", {}, [](auto&, auto& q) {
    q["quantization"]["quant_algo"] = "MIXED_PRECISION";
    q["quantization"]["quantized_layers"] = {{"model.layers.0.self_attn.q_proj", {{"quant_algo", "FP8"}}}};
  });
  expect_error<FormatError>([&] { Checkpoint::open(none); }, {"MIXED_PRECISION", "found none"});
}

TEST_F(Crafted, QuantizationConfigInConfigJson) {
  auto to_config = [](nlohmann::json& c, nlohmann::json& q, int gs) {
    c["quantization_config"] = {
        {"quant_method", "modelopt"},
        {"config_groups",
         {{"group_0",
           {{"weights", {{"num_bits", 4}, {"type", "float"}, {"group_size", gs}, {"dynamic", false}}},
            {"input_activations", {{"num_bits", 4}, {"type", "float"}, {"group_size", 16}, {"dynamic", false}}},
            {"targets", {"Linear"}}}}}},
        {"ignore", {"lm_head", "*.mlp.gate"}}};
    q = nullptr;
  };
  const std::string ok = craft("cfg_quant", {}, [&](auto& c, auto& q) { to_config(c, q, 16); });
  auto ck = Checkpoint::open(ok);
  EXPECT_EQ(ck->exclude_modules(), (std::vector<std::string>{"lm_head", "*.mlp.gate"}));
  EXPECT_NO_THROW(ck->load_layer(0));
  const std::string bad = craft("cfg_quant32", {}, [&](auto& c, auto& q) { to_config(c, q, 32); });
  expect_error<FormatError>([&] { Checkpoint::open(bad); },
                            {"config.json", "config_groups.group_0.weights.group_size", "expected 16", "32"});
  const std::string none = craft("no_quant", {}, [](auto&, auto& q) { q = nullptr; });
  expect_error<FormatError>([&] { Checkpoint::open(none); }, {"no NVFP4 quantization config", "hf_quant_config.json"});
  const std::string ct = craft("ct", {}, [](auto& c, auto& q) {
    c["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}};
    q = nullptr;
  });
  // compressed-tensors is read (tests/model/test_compressed_tensors.cpp); without config_groups it is refused
  expect_error<FormatError>([&] { Checkpoint::open(ct); }, {"quantization_config.config_groups", "missing"});
}

TEST_F(Crafted, ConfigAndTensorsDisagree) {
  const std::string dir = craft("dense_by_config", {}, [](auto& c, auto&) { c["mlp_only_layers"] = {0}; });
  expect_error<FormatError>([&] { Checkpoint::open(dir); }, {"layer 0", "dense layer", "experts"});
  const std::string wide = craft("wrong_i", {}, [](auto& c, auto&) { c["moe_intermediate_size"] = 64; });
  expect_error<FormatError>([&] { Checkpoint::open(wide); }, {"layer 0", "intermediate size = 64", "I = 32"});
  const std::string topk = craft("topk", {}, [](auto& c, auto&) { c["num_experts_per_tok"] = 4; });
  expect_error<FormatError>([&] { Checkpoint::open(topk); }, {"top_k", "4"});
}

TEST_F(Crafted, GateUpScaleMismatchKeptAndReported) {
  float up_ws2 = 0;
  const std::string dir = craft("mismatch", [&](auto& ts) {
    Tensor* t = find(ts, kE + "1.up_proj.weight_scale_2");
    std::memcpy(&up_ws2, t->bytes.data(), 4);
    up_ws2 *= 2.0f;
    std::memcpy(t->bytes.data(), &up_ws2, 4);
  });
  auto ck = Checkpoint::open(dir);
  const MoeWeights w = ck->load_layer(0);
  EXPECT_EQ(w.experts.w13_up_scale2[1], up_ws2);
  EXPECT_EQ(w.experts.w13_gate_scale2[1] * 2.0f, up_ws2);
  const std::string report = ck->inspect();
  EXPECT_NE(report.find("gate vs up weight_scale_2: 1 of 3 experts differ (largest ratio 2"), std::string::npos) << report;
}

TEST_F(Crafted, InputScaleIsMaxOfGateAndUp) {
  float g = 0;
  const std::string dir = craft("in_max", [&](auto& ts) {
    Tensor* t = find(ts, kE + "2.gate_proj.input_scale");
    std::memcpy(&g, t->bytes.data(), 4);
    g *= 3.0f;
    std::memcpy(t->bytes.data(), &g, 4);
  });
  const MoeWeights w = Checkpoint::open(dir)->load_layer(0);
  EXPECT_EQ(w.experts.w13_input_scale[2], g);
}

TEST_F(Crafted, DeepSeekBf16BiasConvertedExactly) {
  const std::string dir = craft("bf16_bias", [](auto& ts) {
    Tensor* t = find(ts, "model.layers.0.mlp.gate.e_score_correction_bias");
    std::vector<uint8_t> b;
    for (size_t i = 0; i < t->bytes.size(); i += 4) {
      float v;
      std::memcpy(&v, t->bytes.data() + i, 4);
      const uint16_t h = fmt::bf16_from_float(v);
      b.push_back(static_cast<uint8_t>(h & 0xFF));
      b.push_back(static_cast<uint8_t>(h >> 8));
    }
    t->dtype = DType::BF16;
    t->bytes = b;
  }, {}, ds_);
  const MoeWeights w = Checkpoint::open(dir)->load_layer(0);
  const auto want = model::synthesize_router_bias(ds_->model, 0);
  ASSERT_EQ(w.router_bias.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(w.router_bias[i], fmt::bf16_round(want[i]));
  EXPECT_TRUE(w.has_shared());
  EXPECT_EQ(w.spec.routing, Routing::SigmoidGroupedTopK);
}

TEST_F(Crafted, SharedExpertWithWrongDtype) {
  const std::string dir = craft("shared_bf16", [](auto& ts) {
    find(ts, "model.layers.0.mlp.shared_experts.up_proj.weight_scale")->dtype = DType::I8;
  }, {}, ds_);
  expect_load_error(dir, {"shared expert", "shared_experts.up_proj.weight_scale", "F8_E4M3"});
}

TEST_F(Crafted, RouterWrongShape) {
  const std::string dir = craft("router_shape", [](auto& ts) { find(ts, "model.layers.0.mlp.gate.weight")->shape = {32, 3}; });
  expect_load_error(dir, {"mlp.gate.weight", "expected shape [3, 32]", "got [32, 3]"});
}

TEST_F(Crafted, F32RouterRoundedToBf16) {
  const std::string dir = craft("router_f32", [](auto& ts) {
    Tensor* t = find(ts, "model.layers.0.mlp.gate.weight");
    std::vector<uint8_t> b;
    for (size_t i = 0; i < t->bytes.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, t->bytes.data() + i, 2);
      // a value between two bf16 neighbours that rounds back to h
      const float f = fmt::bf16_to_float(h) * (1.0f + 1.0f / 1024.0f);
      uint8_t q[4];
      std::memcpy(q, &f, 4);
      b.insert(b.end(), q, q + 4);
    }
    t->dtype = DType::F32;
    t->bytes = b;
  });
  auto ck = Checkpoint::open(dir);
  const MoeWeights w = ck->load_layer(0);
  EXPECT_EQ(w.router_weight, model::synthesize_router(base_->model, 0));
  EXPECT_NE(ck->inspect().find("is F32"), std::string::npos);
  const std::string bad = craft("router_i8", [](auto& ts) { find(ts, "model.layers.0.mlp.gate.weight")->dtype = DType::F16; });
  expect_load_error(bad, {"mlp.gate.weight", "expected dtype BF16", "F16"});
}

TEST_F(Crafted, MissingGateProjection) {
  const std::string dir = craft("no_gate", [](auto& ts) {
    erase_if(ts, [](const std::string& n) { return n.rfind(kE + "1.gate_proj.", 0) == 0; });
  });
  expect_load_error(dir, {"expert 1 gate_proj", "missing tensor", "experts.1.gate_proj.weight"});
}

TEST_F(Crafted, ActivationFromTensorsOrConfig) {
  auto drop_gates = [](auto& ts) {
    erase_if(ts, [](const std::string& n) { return n.find(".gate_proj.") != std::string::npos; });
  };
  // No activation in config.json: no gate projections means non-gated relu^2 experts.
  const std::string relu = craft("relu_by_tensors", drop_gates, [](auto& c, auto&) { c.erase("hidden_act"); });
  auto ck = Checkpoint::open(relu);
  EXPECT_EQ(ck->spec(0).activation, Activation::Relu2);
  const MoeWeights w = ck->load_layer(0);
  EXPECT_FALSE(w.experts.gated);
  expect_expert_equal(w.experts, 2, [&] {
    auto x = model::synthesize_expert(base_->model, 0, 2);
    x.gate = {};
    return x;
  }(), false, "relu2 expert 2");
  // The config names silu: the missing gate projections are an error.
  const std::string silu = craft("silu_no_gates", drop_gates);
  EXPECT_EQ(Checkpoint::open(silu)->spec(0).activation, Activation::SwiGLU);
  expect_load_error(silu, {"expert 0 gate_proj", "missing tensor"});
  // relu2 by config but gate projections present: refused by name.
  const std::string extra = craft("relu2_with_gates", {}, [](auto& c, auto&) { c["mlp_hidden_act"] = "relu2"; });
  expect_load_error(extra, {"unexpected projection", "gate_proj", "non-gated relu2"});
}

TEST_F(Crafted, FusedExpertsRefused) {
  const std::string dir = craft("fused", [](auto& ts) {
    Tensor f = *find(ts, kE + "0.up_proj.weight");
    erase_if(ts, [](const std::string& n) { return n.rfind(kE, 0) == 0; });
    f.name = "model.layers.0.mlp.experts.gate_up_proj";
    ts.push_back(f);
  });
  expect_error<FormatError>([&] { Checkpoint::open(dir); }, {"layer 0", "experts.gate_up_proj", "fused expert"});
}

TEST_F(Crafted, NonMoeLayerAndBadIndex) {
  auto ck = Checkpoint::open(base_->dir);
  expect_error<ArgumentError>([&] { ck->spec(5); }, {"layer", "got 5"});
  expect_error<ArgumentError>([&] { ck->load_layer(-1); }, {"layer", "got -1"});
}

TEST_F(Crafted, ProgressReportsWhenSlow) {
  // The loader reports only after one second; a tiny layer finishes sooner and never calls it.
  int calls = 0;
  Checkpoint::open(base_->dir)->load_layer(0, [&](size_t, size_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

// ------------------------------------------------------------------ untrusted config.json sizes and values
TEST_F(Crafted, HugeConfigSizesRefusedBeforeAllocating) {
  // Sized by config.json before these checks: ~48 PB of per-layer maps, ~24 PB of expert scalars (bad_alloc).
  const std::string layers = craft("huge_layers", {}, [](auto& c, auto&) { c["num_hidden_layers"] = 1000000000000000; });
  expect_error<FormatError>([&] { Checkpoint::open(layers); },
                            {"layer 1 has no tensors at all", "num_hidden_layers = 1000000000000000",
                             "the highest layer with tensors is 0"});
  const std::string experts = craft("huge_experts", {}, [](auto& c, auto&) { c["num_experts"] = 1000000000000000; });
  expect_load_error(experts, {"layer 0", "missing expert 3", "num_experts = 1000000000000000", "found 3"});
  expect_error<FormatError>([&] { Checkpoint::open(experts)->load_shard(0, ParallelConfig{}); },
                            {"layer 0", "missing expert 3", "num_experts = 1000000000000000", "found 3"});
}

TEST_F(Crafted, NonPositiveNumExpertsRefused) {
  for (int v : {0, -5}) {
    const std::string dir = craft("experts_" + std::to_string(v), {}, [&](auto& c, auto&) { c["num_experts"] = v; });
    expect_error<FormatError>([&] { Checkpoint::open(dir); },
                              {"config.json", "field num_experts", "expected a positive integer", "got " + std::to_string(v),
                               "layer 0 holds 3 experts"});
  }
  const std::string ds = craft("ds_experts_0", {}, [](auto& c, auto&) { c["n_routed_experts"] = 0; }, ds_);
  expect_error<FormatError>([&] { Checkpoint::open(ds); }, {"field n_routed_experts", "positive", "got 0"});
}

TEST_F(Crafted, UnknownActivationRefused) {
  const std::string gelu = craft("act_gelu", {}, [](auto& c, auto&) { c["hidden_act"] = "gelu"; });
  expect_error<FormatError>([&] { Checkpoint::open(gelu); },
                            {"config.json", "field hidden_act", "expected \"silu\"", "\"relu2\"", "got \"gelu\""});
  const std::string tanh = craft("act_tanh", {}, [](auto& c, auto&) { c["mlp_hidden_act"] = "tanh"; });
  expect_error<FormatError>([&] { Checkpoint::open(tanh); }, {"field mlp_hidden_act", "got \"tanh\""});
  // The spellings real checkpoints use are accepted.
  for (const char* a : {"silu", "swish", "swiglu"}) {
    const std::string dir = craft(std::string("act_") + a, {}, [&](auto& c, auto&) { c["hidden_act"] = a; });
    EXPECT_EQ(Checkpoint::open(dir)->spec(0).activation, Activation::SwiGLU) << a;
  }
}

TEST_F(Crafted, DeclaredSharedExpertWithoutTensorsRefused) {
  auto drop_shared = [](auto& ts) {
    erase_if(ts, [](const std::string& n) { return n.find(".shared_expert") != std::string::npos; });
  };
  // DeepSeek: n_shared_experts = 1 (config) but no shared_experts.* tensors.
  const std::string ds = craft("ds_no_shared", drop_shared, {}, ds_);
  expect_error<FormatError>([&] { Checkpoint::open(ds); },
                            {"layer 0", "config.json", "field n_shared_experts = 1", "declares a shared expert",
                             "no tensors model.layers.0.mlp.shared_experts.*",
                             "model.layers.0.mlp.shared_experts.down_proj.weight"});
  // Qwen2 style: shared_expert_intermediate_size > 0 on a checkpoint without a shared expert.
  const std::string qw = craft("qw_no_shared", {}, [](auto& c, auto&) { c["shared_expert_intermediate_size"] = 32; });
  expect_error<FormatError>([&] { Checkpoint::open(qw); },
                            {"field shared_expert_intermediate_size = 32", "declares a shared expert"});
  // 0 declares none; a negative width is refused.
  const std::string zero = craft("qw_shared_0", {}, [](auto& c, auto&) { c["shared_expert_intermediate_size"] = 0; });
  EXPECT_EQ(Checkpoint::open(zero)->spec(0).shared_intermediate, 0);
  const std::string neg = craft("qw_shared_neg", {}, [](auto& c, auto&) { c["moe_shared_expert_intermediate_size"] = -5; });
  expect_error<FormatError>([&] { Checkpoint::open(neg); },
                            {"field moe_shared_expert_intermediate_size", "non-negative", "got -5"});
}

TEST_F(Crafted, ShapeProductsOverflowRefused) {
  // A zero-size tensor may have any other dimension (valid safetensors): I = 2 * 2^62 overflows int64.
  const std::string dir = craft("down_2p62", [](auto& ts) {
    Tensor* t = find(ts, kE + "0.down_proj.weight");
    t->shape = {0, int64_t{1} << 62};
    t->bytes.clear();
  });
  expect_error<FormatError>([&] { Checkpoint::open(dir); },
                            {"layer 0", "experts.0.down_proj.weight", "I within int64", "[0, 4611686018427387904]"});
  const std::string sh = craft("shared_down_2p62", [](auto& ts) {
    Tensor* t = find(ts, "model.layers.0.mlp.shared_experts.down_proj.weight");
    t->shape = {0, int64_t{1} << 62};
    t->bytes.clear();
  }, {}, ds_);
  expect_error<FormatError>([&] { Checkpoint::open(sh); },
                            {"shared expert tensor", "shared_experts.down_proj.weight", "I within int64",
                             "[0, 4611686018427387904]"});
  const std::string n = craft("n_shared_ovf", {}, [](auto& c, auto&) {
    c["n_shared_experts"] = int64_t{1} << 40;
    c["moe_intermediate_size"] = int64_t{1} << 40;
  }, ds_);
  expect_error<FormatError>([&] { Checkpoint::open(n); },
                            {"field n_shared_experts = 1099511627776", "moe_intermediate_size = 1099511627776", "overflow"});
}

TEST_F(Crafted, NonFiniteRouterBiasOrSharedGateRefused) {
  auto set_bf16 = [](Tensor* t, size_t i, uint16_t h) { std::memcpy(t->bytes.data() + 2 * i, &h, 2); };
  const std::string nan = craft("router_nan", [&](auto& ts) { set_bf16(find(ts, "model.layers.0.mlp.gate.weight"), 37, 0x7FC0); });
  for (bool shard : {false, true}) {
    auto ck = Checkpoint::open(nan);
    expect_error<FormatError>([&] { shard ? (void)ck->load_shard(0, ParallelConfig{}) : (void)ck->load_layer(0); },
                              {"layer 0", "tensor model.layers.0.mlp.gate.weight", "expected finite values", "got nan",
                               "index 37 ([1, 5])"});
  }
  // An F32 router finite in fp32 but inf once rounded to the bf16 MoeWeights holds.
  const std::string big = craft("router_f32_big", [](auto& ts) {
    Tensor* t = find(ts, "model.layers.0.mlp.gate.weight");
    std::vector<uint8_t> b(t->bytes.size() * 2, 0);
    const float f = 3.4e38f;
    std::memcpy(b.data() + 4 * 2, &f, 4);
    t->dtype = DType::F32;
    t->bytes = b;
  });
  expect_load_error(big, {"mlp.gate.weight", "expected finite values", "index 2", "inf once rounded to bf16"});
  // DeepSeek correction bias (F32): an Inf would put expert 3 in every token's top-k.
  const std::string bias = craft("bias_inf", [](auto& ts) {
    const float f = INFINITY;
    std::memcpy(find(ts, "model.layers.0.mlp.gate.e_score_correction_bias")->bytes.data() + 4 * 3, &f, 4);
  }, {}, ds_);
  for (bool shard : {false, true}) {
    auto ck = Checkpoint::open(bias);
    expect_error<FormatError>([&] { shard ? (void)ck->load_shard(0, ParallelConfig{}) : (void)ck->load_layer(0); },
                              {"tensor model.layers.0.mlp.gate.e_score_correction_bias", "expected finite values",
                               "got inf at index 3"});
  }
  // Qwen2's shared-expert gate (BF16 [1, H]).
  SyntheticOptions o;
  o.hidden = 32;
  o.intermediate = 32;
  o.experts = 3;
  o.top_k = 2;
  o.shared_intermediate = 32;
  const auto qw2 = gen("crafted_qw2", o);
  const std::string sg = craft("shared_gate_ninf", [&](auto& ts) {
    set_bf16(find(ts, "model.layers.0.mlp.shared_expert_gate.weight"), 7, 0xFF80);
  }, {}, &qw2);
  for (bool shard : {false, true}) {
    auto ck = Checkpoint::open(sg);
    expect_error<FormatError>([&] { shard ? (void)ck->load_shard(0, ParallelConfig{}) : (void)ck->load_layer(0); },
                              {"tensor model.layers.0.mlp.shared_expert_gate.weight", "expected finite values",
                               "got -inf at index 7"});
  }
}

// ------------------------------------------------------------------ strict JSON, index spelling, shared-expert tensors
// config.json and hf_quant_config.json: a duplicate key kept the last value silently (nlohmann's default).
TEST_F(Crafted, DuplicateJsonKeyRefused) {
  // Rewrites `file` in dir with `text` inserted after the first occurrence of `after`.
  auto inject = [](const std::string& dir, const char* file, const std::string& after, const std::string& text) {
    const fs::path p = fs::path(dir) / file;
    std::stringstream ss;
    ss << std::ifstream(p).rdbuf();
    std::string s = ss.str();
    const size_t at = s.find(after);
    ASSERT_NE(at, std::string::npos) << after << " not in " << s;
    s.insert(at + after.size(), text);
    std::ofstream(p, std::ios::trunc) << s;
  };
  const std::string top = craft("dup_config", {});
  inject(top, "config.json", "{", "\"num_experts\": 99,");
  expect_error<FormatError>([&] { Checkpoint::open(top); }, {"config.json", "duplicate key \"num_experts\""});
  const std::string nested = craft("dup_quant", {});
  inject(nested, "hf_quant_config.json", "\"quantization\": {", "\"group_size\": 32,");
  expect_error<FormatError>([&] { Checkpoint::open(nested); },
                            {"hf_quant_config.json", "duplicate key \"group_size\" in \"quantization\""});
}

// "experts.02" / "layers.00" were read as 2 / 0 (an alias of the unpadded name).
TEST_F(Crafted, ZeroPaddedIndexRefused) {
  const std::string ex = craft("padded_expert", [](auto& ts) { find(ts, kE + "2.up_proj.weight")->name = kE + "02.up_proj.weight"; });
  expect_error<FormatError>([&] { Checkpoint::open(ex); },
                            {"tensor " + kE + "02.up_proj.weight", "index \"02\" has a leading zero", "expected \"2\""});
  const std::string ly = craft("padded_layer", [](auto& ts) {
    find(ts, "model.layers.0.mlp.gate.weight")->name = "model.layers.00.mlp.gate.weight";
  });
  expect_error<FormatError>([&] { Checkpoint::open(ly); },
                            {"tensor model.layers.00.mlp.gate.weight", "index \"00\" has a leading zero"});
}

TEST_F(Crafted, SharedGateWithoutSharedExpertRefused) {
  // Qwen2's shared_expert_gate on a layer with no shared expert was ignored.
  const std::string dir = craft("gate_no_shared", [](auto& ts) {
    Tensor g = *find(ts, "model.layers.0.mlp.gate.weight");  // BF16 [3, 32]: any BF16 tensor of 32 values will do
    g.name = "model.layers.0.mlp.shared_expert_gate.weight";
    g.shape = {1, 32};
    g.bytes.resize(64);
    ts.push_back(g);
  });
  expect_error<FormatError>([&] { Checkpoint::open(dir); },
                            {"layer 0", "tensor model.layers.0.mlp.shared_expert_gate.weight",
                             "gates a shared expert, but there are no tensors model.layers.0.mlp.shared_experts.*"});
}

TEST_F(Crafted, ZeroWidthSharedExpertRefused) {
  // [H, 0] was taken as "no shared expert" (the config, without n_shared_experts, did not say otherwise).
  const std::string dir = craft("shared_width_0", [](auto& ts) {
    Tensor* t = find(ts, "model.layers.0.mlp.shared_experts.down_proj.weight");
    t->shape = {32, 0};
    t->bytes.clear();
  }, [](auto& c, auto&) { c.erase("n_shared_experts"); }, ds_);
  expect_error<FormatError>([&] { Checkpoint::open(dir); },
                            {"layer 0", "shared expert tensor model.layers.0.mlp.shared_experts.down_proj.weight",
                             "I > 0", "got [32, 0]"});
}

}  // namespace
}  // namespace nvfp4moe
