// Expert naming across model families (nvfp4-format.md section 11): Mixtral block_sparse_moe w1/w3/w2, Qwen3-Next
// (and Qwen2-MoE) shared_expert + shared_expert_gate, GLM-4.5 (glm4_moe, DeepSeek-like), Qwen decoder_sparse_step
// dense layers. Each family's checkpoint is compared with the same tensors under the Qwen/DeepSeek names: the
// loaded MoeWeights and the cpu::moe_forward outputs must be bitwise equal, so the names map to the right slots.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "io/safetensors.h"
#include "model/synthetic.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "support/checkpoint_files.h"
#include "support/test_support.h"

namespace nvfp4moe {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::ends_with;
using test::expect_error;
using test::read_json;
using test::write_json;
using Tensor = test::FileTensor;
std::vector<Tensor> read_all(const std::string& dir) { return test::read_all_tensors(dir); }
void write_dir(const std::string& dir, const std::vector<Tensor>& tensors, const json& config, const json& hf_quant) {
  test::write_checkpoint_dir(dir, tensors, config, hf_quant);
}
std::string fresh_dir(const std::string& name) { return test::fresh_dir("test_naming", name); }

bool roundtrips(float x) { return 1.0f / (1.0f / x) == x; }

using test::cpu_forward;
using test::round_robin_tokens;
using test::RoutedTokens;


std::string replace_all(std::string s, const std::string& a, const std::string& b) {
  for (size_t p = s.find(a); p != std::string::npos; p = s.find(a, p + b.size())) s.replace(p, a.size(), b);
  return s;
}

void expect_weights_equal(const MoeWeights& a, const MoeWeights& b) {
  auto stacked = [](const StackedExperts& x, const StackedExperts& y, const char* what) {
    ASSERT_EQ(x.num_experts, y.num_experts) << what;
    for (auto [p, q] : {std::pair{&x.w13, &y.w13}, {&x.w13_scale, &y.w13_scale}, {&x.w2, &y.w2}, {&x.w2_scale, &y.w2_scale}}) {
      ASSERT_EQ(p->size(), q->size()) << what;
      EXPECT_EQ(0, std::memcmp(p->data(), q->data(), p->size())) << what;
    }
    EXPECT_EQ(x.w13_gate_scale2, y.w13_gate_scale2) << what;
    EXPECT_EQ(x.w13_up_scale2, y.w13_up_scale2) << what;
    EXPECT_EQ(x.w13_input_scale, y.w13_input_scale) << what;
    EXPECT_EQ(x.w2_scale2, y.w2_scale2) << what;
    EXPECT_EQ(x.w2_input_scale, y.w2_input_scale) << what;
  };
  stacked(a.experts, b.experts, "experts");
  stacked(a.shared, b.shared, "shared");
  EXPECT_EQ(a.router_weight, b.router_weight);
  EXPECT_EQ(a.router_bias, b.router_bias);
  EXPECT_EQ(a.shared_gate_weight, b.shared_gate_weight);
}

// Both layers run through cpu::moe_forward (both modes) and the public MoeLayer with router logits.
void expect_same_outputs(const MoeWeights& a, const MoeWeights& b) {
  const RoutedTokens k = round_robin_tokens(a.spec, 7, 11);
  for (Mode m : {Mode::W4A16, Mode::W4A4}) {
    const auto oa = cpu_forward(a, m, k), ob = cpu_forward(b, m, k);
    ASSERT_EQ(oa.size(), ob.size());
    EXPECT_EQ(0, std::memcmp(oa.data(), ob.data(), oa.size() * 4)) << mode_name(m);
    double l2 = 0;
    for (float x : oa) l2 += double(x) * x;
    EXPECT_GT(l2, 0.0) << mode_name(m);
  }
}

std::string gen(const std::string& name, const model::SyntheticOptions& o) {
  return model::generate_synthetic_checkpoint(fresh_dir(name), o).dir;
}

// A copy of `src` with tensor names rewritten by `rename` and config.json by `cfg`.
std::string rewrite(const std::string& src, const std::string& name, const std::function<std::string(std::string)>& rename,
                    const std::function<void(json&)>& cfg = {}) {
  auto ts = read_all(src);
  if (rename)
    for (auto& t : ts) t.name = rename(t.name);
  json c = read_json(fs::path(src) / "config.json");
  if (cfg) cfg(c);
  const std::string dir = fresh_dir(name);
  write_dir(dir, ts, c, read_json(fs::path(src) / "hf_quant_config.json"));
  return dir;
}

TEST(Naming, MixtralBlockSparseMoeW1W3W2) {
  model::SyntheticOptions o;
  o.preset = "mixtral-8x7b";
  o.hidden = 64;
  o.intermediate = 32;
  o.experts = 4;
  o.layers = 2;
  const std::string mix = gen("mixtral", o);
  // the same tensors under Qwen/DeepSeek names: w1 -> gate_proj, w3 -> up_proj, w2 -> down_proj
  const std::string hf = rewrite(mix, "mixtral_as_hf", [](std::string n) {
    n = replace_all(n, ".block_sparse_moe.", ".mlp.");
    n = replace_all(n, ".w1.", ".gate_proj.");
    n = replace_all(n, ".w3.", ".up_proj.");
    return replace_all(n, ".w2.", ".down_proj.");
  });
  auto a = Checkpoint::open(mix);
  auto b = Checkpoint::open(hf);
  ASSERT_EQ(a->moe_layers(), (std::vector<int>{0, 1}));
  EXPECT_EQ(a->layers()[1].prefix, "model.layers.1.block_sparse_moe");
  EXPECT_TRUE(a->spec(1).norm_topk_prob);  // Mixtral renormalizes the top-k weights
  EXPECT_EQ(a->spec(1).shared_intermediate, 0);
  EXPECT_NE(a->inspect().find("(Mixtral names)"), std::string::npos);
  for (int l : {0, 1}) {
    const MoeWeights wa = a->load_layer(l), wb = b->load_layer(l);
    EXPECT_EQ(wa.spec.describe(), wb.spec.describe());
    expect_weights_equal(wa, wb);
    expect_same_outputs(wa, wb);
  }
  // the public layer, routed by the checkpoint's own router
  MoeLayerOptions opt;
  auto layer = MoeLayer::create(*a, 1, opt);
  const MoeWeights w = a->load_layer(1);
  const RoutedTokens k = round_robin_tokens(w.spec, 4, 2);
  std::vector<float> logits(static_cast<size_t>(4 * w.spec.num_experts)), out(static_cast<size_t>(4 * w.spec.hidden));
  cpu::router_logits(w, k.hidden.data(), 4, logits.data());
  auto ref_of = [](const void* p, DType d, std::vector<int64_t> shape) {
    TensorRef t;
    t.data = const_cast<void*>(p);
    t.dtype = d;
    t.shape = std::move(shape);
    return t;
  };
  const TensorRef h = ref_of(k.hidden.data(), DType::BF16, {4, w.spec.hidden});
  const TensorRef lg = ref_of(logits.data(), DType::F32, {4, w.spec.num_experts});
  const TensorRef ot = ref_of(out.data(), DType::F32, {4, w.spec.hidden});
  RoutingArgs r;
  r.router_logits = &lg;
  EXPECT_NO_THROW(layer->forward(h, r, ot));
  for (float x : out) EXPECT_TRUE(std::isfinite(x));
}

TEST(Naming, Qwen3NextSharedExpertWithSigmoidGate) {
  model::SyntheticOptions o;  // Qwen2-MoE style: mlp.shared_expert.* + mlp.shared_expert_gate.weight
  o.hidden = 64;
  o.intermediate = 32;
  o.experts = 4;
  o.top_k = 2;
  o.shared_intermediate = 48;
  o.layers = 3;
  o.first_dense_layers = 1;
  const std::string q2 = gen("qwen2moe", o);
  // Qwen3-Next's config: model_type qwen3_next, same MoE keys, hybrid attention keys the MoE loader ignores
  const std::string q3n = rewrite(q2, "qwen3_next", {}, [](json& c) {
    c["model_type"] = "qwen3_next";
    c["architectures"] = {"Qwen3NextForCausalLM"};
    c["full_attention_interval"] = 4;
    c["linear_num_value_heads"] = 32;
  });
  auto a = Checkpoint::open(q3n);
  auto b = Checkpoint::open(q2);
  EXPECT_EQ(a->moe_layers(), (std::vector<int>{1, 2}));
  EXPECT_FALSE(a->layers()[0].is_moe);
  EXPECT_NE(a->inspect().find("dense layers: 0"), std::string::npos) << a->inspect();
  for (int l : {1, 2}) {
    const MoeSpec s = a->spec(l);
    EXPECT_EQ(s.shared_intermediate, 48);
    EXPECT_TRUE(s.shared_expert_gated);
    const MoeWeights wa = a->load_layer(l), wb = b->load_layer(l);
    EXPECT_EQ(wa.shared_gate_weight.size(), 64u);
    expect_weights_equal(wa, wb);
    expect_same_outputs(wa, wb);
    // the sigmoid gate is applied: an all-zero gate (sigmoid 0 = 1/2) changes the output
    MoeWeights wz = a->load_layer(l);
    std::fill(wz.shared_gate_weight.begin(), wz.shared_gate_weight.end(), uint16_t(0));
    const RoutedTokens k = round_robin_tokens(wa.spec, 5, 3);
    EXPECT_NE(cpu_forward(wa, Mode::W4A16, k), cpu_forward(wz, Mode::W4A16, k));
  }
}

TEST(Naming, Glm4MoeIsDeepSeekLikeWithDenseLayers) {
  model::SyntheticOptions o;
  o.preset = "deepseek-v3";
  o.hidden = 64;
  o.intermediate = 32;
  o.shared_intermediate = 32;
  o.experts = 8;
  o.layers = 3;
  o.first_dense_layers = 1;
  const std::string ds = gen("deepseek", o);
  // GLM-4.5 config: glm4_moe, sigmoid routing implied by the model type (no scoring_func / topk_method keys)
  const std::string glm = rewrite(ds, "glm4_moe", {}, [](json& c) {
    c["model_type"] = "glm4_moe";
    c["architectures"] = {"Glm4MoeForCausalLM"};
    c.erase("scoring_func");
    c.erase("topk_method");
  });
  auto a = Checkpoint::open(glm);
  auto b = Checkpoint::open(ds);
  EXPECT_EQ(a->moe_layers(), (std::vector<int>{1, 2}));
  EXPECT_FALSE(a->layers()[0].is_moe);
  EXPECT_NE(a->inspect().find("dense layers: 0"), std::string::npos);
  try {
    a->spec(0);
    ADD_FAILURE() << "spec(0) of a dense layer must throw";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("dense layer"), std::string::npos) << e.what();
  }
  const MoeSpec s = a->spec(1);
  EXPECT_EQ(s.routing, Routing::SigmoidGroupedTopK);
  EXPECT_TRUE(s.has_router_bias);
  EXPECT_EQ(s.shared_intermediate, 32);
  EXPECT_EQ(s.describe(), b->spec(1).describe());
  const MoeWeights wa = a->load_layer(2), wb = b->load_layer(2);
  expect_weights_equal(wa, wb);
  expect_same_outputs(wa, wb);
}

