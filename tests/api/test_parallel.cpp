// Expert parallel + tensor parallel sharding on the CPU (include/nvfp4moe/parallel.h, docs/parallel.md):
// the expert map and the TP split, the rank-by-rank CPU layer whose partial outputs sum to the unsharded
// layer, the fixed-order combine that makes EP bitwise equal, and Checkpoint::load_shard == slice_weights.
//
// Tolerances (u = 2^-24, fp32 round-off):
//   - EP, fixed-order combine (cpu::run_ranks `combined`, tp = 1): bitwise.
//   - EP, all-reduce of partial outputs: the same k (+1 shared) terms w_j * y_j added in another grouping, so
//     |diff| <= 2 (k + 2) u S with S[t, c] = sum_j |w_j y_j[c]| + |shared[c]| (computed from the unsharded
//     layer's own slot outputs; first-order bound of two summation orders).
//   - TP: GEMM2's K = I sum is split into tp partial sums (each times alpha), then added: |diff| <= (2 I + 4 k + 8)
//     u A with A[t, c] = sum_j |w_j| alpha_j sum_i |a_i W_ci| (+ shared): the absolute-value layer. A is exact
//     for relu2 (a >= 0) with |W2| (sign bits cleared), which the TP test runs; for SwiGLU layers the same
//     bound is checked with S * sqrt(I) in place of A (A cannot be formed from outside the reference; on
//     these random layers the worst observed error is 377 u S against a bound of ~3000 u S).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "cpu/reference.h"
#include "cpu/shard.h"
#include "format/nvfp4.h"
#include "model/synthetic.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "nvfp4moe/parallel.h"
#include "support/checkpoint_files.h"
#include "support/test_support.h"

