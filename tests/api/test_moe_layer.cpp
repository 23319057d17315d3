// Tests of the public MoeLayer API (src/api/moe_layer.cpp) on the cpu backend: backend selection, forward in
// every input/output/routing form against cpu::route + cpu::moe_forward (bitwise), T = 0, shared-max input
// scales, calibration, and every refusal of validate_forward_args with its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cpu/reference.h"
#include "format/nvfp4.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "support/test_support.h"

namespace nvfp4moe {
namespace {

using test::cpu_tensor;

MoeSpec softmax_spec() {
  MoeSpec s = test::small_spec(80, 48, 6, 2);
  s.shared_intermediate = 32;
  return s;
}

MoeSpec deepseek_spec() {
  MoeSpec s = test::small_spec(64, 32, 8, 3);
  s.routing = Routing::SigmoidGroupedTopK;
  s.n_group = 4;
  s.topk_group = 2;
  s.routed_scaling_factor = 2.5f;
  s.has_router_bias = true;
  s.shared_intermediate = 64;
  return s;
}

std::unique_ptr<MoeLayer> make_layer(const MoeSpec& spec, Mode mode, int64_t max_tokens = 64, bool shared_max = false,
                                     uint64_t seed = 1) {
  MoeLayerOptions o;
  o.mode = mode;
  o.max_tokens = max_tokens;
  o.shared_max_input_scale = shared_max;
  test::RandomWeightsOptions r;
  r.seed = seed;
  return MoeLayer::create(test::random_weights(spec, r), o);
}

std::vector<float> expected(const MoeWeights& w, Mode mode, const std::vector<uint16_t>& hidden, int64_t T,
                            const std::vector<float>& logits) {
  const int64_t K = w.spec.top_k;
  std::vector<int32_t> ids(T * K);
  std::vector<float> ws(T * K), out(T * w.spec.hidden);
  cpu::route(w.spec, logits.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(), T, ids.data(), ws.data());
  cpu::moe_forward(w, mode, hidden.data(), T, ids.data(), ws.data(), out.data());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(Backend, Names) {
  Backend b = Backend::Cuda;
  EXPECT_TRUE(backend_from_name("cpu", &b));
  EXPECT_EQ(b, Backend::Cpu);
  EXPECT_TRUE(backend_from_name("cuda", &b));
  EXPECT_EQ(b, Backend::Cuda);
  EXPECT_FALSE(backend_from_name("tpu", &b));
  EXPECT_STREQ(backend_name(Backend::Cpu), "cpu");
  EXPECT_STREQ(backend_name(Backend::Cuda), "cuda");
#if !defined(NVFP4MOE_WITH_CUDA)
  EXPECT_FALSE(cuda_backend_available());
  MoeLayerOptions o;
  o.backend = Backend::Cuda;
  try {
    MoeLayer::create(test::random_weights(softmax_spec()), o);
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("built without CUDA"), std::string::npos) << e.what();
  }
#endif
}

TEST(MoeLayerCpu, CreateRefusals) {
  MoeLayerOptions o;
  o.max_tokens = -1;
  EXPECT_THROW(MoeLayer::create(test::random_weights(softmax_spec()), o), ArgumentError);
  MoeWeights w = test::random_weights(softmax_spec());
  w.experts.w2_input_scale.pop_back();
  try {
    MoeLayer::create(std::move(w), MoeLayerOptions{});
    FAIL() << "expected ArgumentError";
  } catch (const ArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("w2_input_scale"), std::string::npos) << e.what();
  }
}

// routed_scaling_factor multiplies every routed weight: inf (or a config's 1e39, inf as a float) would make every
// output NaN, so the spec refuses it as it refuses NaN and <= 0, naming the field and the value.
TEST(MoeSpec, RefusesNonFiniteScaling) {
  for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(), 0.0f, -1.0f}) {
    MoeSpec s = deepseek_spec();
    s.routed_scaling_factor = bad;
    try {
      s.validate();
      ADD_FAILURE() << "routed_scaling_factor = " << bad << " was accepted";
    } catch (const ArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("routed_scaling_factor"), std::string::npos) << e.what();
    }
  }
  MoeSpec s = deepseek_spec();
  s.routed_scaling_factor = std::numeric_limits<float>::max();
  EXPECT_NO_THROW(s.validate());
}

