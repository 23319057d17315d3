// GPU tests of the sm_90a NVFP4 grouped GEMM (src/cuda/sm90_nvfp4_grouped_gemm.*): every instantiated config
// and epilogue against a straightforward CPU reference (dequantize, fp32 accumulate), adversarial expert
// offsets, the real model shapes with small E, bitwise determinism, and batch invariance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda/sm90_nvfp4_grouped_gemm.cuh"
#include "cuda/sm90_nvfp4_grouped_gemm.h"
#include "format/nvfp4.h"
#include "support/cuda_test_support.h"

namespace nvfp4moe::cuda {
namespace {

using test::DevBuf;

// CUDA_OK plus the launcher's own reason (sm90_gemm_last_error_message) when a GEMM call is refused.
#define CUDA_GEMM_OK(x)                                                                               \
  do {                                                                                           \
    cudaError_t err_ = (x);                                                                      \
    ASSERT_EQ(err_, cudaSuccess) << #x << ": " << cudaGetErrorString(err_) << " "                \
                                 << sm90_gemm_last_error_message();                              \
  } while (0)

template <typename F>
void parallel_for(int64_t n, F f) {
  const int nt = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> th;
  for (int w = 0; w < nt; ++w)
    th.emplace_back([&, w] {
      for (int64_t i = w; i < n; i += nt) f(i);
    });
  for (auto& t : th) t.join();
}

// ------------------------------------------------------------------------------------ problem + reference
struct Problem {
  int E, N, K;
  bool gated;
  std::vector<uint8_t> packed, scales;  // [E][N][K/2], [E][N][K/16]
  std::vector<uint16_t> a;              // [cap][K]
  std::vector<int32_t> offsets;         // [E+1]
  std::vector<float> alpha0, alpha1, gs;
  int64_t cap;
};

uint8_t random_scale(std::mt19937& rng) {
  const int r = rng() % 64;
  if (r == 0) return 0x00;                       // zero block
  if (r < 3) return static_cast<uint8_t>(1 + rng() % 7);  // e4m3 subnormals
  return static_cast<uint8_t>(0x28 + rng() % 0x30);     // ~2^-2 .. 2^4
}

Problem make_problem(int E, int N, int K, bool gated, const std::vector<int>& counts, uint32_t seed,
                     int64_t extra_rows = 5) {
  std::mt19937 rng(seed);
  Problem p{E, N, K, gated, {}, {}, {}, {}, {}, {}, {}, 0};
  p.packed.resize(static_cast<size_t>(E) * N * K / 2);
  p.scales.resize(static_cast<size_t>(E) * N * K / 16);
  for (auto& b : p.packed) b = static_cast<uint8_t>(rng());
  for (auto& s : p.scales) s = random_scale(rng);
  p.offsets.assign(E + 1, 0);
  for (int e = 0; e < E; ++e) p.offsets[e + 1] = p.offsets[e] + counts[e];
  p.cap = p.offsets[E] + extra_rows;
  p.a.resize(static_cast<size_t>(p.cap) * K);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  for (auto& x : p.a) x = fmt::bf16_from_float(ud(rng));
  for (int e = 0; e < E; ++e) {
    p.alpha0.push_back(std::ldexp(1.0f + (rng() % 100) / 100.0f, -9));
    p.alpha1.push_back(std::ldexp(1.0f + (rng() % 100) / 100.0f, -9));
    p.gs.push_back(1.0f / std::ldexp(1.0f + (rng() % 100) / 100.0f, -4));
  }
  return p;
}

// h[row][n] in fp32 (before the epilogue, alpha applied per half), n over all N prepared-logical rows.
std::vector<float> reference_h(const Problem& p) {
  const int64_t rows = p.offsets[p.E];
  std::vector<float> h(static_cast<size_t>(rows) * p.N);
  for (int e = 0; e < p.E; ++e) {
    if (p.offsets[e + 1] == p.offsets[e]) continue;
    std::vector<float> wdq(static_cast<size_t>(p.N) * p.K);
    parallel_for(p.N, [&](int64_t n) {
      for (int k = 0; k < p.K; ++k) {
        const size_t row = static_cast<size_t>(e) * p.N + n;
        wdq[n * p.K + k] = fmt::dequant_operand(fmt::unpack_e2m1(&p.packed[row * (p.K / 2)], k),
                                                p.scales[row * (p.K / 16) + k / 16]);
      }
    });
    parallel_for(p.offsets[e + 1] - p.offsets[e], [&](int64_t i) {
      const int64_t r = p.offsets[e] + i;
      std::vector<float> x(p.K);
      for (int k = 0; k < p.K; ++k) x[k] = fmt::bf16_to_float(p.a[r * p.K + k]);
      for (int n = 0; n < p.N; ++n) {
        float s = 0.0f;
        const float* w = &wdq[static_cast<size_t>(n) * p.K];
        for (int k = 0; k < p.K; ++k) s += x[k] * w[k];
        const float al = (p.gated && n >= p.N / 2) ? p.alpha1[e] : p.alpha0[e];
        h[r * p.N + n] = s * al;
      }
    });
  }
  return h;
}

int expert_of(const Problem& p, int64_t r) {
  int e = 0;
  while (p.offsets[e + 1] <= r) ++e;
  return e;
}

void quantize_row_inplace(float* x, int n, float gs) {
  for (int c = 0; c < n; c += 16) {
    uint8_t q[16];
    const uint8_t sf = fmt::quantize_activation_block(x + c, 16, gs, q);
    for (int i = 0; i < 16; ++i) x[c + i] = fmt::e2m1_decode(q[i]) * fmt::e4m3_decode(sf);
  }
}

// Reference output (f32 values; bf16 epilogues rounded to bf16, and quantized when quant).
std::vector<float> reference_out(const Problem& p, Sm90GemmEpilogue epi, bool quant, const std::vector<float>& h) {
  const int64_t rows = p.offsets[p.E];
  const int n_out = epi == Sm90GemmEpilogue::kSwiGLU ? p.N / 2 : p.N;
  std::vector<float> out(static_cast<size_t>(rows) * n_out);
  for (int64_t r = 0; r < rows; ++r) {
    for (int n = 0; n < n_out; ++n) {
      float v;
      if (epi == Sm90GemmEpilogue::kF32) {
        v = h[r * p.N + n];
      } else if (epi == Sm90GemmEpilogue::kSwiGLU) {
        const float g = h[r * p.N + n], u = h[r * p.N + n_out + n];
        v = fmt::bf16_round(g / (1.0f + std::exp(-g)) * u);
      } else {
        const float y = std::max(h[r * p.N + n], 0.0f);
        v = fmt::bf16_round(y * y);
      }
      out[r * n_out + n] = v;
    }
    if (quant && epi != Sm90GemmEpilogue::kF32) quantize_row_inplace(&out[r * n_out], n_out, p.gs[expert_of(p, r)]);
  }
  return out;
}


struct GpuRun {
  std::vector<float> out;     // as f32 values
  std::vector<uint32_t> bits; // raw bits (f32) or bf16 bits, for bitwise comparisons
  int64_t unwritten = 0;      // poisoned elements left inside [0, offsets[E]) rows
  int64_t overwritten = 0;    // elements written past offsets[E]
  // Set by the caller: runs that differ from the first are counted here (with the first one's description)
  // instead of failing the test at once.
  bool record_differences = false;
  int differing_runs = 0;
  std::string first_difference;
};

// The arguments of one launch over problem p's device copies (a, prepared w, offsets, the factors, out);
// gs, the schedule and the stagger are left at their defaults for the caller to set.
Sm90GemmArgs problem_args(const Problem& p, const Sm90PreparedShape& shape, const uint16_t* a, const uint8_t* w,
                          const int32_t* offsets, const float* alpha0, const float* alpha1, void* out,
                          Sm90GemmEpilogue epi) {
  Sm90GemmArgs args;
  args.a = a;
  args.a_rows_capacity = p.cap;
  args.w = w;
  args.shape = shape;
  args.offsets = offsets;
  args.alpha0 = alpha0;
  args.alpha1 = alpha1;
  args.out = out;
  args.epilogue = epi;
  return args;
}

// A gathered A (Sm90GemmArgs::a_gather_*): the source rows and the permutation the GEMM reads instead of p.a.
struct GatherInput {
  std::vector<uint16_t> src;  // [src_rows][K]
  int64_t src_rows = 0;
  std::vector<int32_t> perm;  // [offsets[E]] (entries past offsets[perm_experts] unused)
  int top_k = 1;
  int perm_experts = -1;
  int64_t shared_base = 0;    // Sm90GemmArgs::a_gather_shared_row_base
};

// Where two outputs of [rows, n_out] elements of esz bytes differ: how many elements, how many of them are the
// 0xFF poison (not written) in each, and the first few (row, column, both raw values).
std::string describe_difference(const std::vector<uint8_t>& x, const std::vector<uint8_t>& y, size_t esz, int n_out) {
  int64_t differ = 0, unwritten_x = 0, unwritten_y = 0;
  std::ostringstream first;
  auto value = [&](const std::vector<uint8_t>& v, size_t i) {
    uint32_t b = 0;
    std::memcpy(&b, &v[i * esz], esz);
    return b;
  };
  const uint32_t poison = esz == 4 ? 0xFFFFFFFFu : 0xFFFFu;
  for (size_t i = 0; i < x.size() / esz; ++i) {
    const uint32_t a = value(x, i), b = value(y, i);
    if (a == b) continue;
    unwritten_x += a == poison;
    unwritten_y += b == poison;
    if (differ++ < 4)
      first << " [row " << i / n_out << " col " << i % n_out << ": 0x" << std::hex << a << " vs 0x" << b << std::dec
            << "]";
  }
  std::ostringstream m;
  m << differ << " elements differ (" << unwritten_x << " not written in the first run, " << unwritten_y
    << " in this one); first:" << first.str();
  return m.str();
}

// Prepares the weights and runs one config; out poisoned with 0xFF bytes first. tile_counter: the dynamic tile
// schedule (zero before the call; every launch must leave it zero); num_sms: the persistent grid (0: the SMs);
// stagger_ns: Sm90GemmArgs::consumer_stagger_ns; gather: A gathered from it (then `a` is passed as null);
// broadcast_row: `a` is a one-row buffer holding p.a's row 0, read for every row (Sm90GemmArgs::a_broadcast_row).
void run_gpu(const Problem& p, Sm90GemmEpilogue epi, bool quant, const Sm90GemmConfig& cfg, GpuRun& res,
             int repeats = 1, bool before_pdl_wait = false, int32_t* tile_counter = nullptr, int num_sms = 0,
             int stagger_ns = 0, const GatherInput* gather = nullptr, bool broadcast_row = false,
             bool mixed_last_pass = false) {
  const Sm90PreparedShape shape = sm90_prepared_shape(p.E, p.N, p.K, p.gated);
  DevBuf<uint8_t> packed(p.packed), scales(p.scales), w(shape.bytes);
  DevBuf<uint16_t> a(p.a);
  DevBuf<int32_t> off(p.offsets);
  DevBuf<float> al0(p.alpha0), al1(p.alpha1), gs(p.gs);
  const int n_out = epi == Sm90GemmEpilogue::kSwiGLU ? p.N / 2 : p.N;
  const size_t esz = epi == Sm90GemmEpilogue::kF32 ? 4 : 2;
  DevBuf<uint8_t> out(static_cast<size_t>(p.cap) * n_out * esz);
  ASSERT_TRUE(packed.p && scales.p && w.p && a.p && off.p && out.p);
  CUDA_GEMM_OK(cudaMemset(w.p, 0xAB, shape.bytes));  // prepare must write every byte it owns
  CUDA_GEMM_OK(sm90_prepare_weights(packed.p, scales.p, shape, w.p, nullptr));
  Sm90GemmArgs args = problem_args(p, shape, a.p, w.p, off.p, al0.p, al1.p, out.p, epi);
  args.gs = quant ? gs.p : nullptr;
  args.prologue_before_pdl_wait = before_pdl_wait;
  args.tile_counter = tile_counter;
  args.consumer_stagger_ns = stagger_ns;
  args.mixed_last_pass = mixed_last_pass;
  DevBuf<uint16_t> gsrc(gather ? gather->src.size() : 1);
  DevBuf<int32_t> gperm(gather ? std::max<size_t>(gather->perm.size(), 1) : 1);
  if (gather) {
    ASSERT_TRUE(gsrc.p && gperm.p);
    gsrc.put(gather->src);
    gperm.put(gather->perm);
    args.a = nullptr;
    args.a_gather_src = gsrc.p;
    args.a_gather_src_rows = gather->src_rows;
    args.a_gather_perm = gperm.p;
    args.a_gather_top_k = gather->top_k;
    args.a_gather_perm_experts = gather->perm_experts;
    args.a_gather_shared_row_base = gather->shared_base;
  }
  DevBuf<uint16_t> row0(std::vector<uint16_t>(p.a.begin(), p.a.begin() + p.K));
  if (broadcast_row) {
    ASSERT_TRUE(row0.p);
    args.a = row0.p;
    args.a_rows_capacity = 1;
    args.a_broadcast_row = true;
  }
  std::vector<uint8_t> first;
  for (int rep = 0; rep < repeats; ++rep) {
    CUDA_GEMM_OK(cudaMemset(out.p, 0xFF, out.n));
    CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(args, cfg, nullptr, num_sms));
    CUDA_GEMM_OK(cudaDeviceSynchronize());
    if (tile_counter != nullptr) {
      int32_t left = -1;
      CUDA_GEMM_OK(cudaMemcpy(&left, tile_counter, sizeof(left), cudaMemcpyDeviceToHost));
      ASSERT_EQ(left, 0) << "the dynamic schedule's last claim must reset the tile counter (run " << rep << ")";
    }
    std::vector<uint8_t> h = out.get();
    if (rep == 0) {
      first = h;
    } else if (res.record_differences) {
      if (std::memcmp(first.data(), h.data(), h.size()) != 0 && res.differing_runs++ == 0)
        res.first_difference = "run " + std::to_string(rep) + ": " + describe_difference(first, h, esz, n_out);
    } else {
      ASSERT_EQ(0, std::memcmp(first.data(), h.data(), h.size()))
          << "run " << rep << " differs bitwise: " << describe_difference(first, h, esz, n_out);
    }
  }
  const int64_t rows = p.offsets[p.E];
  res.out.assign(static_cast<size_t>(rows) * n_out, 0.0f);
  res.bits.assign(static_cast<size_t>(rows) * n_out, 0u);
  res.unwritten = res.overwritten = 0;
  for (int64_t i = 0; i < p.cap * n_out; ++i) {
    uint32_t b;
    float v;
    if (esz == 4) {
      std::memcpy(&b, &first[i * 4], 4);
      v = fmt::bits_float(b);
    } else {
      uint16_t hb;
      std::memcpy(&hb, &first[i * 2], 2);
      b = hb;
      v = fmt::bf16_to_float(hb);
    }
    const bool poison = esz == 4 ? b == 0xFFFFFFFFu : b == 0xFFFFu;
    if (i < rows * n_out) {
      res.out[i] = v;
      res.bits[i] = b;
      if (poison) ++res.unwritten;
    } else if (!poison) {
      ++res.overwritten;
    }
  }
}

double rel_l2(const std::vector<float>& x, const std::vector<float>& ref, int64_t* nonfinite) {
  double num = 0, den = 0;
  *nonfinite = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) ++*nonfinite;
    num += (double(x[i]) - ref[i]) * (double(x[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

const char* epi_name(Sm90GemmEpilogue e) {
  return e == Sm90GemmEpilogue::kF32 ? "f32" : e == Sm90GemmEpilogue::kSwiGLU ? "swiglu" : "relu2";
}

// Checks one problem for one config/epilogue against the reference; quant also bitwise against the CPU
// quantization of the GPU's own unquantized output (the quantizer itself must be exact).
// Activations for the bitwise comparisons of two MMA paths: exponents over 2^-60 .. 2^40, both signs, and exact
// cancellations (x and -x in one k16 step).
void fill_adversarial_activations(Problem& p, std::mt19937& rng) {
  for (size_t i = 0; i < p.a.size(); ++i) {
    const uint32_t h = static_cast<uint32_t>(rng());
    const int ex = static_cast<int>(h % 101) - 60;
    float v = std::ldexp(1.0f + static_cast<float>((h >> 8) & 0x7F) / 128.0f, ex);
    if (h & 0x80000000u) v = -v;
    p.a[i] = fmt::bf16_from_float(v);
  }
  for (size_t i = 0; i + 16 < p.a.size(); i += 97) p.a[i + 8] = p.a[i] ^ 0x8000u;  // x and -x in one step
}
// The epilogues of a gated (SwiGLU) or non-gated (f32 and relu^2) problem.
std::vector<Sm90GemmEpilogue> epilogues_of(bool gated) {
  if (gated) return {Sm90GemmEpilogue::kSwiGLU};
  return {Sm90GemmEpilogue::kF32, Sm90GemmEpilogue::kRelu2};
}

void check(const Problem& p, Sm90GemmEpilogue epi, const Sm90GemmConfig& cfg, const std::vector<float>& h,
           bool also_quant, int repeats = 1) {
  SCOPED_TRACE(::testing::Message() << "E=" << p.E << " N=" << p.N << " K=" << p.K << " rows=" << p.offsets[p.E]
                                    << " epi=" << epi_name(epi) << " cfg=" << to_string(cfg));
  GpuRun r;
  run_gpu(p, epi, false, cfg, r, repeats);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(r.unwritten, 0);
  EXPECT_EQ(r.overwritten, 0);
  // The dynamic tile schedule (what the layer launches) on the device's grid and on a grid of 5 CTAs (each
  // claims many tiles; there with the consumer stagger, so the two consumer warpgroups run apart over many
  // tiles): the static schedule's bits, every output written once, the counter left zero.
  DevBuf<int32_t> counter(std::vector<int32_t>{0});
  ASSERT_TRUE(counter.p);
  for (const int sms : {0, 5}) {
    if (cfg.warp_stream) break;  // (its pieces are spread statically; it ignores the counter)
    const int stagger = sms == 5 ? 3000 : 0;
    SCOPED_TRACE(::testing::Message() << "dynamic schedule, grid " << sms << ", stagger " << stagger);
    GpuRun d;
    run_gpu(p, epi, false, cfg, d, 2, false, counter.p, sms, stagger);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(d.unwritten, 0) << "dynamic schedule, grid " << sms << ", stagger " << stagger;
    EXPECT_EQ(d.overwritten, 0) << "dynamic schedule, grid " << sms << ", stagger " << stagger;
    EXPECT_TRUE(d.bits == r.bits) << "dynamic schedule, grid " << sms << ", stagger " << stagger
                                  << ": bits differ from the static schedule";
  }
  const std::vector<float> ref = reference_out(p, epi, false, h);
  int64_t nonfinite = 0;
  const double err = rel_l2(r.out, ref, &nonfinite);
  EXPECT_EQ(nonfinite, 0);
  EXPECT_LE(err, epi == Sm90GemmEpilogue::kF32 ? 1e-5 : 4e-3) << "relative L2 error";
  if (also_quant && epi != Sm90GemmEpilogue::kF32) {
    GpuRun q;
    run_gpu(p, epi, true, cfg, q);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(q.unwritten, 0);
    if (!cfg.warp_stream) {
      GpuRun qd;
      run_gpu(p, epi, true, cfg, qd, 1, false, counter.p, 3);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_TRUE(qd.bits == q.bits) << "dynamic schedule, quantizing epilogue: bits differ from the static one";
      GpuRun qs;  // the static schedule with the consumer stagger, on the device's grid
      run_gpu(p, epi, true, cfg, qs, 1, false, nullptr, 0, 5000);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_TRUE(qs.bits == q.bits) << "consumer stagger, quantizing epilogue: bits differ";
    }
    const int n_out = epi == Sm90GemmEpilogue::kSwiGLU ? p.N / 2 : p.N;
    std::vector<float> expect = r.out;
    int64_t mism = 0;
    for (int64_t row = 0; row < p.offsets[p.E]; ++row) {
      quantize_row_inplace(&expect[row * n_out], n_out, p.gs[expert_of(p, row)]);
      for (int n = 0; n < n_out; ++n)
        if (fmt::bf16_from_float(expect[row * n_out + n]) != q.bits[row * n_out + n]) ++mism;
    }
    EXPECT_EQ(mism, 0) << "fused NVFP4 quantization differs from fmt::quantize_activation_block";
    const std::vector<float> refq = reference_out(p, epi, true, h);
    EXPECT_LE(rel_l2(q.out, refq, &nonfinite), 0.1) << "quantized output far from the quantized reference";
  }
}

// ------------------------------------------------------------------------------------ tests
// The register dequantization: every (code, scale) pair equals fmt::dequant_operand * 2^-26 exactly, in every
// one of the 16 registers x 2 halves of a thread's block and every one of its 8 scale slots (the prepared bit
// order puts each at different bits). Thread c of block s: code c in all 32 slots, scale s in all 8 slots; and
// a second pass (code slot v gets code (c + v) % 16, scale slot u gets (s + 37u) % 256) so that neighbouring
// slots hold different values.
__global__ void dequant_all_kernel(uint16_t* out, int mix) {
  const int s = blockIdx.x;   // scale code 0..255
  const int c = threadIdx.x;  // code 0..15
  uint32_t w[4];
  for (int j = 0; j < 4; ++j) {
    uint32_t code[4][2];
    for (int i = 0; i < 4; ++i)
      for (int e = 0; e < 2; ++e) code[i][e] = mix ? (c + 8 * j + 2 * i + e) % 16 : c;
    w[j] = sm90::pack_fp4_word(code);
  }
  uint32_t sw[2];
  for (int h2 = 0; h2 < 2; ++h2) {
    uint8_t sc[2][2];
    for (int jj = 0; jj < 2; ++jj)
      for (int h = 0; h < 2; ++h) sc[jj][h] = static_cast<uint8_t>(mix ? (s + 37 * (4 * h2 + 2 * jj + h)) % 256 : s);
    sw[h2] = sm90::pack_scale_word(sc);
  }
  uint32_t a[16];
  sm90::dequant_block(make_uint4(w[0], w[1], w[2], w[3]), make_uint2(sw[0], sw[1]), a);
  for (int r = 0; r < 16; ++r) {
    out[(s * 16 + c) * 32 + 2 * r] = static_cast<uint16_t>(a[r] & 0xFFFF);
    out[(s * 16 + c) * 32 + 2 * r + 1] = static_cast<uint16_t>(a[r] >> 16);
  }
}

TEST(Sm90GroupedGemm, DequantIsExactForEveryCodeAndScale) {
  for (int mix = 0; mix < 2; ++mix) {
    DevBuf<uint16_t> out(256 * 16 * 32);
    dequant_all_kernel<<<256, 16>>>(out.p, mix);
    CUDA_GEMM_OK(cudaGetLastError());
    CUDA_GEMM_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> h = out.get();
    int bad = 0;
    for (int s = 0; s < 256; ++s)
      for (int c = 0; c < 16; ++c)
        for (int r = 0; r < 16; ++r)
          for (int e = 0; e < 2; ++e) {
            const int j = r / 4, i = r % 4;
            const int code = mix ? (c + 8 * j + 2 * i + e) % 16 : c;
            const int slot = 2 * j + (i & 1);  // scale slot 4*h2 + 2*jj + h with j = 2*h2 + jj, h = i & 1
            const int sc = mix ? (s + 37 * slot) % 256 : s;
            if ((sc & 0x7F) == 0x7F) continue;  // NaN scales: never written by a quantizer (see scale_word)
            const float want =
                fmt::dequant_operand(static_cast<uint8_t>(code), static_cast<uint8_t>(sc)) / sm90::kWeightUnscale;
            const uint16_t got_bits = h[(s * 16 + c) * 32 + 2 * r + e];
            const float got = fmt::bf16_to_float(got_bits);
            // the same value (a zero's sign does not reach the fp32 accumulator)
            if (!(want == got)) {
              if (++bad < 10)
                ADD_FAILURE() << "mix " << mix << " code " << code << " scale 0x" << std::hex << sc << std::dec
                              << " reg " << r << " half " << e << ": got " << got << " want " << want;
            }
          }
    EXPECT_EQ(bad, 0);
  }
}

// silu_batch (the branch-free silu of the experiment-17 epilogue) against the engine's silu_f32, v / (1 + expf(-v))
// with the IEEE division, bit for bit for every one of the 2^32 float inputs: once with each value alone in its
// batch (the fast path wherever the batch's range check lets it stand) and once in batches of 16 consecutive bit
// patterns (the check for a whole batch, and the fallback where one of them is out of range). Counts the
// mismatches and keeps the first few inputs.
template <int N>
__global__ void silu_batch_vs_ieee_kernel(unsigned long long* mismatches, uint32_t* first_bad) {
  const uint64_t batches = (uint64_t{1} << 32) / N;
  for (uint64_t bi = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; bi < batches;
       bi += uint64_t{gridDim.x} * blockDim.x) {
    float v[N], got[N];
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = __uint_as_float(static_cast<uint32_t>(bi * N + i));
    sm90::silu_batch<N>(v, got);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float want = sm90::silu_f32(v[i]);
      if (__float_as_uint(got[i]) != __float_as_uint(want)) {
        const unsigned long long k = atomicAdd(mismatches, 1ull);
        if (k < 8) first_bad[k] = __float_as_uint(v[i]);
      }
    }
  }
}

TEST(Sm90GroupedGemm, SiluBatchIsTheIeeeDivisionForEveryFloat) {
  DevBuf<unsigned long long> mismatches(std::vector<unsigned long long>{0, 0});
  DevBuf<uint32_t> first_bad(16);
  ASSERT_TRUE(mismatches.p && first_bad.p);
  silu_batch_vs_ieee_kernel<1><<<132 * 8, 256>>>(mismatches.p, first_bad.p);
  CUDA_GEMM_OK(cudaGetLastError());
  silu_batch_vs_ieee_kernel<16><<<132 * 8, 256>>>(mismatches.p + 1, first_bad.p + 8);
  CUDA_GEMM_OK(cudaGetLastError());
  CUDA_GEMM_OK(cudaDeviceSynchronize());
  const std::vector<unsigned long long> m = mismatches.get();
  const std::vector<uint32_t> bad = first_bad.get();
  for (int n = 0; n < 2; ++n) {
    std::string inputs;
    for (unsigned long long k = 0; k < std::min<unsigned long long>(m[n], 8); ++k) {
      char buf[32];
      std::snprintf(buf, sizeof buf, " 0x%08x", bad[8 * n + k]);
      inputs += buf;
    }
    EXPECT_EQ(m[n], 0ull) << (n == 0 ? "batches of 1" : "batches of 16") << ", first inputs:" << inputs;
  }
}

TEST(Sm90GroupedGemm, EveryConfigEveryEpilogueRandomOffsets) {
  std::mt19937 rng(7);
  for (const auto& cfg : sm90_gemm_configs()) {
    // E=5 with an empty expert, N not a multiple of the tile, K not a multiple of 64.
    std::vector<int> counts = {static_cast<int>(rng() % 40), 0, cfg.block_t + 3, static_cast<int>(1 + rng() % 7),
                               2 * cfg.block_t + 1};
    {
      Problem p = make_problem(5, 320, 208, false, counts, 11 + cfg.block_t);
      const auto h = reference_h(p);
      check(p, Sm90GemmEpilogue::kF32, cfg, h, false);
      check(p, Sm90GemmEpilogue::kRelu2, cfg, h, true);
    }
    {
      Problem p = make_problem(5, 2 * 208, 272, true, counts, 21 + cfg.block_t);  // I = 208: masked unit
      const auto h = reference_h(p);
      check(p, Sm90GemmEpilogue::kSwiGLU, cfg, h, true);
    }
  }
}

// Every wgmma width a token tile can run (mma_n_for_rows: 16 / 32 / 64 / 128 / 144 up to the tile), with rows just
// below, on and just above each width and every multiple of 16 between (the widths measured and reverted at
// 13aabf8), in every config, every epilogue (the quantizing one bitwise against the CPU quantizer).
TEST(Sm90GroupedGemm, EveryWgmmaWidthOfATile) {
  const std::vector<int> counts = {1, 16, 17, 31, 33, 47, 49, 64, 65, 79, 81, 96, 97, 112, 113, 127, 129, 143, 145,
                                   160, 161, 289, 300};
  const int E = static_cast<int>(counts.size());
  Problem p = make_problem(E, 320, 208, false, counts, 4321);
  const auto h = reference_h(p);
  Problem g = make_problem(E, 2 * 208, 144, true, counts, 4322);
  const auto hg = reference_h(g);
  for (const auto& cfg : sm90_gemm_configs()) {
    check(p, Sm90GemmEpilogue::kF32, cfg, h, false);
    check(p, Sm90GemmEpilogue::kRelu2, cfg, h, true);
    check(g, Sm90GemmEpilogue::kSwiGLU, cfg, hg, true);
  }
}

// Every tile config launched many times in a row gives the same bits every time, on the static and the dynamic
// schedule, on the device's grid and on 5 CTAs (an H200 run of the x18 build once saw EveryWgmmaWidthOfATile's
// dynamic-schedule launches of bt16_s14_wg2_sync relu^2 differ between two runs, and 1316906's first form of this
// test saw it again, 2 of 4 repeats). Each (config, epilogue, schedule, grid) runs 24 times; every unstable one is
// reported (how many runs differ from the first, which elements, whether written), and every run is compared
// with the static schedule's first run on the device's grid.
TEST(Sm90GroupedGemm, TileConfigsStableOverManyLaunches) {
  const std::vector<int> counts = {1, 16, 17, 31, 33, 47, 49, 64, 65, 79, 81, 96, 97, 112, 113, 127, 129, 143, 145,
                                   160, 161, 289, 300};
  const Problem p = make_problem(static_cast<int>(counts.size()), 320, 208, false, counts, 4321);
  DevBuf<int32_t> counter(std::vector<int32_t>{0});
  ASSERT_TRUE(counter.p);
  int unstable = 0;
  for (const auto& cfg : sm90_gemm_configs()) {
    if (cfg.warp_stream) continue;
    for (const Sm90GemmEpilogue epi : {Sm90GemmEpilogue::kRelu2, Sm90GemmEpilogue::kF32}) {
      std::vector<uint32_t> reference;
      for (const bool dynamic : {false, true})
        for (const int sms : {0, 5}) {
          SCOPED_TRACE(::testing::Message() << "cfg=" << to_string(cfg) << " epi=" << epi_name(epi)
                                            << (dynamic ? " dynamic" : " static") << " grid " << sms);
          GpuRun d;
          d.record_differences = true;
          run_gpu(p, epi, false, cfg, d, 24, false, dynamic ? counter.p : nullptr, sms);
          if (::testing::Test::HasFatalFailure()) return;
          if (reference.empty()) reference = d.bits;
          const bool same = d.bits == reference;
          if (d.differing_runs > 0 || !same || d.unwritten != 0) {
            ++unstable;
            std::printf("UNSTABLE cfg=%s epi=%s %s grid %d: %d of 23 runs differ from the first; first run %s the "
                        "static one's; unwritten %lld; %s\n",
                        to_string(cfg).c_str(), epi_name(epi), dynamic ? "dynamic" : "static", sms, d.differing_runs,
                        same ? "equals" : "differs from", static_cast<long long>(d.unwritten),
                        d.first_difference.c_str());
          }
          EXPECT_EQ(d.differing_runs, 0) << d.first_difference;
          EXPECT_TRUE(same) << "the first run's bits differ from the static schedule's on the device's grid";
          EXPECT_EQ(d.unwritten, 0);
        }
    }
  }
  int tile_configs = 0;
  for (const auto& cfg : sm90_gemm_configs()) tile_configs += cfg.warp_stream ? 0 : 1;
  std::printf("TileConfigsStableOverManyLaunches: %d unstable (config, epilogue, schedule, grid) of %d\n", unstable,
              tile_configs * 8);
}

// Rows of A that are NaN or +-Inf make whole GEMM1 output rows non-finite (one NaN in a row reaches every
// output of it). The quantizing epilogue must give the CPU quantizer's bits there as well: a group of 16 NaNs has
// vmax 0 in fmt::quantize_activation_block (its max starts from 0), so scale 0 and operands 0, where a max over
// the group alone would be NaN (scale 0x7F, NaN operands); a group with an Inf has scale 448 and saturated values.
// Every config, both activations (relu^2 maps NaN to 0 and keeps +Inf).
TEST(Sm90GroupedGemm, QuantizingEpilogueOnNonFiniteRows) {
  const std::vector<int> counts = {9, 0, 20, 3};
  for (const bool gated : {true, false}) {
    Problem p = make_problem(4, gated ? 2 * 208 : 320, 144, gated, counts, gated ? 99 : 98);
    const struct { int64_t row; uint16_t bits; } fills[] = {{2, 0x7FC0}, {11, 0x7F80}, {25, 0xFF80}, {30, 0x7FC0}};
    for (const auto& f : fills) std::fill_n(&p.a[f.row * p.K], p.K, f.bits);
    p.a[17 * p.K + 5] = 0x7FC0;  // one NaN in an otherwise finite row
    const Sm90GemmEpilogue epi = gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
    const int n_out = gated ? p.N / 2 : p.N;
    for (const auto& cfg : sm90_gemm_configs()) {
      SCOPED_TRACE(to_string(cfg) + (gated ? " SwiGLU" : " relu2"));
      GpuRun r, q;
      run_gpu(p, epi, false, cfg, r);
      if (::testing::Test::HasFatalFailure()) return;
      run_gpu(p, epi, true, cfg, q);
      if (::testing::Test::HasFatalFailure()) return;
      EXPECT_EQ(q.unwritten, 0);
      std::vector<float> expect = r.out;
      int64_t mism = 0, nan_row_nonzero = 0;
      for (int64_t row = 0; row < p.offsets[p.E]; ++row) {
        quantize_row_inplace(&expect[row * n_out], n_out, p.gs[expert_of(p, row)]);
        for (int n = 0; n < n_out; ++n) {
          const uint16_t got = static_cast<uint16_t>(q.bits[row * n_out + n]);
          if (fmt::bf16_from_float(expect[row * n_out + n]) != got) ++mism;
          if (gated && (row == 2 || row == 17) && got != 0) ++nan_row_nonzero;
        }
      }
      EXPECT_EQ(mism, 0) << "quantized non-finite rows differ from fmt::quantize_activation_block";
      EXPECT_EQ(nan_row_nonzero, 0) << "a SwiGLU row of NaNs must quantize to zero operands";
    }
  }
}

TEST(Sm90GroupedGemm, AdversarialOffsets) {
  const std::vector<std::vector<int>> cases = {
      {0, 0, 0, 0},        // no rows at all
      {0, 0, 301, 0},      // one expert with everything
      {1, 0, 0, 0},        // a single row
      {0, 4097, 0, 2},     // 4097 rows in one expert
  };
  for (const auto& counts : cases) {
    Problem p = make_problem(4, 256, 128, true, counts, 99);
    const auto h = reference_h(p);
    for (const auto& cfg : sm90_gemm_configs()) check(p, Sm90GemmEpilogue::kSwiGLU, cfg, h, false);
    Problem q = make_problem(4, 192, 192, false, counts, 98);
    const auto hq = reference_h(q);
    for (const auto& cfg : sm90_gemm_configs()) check(q, Sm90GemmEpilogue::kF32, cfg, hq, false);
  }
}

// More experts than one tile-cursor step covers (256 per consumer step, 128 per producer step): sparse rows
// on both sides of every step boundary, and one row in every expert (many tiles per CTA across boundaries).
TEST(Sm90GroupedGemm, ManyExpertsCursorSteps) {
  const int E = 600;
  std::vector<int> sparse(E, 0);
  for (int e : {0, 127, 128, 255, 256, 257, 383, 384, 511, 512, 599}) sparse[e] = 1 + e % 5;
  sparse[300] = 40;  // several token tiles at BT = 16
  const std::vector<int> every(E, 1);
  for (const auto& counts : {sparse, every}) {
    Problem p = make_problem(E, 256, 64, true, counts, 77);
    const auto h = reference_h(p);
    for (const auto& cfg : sm90_gemm_configs()) check(p, Sm90GemmEpilogue::kSwiGLU, cfg, h, false);
    Problem q = make_problem(E, 128, 128, false, counts, 78);
    const auto hq = reference_h(q);
    for (const auto& cfg : sm90_gemm_configs()) check(q, Sm90GemmEpilogue::kF32, cfg, hq, false);
  }
}

// The model shapes (nvfp4-format.md section 8) with E = 2 and a few rows: GEMM1 (N = 2I, K = H) and GEMM2
// (N = H, K = I), K in {7168, 2048, 4096, 1536, 768, 2880, 2688, 1856}; three runs must agree bitwise.
TEST(Sm90GroupedGemm, RealShapesDeterministic) {
  struct S { int h, i; bool gated; };
  const S shapes[] = {{7168, 2048, true}, {2048, 768, true}, {4096, 1536, true}, {2880, 2880, true},
                      {2688, 1856, false}};
  for (const S& s : shapes) {
    const std::vector<int> counts = {13, 20};
    const Sm90GemmConfig cfg = sm90_pick_config(Sm90GemmLoad{33, 2, 0, 0});  // 16.5 rows per expert
    Problem g1 = make_problem(2, s.gated ? 2 * s.i : s.i, s.h, s.gated, counts, 5);
    const auto h1 = reference_h(g1);
    check(g1, s.gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2, cfg, h1, false, 3);
    Problem g2 = make_problem(2, s.h, s.i, false, counts, 6);
    const auto h2 = reference_h(g2);
    check(g2, Sm90GemmEpilogue::kF32, cfg, h2, false, 3);
  }
}

// A row alone (one expert, one row) and the same row among many, in every config, gives identical bits.
TEST(Sm90GroupedGemm, BatchInvariance) {
  for (const Sm90GemmEpilogue epi : {Sm90GemmEpilogue::kF32, Sm90GemmEpilogue::kSwiGLU}) {
    const bool gated = epi == Sm90GemmEpilogue::kSwiGLU;
    Problem big = make_problem(3, 512, 1536, gated, {37, 150, 9}, 1234);
    // The probe row: row 37 + 77 of expert 1.
    const int64_t probe = 37 + 77;
    Problem alone = big;
    alone.offsets = {0, 0, 1, 1};
    alone.cap = 1;
    alone.a.assign(big.a.begin() + probe * big.K, big.a.begin() + (probe + 1) * big.K);
    std::vector<uint32_t> ref_bits;
    for (const auto& cfg : sm90_gemm_configs()) {
      for (const Problem* p : {&alone, &big}) {
        GpuRun r;
        run_gpu(*p, epi, false, cfg, r);
        if (HasFatalFailure()) return;
        const int n_out = gated ? p->N / 2 : p->N;
        const int64_t row = p == &alone ? 0 : probe;
        std::vector<uint32_t> bits(r.bits.begin() + row * n_out, r.bits.begin() + (row + 1) * n_out);
        if (ref_bits.empty()) ref_bits = bits;
        EXPECT_EQ(bits, ref_bits) << "cfg " << to_string(cfg) << (p == &alone ? " alone" : " in batch");
      }
    }
  }
}

// The mma.sync consumers (configs *_sync, and the warp-streaming ws* kernel against bt16_s14_wg2) against their
// wgmma twins, bitwise: the same k16 dot products in the
// same order into one fp32 accumulator, on adversarial activations (exponents over 2^-60 .. 2^40, both signs,
// exact cancellations: x and -x in one k16 step) and weights with subnormal and zero block scales, at 1..16
// rows per expert (mma.sync runs one n-tile of 8 tokens up to 8 rows, two above), every epilogue.
TEST(Sm90GroupedGemm, SyncMmaBitIdenticalToWgmma) {
  std::mt19937 rng(2024);
  std::vector<int> counts;
  for (int e = 0; e < 12; ++e) counts.push_back(e == 3 ? 0 : 1 + static_cast<int>(rng() % 16));
  int pairs = 0;
  for (const bool gated : {false, true}) {
    Problem p = make_problem(12, gated ? 2 * 192 : 320, 448, gated, counts, 4242);
    fill_adversarial_activations(p, rng);
    const std::vector<Sm90GemmEpilogue> epis = epilogues_of(gated);
    for (const Sm90GemmEpilogue epi : epis)
      for (const auto& sync_cfg : sm90_gemm_configs()) {
        if (!sync_cfg.mma_sync && !sync_cfg.warp_stream) continue;
        Sm90GemmConfig twin{};
        // The warp-streaming configs (mma.sync per 32-row piece, own kernel) against the wgmma decode tile.
        if (sync_cfg.warp_stream) ASSERT_TRUE(sm90_gemm_config_by_name("bt16_s14_wg2", &twin));
        else ASSERT_TRUE(sm90_gemm_mma_twin(sync_cfg, false, &twin)) << to_string(sync_cfg);
        SCOPED_TRACE(::testing::Message() << to_string(sync_cfg) << " epi=" << epi_name(epi));
        for (const bool quant : {false, true}) {
          if (quant && epi == Sm90GemmEpilogue::kF32) continue;
          GpuRun a, b;
          run_gpu(p, epi, quant, sync_cfg, a);
          run_gpu(p, epi, quant, twin, b);
          if (HasFatalFailure()) return;
          EXPECT_EQ(a.unwritten, 0);
          EXPECT_EQ(a.overwritten, 0);
          int64_t differ = 0;
          for (size_t i = 0; i < a.bits.size(); ++i) differ += a.bits[i] != b.bits[i];
          EXPECT_EQ(differ, 0) << "of " << a.bits.size() << " outputs (quantized: " << quant << ") differ from "
                               << to_string(twin);
        }
        ++pairs;
      }
  }
  EXPECT_GE(pairs, 3 * 5);  // every sync and warp-streaming config, three epilogues
}

// The mixed last pass (Sm90GemmArgs::mixed_last_pass, src/cuda/sm90_mixed_last_pass.h): on the prefill tiles, the
// bits of the plain kernel and every output written once, for experts whose last token tile has 1, 16, 31 or 32 rows
// (mixed) beside ones with 33, a full or a single tile (plain); an odd unit count (a mixed tile past the last unit
// stores nothing); 16 k-tiles (the 8-stage ring wraps twice); the static schedule, the dynamic one on the device's
// grid and on 5 CTAs with the consumer stagger; SwiGLU with and without the quantizing epilogue, f32, and relu^2
// (no mixed kernel: the flag is ignored). The configs without a mixed kernel ignore it too.
TEST(Sm90GroupedGemm, MixedLastPassBitIdenticalToPlain) {
  int mixed_configs = 0, configs = 0, comparisons = 0;
  DevBuf<int32_t> counter(std::vector<int32_t>{0});
  ASSERT_TRUE(counter.p);
  for (const auto& cfg : sm90_gemm_configs()) {
    const bool has_mixed = sm90_mixed_last_pass_available(cfg, Sm90GemmEpilogue::kSwiGLU);
    if (cfg.warp_stream || (!has_mixed && cfg.block_t != 64)) continue;  // (bt64: one config that ignores it)
    mixed_configs += has_mixed ? 1 : 0;
    ++configs;
    const int bt = cfg.block_t;
    const std::vector<int> counts = {bt + 1, 0, bt + 32, bt + 33, 2 * bt + 16, 5, bt, 3 * bt + 31, 1, 2 * bt};
    for (const bool gated : {true, false}) {
      // gated: 3 units of 64 gate + 64 up rows; otherwise 5 units of 128 rows
      const Problem p = make_problem(10, gated ? 2 * 192 : 640, 1024, gated, counts, 777 + bt);
      for (const Sm90GemmEpilogue epi : epilogues_of(gated))
        for (const bool quant : {false, true}) {
          if (quant && epi == Sm90GemmEpilogue::kF32) continue;
          for (const int variant : {0, 1, 2}) {
            int32_t* const tc = variant == 0 ? nullptr : counter.p;
            const int sms = variant == 2 ? 5 : 0, stagger = variant == 2 ? 3000 : 0;
            SCOPED_TRACE(::testing::Message() << to_string(cfg) << " epi=" << epi_name(epi) << " quant=" << quant
                                              << " schedule " << (tc ? "dynamic" : "static") << " grid " << sms);
            GpuRun plain, mixed;
            run_gpu(p, epi, quant, cfg, plain, 1, false, tc, sms, stagger);
            run_gpu(p, epi, quant, cfg, mixed, 2, false, tc, sms, stagger, nullptr, false, true);
            if (HasFatalFailure()) return;
            EXPECT_EQ(mixed.unwritten, 0);
            EXPECT_EQ(mixed.overwritten, 0);
            int64_t differ = 0;
            for (size_t i = 0; i < plain.bits.size(); ++i) differ += plain.bits[i] != mixed.bits[i];
            EXPECT_EQ(differ, 0) << "of " << plain.bits.size() << " outputs differ with the mixed last pass";
            ++comparisons;
          }
        }
    }
  }
  EXPECT_EQ(mixed_configs, 2);  // bt128_s8_wg2, bt144_s8_wg2
  EXPECT_EQ(comparisons, configs * 3 * 5);  // 3 schedules x (SwiGLU x 2, f32, relu^2 x 2)
}

// prologue_before_pdl_wait (the layer's GEMM2): the warp-streaming kernels seek their first piece and start its
// weights before the PDL wait (the rolled loop), or wait at the loop's start (unrolled); the same bits as
// without it, every output written once, for K of 2 k-tiles (fewer than the ring's prologue), a ragged K tail
// and 7 k-tiles, with empty experts and with no rows at all (warps that exit without waiting).
TEST(Sm90GroupedGemm, WarpStreamPrologueBeforePdlWaitBitIdentical) {
  int runs = 0;
  for (const std::vector<int>& counts : {std::vector<int>{3, 0, 9, 1, 17}, std::vector<int>{0, 0, 0, 0, 0}})
    for (const int K : {128, 208, 448})
      for (const bool gated : {false, true}) {
        Problem p = make_problem(5, gated ? 2 * 208 : 320, K, gated, counts, 500 + K + gated);
        const std::vector<Sm90GemmEpilogue> epis =
            gated ? std::vector<Sm90GemmEpilogue>{Sm90GemmEpilogue::kSwiGLU}
                  : std::vector<Sm90GemmEpilogue>{Sm90GemmEpilogue::kF32, Sm90GemmEpilogue::kRelu2};
        for (const Sm90GemmEpilogue epi : epis)
          for (const auto& cfg : sm90_gemm_configs()) {
            if (!cfg.warp_stream) continue;
            SCOPED_TRACE(::testing::Message() << to_string(cfg) << " epi=" << epi_name(epi) << " K=" << K
                                              << " rows=" << p.offsets[5]);
            for (const bool quant : {false, true}) {
              if (quant && epi == Sm90GemmEpilogue::kF32) continue;
              GpuRun a, b;
              run_gpu(p, epi, quant, cfg, a, 1, false);
              run_gpu(p, epi, quant, cfg, b, 2, true);
              if (HasFatalFailure()) return;
              EXPECT_EQ(b.unwritten, 0);
              EXPECT_EQ(b.overwritten, 0);
              ASSERT_EQ(a.bits, b.bits);
              ++runs;
            }
          }
      }
  int listed_ws = 0;
  for (const auto& cfg : sm90_gemm_configs()) listed_ws += cfg.warp_stream ? 1 : 0;
  EXPECT_GE(listed_ws, 3);
  EXPECT_EQ(runs, 2 * 3 * 5 * listed_ws);  // 2 row patterns x 3 K x 5 (epilogue, quantized) per config
}

// A warp-streaming launch with prologue_before_pdl_wait and no piece at all (every expert empty: e.g. caller ids
// that route no token to this rank's experts) must still complete after the previous kernel of the stream, or the
// next kernel's PDL wait no longer covers that one. Kernel A lets its dependents start at once, then spins ~20 ms
// and sets a flag; the launch under test follows with the PDL attribute, then a kernel that waits and reads the
// flag. A control run puts a kernel that exits without waiting (the bug's shape) in the middle: where it sees the
// flag unset, the device overlaps the three launches and the check can fail; where it does not, the check cannot
// see the bug on this device and the test says so.
// Lets the next launch of the stream start (PDL), then spins spin_ns of %globaltimer.
__device__ void trigger_then_spin(long long spin_ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < spin_ns);
}
__global__ void trigger_then_spin_then_flag(int* flag, long long spin_ns) {
  trigger_then_spin(spin_ns);
  __threadfence();
  *reinterpret_cast<volatile int*>(flag) = 1;
}
__global__ void exit_without_waiting() {}
__global__ void wait_then_read_flag(const int* flag, int* seen) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  *seen = *reinterpret_cast<const volatile int*>(flag);
}

TEST(Sm90GroupedGemm, WarpStreamWithoutPiecesWaitsForThePreviousKernel) {
  if (!pdl_enabled()) GTEST_SKIP() << "NVFP4MOE_PDL=0: no programmatic launches to order";
  cudaStream_t stream;
  CUDA_GEMM_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DevBuf<int> flag(1), seen(1);
  ASSERT_TRUE(flag.p && seen.p);
  // A (spinning spin_ns), middle(), then the reader; `got`: the flag the reader saw (1: the middle launch
  // completed after A).
  auto run = [&](long long spin_ns, auto&& middle, int& got) {
    CUDA_GEMM_OK(cudaMemset(flag.p, 0, 4));
    CUDA_GEMM_OK(cudaMemset(seen.p, 0xFF, 4));
    CUDA_GEMM_OK(cudaDeviceSynchronize());
    trigger_then_spin_then_flag<<<1, 32, 0, stream>>>(flag.p, spin_ns);
    CUDA_GEMM_OK(cudaGetLastError());
    middle();
    CUDA_GEMM_OK(launch_pdl(wait_then_read_flag, dim3(1), dim3(1), 0, stream, static_cast<const int*>(flag.p),
                            seen.p));
    CUDA_GEMM_OK(cudaStreamSynchronize(stream));
    got = seen.get()[0];
  };
  constexpr long long kSpinNs = 20'000'000;
  auto control = [&] { CUDA_GEMM_OK(launch_pdl(exit_without_waiting, dim3(132), dim3(32), 0, stream)); };

  const int E = 5, N = 320, K = 448;
  Problem p = make_problem(E, N, K, false, std::vector<int>(E, 0), 77);
  const Sm90PreparedShape shape = sm90_prepared_shape(E, N, K, false);
  DevBuf<uint8_t> packed(p.packed), scales(p.scales), w(shape.bytes);
  DevBuf<uint16_t> a(p.a);
  DevBuf<int32_t> off(p.offsets);
  DevBuf<float> al0(p.alpha0), al1(p.alpha1);
  DevBuf<float> out(static_cast<size_t>(p.cap) * N);
  ASSERT_TRUE(packed.p && scales.p && w.p && a.p && off.p && out.p);
  CUDA_GEMM_OK(sm90_prepare_weights(packed.p, scales.p, shape, w.p, nullptr));
  Sm90GemmArgs args = problem_args(p, shape, a.p, w.p, off.p, al0.p, al1.p, out.p, Sm90GemmEpilogue::kF32);
  args.prologue_before_pdl_wait = true;
  // Every kernel once without a spin first: a first launch may load its module, which can wait for the device.
  int got = -1;
  run(0, control, got);
  for (const auto& cfg : sm90_gemm_configs())
    if (cfg.warp_stream) run(0, [&] { CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(args, cfg, stream)); }, got);
  if (HasFatalFailure()) return;