namespace nvfp4moe {
namespace {

using test::expect_error;
constexpr double kU = 5.9604644775390625e-08;  // 2^-24

// ------------------------------------------------------------------ plan
TEST(Plan, ExpertMapIsContiguousAndBalanced) {
  ExpertMap m{5, 2};
  EXPECT_EQ(m.begin(0), 0);
  EXPECT_EQ(m.end(0), 3);
  EXPECT_EQ(m.begin(1), 3);
  EXPECT_EQ(m.end(1), 5);
  for (int64_t e = 0; e < 5; ++e) EXPECT_EQ(m.owner(e), e < 3 ? 0 : 1);
  ExpertMap d{256, 8};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(d.end(r) - d.begin(r), 32);
  ExpertMap s{6, 6};
  for (int r = 0; r < 6; ++r) EXPECT_EQ(s.begin(r), r);
}

TEST(Plan, TpSplitAndSharedExpertOwner) {
  MoeSpec spec = test::small_spec(64, 128, 6, 2);
  spec.shared_intermediate = 64;
  for (int r = 0; r < 4; ++r) {
    const ShardPlan p = plan_shard(spec, ParallelConfig::of_rank(2, 2, r));
    EXPECT_EQ(p.parallel.rank(), r);
    EXPECT_EQ(p.expert_begin, (r / 2) * 3);
    EXPECT_EQ(p.local_experts(), 3);
    EXPECT_EQ(p.inter_begin, (r % 2) * 64);
    EXPECT_EQ(p.local_intermediate(), 64);
    EXPECT_EQ(p.has_shared, r / 2 == 0);  // EP rank 0 holds the shared expert, TP-split
    if (p.has_shared) EXPECT_EQ(p.shared_begin, (r % 2) * 32);
  }
}

TEST(Plan, RefusesBadSplits) {
  MoeSpec spec = test::small_spec(64, 96, 4, 2);
  EXPECT_NO_THROW(plan_shard(spec, {1, 0, 2, 0}));  // 48-wide slices
  expect_error<ArgumentError>([&] { plan_shard(spec, {1, 0, 4, 0}); },
                              {"tp_size = 4", "intermediate (I) = 96", "16-element boundaries", "NVFP4 scale block"});
  expect_error<ArgumentError>([&] { plan_shard(spec, {1, 0, 5, 0}); }, {"tp_size = 5", "96"});
  MoeSpec s128 = test::small_spec(64, 128, 4, 2);
  EXPECT_NO_THROW(plan_shard(s128, {1, 0, 4, 0}));  // 32-wide slices: fine on 16
  expect_error<ArgumentError>([&] { plan_shard(s128, {1, 0, 4, 0}, 64); }, {"64-element boundaries", "GEMM k-tile"});
  EXPECT_NO_THROW(plan_shard(s128, {1, 0, 2, 1}, 64));
  expect_error<ArgumentError>([&] { plan_shard(spec, {5, 0, 1, 0}); }, {"ep_size = 5", "num_experts = 4"});
  expect_error<ArgumentError>([&] { plan_shard(spec, {2, 2, 1, 0}); }, {"ep_rank", "got 2"});
  expect_error<ArgumentError>([&] { plan_shard(spec, {0, 0, 1, 0}); }, {"ep_size", ">= 1"});
  MoeSpec sh = test::small_spec(64, 128, 4, 2);
  sh.shared_intermediate = 48;
  expect_error<ArgumentError>([&] { plan_shard(sh, {1, 0, 2, 0}); }, {"shared_intermediate = 48"});
  EXPECT_NO_THROW(plan_shard(sh, {4, 3, 1, 0}));  // EP alone never splits I
}

TEST(Plan, RefusesOverflowAndBadMaps) {
  // ep_size * tp_size past INT_MAX: world_size() / rank() would overflow int.
  expect_error<ArgumentError>([] { ParallelConfig{65536, 0, 65536, 0}.validate(); },
                              {"ParallelConfig.ep_size * tp_size", "65536 * 65536", "4294967296"});
  EXPECT_NO_THROW((ParallelConfig{65536, 0, 32767, 0}.validate()));
  expect_error<ArgumentError>([] { (void)ExpertMap{5, 0}.begin(0); }, {"ExpertMap::begin", "ep_size 0"});
  expect_error<ArgumentError>([] { (void)ExpertMap{5, 2}.begin(3); }, {"ExpertMap::begin(3)"});
}

// ------------------------------------------------------------------ the layer rank by rank
struct Case {
  const char* name;
  MoeSpec spec;
};

MoeSpec softmax_shared() {
  MoeSpec s = test::small_spec(64, 128, 6, 2);
  s.shared_intermediate = 64;
  return s;
}
MoeSpec deepseek() {
  MoeSpec s = test::small_spec(64, 128, 8, 3);
  s.routing = Routing::SigmoidGroupedTopK;
  s.n_group = 4;
  s.topk_group = 2;
  s.routed_scaling_factor = 2.5f;
  s.has_router_bias = true;
  s.shared_intermediate = 64;
  return s;
}
MoeSpec qwen2_gated_shared() {
  MoeSpec s = test::small_spec(64, 64, 5, 2);
  s.norm_topk_prob = false;
  s.shared_intermediate = 128;
  s.shared_expert_gated = true;
  return s;
}
MoeSpec relu2() {
  MoeSpec s = test::small_spec(80, 128, 6, 2);
  s.activation = Activation::Relu2;
  return s;
}

std::vector<MoeShard> all_shards(const MoeWeights& w, int ep, int tp) {
  std::vector<MoeShard> v;
  for (int r = 0; r < ep * tp; ++r) v.push_back(slice_weights(w, ParallelConfig::of_rank(ep, tp, r)));
  return v;
}

// S[t, c] = sum_j |w_j y_j[c]| + |shared[c]| from the unsharded layer.
std::vector<double> magnitude(const MoeWeights& w, Mode mode, const std::vector<uint16_t>& x, int64_t T,
                              const std::vector<int32_t>& ids, const std::vector<float>& tw) {
  const int64_t H = w.spec.hidden, K = w.spec.top_k;
  std::vector<float> slot(static_cast<size_t>(T * K * H), 0.0f), sh(static_cast<size_t>(T * H), 0.0f);
  cpu::moe_forward_slots(w, mode, x.data(), T, ids.data(), slot.data(), sh.data());
  std::vector<double> S(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H; ++c) {
      double s = std::fabs(sh[t * H + c]);
      for (int64_t j = 0; j < K; ++j)
        if (ids[t * K + j] >= 0) s += std::fabs(double(tw[t * K + j]) * slot[(t * K + j) * H + c]);
      S[t * H + c] = s;
    }
  return S;
}

// Worst |got - ref| / (u * S) over the elements (0 when equal).
double worst_ratio(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<double>& S) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - ref[i]);
    if (d == 0) continue;
    worst = std::max(worst, S[i] > 0 ? d / (kU * S[i]) : 1e30);
  }
  return worst;
}

bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Routing ids: from the router over all E experts (logits), or caller-given with unused slots; optionally
// every token avoids the experts of EP rank `empty_rank` (that rank receives no tokens).
void make_routing(const MoeWeights& w, int64_t T, bool given, int ep, int empty_rank, uint64_t seed,
                  std::vector<int32_t>* ids, std::vector<float>* tw) {
  const MoeSpec& s = w.spec;
  const int64_t K = s.top_k, E = s.num_experts;
  ids->assign(static_cast<size_t>(T * K), -1);
  tw->assign(static_cast<size_t>(T * K), 0.0f);
  if (!given) {
    std::vector<float> logits = test::random_logits(T, E, seed, 2.0f);
    if (empty_rank >= 0) {
      ExpertMap m{E, ep};
      for (int64_t t = 0; t < T; ++t)
        for (int64_t e = m.begin(empty_rank); e < m.end(empty_rank); ++e) logits[t * E + e] = -30.0f;
    }
    cpu::route(s, logits.data(), w.router_bias.empty() ? nullptr : w.router_bias.data(), T, ids->data(), tw->data());
    return;
  }
  test::random_topk(T, E, K, seed, ids, tw, 0.2f);
  if (empty_rank >= 0) {
    ExpertMap m{E, ep};
    for (auto& id : *ids)
      if (id >= 0 && m.owner(id) == empty_rank) id = -1;
  }
}

