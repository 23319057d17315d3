// GPU tests of the NVFP4 weight quantizer (src/cuda/weight_quant.h, sm90_nvfp4_weight_quant.cuh): bitwise equal to
// the CPU quantizer (model::make_cpu_expert_quantizer, the fmt:: functions) on random and adversarial data (zeros,
// all-equal, huge / tiny values, subnormal block scales, RNE ties, fp32 subnormals, F16 subnormals), in BF16, F16
// and F32; the whole quantize-at-load path (Checkpoint::open on a bf16 checkpoint, GPU quantizer vs CPU loader,
// MoeLayer::create with backend cuda); non-finite weights refused; and the time to quantize a deepseek-v3-shaped
// layer (H=7168, I=2048, E=256) on the GPU (kernels only, and end to end from host memory) and on the CPU
// (NVFP4MOE_QUANT_CPU_EXPERTS experts, default 16, extrapolated to 256).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <thread>
#include <tuple>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <vector>

#include "cuda/weight_quant.h"
#include "format/nvfp4.h"
#include "model/unquantized.h"
#include "nvfp4moe/checkpoint.h"
#include "nvfp4moe/error.h"
#include "nvfp4moe/moe.h"
#include "support/checkpoint_files.h"
#include "support/cuda_test_support.h"

namespace nvfp4moe::cuda {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Raw source bytes of a [n, k] weight in dtype dt from fp32 values (BF16 / F16: rounded by the conversion; the
// comparison uses the stored bytes, so both quantizers see the same numbers).
std::vector<uint8_t> encode(const std::vector<float>& v, DType dt) {
  std::vector<uint8_t> b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::F32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    } else if (dt == DType::BF16) {
      const uint16_t h = fmt::bf16_from_float(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    } else {  // F16 by truncation of the f32 bits (any f16 bit pattern is a valid test input)
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      const uint32_t sign = (u >> 16) & 0x8000u;
      const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
      uint16_t h;
      if (v[i] == 0.0f || e < -10) h = static_cast<uint16_t>(sign);
      else if (e <= 0) h = static_cast<uint16_t>(sign | (((u & 0x7FFFFFu) | 0x800000u) >> (14 - e)));  // subnormal
      else if (e >= 31) h = static_cast<uint16_t>(sign | 0x7BFFu);                                      // max finite
      else h = static_cast<uint16_t>(sign | (static_cast<uint32_t>(e) << 10) | ((u >> 13) & 0x3FFu));
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

io::TensorInfo info(const std::string& name, DType dt, int64_t n, int64_t k, const std::vector<uint8_t>& bytes) {
  io::TensorInfo t;
  t.name = name;
  t.dtype = dt;
  t.shape = {n, k};
  t.begin = 0;
  t.end = bytes.size();
  t.data = bytes.data();
  return t;
}

// One expert (gate, up [I, H], down [H, I]) through both quantizers; everything compared bitwise.
void compare_expert(const std::vector<float>& g, const std::vector<float>& u, const std::vector<float>& d, int64_t H,
                    int64_t I, DType dt, bool gated, const std::string& what) {
  SCOPED_TRACE(what);
  const auto gb = encode(g, dt), ub = encode(u, dt), db = encode(d, dt);
  const io::TensorInfo gi = info("gate", dt, I, H, gb), ui = info("up", dt, I, H, ub), di = info("down", dt, H, I, db);
  model::ExpertSource src;
  src.what = what;
  src.proj[0] = gated ? &gi : nullptr;
  src.proj[1] = &ui;
  src.proj[2] = &di;
  StackedExperts a, b;
  a.allocate(2, H, I, gated);
  b.allocate(2, H, I, gated);
  std::memset(a.w13.data(), 0xAA, a.w13.size());
  std::memset(b.w13.data(), 0x55, b.w13.size());
  auto cq = model::make_cpu_expert_quantizer();
  auto gq = make_weight_quantizer(0);
  for (int64_t slot : {1, 0}) {
    cq->quantize(src, a, slot);
    gq->quantize(src, b, slot);
  }
  cq->finish();
  gq->finish();
  EXPECT_EQ(0, std::memcmp(a.w13.data(), b.w13.data(), a.w13.size())) << "codes w13";
  EXPECT_EQ(0, std::memcmp(a.w13_scale.data(), b.w13_scale.data(), a.w13_scale.size())) << "scales w13";
  EXPECT_EQ(0, std::memcmp(a.w2.data(), b.w2.data(), a.w2.size())) << "codes w2";
  EXPECT_EQ(0, std::memcmp(a.w2_scale.data(), b.w2_scale.data(), a.w2_scale.size())) << "scales w2";
  if (gated) EXPECT_EQ(a.w13_gate_scale2, b.w13_gate_scale2);
  EXPECT_EQ(a.w13_up_scale2, b.w13_up_scale2);
  EXPECT_EQ(a.w2_scale2, b.w2_scale2);
}

std::vector<float> random_w(int64_t n, std::mt19937_64& rng, float sd) {
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(WeightQuant, RandomAllDtypes) {
  std::mt19937_64 rng(1);
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (bool gated : {true, false}) {
      const int64_t H = 256, I = 96;
      auto g = random_w(I * H, rng, 0.02f), u = random_w(I * H, rng, 0.05f), d = random_w(H * I, rng, 0.01f);
      compare_expert(g, u, d, H, I, dt, gated, std::string(dtype_name(dt)) + (gated ? " gated" : " relu2"));
    }
}

// Adversarial blocks: every pattern below placed in rows of one weight; run in each dtype.
std::vector<float> adversarial(int64_t n, int64_t k, std::mt19937_64& rng, float big) {
  std::vector<float> w(static_cast<size_t>(n * k), 0.0f);
  std::uniform_real_distribution<float> ud(-1.0f, 1.0f);
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 0.0f, 7.0f};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < k / 16; ++b) {
      float* blk = w.data() + r * k + b * 16;
      switch ((r * 7 + b) % 10) {
        case 0: break;                                                                  // all zero
        case 1: for (int i = 0; i < 16; ++i) blk[i] = 0.013f; break;                    // all equal
        case 2: for (int i = 0; i < 16; ++i) blk[i] = (i & 1 ? -1 : 1) * big; break;    // huge (the tensor amax)
        case 3: for (int i = 0; i < 16; ++i) blk[i] = ud(rng) * 1e-7f * big; break;     // tiny: subnormal e4m3 scale
        case 4: for (int i = 0; i < 16; ++i) blk[i] = ud(rng) * 1e-12f * big; break;    // below e4m3: scale 0
        case 5: for (int i = 0; i < 16; ++i) blk[i] = ties[i] * big / 6.0f * (i & 2 ? -1.f : 1.f); break;  // ties
        case 6: for (int i = 0; i < 16; ++i) blk[i] = ties[i] * 0.0625f; break;          // ties at a small scale
        case 7: blk[r % 16] = big * 0.5f; break;                                         // one spike
        case 8: for (int i = 0; i < 16; ++i) blk[i] = std::ldexp(1.0f, -130 + i) * (i & 1 ? -1.f : 1.f); break;  // f32 subnormals
        default: for (int i = 0; i < 16; ++i) blk[i] = ud(rng) * big * 0.1f;
      }
    }
  return w;
}

TEST(WeightQuant, Adversarial) {
  std::mt19937_64 rng(2);
  const int64_t H = 160, I = 48;
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (float big : {1.0f, 3.0e4f, 1.0e-3f}) {
      auto g = adversarial(I, H, rng, big), u = adversarial(I, H, rng, big * 0.5f), d = adversarial(H, I, rng, big);
      compare_expert(g, u, d, H, I, dt, true, std::string(dtype_name(dt)) + " big " + std::to_string(big));
    }
  // whole tensors of zeros (ws2 = 1, every block scale 1) and all-equal values
  for (DType dt : {DType::BF16, DType::F32}) {
    std::vector<float> z(static_cast<size_t>(H * I), 0.0f), c(static_cast<size_t>(H * I), -0.75f);
    compare_expert(z, z, z, H, I, dt, true, "zeros");
    compare_expert(c, z, c, H, I, dt, true, "constant gate, zero up");
  }
  if (true) {  // huge fp32 values (near FLT_MAX / 2688 and beyond: ws2 large, block scales saturate)
    std::vector<float> h = random_w(H * I, rng, 1.0f);
    for (auto& x : h) x *= 1e36f;
    compare_expert(h, h, h, H, I, DType::F32, true, "1e36");
  }
}

TEST(WeightQuant, NonFiniteRefused) {
  const int64_t H = 64, I = 32;
  std::mt19937_64 rng(3);
  auto g = random_w(I * H, rng, 0.02f), u = g, d = random_w(H * I, rng, 0.02f);
  u[77] = std::numeric_limits<float>::quiet_NaN();
  const auto gb = encode(g, DType::BF16), ub = encode(u, DType::BF16), db = encode(d, DType::BF16);
  const io::TensorInfo gi = info("gate", DType::BF16, I, H, gb), ui = info("up", DType::BF16, I, H, ub),
                       di = info("down", DType::BF16, H, I, db);
  model::ExpertSource src;
  src.what = "layer 1 expert 3";
  src.proj[0] = &gi;
  src.proj[1] = &ui;
  src.proj[2] = &di;
  StackedExperts s;
  s.allocate(1, H, I, true);
  auto gq = make_weight_quantizer(0);
  test::expect_error<FormatError>([&] { gq->quantize(src, s, 0); gq->finish(); }, {"layer 1 expert 3", "expected finite"});
}

TEST(WeightQuant, LaunchersRejectMisalignment) {
  uint8_t* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 4096));
  uint32_t* m = nullptr;
  CUDA_OK(cudaMalloc(&m, 64));
  EXPECT_EQ(launch_weight_amax(d + 2, DType::BF16, 64, m, m + 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_weight_amax(d, DType::BF16, 60, m, m + 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_weight_amax(d, DType::U8, 64, m, m + 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(launch_weight_quantize(d, DType::BF16, 64, m, m, d + 1028, d + 2048, nullptr, nullptr), cudaErrorInvalidValue);
  cudaFree(d);
  cudaFree(m);
}

// The whole path: a bf16 checkpoint quantized at load on the GPU == on the CPU; MoeLayer with backend cuda runs.
TEST(WeightQuant, QuantizeAtLoadOnTheGpu) {
  const int64_t H = 128, I = 64, E = 8;
  std::mt19937_64 rng(4);
  std::vector<test::FileTensor> ts;
  auto add = [&](const std::string& name, int64_t n, int64_t k, float sd) {
    const auto v = random_w(n * k, rng, sd);
    ts.push_back({name, DType::BF16, {n, k}, encode(v, DType::BF16)});
  };
  add("model.layers.0.mlp.gate.weight", E, H, 1.0f);
  for (int e = 0; e < E; ++e)
    for (auto [p, n, k] : {std::tuple{"gate_proj", I, H}, {"up_proj", I, H}, {"down_proj", H, I}})
      add("model.layers.0.mlp.experts." + std::to_string(e) + "." + p + ".weight", n, k, 0.02f * (e + 1));
  const std::string dir = test::fresh_dir("weight_quant", "qwen_bf16");
  const nlohmann::json cfg = {{"model_type", "qwen3_moe"}, {"hidden_size", H}, {"num_hidden_layers", 1},
                              {"moe_intermediate_size", I}, {"num_experts", E}, {"num_experts_per_tok", 2},
                              {"norm_topk_prob", true}, {"hidden_act", "silu"}};
  test::write_checkpoint_dir(dir, ts, cfg, nullptr);
  auto ck = Checkpoint::open(dir);
  ASSERT_EQ(ck->format(), CheckpointFormat::Bf16);
  const auto* u = dynamic_cast<const model::UnquantizedCheckpoint*>(ck.get());
  ASSERT_NE(u, nullptr);
  auto gq = make_weight_quantizer(0);
  const MoeWeights a = ck->load_layer(0), b = u->load_layer_with(0, *gq);
  EXPECT_EQ(0, std::memcmp(a.experts.w13.data(), b.experts.w13.data(), a.experts.w13.size()));
  EXPECT_EQ(0, std::memcmp(a.experts.w13_scale.data(), b.experts.w13_scale.data(), a.experts.w13_scale.size()));
  EXPECT_EQ(0, std::memcmp(a.experts.w2.data(), b.experts.w2.data(), a.experts.w2.size()));
  EXPECT_EQ(0, std::memcmp(a.experts.w2_scale.data(), b.experts.w2_scale.data(), a.experts.w2_scale.size()));
  EXPECT_EQ(a.experts.w13_gate_scale2, b.experts.w13_gate_scale2);
  EXPECT_EQ(a.experts.w2_scale2, b.experts.w2_scale2);
  MoeLayerOptions o;
  o.backend = Backend::Cuda;
  o.max_tokens = 16;
  auto layer = MoeLayer::create(*ck, 0, o);
  EXPECT_EQ(layer->spec().num_experts, E);
  o.mode = Mode::W4A4;
  test::expect_error<ArgumentError>([&] { MoeLayer::create(*ck, 0, o); }, {"nvfp4moe quantize", "w4a4"});
}

// ------------------------------------------------------------------ timing: deepseek-v3 layer
TEST(WeightQuant, TimingDeepSeekV3Layer) {
  const int64_t H = 7168, I = 2048, E = 256;
  const int64_t n13 = I * H, n2 = H * I;  // elements per gate / up / down
  const size_t layer_src_bytes = static_cast<size_t>(E) * 3 * n13 * 2;
  // device-resident bf16 weights for a few experts (reused round-robin: the kernels' time does not depend on the
  // values), the packed output for all 256
  constexpr int kDistinct = 4;
  std::mt19937_64 rng(5);
  std::vector<uint16_t> host(static_cast<size_t>(3 * n13));
  {
    std::normal_distribution<float> nd(0.0f, 0.02f);
    for (auto& h : host) h = fmt::bf16_from_float(nd(rng));
  }
  uint16_t* d_src = nullptr;
  CUDA_OK(cudaMalloc(&d_src, host.size() * 2 * kDistinct));
  for (int i = 0; i < kDistinct; ++i)
    CUDA_OK(cudaMemcpy(d_src + i * host.size(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  uint8_t *d_packed = nullptr, *d_scales = nullptr;
  uint32_t* d_misc = nullptr;
  CUDA_OK(cudaMalloc(&d_packed, static_cast<size_t>(E) * 3 * n13 / 2));
  CUDA_OK(cudaMalloc(&d_scales, static_cast<size_t>(E) * 3 * n13 / 16));
  CUDA_OK(cudaMalloc(&d_misc, static_cast<size_t>(E) * 8 * 4));
  auto run_layer = [&]() {
    cudaMemsetAsync(d_misc, 0, static_cast<size_t>(E) * 8 * 4);
    for (int64_t e = 0; e < E; ++e) {
      const uint16_t* s = d_src + (e % kDistinct) * host.size();
      uint32_t* m = d_misc + e * 8;
      for (int r = 0; r < 3; ++r) launch_weight_amax(s + r * n13, DType::BF16, n13, m + r, m + 3, nullptr);
      for (int r = 0; r < 3; ++r) {
        const size_t o = static_cast<size_t>(e * 3 + r) * n13;
        launch_weight_quantize(s + r * n13, DType::BF16, n13, m + (r == 2 ? 2 : 0), m + (r == 2 ? 2 : 1),
                               d_packed + o / 2, d_scales + o / 16, reinterpret_cast<float*>(m + 5 + r), nullptr);
      }
    }
  };
  run_layer();  // warm-up
  CUDA_OK(cudaDeviceSynchronize());
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  constexpr int kReps = 5;
  cudaEventRecord(t0);
  for (int i = 0; i < kReps; ++i) run_layer();
  cudaEventRecord(t1);
  CUDA_OK(cudaEventSynchronize(t1));
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  const double kernel_s = ms / 1e3 / kReps;
  // each source element is read twice (amax, quantize)
  std::printf("[timing] deepseek-v3 layer (H=%lld I=%lld E=%lld, %.2f GB bf16): GPU kernels only (device-resident "
              "bf16 -> NVFP4): %.4f s, %.1f GB/s of source (%.1f GB/s of DRAM traffic)\n",
              (long long)H, (long long)I, (long long)E, layer_src_bytes / 1e9, kernel_s, layer_src_bytes / 1e9 / kernel_s,
              (2.0 * layer_src_bytes + layer_src_bytes * 9.0 / 32.0) / 1e9 / kernel_s);
  cudaFree(d_src);
  cudaFree(d_packed);
  cudaFree(d_scales);
  cudaFree(d_misc);

  // end to end from host memory into MoeWeights (the quantize-at-load path): a host "mapping" of a few distinct
  // experts reused round-robin (what a page-cached checkpoint costs), through the GPU ExpertQuantizer
  std::vector<std::vector<uint8_t>> hsrc(kDistinct);
  for (int i = 0; i < kDistinct; ++i) {
    hsrc[i].resize(host.size() * 2);
    std::memcpy(hsrc[i].data(), host.data(), hsrc[i].size());
  }
  StackedExperts dst;
  dst.allocate(E, H, I, true);
  std::memset(dst.w13.data(), 0, dst.w13.size());  // fault the destination pages in before timing
  std::memset(dst.w2.data(), 0, dst.w2.size());
  std::memset(dst.w13_scale.data(), 0, dst.w13_scale.size());
  std::memset(dst.w2_scale.data(), 0, dst.w2_scale.size());
  auto expert_src = [&](int64_t e, io::TensorInfo (&ti)[3]) {
    const uint8_t* base = hsrc[e % kDistinct].data();
    ti[0] = {"gate", DType::BF16, {I, H}, 0, static_cast<uint64_t>(n13 * 2), base};
    ti[1] = {"up", DType::BF16, {I, H}, 0, static_cast<uint64_t>(n13 * 2), base + n13 * 2};
    ti[2] = {"down", DType::BF16, {H, I}, 0, static_cast<uint64_t>(n2 * 2), base + n13 * 4};
  };
  WeightQuantStats st;
  auto gq = make_weight_quantizer(0, &st);
  {
    io::TensorInfo ti[3];
    expert_src(0, ti);
    model::ExpertSource s;
    s.proj[0] = &ti[0];
    s.proj[1] = &ti[1];
    s.proj[2] = &ti[2];
    gq->quantize(s, dst, 0);  // warm-up (allocates the staging)
    gq->finish();
  }
  st = WeightQuantStats{};
  const double g0 = now_s();
  std::vector<std::array<io::TensorInfo, 3>> keep(2);
  for (int64_t e = 0; e < E; ++e) {
    io::TensorInfo ti[3];
    expert_src(e, ti);
    auto& k = keep[e % 2];  // the quantizer may still read the previous expert's TensorInfo names
    for (int r = 0; r < 3; ++r) k[r] = ti[r];
    model::ExpertSource s;
    s.what = "expert " + std::to_string(e);
    for (int r = 0; r < 3; ++r) s.proj[r] = &k[r];
    gq->quantize(s, dst, e);
  }
  gq->finish();
  const double gpu_e2e = now_s() - g0;
  std::printf("[timing] deepseek-v3 layer: GPU end to end (host bf16 -> pinned staging -> GPU -> MoeWeights): %.3f s, "
              "%.1f GB/s (host staging copies %.3f s, waiting for the GPU %.3f s)\n",
              gpu_e2e, layer_src_bytes / 1e9 / gpu_e2e, st.host_copy_s, st.wait_s);

  // CPU: N experts timed, extrapolated to the layer; the GPU result of those experts checked against it
  const char* env = std::getenv("NVFP4MOE_QUANT_CPU_EXPERTS");
  const int64_t ncpu = std::max<int64_t>(1, std::min<int64_t>(E, env ? std::atoll(env) : 16));
  StackedExperts cdst;
  cdst.allocate(ncpu, H, I, true);
  auto cq = model::make_cpu_expert_quantizer();
  const double c0 = now_s();
  for (int64_t e = 0; e < ncpu; ++e) {
    io::TensorInfo ti[3];
    expert_src(e, ti);
    model::ExpertSource s;
    for (int r = 0; r < 3; ++r) s.proj[r] = &ti[r];
    cq->quantize(s, cdst, e);
  }
  const double cpu_s = now_s() - c0;
  const double cpu_layer = cpu_s * E / ncpu;
  std::printf("[timing] deepseek-v3 layer: CPU (%u host threads): %lld experts in %.3f s -> %.2f s per layer%s, %.2f GB/s\n",
              std::thread::hardware_concurrency(), (long long)ncpu, cpu_s, cpu_layer, ncpu == E ? "" : " (extrapolated)",
              layer_src_bytes / 1e9 / cpu_layer);
  std::printf("[timing] deepseek-v3 layer: GPU end to end is %.1fx the CPU\n", cpu_layer / gpu_e2e);
  for (int64_t e = 0; e < ncpu; ++e) {
    EXPECT_EQ(0, std::memcmp(cdst.w13.data() + e * cdst.w13_bytes_per_expert(),
                             dst.w13.data() + e * dst.w13_bytes_per_expert(), cdst.w13_bytes_per_expert()))
        << "expert " << e;
    EXPECT_EQ(0, std::memcmp(cdst.w2_scale.data() + e * cdst.w2_scale_bytes_per_expert(),
                             dst.w2_scale.data() + e * dst.w2_scale_bytes_per_expert(), cdst.w2_scale_bytes_per_expert()));
    EXPECT_EQ(cdst.w13_gate_scale2[e], dst.w13_gate_scale2[e]);
  }
}

}  // namespace
}  // namespace nvfp4moe::cuda