  run(kSpinNs, control, got);
  if (HasFatalFailure()) return;
  const bool detectable = got == 0;
  int configs = 0;
  for (const auto& cfg : sm90_gemm_configs()) {
    if (!cfg.warp_stream) continue;
    ++configs;
    run(kSpinNs, [&] { CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(args, cfg, stream)); }, got);
    if (HasFatalFailure()) return;
    EXPECT_EQ(got, 1) << to_string(cfg) << ": a launch without pieces completed before the previous kernel";
  }
  EXPECT_GE(configs, 3);
  CUDA_GEMM_OK(cudaStreamDestroy(stream));
  if (!detectable)
    GTEST_SKIP() << "the control (a kernel that exits without waiting) saw the flag set: this device did not "
                    "overlap the three launches, so the check above could not have failed here";
}

// The T = 1 GEMM2 that reads GEMM1's k ids (Sm90OneTokenRoute::read_ids), with prologue_before_pdl_wait: each warp
// guesses the ids before its PDL wait, issues its first piece's weights, and checks the ids after the wait,
// running its pieces again where the guess was wrong. Every direct-row routed config, K of 2 k-tiles (fewer than
// the ring's prologue), a ragged K and 7 k-tiles, with and without a merged shared expert (expert E), k ids all
// valid or partly -1, against the plain kernel over the same rows' offsets, bitwise, with nothing written past the
// rows. What the buffer holds when the launch starts: the right ids (the guess holds: no warp runs again), or a
// kernel before it lets the launch start at once, spins, and only then writes the right ids over other experts,
// 0xD5 poison (no expert: a warp finds no piece under its guess), the same experts in another slot order, or
// fewer valid ids; the launch must then count its wrong guesses (Sm90OneTokenRoute::misspeculations: the rerun
// path ran) and still give the plain kernel's bits. Without prologue_before_pdl_wait nothing is guessed. (Skipped
// after the comparisons where no launch could start early: PDL off, or a sanitizer serializing the launches.)
__global__ void trigger_then_spin_then_copy_ids(const int32_t* src, int32_t* ids, int n, long long spin_ns) {
  trigger_then_spin(spin_ns);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) ids[i] = src[i];
}