class RankByRank : public ::testing::TestWithParam<int> {};

void check_layer(const char* name, const MoeSpec& spec, Mode mode, int ep, int tp, bool given, int empty_rank) {
  SCOPED_TRACE(::testing::Message() << name << " " << mode_name(mode) << " ep " << ep << " tp " << tp
                                    << (given ? " given ids" : " router") << " empty rank " << empty_rank);
  test::RandomWeightsOptions wo;
  wo.seed = 7 + ep * 10 + tp;
  wo.different_gate_up_scales = true;
  const MoeWeights w = test::random_weights(spec, wo);
  const int64_t T = 37, H = spec.hidden;
  const std::vector<uint16_t> x = test::random_hidden_bf16(T, H, 11);
  std::vector<int32_t> ids;
  std::vector<float> tw;
  make_routing(w, T, given, ep, empty_rank, 5, &ids, &tw);
  // A token with every slot unused (only the shared expert, or exact zeros).
  for (int64_t j = 0; j < spec.top_k; ++j) ids[3 * spec.top_k + j] = -1;
  std::vector<float> full(static_cast<size_t>(T * H));
  cpu::moe_forward(w, mode, x.data(), T, ids.data(), tw.data(), full.data());

  const std::vector<MoeShard> shards = all_shards(w, ep, tp);
  std::vector<float> sum(full.size()), combined(full.size());
  cpu::run_ranks(shards, mode, x.data(), T, ids.data(), tw.data(), sum.data(), combined.data());
  const std::vector<double> S = magnitude(w, mode, x, T, ids, tw);
  const double K = static_cast<double>(spec.top_k);
  if (std::getenv("NVFP4MOE_TEST_VERBOSE"))
    std::printf("%s %s ep %d tp %d: worst |diff|/(u S): all-reduce %.3g, combined %.3g\n", name, mode_name(mode), ep, tp,
                worst_ratio(sum, full, S), worst_ratio(combined, full, S));
  if (tp == 1) {
    EXPECT_TRUE(bits_equal(combined, full)) << "EP fixed-order combine must be bitwise: "
                                            << test::compare(combined, full).str();
    EXPECT_LE(worst_ratio(sum, full, S), 2 * (K + 2)) << test::compare(sum, full).str();
  } else {
    const double I = static_cast<double>(std::max(spec.intermediate, spec.shared_intermediate));
    const double bound = (2 * I + 4 * K + 8) * std::sqrt(I);
    EXPECT_LE(worst_ratio(combined, full, S), bound) << test::compare(combined, full).str();
    EXPECT_LE(worst_ratio(sum, full, S), bound) << test::compare(sum, full).str();
  }
  // A rank that receives no tokens writes exact zeros (EP rank > 0) or only the shared expert's part.
  if (empty_rank > 0) {
    for (int r = empty_rank * tp; r < (empty_rank + 1) * tp; ++r) {
      std::vector<float> part(full.size(), 1.0f);
      cpu::shard_forward(shards[static_cast<size_t>(r)], mode, x.data(), T, ids.data(), tw.data(), part.data());
      for (float v : part) ASSERT_EQ(v, 0.0f) << "rank " << r;
    }
  }
  // The token without experts: the shared part only (exact zeros without a shared expert), on every rank sum.
  if (spec.shared_intermediate == 0)
    for (int64_t c = 0; c < H; ++c) ASSERT_EQ(sum[3 * H + c], 0.0f);
}

TEST(RankByRankCpu, SoftmaxSharedExpert) {
  for (Mode m : {Mode::W4A16, Mode::W4A4})
    for (auto [ep, tp] : {std::pair{2, 1}, {3, 1}, {6, 1}, {1, 2}, {2, 2}, {3, 4}})
      for (bool given : {false, true}) check_layer("softmax+shared", softmax_shared(), m, ep, tp, given, -1);
}

TEST(RankByRankCpu, DeepSeekGroupedSigmoid) {
  for (Mode m : {Mode::W4A16, Mode::W4A4})
    for (auto [ep, tp] : {std::pair{2, 1}, {4, 1}, {8, 1}, {1, 2}, {4, 2}})
      for (bool given : {false, true}) check_layer("deepseek", deepseek(), m, ep, tp, given, -1);
}

TEST(RankByRankCpu, GatedSharedExpertAndRelu2) {
  for (Mode m : {Mode::W4A16, Mode::W4A4}) {
    for (auto [ep, tp] : {std::pair{2, 1}, {5, 1}, {1, 4}, {5, 2}})
      check_layer("qwen2 gated shared", qwen2_gated_shared(), m, ep, tp, true, -1);
    for (auto [ep, tp] : {std::pair{3, 1}, {2, 2}, {1, 8}})
      check_layer("relu2", relu2(), m, ep, tp, false, -1);
  }
}