TEST(MoeLayerCpu, ForwardFormsMatchReference) {
  for (const MoeSpec& spec : {softmax_spec(), deepseek_spec()})
    for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
      const MoeWeights w = test::random_weights(spec);
      auto layer = make_layer(spec, mode);
      EXPECT_EQ(layer->spec().hidden, spec.hidden);
      EXPECT_EQ(layer->options().mode, mode);
      EXPECT_EQ(layer->weight_bytes(), w.packed_bytes());
      const int64_t T = 13, H = spec.hidden, E = spec.num_experts, K = spec.top_k;
      const auto hidden = test::random_hidden_bf16(T, H, 3);
      const auto logits = test::random_logits(T, E, 4);
      const auto want = expected(w, mode, hidden, T, logits);
      // BF16 hidden + logits -> F32 out.
      std::vector<float> out(T * H, -1.0f);
      TensorRef h = cpu_tensor(hidden.data(), DType::BF16, {T, H});
      TensorRef l = cpu_tensor(logits.data(), DType::F32, {T, E});
      TensorRef o = cpu_tensor(out.data(), DType::F32, {T, H});
      RoutingArgs rl;
      rl.router_logits = &l;
      layer->forward(h, rl, o);
      EXPECT_TRUE(same_bits(out, want)) << spec.describe() << " " << mode_name(mode);
      // F32 hidden (not bf16-exact): rounded to bf16 first.
      std::vector<float> hf = test::random_hidden_f32(T, H, 3, 1.0f, false);
      std::vector<uint16_t> hb(hf.size());
      for (size_t i = 0; i < hf.size(); ++i) hb[i] = fmt::bf16_from_float(hf[i]);
      TensorRef hF = cpu_tensor(hf.data(), DType::F32, {T, H});
      layer->forward(hF, rl, o);
      EXPECT_TRUE(same_bits(out, expected(w, mode, hb, T, logits))) << "f32 hidden";
      // BF16 out = bf16 of the f32 result.
      std::vector<uint16_t> outb(T * H);
      TensorRef ob = cpu_tensor(outb.data(), DType::BF16, {T, H});
      layer->forward(h, rl, ob);
      for (int64_t i = 0; i < T * H; ++i) ASSERT_EQ(outb[i], fmt::bf16_from_float(want[i])) << i;
      // Given ids/weights (with an unused slot) = cpu::moe_forward on them.
      std::vector<int32_t> ids;
      std::vector<float> ws;
      test::random_topk(T, E, K, 5, &ids, &ws, 0.2f);
      TensorRef ti = cpu_tensor(ids.data(), DType::I32, {T, K});
      TensorRef tw = cpu_tensor(ws.data(), DType::F32, {T, K});
      RoutingArgs rt;
      rt.topk_ids = &ti;
      rt.topk_weights = &tw;
      layer->forward(h, rt, o);
      std::vector<float> want2(T * H);
      cpu::moe_forward(w, mode, hidden.data(), T, ids.data(), ws.data(), want2.data());
      EXPECT_TRUE(same_bits(out, want2)) << "topk form";
      // T = 0 with null pointers.
      TensorRef h0 = cpu_tensor(nullptr, DType::BF16, {0, H});
      TensorRef l0 = cpu_tensor(nullptr, DType::F32, {0, E});
      TensorRef o0 = cpu_tensor(nullptr, DType::F32, {0, H});
      RoutingArgs r0;
      r0.router_logits = &l0;
      EXPECT_NO_THROW(layer->forward(h0, r0, o0));
      // An out-of-range id is refused with its position.
      ids[3 * K + 1] = static_cast<int32_t>(E);
      try {
        layer->forward(h, rt, o);
        FAIL() << "expected ArgumentError";
      } catch (const ArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find("topk_ids[3, 1]"), std::string::npos) << e.what();
      }
    }
}