TEST(Sm90GroupedGemm, T1SpeculativeIdsBitIdenticalToIdsAfterTheWait) {
  cudaStream_t stream;
  CUDA_GEMM_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int E = 40, top_k = 8, N = 320;
  std::vector<Sm90GemmConfig> configs;
  for (const auto& cfg : sm90_gemm_configs())
    if (sm90_one_token_route_available(cfg, Sm90GemmEpilogue::kF32, false)) configs.push_back(cfg);
  ASSERT_GE(configs.size(), 2u) << "the direct-row routed kernels (ws8_s6_w16, its unrolled form)";
  int checked = 0, late_cases = 0, rerun_cases = 0;
  for (const int K : {128, 208, 448})
    for (const bool shared : {false, true})
      for (const int valid : {top_k, 5}) {
        std::mt19937 rng(900 + K + 7 * shared + valid);
        std::vector<int32_t> experts(E);
        for (int e = 0; e < E; ++e) experts[e] = e;
        std::shuffle(experts.begin(), experts.end(), rng);
        std::vector<int32_t> right(experts.begin(), experts.begin() + top_k);  // (slot order: not expert order)
        for (int j = valid; j < top_k; ++j) right[j] = -1;
        const int launch_experts = E + (shared ? 1 : 0);
        std::vector<int> counts(launch_experts, 0);
        for (const int32_t id : right)
          if (id >= 0) counts[id] = 1;
        if (shared) counts[E] = 1;
        Problem p = make_problem(launch_experts, N, K, false, counts, 950 + K + shared + valid);
        SCOPED_TRACE(::testing::Message() << "K=" << K << " shared=" << shared << " valid ids=" << valid);
        std::vector<int32_t> other(experts.begin() + top_k, experts.begin() + 2 * top_k);
        std::vector<int32_t> reordered(right.rbegin(), right.rend());
        std::vector<int32_t> fewer = right;
        for (int j = 2; j < top_k; ++j) fewer[j] = -1;
        const std::vector<int32_t> poison(top_k, static_cast<int32_t>(0xD5D5D5D5u));
        struct Stale {
          const char* what;
          const std::vector<int32_t>* ids;
        };
        const Stale stales[] = {{"the right ids", &right},
                                {"other experts", &other},
                                {"0xD5 poison", &poison},
                                {"another slot order", &reordered},
                                {"fewer valid ids", &fewer}};
        const Sm90PreparedShape shape = sm90_prepared_shape(launch_experts, N, K, false);
        DevBuf<uint8_t> packed(p.packed), scales(p.scales), w(shape.bytes);
        DevBuf<uint16_t> a(p.a);
        DevBuf<int32_t> off(p.offsets), ids(top_k), right_ids(right), misspeculations(1);
        DevBuf<float> al0(p.alpha0), al1(p.alpha1), out(static_cast<size_t>(p.cap) * N);
        ASSERT_TRUE(packed.p && scales.p && w.p && a.p && off.p && ids.p && right_ids.p && misspeculations.p &&
                    al0.p && al1.p && out.p);
        CUDA_GEMM_OK(sm90_prepare_weights(packed.p, scales.p, shape, w.p, nullptr));
        Sm90OneTokenRoute rt;
        rt.route.tokens = 1;
        rt.route.experts = E;
        rt.route.top_k = top_k;
        rt.route.topk_ids = ids.p;
        rt.plan.tokens = 1;
        rt.plan.experts = E;
        rt.plan.top_k = top_k;
        rt.plan.append_shared = shared;
        rt.read_ids = true;
        rt.misspeculations = misspeculations.p;
        for (const auto& cfg : configs) {
          SCOPED_TRACE(to_string(cfg));
          GpuRun plain;
          run_gpu(p, Sm90GemmEpilogue::kF32, false, cfg, plain);  // the offsets' pieces, no routing
          if (HasFatalFailure()) return;
          ASSERT_EQ(plain.unwritten, 0);
          const size_t row_words = static_cast<size_t>(p.offsets[launch_experts]) * N;
          for (const bool before_wait : {false, true})
            for (const Stale& st : stales) {
              SCOPED_TRACE(::testing::Message() << "before_wait=" << before_wait << ", the buffer holds " << st.what);
              Sm90GemmArgs args =
                  problem_args(p, shape, a.p, w.p, off.p, al0.p, al1.p, out.p, Sm90GemmEpilogue::kF32);
              args.one_token_route = &rt;
              args.prologue_before_pdl_wait = before_wait;
              CUDA_GEMM_OK(cudaMemset(out.p, 0xFF, out.n * 4));
              CUDA_GEMM_OK(cudaMemset(misspeculations.p, 0, 4));
              ids.put(*st.ids);
              CUDA_GEMM_OK(cudaDeviceSynchronize());
              const bool late = st.ids != &right;
              trigger_then_spin_then_copy_ids<<<1, 32, 0, stream>>>(right_ids.p, ids.p, top_k, late ? 200'000 : 0);
              CUDA_GEMM_OK(cudaGetLastError());
              CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(args, cfg, stream));
              CUDA_GEMM_OK(cudaStreamSynchronize(stream));
              const std::vector<float> got = out.get();
              std::vector<uint32_t> bits(got.size());
              std::memcpy(bits.data(), got.data(), got.size() * 4);
              int64_t differ = 0, past = 0;
              for (size_t i = 0; i < bits.size(); ++i) {
                if (i < row_words) differ += bits[i] != plain.bits[i];
                else past += bits[i] != 0xFFFFFFFFu;
              }
              EXPECT_EQ(differ, 0) << "elements differing from the plain kernel's";
              EXPECT_EQ(past, 0) << "elements written past the rows";
              const int32_t wrong = misspeculations.get()[0];
              if (!before_wait || !late) EXPECT_EQ(wrong, 0) << "warps that ran again without a wrong guess";
              if (before_wait && late) {
                ++late_cases;
                rerun_cases += wrong > 0 ? 1 : 0;
              }
              ++checked;
            }
        }
      }
  CUDA_GEMM_OK(cudaStreamDestroy(stream));
  EXPECT_EQ(checked, 3 * 2 * 2 * static_cast<int>(configs.size()) * 2 * 5);
  EXPECT_EQ(late_cases, 3 * 2 * 2 * static_cast<int>(configs.size()) * 4);
  // Where the launches overlap (PDL on the device), every stale guess must have been caught. Where none did (PDL
  // off, or compute-sanitizer, which runs the launches one after the other), the guesses were all right: the bits
  // were checked, the rerun path was not.
  if (rerun_cases == 0)
    GTEST_SKIP() << "no launch started before the spinning kernel wrote the ids (PDL off or launches serialized): "
                    "the rerun path did not run here; the outputs were still compared";
  EXPECT_EQ(rerun_cases, late_cases) << "stale guesses that no warp caught";
}