// Experts with no tokens and EP ranks with no tokens (router and caller-given ids).
TEST(RankByRankCpu, RanksAndExpertsWithoutTokens) {
  for (Mode m : {Mode::W4A16, Mode::W4A4}) {
    check_layer("softmax+shared", softmax_shared(), m, 3, 1, false, 1);
    check_layer("softmax+shared", softmax_shared(), m, 3, 2, true, 2);
    check_layer("deepseek", deepseek(), m, 4, 1, true, 3);
    check_layer("deepseek", deepseek(), m, 2, 2, false, 1);
    check_layer("relu2", relu2(), m, 6, 1, true, 4);
  }
  // One token only: most experts and most ranks see nothing.
  const MoeWeights w = test::random_weights(deepseek());
  const std::vector<uint16_t> x = test::random_hidden_bf16(1, 64, 3);
  std::vector<int32_t> ids;
  std::vector<float> tw;
  make_routing(w, 1, false, 8, -1, 9, &ids, &tw);
  std::vector<float> full(64), combined(64);
  cpu::moe_forward(w, Mode::W4A4, x.data(), 1, ids.data(), tw.data(), full.data());
  cpu::run_ranks(all_shards(w, 8, 1), Mode::W4A4, x.data(), 1, ids.data(), tw.data(), nullptr, combined.data());
  EXPECT_TRUE(bits_equal(combined, full));
}

// TP with the exact absolute-value bound: relu2 activations are >= 0, so the layer over |W2| (e2m1 sign bits
// cleared) with non-negative routing weights is A itself.
TEST(RankByRankCpu, TensorParallelWithinTheAbsoluteValueBound) {
  for (Mode m : {Mode::W4A16, Mode::W4A4})
    for (int tp : {2, 4, 8}) {
      const MoeSpec spec = relu2();
      const MoeWeights w = test::random_weights(spec);
      MoeWeights a = test::random_weights(spec);  // same seed: same weights, then |W2|
      for (size_t i = 0; i < a.experts.w2.size(); ++i) a.experts.w2.data()[i] &= 0x77;
      const int64_t T = 29, H = spec.hidden;
      const std::vector<uint16_t> x = test::random_hidden_bf16(T, H, 2);
      std::vector<int32_t> ids;
      std::vector<float> tw;
      test::random_topk(T, spec.num_experts, spec.top_k, 4, &ids, &tw, 0.1f);
      std::vector<float> full(static_cast<size_t>(T * H)), absl(full.size()), sum(full.size()), comb(full.size());
      cpu::moe_forward(w, m, x.data(), T, ids.data(), tw.data(), full.data());
      cpu::moe_forward(a, m, x.data(), T, ids.data(), tw.data(), absl.data());
      cpu::run_ranks(all_shards(w, 1, tp), m, x.data(), T, ids.data(), tw.data(), sum.data(), comb.data());
      const double bound = 2.0 * spec.intermediate + 4.0 * spec.top_k + 8;
      double worst = 0;
      for (size_t i = 0; i < full.size(); ++i) {
        ASSERT_GE(absl[i], std::fabs(full[i]) * (1 - 1e-5)) << i;
        const double d = std::max(std::fabs(double(sum[i]) - full[i]), std::fabs(double(comb[i]) - full[i]));
        worst = std::max(worst, d / (kU * absl[i] + 1e-30));
      }
      EXPECT_LE(worst, bound) << mode_name(m) << " tp " << tp;
      RecordProperty(std::string("worst_tp") + std::to_string(tp) + mode_name(m), std::to_string(worst));
    }
}