TEST(MoeLayerCpu, SharedMaxInputScale) {
  const MoeSpec spec = softmax_spec();
  MoeWeights w = test::random_weights(spec);
  use_shared_max_input_scales(w);
  auto layer = make_layer(spec, Mode::W4A4, 64, true);
  const int64_t T = 9, H = spec.hidden;
  const auto hidden = test::random_hidden_bf16(T, H, 6);
  const auto logits = test::random_logits(T, spec.num_experts, 7);
  std::vector<float> out(T * H);
  TensorRef h = cpu_tensor(hidden.data(), DType::BF16, {T, H});
  TensorRef l = cpu_tensor(logits.data(), DType::F32, {T, spec.num_experts});
  TensorRef o = cpu_tensor(out.data(), DType::F32, {T, H});
  RoutingArgs rl;
  rl.router_logits = &l;
  layer->forward(h, rl, o);
  EXPECT_TRUE(same_bits(out, expected(w, Mode::W4A4, hidden, T, logits)));
  // ... and differs from the per-expert scales.
  auto per_expert = make_layer(spec, Mode::W4A4, 64, false);
  std::vector<float> out2(T * H);
  TensorRef o2 = cpu_tensor(out2.data(), DType::F32, {T, H});
  per_expert->forward(h, rl, o2);
  EXPECT_FALSE(same_bits(out, out2));
}

TEST(MoeLayerCpu, Calibration) {
  const MoeSpec spec = softmax_spec();
  MoeWeights w = test::random_weights(spec);
  auto layer = make_layer(spec, Mode::W4A4);
  EXPECT_THROW(layer->end_calibration(), ArgumentError);
  const int64_t T = 24, H = spec.hidden, K = spec.top_k, E = spec.num_experts;
  const auto hidden = test::random_hidden_bf16(T, H, 8);
  std::vector<int32_t> ids;
  std::vector<float> ws;
  test::random_topk(T, E, K, 9, &ids, &ws);
  for (auto& id : ids)
    if (id == 2) id = -1;  // expert 2 sees no tokens
  std::vector<float> out(T * H);
  TensorRef h = cpu_tensor(hidden.data(), DType::BF16, {T, H});
  TensorRef ti = cpu_tensor(ids.data(), DType::I32, {T, K});
  TensorRef tw = cpu_tensor(ws.data(), DType::F32, {T, K});
  TensorRef o = cpu_tensor(out.data(), DType::F32, {T, H});
  RoutingArgs rt;
  rt.topk_ids = &ti;
  rt.topk_weights = &tw;
  layer->begin_calibration();
  // Two batches (the first half, then all): the amax is over both.
  TensorRef h_half = cpu_tensor(hidden.data(), DType::BF16, {T / 2, H});
  TensorRef ti_half = cpu_tensor(ids.data(), DType::I32, {T / 2, K});
  TensorRef tw_half = cpu_tensor(ws.data(), DType::F32, {T / 2, K});
  TensorRef o_half = cpu_tensor(out.data(), DType::F32, {T / 2, H});
  RoutingArgs rh;
  rh.topk_ids = &ti_half;
  rh.topk_weights = &tw_half;
  layer->forward(h_half, rh, o_half);
  layer->forward(h, rt, o);
  layer->end_calibration();
  // Expected: the stats of one forward over all tokens with the checkpoint's scales.
  cpu::CalibrationStats st;
  std::vector<float> tmp(T * H);
  cpu::moe_forward(w, Mode::W4A4, hidden.data(), T, ids.data(), ws.data(), tmp.data(), &st);
  const float mx1 = *std::max_element(st.gemm1_amax.begin(), st.gemm1_amax.end());
  const float mx2 = *std::max_element(st.gemm2_amax.begin(), st.gemm2_amax.end());
  ASSERT_EQ(st.gemm1_amax[2], 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    w.experts.w13_input_scale[e] = (st.gemm1_amax[e] > 0 ? st.gemm1_amax[e] : mx1) / 2688.0f;
    w.experts.w2_input_scale[e] = (st.gemm2_amax[e] > 0 ? st.gemm2_amax[e] : mx2) / 2688.0f;
  }
  w.shared.w13_input_scale[0] = st.shared_gemm1_amax[0] / 2688.0f;
  w.shared.w2_input_scale[0] = st.shared_gemm2_amax[0] / 2688.0f;
  layer->forward(h, rt, o);
  std::vector<float> want(T * H);
  cpu::moe_forward(w, Mode::W4A4, hidden.data(), T, ids.data(), ws.data(), want.data());
  EXPECT_TRUE(same_bits(out, want));
  EXPECT_THROW(layer->end_calibration(), ArgumentError);
}