// GEMM1 -> GEMM2 in one launch (sm90_nvfp4_chained_gemms) against the two launches, bitwise: GEMM1's
// activations (bf16, NVFP4-quantized or not) and GEMM2's f32 rows, every chained config, SwiGLU and relu^2,
// masked units and K tails, empty experts, experts with several token tiles, all rows in one expert, the
// decode pattern (8 single-row experts of 128) at real qwen3-30b shapes, and grids of 132, 7 and 1 CTAs (one CTA
// waits in GEMM2 for its own GEMM1 tiles; 7 walk many tiles each). Repeated launches give the same bits and
// leave the counters zero (what the next launch relies on).
struct ChainCase {
  const char* name;
  int E, I, H;
  std::vector<int> counts;
};

void run_chain_case(const ChainCase& cc, const Problem& p1, const Problem& p2, bool gated, bool quant,
                    const Sm90GemmConfig& cfg, int num_sms) {
  SCOPED_TRACE(::testing::Message() << cc.name << " gated=" << gated << " quant=" << quant << " cfg="
                                    << to_string(cfg) << " sms=" << num_sms);
  const int n1 = gated ? 2 * cc.I : cc.I;
  const Sm90PreparedShape s1 = sm90_prepared_shape(cc.E, n1, cc.H, gated), s2 = sm90_prepared_shape(cc.E, cc.H, cc.I, false);
  DevBuf<uint8_t> pk1(p1.packed), sc1(p1.scales), w1(s1.bytes), pk2(p2.packed), sc2(p2.scales), w2(s2.bytes);
  CUDA_GEMM_OK(sm90_prepare_weights(pk1.p, sc1.p, s1, w1.p, nullptr));
  CUDA_GEMM_OK(sm90_prepare_weights(pk2.p, sc2.p, s2, w2.p, nullptr));
  DevBuf<uint16_t> a(p1.a);
  DevBuf<int32_t> off(p1.offsets);
  DevBuf<float> al0(p1.alpha0), al1(p1.alpha1), gs(p1.gs), al2(p2.alpha0);
  const int64_t cap = p1.cap;
  DevBuf<uint16_t> act(cap * cc.I), act_c(cap * cc.I);
  DevBuf<float> y(cap * cc.H), y_c(cap * cc.H);
  DevBuf<int32_t> counters(sm90_chain_counter_count(cc.E));
  CUDA_GEMM_OK(cudaMemset(counters.p, 0, counters.n * 4));
  Sm90GemmArgs g1;
  g1.a = a.p;
  g1.a_rows_capacity = cap;
  g1.w = w1.p;
  g1.shape = s1;
  g1.offsets = off.p;
  g1.alpha0 = al0.p;
  g1.alpha1 = al1.p;
  g1.gs = quant ? gs.p : nullptr;
  g1.epilogue = gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
  Sm90GemmArgs g2;
  g2.a_rows_capacity = cap;
  g2.w = w2.p;
  g2.shape = s2;
  g2.offsets = off.p;
  g2.alpha0 = al2.p;
  g2.epilogue = Sm90GemmEpilogue::kF32;
  // Two launches (the reference path).
  CUDA_GEMM_OK(cudaMemset(act.p, 0xFF, act.n * 2));
  CUDA_GEMM_OK(cudaMemset(y.p, 0xFF, y.n * 4));
  g1.out = act.p;
  g2.a = act.p;
  g2.out = y.p;
  CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(g1, cfg, nullptr, num_sms));
  CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(g2, cfg, nullptr, num_sms));
  CUDA_GEMM_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> act_ref = act.get();
  const std::vector<float> y_ref = y.get();
  int64_t written = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(p1.offsets[cc.E]) * cc.H; ++i) written += fmt::float_bits(y_ref[i]) != 0xFFFFFFFFu;
  EXPECT_EQ(written, static_cast<int64_t>(p1.offsets[cc.E]) * cc.H) << "the two-launch reference left rows unwritten";
  g1.out = act_c.p;
  g2.a = act_c.p;
  g2.out = y_c.p;
  for (int rep = 0; rep < 3; ++rep) {
    CUDA_GEMM_OK(cudaMemset(act_c.p, 0xFF, act_c.n * 2));
    CUDA_GEMM_OK(cudaMemset(y_c.p, 0xFF, y_c.n * 4));
    CUDA_GEMM_OK(sm90_nvfp4_chained_gemms(g1, g2, cfg, counters.p, nullptr, num_sms));
    CUDA_GEMM_OK(cudaDeviceSynchronize());
    const std::vector<uint16_t> ac = act_c.get();
    const std::vector<float> yc = y_c.get();
    ASSERT_EQ(0, std::memcmp(ac.data(), act_ref.data(), ac.size() * 2)) << "GEMM1 output differs, run " << rep;
    int64_t differ = 0;
    for (size_t i = 0; i < yc.size(); ++i) differ += fmt::float_bits(yc[i]) != fmt::float_bits(y_ref[i]);
    ASSERT_EQ(differ, 0) << "of " << yc.size() << " GEMM2 outputs (whole buffer) differ, run " << rep;
    const std::vector<int32_t> cnt = counters.get();
    for (size_t i = 0; i < cnt.size(); ++i) ASSERT_EQ(cnt[i], 0) << "counter " << i << " not reset, run " << rep;
  }
}