// ------------------------------------------------------------------ MoeLayer with options.parallel
TEST(ShardedMoeLayer, SumOfRanksEqualsUnshardedLayer) {
  const MoeSpec spec = deepseek();
  const MoeWeights w = test::random_weights(spec);
  const int64_t T = 21, H = spec.hidden;
  const std::vector<uint16_t> x = test::random_hidden_bf16(T, H, 1);
  const std::vector<float> logits = test::random_logits(T, spec.num_experts, 2);
  MoeLayerOptions o;
  o.mode = Mode::W4A4;
  std::vector<float> full(static_cast<size_t>(T * H));
  auto xt = test::cpu_tensor(x.data(), DType::BF16, {T, H});
  auto lt = test::cpu_tensor(logits.data(), DType::F32, {T, spec.num_experts});
  RoutingArgs ra;
  ra.router_logits = &lt;
  {
    auto layer = MoeLayer::create(test::random_weights(spec), o);
    layer->forward(xt, ra, test::cpu_tensor(full.data(), DType::F32, {T, H}));
  }
  std::vector<int32_t> ids(static_cast<size_t>(T * spec.top_k));
  std::vector<float> tw(ids.size());
  cpu::route(spec, logits.data(), w.router_bias.data(), T, ids.data(), tw.data());
  const std::vector<double> S = magnitude(w, o.mode, x, T, ids, tw);
  for (auto [ep, tp] : {std::pair{4, 1}, {2, 2}}) {
    std::vector<float> sum(full.size(), 0.0f), part(full.size());
    size_t bytes = 0;
    for (int r = 0; r < ep * tp; ++r) {
      o.parallel = ParallelConfig::of_rank(ep, tp, r);
      auto layer = MoeLayer::create(test::random_weights(spec), o);
      EXPECT_EQ(layer->spec().num_experts, spec.num_experts);
      bytes += layer->weight_bytes();
      layer->forward(xt, ra, test::cpu_tensor(part.data(), DType::F32, {T, H}));
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    EXPECT_EQ(bytes, w.packed_bytes());  // every byte on exactly one rank (shared on EP rank 0, TP-split)
    const double I = 128;
    EXPECT_LE(worst_ratio(sum, full, S), tp == 1 ? 2 * (3 + 2) : (2 * I + 20) * std::sqrt(I));
  }
}

// One rank's forward takes every input form the whole layer takes: F32 hidden (rounded to bf16 first), the
// caller's ids and weights instead of logits, a BF16 out (the f32 partial rounded once). Fed the same values, each
// form gives the BF16-hidden / logits / F32-out result bit for bit, and a second call at a smaller T reuses it.
TEST(ShardedMoeLayer, EveryInputFormGivesTheSamePartial) {
  const MoeSpec spec = deepseek();
  const int64_t T = 9, H = spec.hidden, K = spec.top_k;
  const std::vector<uint16_t> x = test::random_hidden_bf16(T, H, 3);
  const std::vector<float> logits = test::random_logits(T, spec.num_experts, 4);
  std::vector<float> xf(x.size());
  for (size_t i = 0; i < x.size(); ++i) xf[i] = fmt::bf16_to_float(x[i]) * (1.0f + 0x1p-12f);  // rounds back to x
  const MoeWeights w = test::random_weights(spec);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> tw(ids.size());
  cpu::route(spec, logits.data(), w.router_bias.data(), T, ids.data(), tw.data());
  MoeLayerOptions o;
  o.mode = Mode::W4A4;
  o.parallel = ParallelConfig::of_rank(2, 2, 3);
  auto layer = MoeLayer::create(test::random_weights(spec), o);
  auto lt = test::cpu_tensor(logits.data(), DType::F32, {T, spec.num_experts});
  auto it = test::cpu_tensor(ids.data(), DType::I32, {T, K});
  auto wt = test::cpu_tensor(tw.data(), DType::F32, {T, K});
  RoutingArgs by_logits, by_ids;
  by_logits.router_logits = &lt;
  by_ids.topk_ids = &it;
  by_ids.topk_weights = &wt;
  std::vector<float> part(static_cast<size_t>(T * H)), part_ids(part.size());
  layer->forward(test::cpu_tensor(x.data(), DType::BF16, {T, H}), by_logits,
                 test::cpu_tensor(part.data(), DType::F32, {T, H}));
  EXPECT_GT(layer->workspace_bytes(), size_t{0});  // the routed ids and weights
  ASSERT_TRUE(std::any_of(part.begin(), part.end(), [](float v) { return v != 0.0f; }));  // the rank has work
  layer->forward(test::cpu_tensor(xf.data(), DType::F32, {T, H}), by_ids,
                 test::cpu_tensor(part_ids.data(), DType::F32, {T, H}));
  ASSERT_EQ(0, std::memcmp(part.data(), part_ids.data(), part.size() * sizeof(float)));
  std::vector<uint16_t> part_bf16(part.size());
  auto lt_head = test::cpu_tensor(logits.data(), DType::F32, {T - 2, spec.num_experts});  // the first T - 2 tokens
  RoutingArgs head;
  head.router_logits = &lt_head;
  layer->forward(test::cpu_tensor(xf.data(), DType::F32, {T - 2, H}), head,
                 test::cpu_tensor(part_bf16.data(), DType::BF16, {T - 2, H}));
  for (size_t i = 0; i < static_cast<size_t>((T - 2) * H); ++i)
    ASSERT_EQ(part_bf16[i], fmt::bf16_from_float(part[i])) << "element " << i;
}

TEST(ShardedMoeLayer, RefusesWhatItCannotDo) {
  const MoeSpec spec = softmax_shared();
  MoeLayerOptions o;
  o.parallel = {2, 1, 1, 0};
  o.backend = Backend::Cuda;
  expect_error<ArgumentError>([&] { MoeLayer::create(test::random_weights(spec), o); },
                              {"MoeLayerOptions.parallel", "expected backend cpu", "NCCL"});
  o.backend = Backend::Cpu;
  o.shared_max_input_scale = true;
  expect_error<ArgumentError>([&] { MoeLayer::create(test::random_weights(spec), o); }, {"shared_max_input_scale"});
  o.shared_max_input_scale = false;
  auto layer = MoeLayer::create(test::random_weights(spec), o);
  expect_error<ArgumentError>([&] { layer->begin_calibration(); }, {"calibration", "sharded"});
  o.parallel = {2, 2, 1, 0};
  expect_error<ArgumentError>([&] { MoeLayer::create(test::random_weights(spec), o); }, {"ParallelConfig.ep_rank"});
  // A shard of another rank than the options say.
  o.parallel = {2, 0, 1, 0};
  MoeShard s = slice_weights(test::random_weights(spec), {2, 1, 1, 0});
  expect_error<ArgumentError>([&] { create_moe_layer_shard(std::move(s), o); }, {"but the shard is", "ep 1/2"});
}

TEST(ShardedMoeLayer, RefusesInconsistentShards) {
  // A shared expert the spec does not declare: refused (as MoeWeights::validate), not dropped.
  MoeWeights w = test::random_weights(test::small_spec(64, 128, 4, 2));
  w.shared.allocate(1, 64, 64, true);
  expect_error<ArgumentError>([&] { slice_weights(w, {2, 0, 1, 0}); },
                              {"MoeWeights.shared", "no shared expert", "num_experts = 1"});
  // The checks of MoeWeights::validate(), but a NaN input scale (none: a W4A16 checkpoint) passes.
  MoeWeights n = test::random_weights(test::small_spec(64, 128, 4, 2));
  n.experts.w2_input_scale[1] = std::numeric_limits<float>::quiet_NaN();
  expect_error<ArgumentError>([&] { n.validate(); }, {"MoeWeights.experts.w2_input_scale[1]", "finite and > 0"});
  EXPECT_TRUE(std::isnan(slice_weights(n, {2, 0, 1, 0}).local.experts.w2_input_scale[1]));
  n.experts.w2_scale2[3] = std::numeric_limits<float>::quiet_NaN();
  expect_error<ArgumentError>([&] { slice_weights(n, {2, 0, 1, 0}); },
                              {"MoeWeights.experts.w2_scale2[3]", "finite and > 0"});
  n.experts.w2_scale2[3] = 1.0f;
  n.router_weight.assign(5, 0.0f);
  expect_error<ArgumentError>([&] { slice_weights(n, {2, 0, 1, 0}); }, {"MoeWeights.router_weight", "got 5"});
  n.router_weight.clear();
  MoeShard short_w2 = slice_weights(n, {2, 1, 1, 0});
  short_w2.local.experts.w2 = HostBuffer(short_w2.local.experts.w2.size() - 1);
  expect_error<ArgumentError>([&] { validate_shard(short_w2); }, {"MoeShard.local.experts.w2", "bytes"});
  // local.spec claiming a gated shared expert the shard has no gate weight for: moe_forward would read
  // shared_gate_weight[0..H) of an empty vector.
  const MoeWeights g = test::random_weights(softmax_shared());
  MoeShard s = slice_weights(g, {2, 0, 1, 0});
  s.local.spec.shared_expert_gated = true;
  expect_error<ArgumentError>([&] { validate_shard(s); }, {"MoeShard.local.spec", "shared_expert_gated"});
  MoeLayerOptions o;
  o.parallel = {2, 0, 1, 0};
  expect_error<ArgumentError>([&] { create_moe_layer_shard(std::move(s), o); }, {"MoeShard.local.spec"});
  s = slice_weights(g, {2, 0, 1, 0});
  s.plan.map.num_experts = 1000;  // localize_ids bounds the ids by the map
  expect_error<ArgumentError>([&] { validate_shard(s); }, {"MoeShard.plan"});
  // run_ranks sizes its buffers from shards[0].spec: a shard of a wider layer would write past them.
  MoeSpec wide = softmax_shared();
  wide.hidden = 128;
  std::vector<MoeShard> ranks = all_shards(g, 2, 1);
  ranks[1] = slice_weights(test::random_weights(wide), {2, 1, 1, 0});
  const int64_t T = 3, H = 64, K = 2;
  std::vector<uint16_t> x(T * H, 0x3f80);
  std::vector<int32_t> ids = {0, 5, 1, 4, 2, 3};
  std::vector<float> tw(T * K, 0.5f), a(T * H), c(T * H);
  expect_error<ArgumentError>(
      [&] { cpu::run_ranks(ranks, Mode::W4A16, x.data(), T, ids.data(), tw.data(), a.data(), c.data()); },
      {"run_ranks: shards[1].spec", "one layer"});
  ranks[1] = slice_weights(g, {2, 1, 1, 0});
  ranks[1].local.spec.shared_expert_gated = true;
  expect_error<ArgumentError>(
      [&] { cpu::run_ranks(ranks, Mode::W4A16, x.data(), T, ids.data(), tw.data(), a.data(), c.data()); },
      {"MoeShard.local.spec"});
}

// ------------------------------------------------------------------ the loader: only the rank's shard
void expect_stacked_equal(const StackedExperts& a, const StackedExperts& b, const std::string& what) {
  EXPECT_EQ(a.num_experts, b.num_experts) << what;
  EXPECT_EQ(a.intermediate, b.intermediate) << what;
  auto buf = [&](const HostBuffer& x, const HostBuffer& y, const char* f) {
    ASSERT_EQ(x.size(), y.size()) << what << f;
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size())) << what << f;
  };
  buf(a.w13, b.w13, ".w13");
  buf(a.w13_scale, b.w13_scale, ".w13_scale");
  buf(a.w2, b.w2, ".w2");
  buf(a.w2_scale, b.w2_scale, ".w2_scale");
  auto vec = [&](const std::vector<float>& x, const std::vector<float>& y, const char* f) {
    ASSERT_EQ(x.size(), y.size()) << what << f;
    EXPECT_EQ(0, std::memcmp(x.data(), y.data(), x.size() * 4)) << what << f;
  };
  vec(a.w13_gate_scale2, b.w13_gate_scale2, ".w13_gate_scale2");
  vec(a.w13_up_scale2, b.w13_up_scale2, ".w13_up_scale2");
  vec(a.w13_input_scale, b.w13_input_scale, ".w13_input_scale");
  vec(a.w2_scale2, b.w2_scale2, ".w2_scale2");
  vec(a.w2_input_scale, b.w2_input_scale, ".w2_input_scale");
}