// ------------------------------------------------------------------------------------------ refusals
class Refusals : public ::testing::Test {
 protected:
  void SetUp() override {
    spec = softmax_spec();
    opt.max_tokens = 16;
    hidden.assign(T * spec.hidden + 8, 0);
    logits.assign(T * spec.num_experts + 8, 0.0f);
    out.assign(T * spec.hidden + 8, 0.0f);
    ids.assign(T * spec.top_k + 8, 0);
    ws.assign(T * spec.top_k + 8, 0.0f);
    h = cpu_tensor(hidden.data(), DType::BF16, {T, spec.hidden});
    l = cpu_tensor(logits.data(), DType::F32, {T, spec.num_experts});
    o = cpu_tensor(out.data(), DType::F32, {T, spec.hidden});
    ti = cpu_tensor(ids.data(), DType::I32, {T, spec.top_k});
    tw = cpu_tensor(ws.data(), DType::F32, {T, spec.top_k});
  }
  RoutingArgs logits_form() {
    RoutingArgs r;
    r.router_logits = &l;
    return r;
  }
  RoutingArgs topk_form() {
    RoutingArgs r;
    r.topk_ids = &ti;
    r.topk_weights = &tw;
    return r;
  }
  // Expects an ArgumentError containing every substring.
  void refused(const TensorRef& hh, const RoutingArgs& r, const TensorRef& oo, std::vector<std::string> parts,
               DeviceType dev = DeviceType::CPU) {
    try {
      validate_forward_args(spec, opt, hh, r, oo, dev);
      ADD_FAILURE() << "not refused; expected: " << parts[0];
    } catch (const ArgumentError& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " / " << p;
    }
  }
  static constexpr int64_t T = 8;
  MoeSpec spec;
  MoeLayerOptions opt;
  std::vector<uint16_t> hidden;
  std::vector<float> logits, out, ws;
  std::vector<int32_t> ids;
  TensorRef h, l, o, ti, tw;
};

TEST_F(Refusals, ValidArgumentsPass) {
  EXPECT_NO_THROW(validate_forward_args(spec, opt, h, logits_form(), o, DeviceType::CPU));
  EXPECT_NO_THROW(validate_forward_args(spec, opt, h, topk_form(), o, DeviceType::CPU));
  TensorRef hf = h, ob = o;
  hf.dtype = DType::F32;
  ob.dtype = DType::BF16;
  EXPECT_NO_THROW(validate_forward_args(spec, opt, hf, logits_form(), ob, DeviceType::CPU));
  TensorRef h0 = cpu_tensor(nullptr, DType::BF16, {0, spec.hidden}), o0 = cpu_tensor(nullptr, DType::F32, {0, spec.hidden});
  TensorRef l0 = cpu_tensor(nullptr, DType::F32, {0, spec.num_experts});
  RoutingArgs r0;
  r0.router_logits = &l0;
  EXPECT_NO_THROW(validate_forward_args(spec, opt, h0, r0, o0, DeviceType::CPU));
  // T == max_tokens is fine.
  TensorRef h16 = cpu_tensor(nullptr, DType::BF16, {16, spec.hidden});
  EXPECT_THROW(validate_forward_args(spec, opt, h16, logits_form(), o, DeviceType::CPU), ArgumentError);  // null data
}