TEST(Sm90GroupedGemm, ChainedEqualsTwoLaunches) {
  std::vector<int> decode(128, 0);
  for (int e : {3, 17, 40, 41, 77, 90, 126, 127}) decode[e] = 1;
  std::vector<int> one(6, 0);
  one[2] = 70;  // five token tiles in one expert, the other experts empty
  const ChainCase cases[] = {
      {"mixed", 9, 208, 320, {1, 0, 3, 1, 17, 2, 0, 40, 1}},  // masked units (I = 208, H = 320), K tails
      {"one-expert", 6, 192, 256, one},
      {"qwen3-30b-decode", 128, 768, 2048, decode},
  };
  ASSERT_FALSE(sm90_chained_configs().empty());
  for (const auto& cc : cases)
    for (const bool gated : {true, false}) {
      const Problem p1 = make_problem(cc.E, gated ? 2 * cc.I : cc.I, cc.H, gated, cc.counts, 77 + cc.E);
      const Problem p2 = make_problem(cc.E, cc.H, cc.I, false, cc.counts, 99 + cc.E);
      for (const auto& cfg : sm90_chained_configs()) {
        ASSERT_TRUE(sm90_chained_available(cfg));
        for (const bool quant : {false, true})
          for (const int sms : {132, 7, 1}) {
            if (sms != 132 && cc.E == 128 && quant) continue;  // the small grids: once per shape and epilogue
            run_chain_case(cc, p1, p2, gated, quant, cfg, sms);
            if (HasFatalFailure()) return;
          }
      }
    }
}