void expect_shard_equal(const MoeShard& a, const MoeShard& b, const std::string& what) {
  EXPECT_EQ(a.plan.expert_begin, b.plan.expert_begin) << what;
  EXPECT_EQ(a.plan.inter_begin, b.plan.inter_begin) << what;
  EXPECT_EQ(a.plan.has_shared, b.plan.has_shared) << what;
  EXPECT_EQ(a.local.spec.num_experts, b.local.spec.num_experts) << what;
  EXPECT_EQ(a.local.spec.intermediate, b.local.spec.intermediate) << what;
  EXPECT_EQ(a.local.spec.shared_intermediate, b.local.spec.shared_intermediate) << what;
  expect_stacked_equal(a.local.experts, b.local.experts, what + " experts");
  expect_stacked_equal(a.local.shared, b.local.shared, what + " shared");
  EXPECT_EQ(a.local.shared_gate_weight, b.local.shared_gate_weight) << what;
  EXPECT_EQ(a.router_weight, b.router_weight) << what;
  ASSERT_EQ(a.router_bias.size(), b.router_bias.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.router_bias.data(), b.router_bias.data(), a.router_bias.size() * 4)) << what;
}

std::string gen(const std::string& name, model::ModelStyle style, std::optional<int64_t> shared) {
  model::SyntheticOptions o;
  o.style = style;
  o.hidden = 64;
  o.intermediate = 128;
  o.experts = 8;
  o.top_k = 2;
  if (style == model::ModelStyle::DeepSeekV3) {
    o.routing = Routing::SigmoidGroupedTopK;
    o.n_group = 4;
    o.topk_group = 2;
  }
  if (style == model::ModelStyle::NemotronH) {
    o.activation = Activation::Relu2;
    o.routing = Routing::SigmoidGroupedTopK;
    o.n_group = 1;
    o.topk_group = 1;
  }
  o.shared_intermediate = shared;
  o.layers = 2;
  o.first_dense_layers = 1;
  const std::string dir = test::fresh_dir("test_parallel", name);
  model::generate_synthetic_checkpoint(dir, o);
  return dir;
}