TEST(Naming, QwenDecoderSparseStepDenseLayersReported) {
  model::SyntheticOptions o;
  o.hidden = 32;
  o.intermediate = 32;
  o.experts = 3;
  o.top_k = 2;
  o.layers = 2;
  o.first_dense_layers = 1;
  const std::string q = gen("qwen3_dense", o);
  // decoder_sparse_step 2: layer L is MoE when (L + 1) % 2 == 0, i.e. layer 0 dense, layer 1 MoE
  const std::string d = rewrite(q, "qwen3_sparse_step", {}, [](json& c) {
    c["mlp_only_layers"] = json::array();
    c["decoder_sparse_step"] = 2;
  });
  auto ck = Checkpoint::open(d);
  EXPECT_EQ(ck->moe_layers(), (std::vector<int>{1}));
  EXPECT_EQ(ck->layers()[0].prefix, "model.layers.0.mlp");
  EXPECT_NE(ck->inspect().find("layers: 2 (1 MoE, 1 dense)"), std::string::npos) << ck->inspect();
  // a step that makes the MoE layer dense disagrees with the tensors: refused naming the layer
  const std::string bad = rewrite(q, "qwen3_bad_step", {}, [](json& c) {
    c["mlp_only_layers"] = json::array();
    c["decoder_sparse_step"] = 3;
  });
  try {
    Checkpoint::open(bad);
    ADD_FAILURE() << "expected a FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace nvfp4moe