TEST(Sm90GroupedGemm, ChainedRefusesMismatchedLaunches) {
  const Sm90GemmConfig cfg = sm90_chained_configs()[0];
  uint16_t* a = reinterpret_cast<uint16_t*>(256);
  uint8_t* w = reinterpret_cast<uint8_t*>(512);
  const int32_t* off = reinterpret_cast<const int32_t*>(1024);
  float* f = reinterpret_cast<float*>(2048);
  int32_t* counters = reinterpret_cast<int32_t*>(4096);
  Sm90GemmArgs g1;
  g1.a = a;
  g1.a_rows_capacity = 8;
  g1.w = w;
  g1.shape = sm90_prepared_shape(4, 2 * 64, 128, true);
  g1.offsets = off;
  g1.alpha0 = f;
  g1.alpha1 = f;
  g1.out = a + 4096;
  g1.epilogue = Sm90GemmEpilogue::kSwiGLU;
  Sm90GemmArgs g2;
  g2.a = a + 4096;
  g2.a_rows_capacity = 8;
  g2.w = w;
  g2.shape = sm90_prepared_shape(4, 128, 64, false);
  g2.offsets = off;
  g2.alpha0 = f;
  g2.out = f + 4096;
  auto refused = [&](const Sm90GemmArgs& x1, const Sm90GemmArgs& x2, const Sm90GemmConfig& c, int32_t* cnt,
                     const char* needle) {
    EXPECT_EQ(sm90_nvfp4_chained_gemms(x1, x2, c, cnt, nullptr), cudaErrorInvalidValue) << needle;
    EXPECT_NE(std::string(sm90_gemm_last_error_message()).find(needle), std::string::npos)
        << sm90_gemm_last_error_message();
  };
  Sm90GemmArgs x = g2;
  x.offsets = off + 8;
  refused(g1, x, cfg, counters, "share the offsets");
  x = g2;
  x.a = a + 8192;
  refused(g1, x, cfg, counters, "read gemm1's output");
  x = g2;
  x.shape = sm90_prepared_shape(4, 128, 128, false);
  refused(g1, x, cfg, counters, "read gemm1's output");
  refused(g1, g2, cfg, nullptr, "chain_counters");
  x = g2;
  x.epilogue = Sm90GemmEpilogue::kRelu2;
  refused(g1, x, cfg, counters, "f32");
  Sm90GemmConfig big{};
  ASSERT_TRUE(sm90_gemm_config_by_name("bt144_s8_wg2", &big));
  refused(g1, g2, big, counters, "no chained kernel");
  EXPECT_EQ(sm90_nvfp4_chained_gemms(g1, g2, cfg, counters, nullptr, 100000), cudaErrorInvalidValue);
  EXPECT_NE(std::string(sm90_gemm_last_error_message()).find("fit at once"), std::string::npos)
      << sm90_gemm_last_error_message();
}