TEST(LoadShard, EqualsTheSliceOfTheFullLoadBitwise) {
  struct Family {
    const char* name;
    model::ModelStyle style;
    std::optional<int64_t> shared;
  };
  for (const Family& f : {Family{"deepseek", model::ModelStyle::DeepSeekV3, 64},
                          Family{"qwen2", model::ModelStyle::Qwen2Moe, 64},
                          Family{"qwen3", model::ModelStyle::Qwen3Moe, std::nullopt},
                          Family{"nemotron", model::ModelStyle::NemotronH, std::nullopt}}) {
    const auto ck = Checkpoint::open(gen(f.name, f.style, f.shared));
    const int layer = ck->moe_layers().at(0);
    const MoeWeights full = ck->load_layer(layer);
    for (auto [ep, tp] : {std::pair{1, 1}, {2, 1}, {3, 1}, {8, 1}, {1, 2}, {1, 4}, {2, 2}, {4, 2}})
      for (int r = 0; r < ep * tp; ++r) {
        const ParallelConfig pc = ParallelConfig::of_rank(ep, tp, r);
        expect_shard_equal(ck->load_shard(layer, pc), slice_weights(full, pc),
                           std::string(f.name) + " " + pc.describe());
      }
  }
}

// Only the rank's experts are read: poison another rank's scales (NaN weight_scale_2) and its packed bytes'
// shape stays valid. The full load refuses the checkpoint; the ranks that do not own the expert load it, equal
// to the clean shard; the owner refuses it naming the expert.
TEST(LoadShard, ReadsOnlyTheRanksExperts) {
  const std::string clean = gen("poison_src", model::ModelStyle::DeepSeekV3, 64);
  auto ts = test::read_all_tensors(clean);
  bool poisoned = false;
  for (auto& t : ts)
    if (t.name.find(".experts.6.down_proj.weight_scale_2") != std::string::npos) {
      t.set_scalar(std::numeric_limits<float>::quiet_NaN());
      poisoned = true;
    }
  ASSERT_TRUE(poisoned);
  const std::string bad = test::fresh_dir("test_parallel", "poisoned");
  std::filesystem::create_directories(bad);
  const nlohmann::json cfg = test::read_json(std::filesystem::path(clean) / "config.json");
  const nlohmann::json hq = test::read_json(std::filesystem::path(clean) / "hf_quant_config.json");
  test::write_checkpoint_dir(bad, ts, cfg, hq);
  const auto good = Checkpoint::open(clean);
  const auto ck = Checkpoint::open(bad);
  const int layer = ck->moe_layers().at(0);
  expect_error<FormatError>([&] { ck->load_layer(layer); }, {"expert 6", "weight_scale_2"});
  for (int r = 0; r < 4; ++r) {
    const ParallelConfig pc = ParallelConfig::of_rank(4, 1, r);  // experts 6, 7 on EP rank 3
    if (r == 3) {
      expect_error<FormatError>([&] { ck->load_shard(layer, pc); }, {"expert 6", "weight_scale_2"});
      continue;
    }
    expect_shard_equal(ck->load_shard(layer, pc), good->load_shard(layer, pc), pc.describe());
  }
  // MoeLayer::create(checkpoint) with options.parallel goes through load_shard.
  MoeLayerOptions o;
  o.parallel = ParallelConfig::of_rank(4, 1, 1);
  EXPECT_NO_THROW(MoeLayer::create(*ck, layer, o));
  o.parallel = ParallelConfig::of_rank(4, 1, 3);
  EXPECT_THROW(MoeLayer::create(*ck, layer, o), FormatError);
}

