// GPU stress suite of the cuda backend through the public API only (MoeLayer::create), testing.md cases 3 and
// 12: index math past 2^31 elements in the permuted operand / GEMM2 output / combine, a 100k-forward soak that
// mixes CUDA-graph replays and eager forwards with changing T and routing (no memory growth, no error, still
// equal to the CPU oracle at the end), and two layers on two streams at once equal to their serial results.
//
// What one MoeLayer allows across streams and threads (docs/architecture.md, "Concurrency"): a layer owns one
// workspace, so its forward() calls must be ordered (one stream, or streams the caller orders with events);
// different layers are independent and may run concurrently on different streams and host threads.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "nvfp4moe/moe.h"
#include "support/cuda_test_support.h"
#include "support/test_support.h"

namespace nvfp4moe::test {
namespace {

// forward() by logits or by ids on device buffers; hidden bf16 [T, H], out f32 [T, H].
void forward_logits(MoeLayer& layer, const uint16_t* hidden, const float* logits, float* out, int64_t T,
                    cudaStream_t s = nullptr) {
  const int64_t H = layer.spec().hidden, E = layer.spec().num_experts;
  const TensorRef h = dev_tensor(const_cast<uint16_t*>(hidden), DType::BF16, {T, H});
  const TensorRef l = dev_tensor(const_cast<float*>(logits), DType::F32, {T, E});
  const TensorRef o = dev_tensor(out, DType::F32, {T, H});
  RoutingArgs r;
  r.router_logits = &l;
  layer.forward(h, r, o, s);
}

void forward_ids(MoeLayer& layer, const uint16_t* hidden, const int32_t* ids, const float* weights, float* out,
                 int64_t T, cudaStream_t s = nullptr) {
  const int64_t H = layer.spec().hidden, K = layer.spec().top_k;
  const TensorRef h = dev_tensor(const_cast<uint16_t*>(hidden), DType::BF16, {T, H});
  const TensorRef i = dev_tensor(const_cast<int32_t*>(ids), DType::I32, {T, K});
  const TensorRef w = dev_tensor(const_cast<float*>(weights), DType::F32, {T, K});
  const TensorRef o = dev_tensor(out, DType::F32, {T, H});
  RoutingArgs r;
  r.topk_ids = &i;
  r.topk_weights = &w;
  layer.forward(h, r, o, s);
}

// The CPU backend's output for host inputs (the oracle).
std::vector<float> cpu_forward(const MoeWeights& w, Mode mode, const std::vector<uint16_t>& hidden,
                               const std::vector<float>& logits, int64_t T) {
  MoeLayerOptions o;
  o.backend = Backend::Cpu;
  o.mode = mode;
  o.max_tokens = T;
  auto layer = MoeLayer::create(clone_weights(w), o);
  const int64_t H = w.spec.hidden, E = w.spec.num_experts;
  std::vector<float> out(T * H);
  const TensorRef h = cpu_tensor(hidden.data(), DType::BF16, {T, H});
  const TensorRef l = cpu_tensor(logits.data(), DType::F32, {T, E});
  const TensorRef oo = cpu_tensor(out.data(), DType::F32, {T, H});
  RoutingArgs r;
  r.router_logits = &l;
  layer->forward(h, r, oo);
  return out;
}

void expect_close_to_oracle(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  const Metrics m = compare(got, ref, 1e-2, 2e-2);
  std::printf("  %s: %s\n", what, m.str().c_str());
  EXPECT_LE(m.rel_l2, 1e-3) << what << ": " << m.str();
  EXPECT_NEAR(m.rms_ratio, 1.0, 0.01) << what;
  EXPECT_EQ(m.nonfinite, 0u) << what;
}

// testing.md case 3. H = 7168 and T*k = 304000 (permuted) rows: the GEMM1 operand has 2.18e9 elements and the
// f32 GEMM2 output the same count, so every row index past 299593 times H overflows int32. With k = E every
// token has a row in every expert, and the last expert's rows (the last 38000) sit past 2^31 / H for the
// tokens t > 33593. Batch invariance gives the oracle: those tokens computed alone (small indices) must be the
// same bits; the small batch is checked against the CPU backend.
TEST(CudaStress, IndexMathPast2Pow31Elements) {
  const int64_t H = 7168, I = 64, E = 8, K = 8, T = 38000;
  static_assert(T * K * H > (int64_t(1) << 31), "the case must cross 2^31 elements");
  MoeSpec spec = small_spec(H, I, E, K);
  RandomWeightsOptions wo;
  wo.seed = 7;
  MoeWeights w = random_weights(spec, wo);
  for (Mode mode : {Mode::W4A16, Mode::W4A4}) {
    MoeLayerOptions o;
    o.backend = Backend::Cuda;
    o.mode = mode;
    o.max_tokens = T;
    size_t free_b = 0, total_b = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    if (free_b < (size_t(24) << 30)) GTEST_SKIP() << "needs ~24 GB free, have " << (free_b >> 20) << " MiB";
    auto layer = MoeLayer::create(clone_weights(w), o);
    std::printf("  %s: workspace %.2f GB for T=%lld (T*k*H = %.3e elements)\n", mode_name(mode),
                layer->workspace_bytes() / 1e9, static_cast<long long>(T), double(T * K * H));
    const auto hidden = random_hidden_bf16(T, H, 11);
    const auto logits = random_logits(T, E, 12);
    DevBuf<uint16_t> hd(T * H);
    DevBuf<float> ld(T * E), od(T * H);
    ASSERT_NE(hd.p, nullptr);
    ASSERT_NE(od.p, nullptr);
    hd.put(hidden);
    ld.put(logits);
    CUDA_OK(cudaMemset(od.p, 0xD5, T * H * sizeof(float)));
    forward_logits(*layer, hd.p, ld.p, od.p, T);
    CUDA_OK(cudaDeviceSynchronize());
    // Tokens past the 2^31 boundary (in the last expert's rows), tokens before it, and the very last one.
    const int64_t picks[] = {0, 1, 20000, 33593, 33594, 36000, T - 3, T - 2, T - 1};
    const int64_t P = static_cast<int64_t>(sizeof(picks) / sizeof(picks[0]));
    std::vector<uint16_t> sh(P * H);
    std::vector<float> sl(P * E), big(P * H);
    for (int64_t i = 0; i < P; ++i) {
      std::memcpy(sh.data() + i * H, hidden.data() + picks[i] * H, H * 2);
      std::memcpy(sl.data() + i * E, logits.data() + picks[i] * E, E * 4);
      const auto row = od.get(H, picks[i] * H);
      std::memcpy(big.data() + i * H, row.data(), H * 4);
    }
    DevBuf<uint16_t> shd(P * H);
    DevBuf<float> sld(P * E), sod(P * H);
    shd.put(sh);
    sld.put(sl);
    forward_logits(*layer, shd.p, sld.p, sod.p, P);
    CUDA_OK(cudaDeviceSynchronize());
    const auto small = sod.get(P * H);
    for (int64_t i = 0; i < P; ++i)
      EXPECT_EQ(std::memcmp(small.data() + i * H, big.data() + i * H, H * 4), 0)
          << mode_name(mode) << ": token " << picks[i] << " differs between the T=" << T << " batch and alone";
    expect_close_to_oracle(small, cpu_forward(w, mode, sh, sl, P), mode_name(mode));
    // Nothing written wrong anywhere: the whole big output is finite (the 0xD5 poison is a finite negative
    // number, so also check a stride of rows against the small run's scale).
    const auto all = od.get(T * H);
    size_t nonfinite = 0;
    for (float v : all) nonfinite += !std::isfinite(v);
    EXPECT_EQ(nonfinite, 0u);
    const float poison = [] { float f; const uint32_t b = 0xD5D5D5D5u; std::memcpy(&f, &b, 4); return f; }();
    size_t poisoned = 0;
    for (float v : all) poisoned += (v == poison);
    EXPECT_EQ(poisoned, 0u) << "output elements never written";
  }
}

// testing.md case 12: 100k forwards, graph replays (captured at T = 17 and T = 64) and eager forwards at
// changing T with changing routing (logits and ids, 4 input sets in rotation). No error, no device memory
// growth; at the end the captured and eager results of a fixed input still equal the first ones bitwise, and
// the CPU oracle.
TEST(CudaStress, Soak100kForwardsMixedGraphAndEager) {
  const int64_t H = 256, I = 128, E = 16, K = 4, TMAX = 64, SETS = 4;
  const int64_t iters = 100000;
  MoeSpec spec = small_spec(H, I, E, K);
  RandomWeightsOptions wo;
  wo.seed = 21;
  MoeWeights w = random_weights(spec, wo);
  for (Mode mode : {Mode::W4A4}) {  // w4a4 runs every kernel of the layer (quantizing gather, fused quant)
    MoeLayerOptions o;
    o.backend = Backend::Cuda;
    o.mode = mode;
    o.max_tokens = TMAX;
    auto layer = MoeLayer::create(clone_weights(w), o);
    DevBuf<uint16_t> hidden(SETS * TMAX * H);
    DevBuf<float> logits(SETS * TMAX * E), tw(SETS * TMAX * K), out(TMAX * H), gout(TMAX * H);
    DevBuf<int32_t> ids(SETS * TMAX * K);
    std::vector<std::vector<uint16_t>> hs;
    std::vector<std::vector<float>> ls;
    for (int64_t s = 0; s < SETS; ++s) {
      hs.push_back(random_hidden_bf16(TMAX, H, 100 + s));
      ls.push_back(random_logits(TMAX, E, 200 + s));
      hidden.put(hs.back(), s * TMAX * H);
      logits.put(ls.back(), s * TMAX * E);
      std::vector<int32_t> id;
      std::vector<float> wt;
      random_topk(TMAX, E, K, 300 + s, &id, &wt, s == 3 ? 0.3f : 0.0f);
      ids.put(id, s * TMAX * K);
      tw.put(wt, s * TMAX * K);
    }
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // Graph inputs live in set 0's slots; the loop copies other sets into them before a replay.
    DevBuf<uint16_t> gh(TMAX * H);
    DevBuf<float> gl(TMAX * E);
    cudaGraphExec_t graphs[2];
    const int64_t graph_T[2] = {17, 64};
    for (int g = 0; g < 2; ++g) {
      cudaGraph_t graph;
      CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      forward_logits(*layer, gh.p, gl.p, gout.p, graph_T[g], st);
      CUDA_OK(cudaStreamEndCapture(st, &graph));
      CUDA_OK(cudaGraphInstantiate(&graphs[g], graph, 0));
      CUDA_OK(cudaGraphDestroy(graph));
    }
    auto load_graph_inputs = [&](int64_t set) {
      cudaMemcpyAsync(gh.p, hidden.p + set * TMAX * H, TMAX * H * 2, cudaMemcpyDeviceToDevice, st);
      cudaMemcpyAsync(gl.p, logits.p + set * TMAX * E, TMAX * E * 4, cudaMemcpyDeviceToDevice, st);
    };
    // The fixed checks, before and after the soak: eager T = 64 on set 1, graph T = 64 on set 2.
    auto fixed_checks = [&](std::vector<float>& eager, std::vector<float>& graph_out) {
      forward_logits(*layer, hidden.p + 1 * TMAX * H, logits.p + 1 * TMAX * E, out.p, TMAX, st);
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      eager = out.get(TMAX * H);
      load_graph_inputs(2);
      EXPECT_EQ(cudaGraphLaunch(graphs[1], st), cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      graph_out = gout.get(TMAX * H);
    };
    std::vector<float> eager0, graph0, eager1, graph1;
    fixed_checks(eager0, graph0);
    size_t free0 = 0, free1 = 0, total = 0;
    CUDA_OK(cudaMemGetInfo(&free0, &total));

    for (int64_t i = 0; i < iters; ++i) {
      const int64_t set = (i * 7) % SETS;
      switch (i % 4) {
        case 0:
          load_graph_inputs(set);
          ASSERT_EQ(cudaGraphLaunch(graphs[(i / 4) % 2], st), cudaSuccess) << "iteration " << i;
          break;
        case 1:
        case 2: {
          const int64_t T = 1 + (i * 37) % TMAX;
          forward_logits(*layer, hidden.p + set * TMAX * H, logits.p + set * TMAX * E, out.p, T, st);
          break;
        }
        default: {
          const int64_t T = (i * 13) % (TMAX + 1);  // includes T = 0
          forward_ids(*layer, hidden.p + set * TMAX * H, ids.p + set * TMAX * K, tw.p + set * TMAX * K, out.p, T,
                      st);
        }
      }
      if (i % 10000 == 9999) {
        CUDA_OK(cudaStreamSynchronize(st));
        CUDA_OK(cudaGetLastError());
      }
    }
    CUDA_OK(cudaStreamSynchronize(st));
    CUDA_OK(cudaMemGetInfo(&free1, &total));
    EXPECT_EQ(free0, free1) << "device memory changed over " << iters << " forwards";

    fixed_checks(eager1, graph1);
    EXPECT_EQ(std::memcmp(eager0.data(), eager1.data(), eager0.size() * 4), 0) << "eager result drifted";
    EXPECT_EQ(std::memcmp(graph0.data(), graph1.data(), graph0.size() * 4), 0) << "graph result drifted";
    expect_close_to_oracle(eager1, cpu_forward(w, mode, hs[1], ls[1], TMAX), "eager after soak vs cpu");
    expect_close_to_oracle(graph1, cpu_forward(w, mode, hs[2], ls[2], TMAX), "graph after soak vs cpu");
    for (auto& g : graphs) CUDA_OK(cudaGraphExecDestroy(g));
    CUDA_OK(cudaStreamDestroy(st));
  }
}

// Two layers (different weights and modes) on two streams, enqueued interleaved from one thread and then from
// two host threads: each result bitwise equal to the layer's serial result.
TEST(CudaStress, TwoLayersOnTwoStreamsEqualSerial) {
  const int64_t H = 512, I = 256, E = 32, K = 4, T = 200, ROUNDS = 20;
  MoeSpec spec = small_spec(H, I, E, K);
  std::unique_ptr<MoeLayer> layers[2];
  for (int l = 0; l < 2; ++l) {
    RandomWeightsOptions wo;
    wo.seed = 40 + l;
    MoeLayerOptions o;
    o.backend = Backend::Cuda;
    o.mode = l == 0 ? Mode::W4A16 : Mode::W4A4;
    o.max_tokens = T;
    layers[l] = MoeLayer::create(random_weights(spec, wo), o);
  }
  DevBuf<uint16_t> hidden(2 * T * H);
  DevBuf<float> logits(2 * T * E), out(2 * ROUNDS * T * H);
  for (int l = 0; l < 2; ++l) {
    hidden.put(random_hidden_bf16(T, H, 50 + l), l * T * H);
    logits.put(random_logits(T, E, 60 + l), l * T * E);
  }
  std::vector<float> serial[2];
  for (int l = 0; l < 2; ++l) {
    forward_logits(*layers[l], hidden.p + l * T * H, logits.p + l * T * E, out.p, T);
    CUDA_OK(cudaDeviceSynchronize());
    serial[l] = out.get(T * H);
  }
  cudaStream_t st[2];
  for (auto& s : st) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto check = [&](const char* how) {
    for (int l = 0; l < 2; ++l)
      for (int64_t r = 0; r < ROUNDS; ++r) {
        const auto got = out.get(T * H, (l * ROUNDS + r) * T * H);
        ASSERT_EQ(std::memcmp(got.data(), serial[l].data(), got.size() * 4), 0)
            << how << ": layer " << l << " round " << r;
      }
  };
  CUDA_OK(cudaMemset(out.p, 0, out.n * sizeof(float)));
  for (int64_t r = 0; r < ROUNDS; ++r)
    for (int l = 0; l < 2; ++l)
      forward_logits(*layers[l], hidden.p + l * T * H, logits.p + l * T * E, out.p + (l * ROUNDS + r) * T * H, T,
                     st[l]);
  CUDA_OK(cudaDeviceSynchronize());
  check("interleaved on two streams");
  CUDA_OK(cudaMemset(out.p, 0, out.n * sizeof(float)));
  std::thread threads[2];
  for (int l = 0; l < 2; ++l)
    threads[l] = std::thread([&, l] {
      for (int64_t r = 0; r < ROUNDS; ++r)
        forward_logits(*layers[l], hidden.p + l * T * H, logits.p + l * T * E, out.p + (l * ROUNDS + r) * T * H,
                       T, st[l]);
    });
  for (auto& t : threads) t.join();
  CUDA_OK(cudaDeviceSynchronize());
  check("two host threads, two streams");
  for (auto& s : st) CUDA_OK(cudaStreamDestroy(s));
}

}  // namespace
}  // namespace nvfp4moe::test