// The dynamic tile schedule across launches: launches on one stream back to back (programmatic dependent launch
// between them, no host synchronization), with grids of 1, 7, the device's SMs and more CTAs than tiles, and the
// same launches captured in a CUDA graph and replayed twice. Every launch must start from a zero counter, so
// each relies on the one before having reset it; every output must equal the static schedule's bits. Two of the
// launches run with a consumer stagger (one of 100 us: the first warpgroup meets the end of the stage ring
// and waits there; the same bits, no hang).
TEST(Sm90GroupedGemm, DynamicScheduleBackToBackAndGraphReplays) {
  // Uneven experts: partial token tiles, an empty expert, one expert with many tiles.
  const std::vector<int> counts = {150, 0, 17, 290, 1, 64, 145, 3};
  const int E = static_cast<int>(counts.size());
  Problem p = make_problem(E, 2 * 208, 272, true, counts, 8080);
  const Sm90PreparedShape shape = sm90_prepared_shape(p.E, p.N, p.K, p.gated);
  DevBuf<uint8_t> packed(p.packed), scales(p.scales), w(shape.bytes);
  DevBuf<uint16_t> a(p.a);
  DevBuf<int32_t> off(p.offsets), counter(std::vector<int32_t>{0});
  DevBuf<float> al0(p.alpha0), al1(p.alpha1);
  ASSERT_TRUE(packed.p && scales.p && w.p && a.p && off.p && counter.p && al0.p && al1.p);
  CUDA_GEMM_OK(sm90_prepare_weights(packed.p, scales.p, shape, w.p, nullptr));
  const size_t out_elems = static_cast<size_t>(p.cap) * (p.N / 2);
  const int grids[] = {1, 7, 0, 1000};  // 0: the device's SMs
  const int staggers[] = {0, 2000, 0, 100000};  // consumer stagger (ns) of each launch
  constexpr int kLaunches = 4;
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int tested = 0;
  for (const auto& cfg : sm90_gemm_configs()) {
    if (cfg.warp_stream) continue;
    SCOPED_TRACE(to_string(cfg));
    DevBuf<uint16_t> ref(out_elems);
    ASSERT_TRUE(ref.p);
    CUDA_OK(cudaMemsetAsync(ref.p, 0xFF, out_elems * 2, stream));
    Sm90GemmArgs args =
        problem_args(p, shape, a.p, w.p, off.p, al0.p, al1.p, ref.p, Sm90GemmEpilogue::kSwiGLU);
    CUDA_GEMM_OK(sm90_nvfp4_grouped_gemm(args, cfg, stream));  // static schedule
    CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<uint16_t> want = ref.get();
    std::vector<std::unique_ptr<DevBuf<uint16_t>>> outs;
    for (int i = 0; i < kLaunches; ++i) outs.push_back(std::make_unique<DevBuf<uint16_t>>(out_elems));
    auto enqueue = [&]() {
      for (int i = 0; i < kLaunches; ++i) {
        Sm90GemmArgs d = args;
        d.out = outs[i]->p;
        d.tile_counter = counter.p;
        d.consumer_stagger_ns = staggers[i];
        const cudaError_t e = sm90_nvfp4_grouped_gemm(d, cfg, stream, grids[i]);
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    };
    auto check_outs = [&](const char* how) {
      for (int i = 0; i < kLaunches; ++i)
        EXPECT_TRUE(outs[i]->get() == want) << how << ": launch " << i << " (grid " << grids[i] << ")";
      int32_t left = -1;
      EXPECT_EQ(cudaMemcpy(&left, counter.p, sizeof(left), cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(left, 0) << how << ": counter not reset";
    };
    for (auto& o : outs) CUDA_OK(cudaMemsetAsync(o->p, 0xFF, out_elems * 2, stream));
    CUDA_GEMM_OK(enqueue());
    CUDA_OK(cudaStreamSynchronize(stream));
    check_outs("back to back");
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t captured = enqueue();
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_GEMM_OK(captured);
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      for (auto& o : outs) CUDA_OK(cudaMemsetAsync(o->p, 0xFF, out_elems * 2, stream));
      CUDA_OK(cudaGraphLaunch(exec, stream));
      CUDA_OK(cudaStreamSynchronize(stream));
      check_outs(replay == 0 ? "graph replay 0" : "graph replay 1");
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    if (HasFailure()) break;
    ++tested;
  }
  cudaStreamDestroy(stream);
  EXPECT_GE(tested, 13);  // every tile config of the list
}

// The schedule arguments are checked before anything is launched: a misaligned tile counter, a consumer stagger
// outside [0, kSm90MaxConsumerStaggerNs]; each refusal names the argument (and the stagger's the value given).
TEST(Sm90GroupedGemm, RefusesBadScheduleArguments) {
  Problem p = make_problem(2, 128, 64, false, {3, 4}, 1);
  const Sm90PreparedShape shape = sm90_prepared_shape(p.E, p.N, p.K, p.gated);
  DevBuf<uint8_t> w(shape.bytes);
  DevBuf<uint16_t> a(p.a);
  DevBuf<int32_t> off(p.offsets), counter(2);
  DevBuf<float> al0(p.alpha0), out(static_cast<size_t>(p.cap) * p.N);
  Sm90GemmArgs args = problem_args(p, shape, a.p, w.p, off.p, al0.p, nullptr, out.p, Sm90GemmEpilogue::kF32);
  args.tile_counter = reinterpret_cast<int32_t*>(reinterpret_cast<uint8_t*>(counter.p) + 2);
  EXPECT_EQ(sm90_nvfp4_grouped_gemm(args, sm90_gemm_configs()[0], nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(sm90_gemm_last_error_message()).find("tile_counter"), std::string::npos)
      << sm90_gemm_last_error_message();
  args.tile_counter = nullptr;  // (a launch past a wrongly passed check must not read an unset counter)
  for (const int bad : {-1, kSm90MaxConsumerStaggerNs + 1}) {
    args.consumer_stagger_ns = bad;
    EXPECT_EQ(sm90_nvfp4_grouped_gemm(args, sm90_gemm_configs()[0], nullptr), cudaErrorInvalidValue);
    const std::string msg = sm90_gemm_last_error_message();
    EXPECT_NE(msg.find("consumer_stagger_ns"), std::string::npos) << msg;
    EXPECT_NE(msg.find("got " + std::to_string(bad)), std::string::npos) << msg;
  }
}

// What the consumer stagger's one __nanosleep gives on this GPU (PTX promises only a sleep in [0, 2 t]): the
// measured sleep of one thread per request, in SM cycles and in globaltimer nanoseconds, printed for the A/B's
// reading, and checked against PTX's upper bound (with 2 us of slack for the timers and the issue).
__global__ void nanosleep_probe_kernel(const int* ns, long long* cycles, unsigned long long* wall_ns, int n) {
  for (int i = 0; i < n; ++i) {
    unsigned long long g0, g1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g0));
    const long long c0 = clock64();
    __nanosleep(ns[i]);
    const long long c1 = clock64();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g1));
    cycles[i] = c1 - c0;
    wall_ns[i] = g1 - g0;
  }
}

TEST(Sm90GroupedGemm, NanosleepOfTheConsumerStagger) {
  const std::vector<int> asked = {0, 250, 500, 1000, 2000, 4000, 8000, 100000};
  const int n = static_cast<int>(asked.size());
  DevBuf<int> ns(asked);
  DevBuf<long long> cycles(asked.size());
  DevBuf<unsigned long long> wall(asked.size());
  ASSERT_TRUE(ns.p && cycles.p && wall.p);
  for (int rep = 0; rep < 2; ++rep) {  // the first launch also loads the code
    nanosleep_probe_kernel<<<1, 1>>>(ns.p, cycles.p, wall.p, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
  }
  const std::vector<long long> c = cycles.get();
  const std::vector<unsigned long long> w = wall.get();
  for (int i = 0; i < n; ++i) {
    std::printf("nanosleep(%d ns): %lld SM cycles, %llu ns of globaltimer\n", asked[i], c[i], w[i]);
    EXPECT_LE(static_cast<double>(w[i]), 2.0 * asked[i] + 2000.0) << "nanosleep(" << asked[i] << ")";
  }
}

// The heuristic itself is host code: tests/cuda_host/test_sm90_pick_config.cpp (label cpu, runs in CI).

// A problem whose rows are gathered: expert e < E - 1 routed (row r = src[perm[r] / top_k]), the last expert a
// shared one (row r = src[r - offsets[E - 1] + shared_base]; shared_base = tokens: a source of 2 x tokens rows, the
// shared expert's own second half, as the layer's w4a4 rows quantized once with two scales), with the adversarial
// entries: a negative permutation entry, one past the pairs, and shared rows past the source's (all read as
// zeros). p.a holds the pre-gathered rows.
struct GatheredProblem {
  Problem p;
  GatherInput g;
};
GatheredProblem make_gathered_problem(int N, int K, bool gated, const std::vector<int>& routed_counts, int tokens,
                                      int top_k, uint32_t seed, bool shared_second_half = false) {
  std::vector<int> counts = routed_counts;
  counts.push_back(tokens + 3);  // the shared expert: one row per token, and 3 past the source
  const int E = static_cast<int>(counts.size());
  GatheredProblem gp{make_problem(E, N, K, gated, counts, seed), {}};
  Problem& p = gp.p;
  GatherInput& g = gp.g;
  std::mt19937 rng(seed + 1);
  const int base = shared_second_half ? tokens : 0;
  g.src_rows = tokens + base;
  g.shared_base = base;
  g.top_k = top_k;
  g.perm_experts = E - 1;
  g.src.resize(static_cast<size_t>(g.src_rows) * K);
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  for (auto& x : g.src) x = fmt::bf16_from_float(ud(rng));
  const int routed = p.offsets[E - 1];
  g.perm.resize(p.offsets[E]);
  for (int r = 0; r < routed; ++r) g.perm[r] = static_cast<int32_t>(rng() % (tokens * top_k));
  if (routed > 2) {
    g.perm[routed / 2] = -5;                                   // negative: zeros
    g.perm[routed - 1] = (tokens + base) * top_k + 1;          // past the source: zeros
  }
  for (int r = routed; r < p.offsets[E]; ++r) g.perm[r] = -1;  // (unused: the shared rows)
  for (int64_t r = 0; r < p.offsets[E]; ++r) {
    int src = r < routed ? (g.perm[r] < 0 ? -1 : g.perm[r] / top_k) : static_cast<int>(r - routed) + base;
    if (src >= tokens + base) src = -1;
    for (int k = 0; k < K; ++k) p.a[r * K + k] = src < 0 ? 0 : g.src[static_cast<size_t>(src) * K + k];
  }
  return gp;
}

// One gathered launch of expect_gathered_bits_equal: the grid (0: the device's SMs), the dynamic schedule's counter
// (nullptr: static) and prologue_before_pdl_wait.
struct GatheredLaunch {
  int sms;
  int32_t* counter;
  bool before_wait;
};
// cfg on gp's pre-gathered rows (returned in base), then gathered in each of `launches` (twice each): the same
// bits, every row written once.
void expect_gathered_bits_equal(const GatheredProblem& gp, Sm90GemmEpilogue epi, bool quant, const Sm90GemmConfig& cfg,
                                const std::vector<GatheredLaunch>& launches, GpuRun& base) {
  run_gpu(gp.p, epi, quant, cfg, base);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_EQ(base.unwritten, 0);
  for (const GatheredLaunch& l : launches) {
    SCOPED_TRACE(::testing::Message() << "gathered A, grid " << l.sms << (l.counter ? " dynamic" : " static")
                                      << (l.before_wait ? ", prologue before the PDL wait" : ""));
    GpuRun g;
    run_gpu(gp.p, epi, quant, cfg, g, 2, l.before_wait, l.counter, l.sms, 0, &gp.g);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(g.unwritten, 0);
    EXPECT_EQ(g.overwritten, 0);
    EXPECT_TRUE(g.bits == base.bits) << "bits differ from the pre-gathered rows";
  }
}

// Gathered A (the w4a16 prefill's GEMM1 without the gather kernel): every config of sm90_gather_configs(), both
// activation epilogues and the quantizing one, bitwise equal to the same launch on the pre-gathered rows, on the
// static schedule and the dynamic one (grids of the SMs and of 3 CTAs: many tiles through one CTA's two gather
// buffers and its stage ring), twice each (determinism); K with a tail (K % 64 != 0), experts with no rows, with a
// partial token tile and with several; and within the tolerance of the CPU reference.
TEST(Sm90GroupedGemm, GatheredABitIdenticalToPreGathered) {
  ASSERT_FALSE(sm90_gather_configs().empty());
  DevBuf<int32_t> counter(std::vector<int32_t>{0});
  ASSERT_TRUE(counter.p);
  for (const auto& cfg : sm90_gather_configs()) {
    EXPECT_TRUE(sm90_gather_available(cfg));
    const int bt = cfg.block_t;
    const std::vector<int> counts = {bt + 5, 0, 1, 2 * bt + 3, 37};
    for (const int form : {0, 1, 2}) {  // SwiGLU; relu^2; SwiGLU with the shared rows in the source's second half
      const bool gated = form != 1;
      const GatheredProblem gp = make_gathered_problem(gated ? 2 * 208 : 320, 7 * 64 + 32, gated, counts, 150, 3,
                                                       9000 + bt + form, form == 2);
      const Problem& p = gp.p;
      const Sm90GemmEpilogue epi = gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
      const auto h = reference_h(p);
      for (const bool quant : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cfg=" << to_string(cfg) << " epi=" << epi_name(epi) << " quant=" << quant
                                          << " form=" << form);
        GpuRun base;
        expect_gathered_bits_equal(gp, epi, quant, cfg, {{0, nullptr, false}, {0, counter.p, false}, {3, counter.p, false}},
                                   base);
        if (::testing::Test::HasFatalFailure()) return;
        const std::vector<float> ref = reference_out(p, epi, quant, h);
        int64_t nonfinite = 0;
        EXPECT_LE(rel_l2(base.out, ref, &nonfinite), quant ? 0.1 : 4e-3) << "against the CPU reference";
        EXPECT_EQ(nonfinite, 0);
      }
    }
  }
}