// A compressed-tensors W4A16 checkpoint (reciprocal global scales, no input scales): same loader, same slice.
TEST(LoadShard, CompressedTensorsW4A16) {
  const std::string src = gen("ct_src", model::ModelStyle::Qwen3Moe, std::nullopt);
  std::vector<test::FileTensor> out;
  for (auto& t : test::read_all_tensors(src)) {
    if (test::ends_with(t.name, ".weight") && t.dtype == DType::U8) {
      t.name += "_packed";
    } else if (test::ends_with(t.name, ".weight_scale_2")) {
      t.name = t.name.substr(0, t.name.size() - 15) + ".weight_global_scale";
      t.set_scalar(1.0f / t.scalar());
    } else if (test::ends_with(t.name, ".input_scale")) {
      continue;
    }
    out.push_back(std::move(t));
  }
  nlohmann::json cfg = test::read_json(std::filesystem::path(src) / "config.json");
  nlohmann::json args = {{"num_bits", 4}, {"type", "float"}, {"strategy", "tensor_group"}, {"group_size", 16},
                         {"symmetric", true}, {"dynamic", false}};
  cfg["quantization_config"] = {
      {"quant_method", "compressed-tensors"}, {"format", "nvfp4-pack-quantized"}, {"version", "0.10.2"},
      {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", args}, {"input_activations", nullptr}}}}},
      {"ignore", {"lm_head", "re:.*mlp.gate$"}}};
  const std::string dir = test::fresh_dir("test_parallel", "ct");
  std::filesystem::create_directories(dir);
  test::write_checkpoint_dir(dir, out, cfg, nlohmann::json(nullptr));
  const auto ck = Checkpoint::open(dir);
  ASSERT_EQ(ck->format(), CheckpointFormat::CompressedTensors);
  const int layer = ck->moe_layers().at(0);
  const MoeWeights full = ck->load_layer(layer);
  for (int r = 0; r < 4; ++r) {
    const ParallelConfig pc = ParallelConfig::of_rank(2, 2, r);
    expect_shard_equal(ck->load_shard(layer, pc), slice_weights(full, pc), "ct " + pc.describe());
  }
  MoeLayerOptions o;
  o.parallel = ParallelConfig::of_rank(2, 2, 1);
  o.mode = Mode::W4A4;
  expect_error<ArgumentError>([&] { MoeLayer::create(*ck, layer, o); }, {"no activation input scales"});
  o.mode = Mode::W4A16;
  EXPECT_NO_THROW(MoeLayer::create(*ck, layer, o));
}

}  // namespace
}  // namespace nvfp4moe