TEST_F(Refusals, Hidden) {
  TensorRef b = h;
  b.dtype = DType::F16;
  refused(b, logits_form(), o, {"hidden", "wrong dtype", "BF16 or F32", "F16[8, 80] on cpu"});
  b = h;
  b.shape = {T, spec.hidden, 1};
  refused(b, logits_form(), o, {"hidden", "rank", "BF16[8, 80, 1]"});
  b = h;
  b.shape = {T, spec.hidden + 16};
  refused(b, logits_form(), o, {"hidden", "wrong shape", "[8, 80]", "BF16[8, 96]"});
  b = h;
  b.strides = {1, T};
  refused(b, logits_form(), o, {"hidden", "not contiguous", "non-contiguous"});
  b = h;
  b.device = DeviceType::CUDA;
  refused(b, logits_form(), o, {"hidden", "wrong device", "on cpu", "cuda:0"});
  b = h;
  b.data = nullptr;
  refused(b, logits_form(), o, {"hidden", "null"});
  b = cpu_tensor(hidden.data(), DType::BF16, {17, spec.hidden});
  TensorRef o17 = cpu_tensor(out.data(), DType::F32, {17, spec.hidden});
  refused(b, logits_form(), o17, {"hidden", "17", "max_tokens = 16"});
  b = cpu_tensor(hidden.data(), DType::BF16, {-1, spec.hidden});
  refused(b, logits_form(), o, {"hidden", "T >= 0"});
}

TEST_F(Refusals, Out) {
  TensorRef b = o;
  b.dtype = DType::F16;
  refused(h, logits_form(), b, {"out", "wrong dtype", "F32 or BF16", "F16[8, 80]"});
  b = o;
  b.shape = {T + 1, spec.hidden};
  refused(h, logits_form(), b, {"out", "wrong shape", "F32[9, 80]"});
  b = o;
  b.shape = {T * spec.hidden};
  refused(h, logits_form(), b, {"out", "rank"});
  b = o;
  b.data = nullptr;
  refused(h, logits_form(), b, {"out", "null"});
  b = o;
  b.strides = {spec.hidden * 2, 1};
  refused(h, logits_form(), b, {"out", "not contiguous"});
  b = o;
  b.device = DeviceType::CUDA;
  refused(h, logits_form(), b, {"out", "wrong device"});
}

TEST_F(Refusals, RoutingForms) {
  refused(h, RoutingArgs{}, o, {"routing", "exactly one", "neither"});
  RoutingArgs both = topk_form();
  both.router_logits = &l;
  refused(h, both, o, {"routing", "exactly one", "both"});
  RoutingArgs only_ids;
  only_ids.topk_ids = &ti;
  refused(h, only_ids, o, {"topk_weights", "together with topk_ids"});
  RoutingArgs only_w;
  only_w.topk_weights = &tw;
  refused(h, only_w, o, {"topk_ids", "together with topk_weights"});
}