// A broadcast row (Sm90GemmArgs::a_broadcast_row: GEMM1 at T = 1 reading the token's hidden state for all its rows,
// kept in the CTA's shared memory for the launch): every warp-streaming config, both activation epilogues and the
// quantizing one, bitwise equal to the same launch on rows that all hold row 0's values; experts with no rows, one,
// several token tiles (more than 8 rows); K with a tail (the row's zero padding); on the device's SMs, and on 3 CTAs
// and 1 CTA with the prologue before the PDL wait (each warp then runs several pieces on the one row copy, every
// CTA copies and waits for it once).
TEST(Sm90GroupedGemm, BroadcastRowBitIdenticalToRepeatedRows) {
  const std::vector<int> counts = {1, 0, 3, 8, 11, 1};
  int configs = 0;
  for (const auto& cfg : sm90_gemm_configs()) {
    if (!cfg.warp_stream) continue;
    ++configs;
    for (const bool gated : {true, false}) {
      Problem p = make_problem(6, gated ? 2 * 208 : 320, 7 * 64 + 32, gated, counts, 7000 + gated);
      for (int64_t r = 1; r < p.cap; ++r)
        std::copy(p.a.begin(), p.a.begin() + p.K, p.a.begin() + r * p.K);
      const Sm90GemmEpilogue epi = gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
      for (const bool quant : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cfg=" << to_string(cfg) << " epi=" << epi_name(epi) << " quant=" << quant);
        GpuRun base;
        run_gpu(p, epi, quant, cfg, base);
        if (::testing::Test::HasFatalFailure()) return;
        for (const int grid : {0, 3, 1}) {
          SCOPED_TRACE(::testing::Message() << "num_sms=" << grid);
          GpuRun bc;
          run_gpu(p, epi, quant, cfg, bc, 2, grid != 0, nullptr, grid, 0, nullptr, true);
          if (::testing::Test::HasFatalFailure()) return;
          EXPECT_EQ(bc.unwritten, 0);
          EXPECT_EQ(bc.overwritten, 0);
          EXPECT_TRUE(bc.bits == base.bits) << "broadcast row: bits differ from the repeated rows";
        }
      }
    }
  }
  EXPECT_GE(configs, 1);
}

// Gathered A on the warp-streaming configs (the decode GEMM1 without a gather step): every warp-streaming config,
// both activation epilogues and the quantizing one, bitwise equal to the same launch on the pre-gathered rows.
// Decode-sized experts (0, 1, 2, 3, 8, 9, 17 rows: one token tile, a partial one, several), a shared expert
// appended (one row per token; rows past the source's read as zeros), the adversarial permutation entries of
// make_gathered_problem; grids of the device's SMs, 3 CTAs and 1 CTA (each warp then runs ~10-40 pieces in turn,
// every one's permutation entries looked up during the piece before, across expert boundaries); K with a tail;
// twice each (determinism); with prologue_before_pdl_wait (ignored by these kernels: they wait first).
TEST(Sm90GroupedGemm, WarpStreamGatheredABitIdenticalToPreGathered) {
  const std::vector<int> counts = {1, 0, 3, 8, 2, 17, 0, 9, 1, 1, 2};
  int configs = 0;
  for (const auto& cfg : sm90_gemm_configs()) {
    if (!cfg.warp_stream) continue;
    ++configs;
    EXPECT_TRUE(sm90_gather_available(cfg));
    for (const int form : {0, 1, 2}) {  // SwiGLU; relu^2; SwiGLU with the shared rows in the source's second half
      const bool gated = form != 1;
      const GatheredProblem gp = make_gathered_problem(gated ? 2 * 208 : 320, 7 * 64 + 32, gated, counts, 12, 4,
                                                       9500 + form + 10 * cfg.slices_per_warp + cfg.ws_unrolled,
                                                       form == 2);
      const Sm90GemmEpilogue epi = gated ? Sm90GemmEpilogue::kSwiGLU : Sm90GemmEpilogue::kRelu2;
      for (const bool quant : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cfg=" << to_string(cfg) << " epi=" << epi_name(epi) << " quant=" << quant
                                          << " form=" << form);
        GpuRun base;
        expect_gathered_bits_equal(gp, epi, quant, cfg, {{0, nullptr, false}, {3, nullptr, true}, {1, nullptr, false}},
                                   base);
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  EXPECT_GE(configs, 1);
}

// The gathered-A arguments are refused where no kernel reads them, with the argument named.
TEST(Sm90GroupedGemm, RefusesBadGatherArguments) {
  const Sm90PreparedShape shape = sm90_prepared_shape(2, 2 * 64, 64, true);
  DevBuf<uint8_t> w(shape.bytes), out(4096);
  DevBuf<uint16_t> src(64 * 8);
  DevBuf<int32_t> off(std::vector<int32_t>{0, 1, 2});
  DevBuf<float> alpha(std::vector<float>{1.0f, 1.0f});
  ASSERT_TRUE(w.p && out.p && src.p && off.p && alpha.p);
  Sm90GemmArgs args;
  args.w = w.p;
  args.shape = shape;
  args.offsets = off.p;
  args.alpha0 = alpha.p;
  args.alpha1 = alpha.p;
  args.out = out.p;
  args.epilogue = Sm90GemmEpilogue::kSwiGLU;
  args.a_gather_src = src.p;
  args.a_gather_src_rows = 8;
  const Sm90GemmConfig gather_cfg = sm90_gather_configs().back();
  auto refused = [&](const Sm90GemmArgs& a, const Sm90GemmConfig& c, const char* needle) {
    EXPECT_EQ(sm90_nvfp4_grouped_gemm(a, c, nullptr), cudaErrorInvalidValue) << needle;
    EXPECT_NE(std::string(sm90_gemm_last_error_message()).find(needle), std::string::npos)
        << sm90_gemm_last_error_message();
  };
  for (const auto& c : sm90_gemm_configs())
    if (!sm90_gather_available(c)) {
      EXPECT_FALSE(c.warp_stream) << "every warp-streaming config has a gathered-A kernel";
      refused(args, c, "no gathered-A kernel");
    }
  Sm90GemmArgs a = args;
  a.a_gather_src_rows = 0;
  refused(a, gather_cfg, "a_gather_src_rows");
  a = args;
  a.a_gather_src = src.p + 1;
  refused(a, gather_cfg, "16-byte aligned");
  a = args;
  a.a_gather_perm = off.p;
  a.a_gather_top_k = 0;
  refused(a, gather_cfg, "a_gather_top_k");
  a = args;
  a.a_gather_perm_experts = 3;
  refused(a, gather_cfg, "a_gather_perm_experts");
  a = args;
  a.a_gather_shared_row_base = 9;  // past a_gather_src_rows = 8
  refused(a, gather_cfg, "a_gather_shared_row_base");
  a = args;
  a.epilogue = Sm90GemmEpilogue::kF32;
  a.shape = sm90_prepared_shape(2, 128, 64, false);
  refused(a, gather_cfg, "activation epilogues");
  // The broadcast row: the warp-streaming configs with an activation epilogue only, and not with a gathered A.
  {
    Sm90GemmArgs b = args;
    b.a_gather_src = nullptr;
    b.a = src.p;
    b.a_rows_capacity = 1;
    b.a_broadcast_row = true;
    for (const auto& c : sm90_gemm_configs())
      if (!c.warp_stream) {
        refused(b, c, "a_broadcast_row");
        EXPECT_EQ(sm90_broadcast_row_max_k(c), 0) << to_string(c);
      }
    for (const auto& c : sm90_gemm_configs())
      if (c.warp_stream) {
        // The row stays in shared memory: every preset's hidden size fits (deepseek-v3: 7168), a longer row is
        // refused before anything runs, naming the argument and both numbers.
        const int max_k = sm90_broadcast_row_max_k(c);
        EXPECT_GE(max_k, 16384) << to_string(c);
        EXPECT_EQ(max_k % 64, 0) << to_string(c);
        Sm90GemmArgs lk = b;
        lk.shape = sm90_prepared_shape(2, 2 * 64, max_k + 64, true);
        refused(lk, c, ("a_broadcast_row: shape.k = " + std::to_string(max_k + 64) + " exceeds " +
                        std::to_string(max_k)).c_str());
        Sm90GemmArgs f = b;
        f.epilogue = Sm90GemmEpilogue::kF32;
        f.shape = sm90_prepared_shape(2, 128, 64, false);
        refused(f, c, "activation epilogues");
        Sm90GemmArgs both = b;
        both.a_gather_src = src.p;
        both.a_gather_src_rows = 8;
        refused(both, c, "a_broadcast_row");
        Sm90GemmArgs gf = args;  // the warp-streaming gathered-A kernels: activation epilogues only
        gf.epilogue = Sm90GemmEpilogue::kF32;
        gf.shape = sm90_prepared_shape(2, 128, 64, false);
        refused(gf, c, "activation epilogues");
      }
  }
  // A chained launch reads A through its descriptors only.
  if (!sm90_chained_configs().empty()) {
    DevBuf<int32_t> counters(std::vector<int32_t>(sm90_chain_counter_count(2), 0));
    DevBuf<uint8_t> w2(sm90_prepared_shape(2, 64, 64, false).bytes);
    ASSERT_TRUE(counters.p && w2.p);
    Sm90GemmArgs g2;
    g2.a = static_cast<const uint16_t*>(args.out);
    g2.a_rows_capacity = 8;
    g2.w = w2.p;
    g2.shape = sm90_prepared_shape(2, 64, 64, false);
    g2.offsets = off.p;
    g2.alpha0 = alpha.p;
    g2.out = out.p;
    g2.epilogue = Sm90GemmEpilogue::kF32;
    EXPECT_EQ(sm90_nvfp4_chained_gemms(args, g2, sm90_chained_configs()[0], counters.p, nullptr),
              cudaErrorInvalidValue);
    EXPECT_NE(std::string(sm90_gemm_last_error_message()).find("a_gather_src"), std::string::npos)
        << sm90_gemm_last_error_message();
  }
}

TEST(Sm90GroupedGemm, RefusesBadArguments) {
  Sm90GemmArgs args;
  EXPECT_EQ(sm90_nvfp4_grouped_gemm(args, sm90_gemm_configs()[0], nullptr), cudaErrorInvalidValue);
  EXPECT_NE(std::string(sm90_gemm_last_error_message()).find("null"), std::string::npos);
  const Sm90PreparedShape bad = sm90_prepared_shape(2, 100, 64, false);
  uint8_t* dummy = reinterpret_cast<uint8_t*>(16);
  EXPECT_EQ(sm90_prepare_weights(dummy, dummy, bad, dummy, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace nvfp4moe::cuda