TEST_F(Refusals, Logits) {
  TensorRef b = l;
  b.dtype = DType::BF16;
  RoutingArgs r;
  r.router_logits = &b;
  refused(h, r, o, {"router_logits", "wrong dtype", "F32[8, 6]", "BF16[8, 6]"});
  b = l;
  b.shape = {T, spec.num_experts + 1};
  refused(h, r, o, {"router_logits", "wrong shape", "F32[8, 7]"});
  b = l;
  b.shape = {T - 1, spec.num_experts};
  refused(h, r, o, {"router_logits", "wrong shape", "[7, 6]"});
  b = l;
  b.data = nullptr;
  refused(h, r, o, {"router_logits", "null"});
  b = l;
  b.device = DeviceType::CUDA;
  refused(h, r, o, {"router_logits", "wrong device"});
  b = l;
  b.data = reinterpret_cast<uint8_t*>(logits.data()) + 2;
  refused(h, r, o, {"router_logits", "4-byte aligned"});
}

TEST_F(Refusals, TopK) {
  TensorRef bi = ti, bw = tw;
  RoutingArgs r;
  r.topk_ids = &bi;
  r.topk_weights = &bw;
  bi.dtype = DType::I64;
  refused(h, r, o, {"topk_ids", "wrong dtype", "I32[8, 2]", "I64[8, 2]"});
  bi = ti;
  bi.shape = {T, spec.top_k + 1};
  refused(h, r, o, {"topk_ids", "wrong shape", "I32[8, 3]"});
  bi = ti;
  bi.data = nullptr;
  refused(h, r, o, {"topk_ids", "null"});
  bi = ti;
  bw.dtype = DType::F16;
  refused(h, r, o, {"topk_weights", "wrong dtype", "F16[8, 2]"});
  bw = tw;
  bw.shape = {T + 1, spec.top_k};
  refused(h, r, o, {"topk_weights", "wrong shape", "F32[9, 2]"});
  bw = tw;
  bw.shape = {T};
  refused(h, r, o, {"topk_weights", "rank"});
}

TEST_F(Refusals, CudaDeviceAndAlignment) {
  auto dev = [](TensorRef t) {
    t.device = DeviceType::CUDA;
    return t;
  };
  TensorRef dh = dev(h), dl = dev(l), doo = dev(o), di = dev(ti), dw = dev(tw);
  RoutingArgs r;
  r.router_logits = &dl;
  EXPECT_NO_THROW(validate_forward_args(spec, opt, dh, r, doo, DeviceType::CUDA));
  refused(h, r, doo, {"hidden", "wrong device", "on cuda", "on cpu"}, DeviceType::CUDA);
  TensorRef mis = dh;
  mis.data = reinterpret_cast<uint8_t*>(hidden.data()) + 2;  // BF16-aligned, not 16-byte aligned
  refused(mis, r, doo, {"hidden", "16-byte aligned"}, DeviceType::CUDA);
  mis = doo;
  mis.data = reinterpret_cast<uint8_t*>(out.data()) + 4;
  refused(dh, r, mis, {"out", "16-byte aligned"}, DeviceType::CUDA);
  TensorRef other = dh;
  other.device_id = 1;
  refused(other, r, doo, {"hidden", "cuda:0", "cuda:1"}, DeviceType::CUDA);
  RoutingArgs rt;
  rt.topk_ids = &di;
  rt.topk_weights = &dw;
  EXPECT_NO_THROW(validate_forward_args(spec, opt, dh, rt, doo, DeviceType::CUDA));
  TensorRef misi = di;
  misi.data = reinterpret_cast<uint8_t*>(ids.data()) + 1;
  rt.topk_ids = &misi;
  refused(dh, rt, doo, {"topk_ids", "4-byte aligned"}, DeviceType::CUDA);
}

TEST_F(Refusals, LayerForwardRunsTheChecks) {
  auto layer = MoeLayer::create(test::random_weights(spec), opt);
  TensorRef b = h;
  b.dtype = DType::F16;
  EXPECT_THROW(layer->forward(b, logits_form(), o), ArgumentError);
  TensorRef dh = h;
  dh.device = DeviceType::CUDA;
  EXPECT_THROW(layer->forward(dh, logits_form(), o), ArgumentError);
  EXPECT_NO_THROW(layer->forward(h, logits_form(), o));
}

}  // namespace
}  // namespace nvfp4moe
