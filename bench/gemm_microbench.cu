// Microbenchmark of the sm_90a NVFP4 grouped GEMM (CMake target gemm_microbench, not in `all`). By hand:
//   nvcc -std=c++20 -O3 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Isrc -Iinclude \
//        bench/gemm_microbench.cu \
//        src/cuda/sm90_nvfp4_grouped_gemm.cu -lcublas -o gemm_microbench
// (-DNVFP4MOE_SM90_DEQUANT_EXPERIMENT=1..5, 7, 8: measurement variants of the kernel, listed at dequant_experiment
// in src/cuda/sm90_nvfp4_grouped_gemm.cuh and in docs/gemm.md; all but 4 give wrong results: timing only. 7 and 8
// change only the wgmma consumers, so the *_sync configs of such a build run as the engine's: a same-run reference.)
// Measures in the same run the ceilings (D2D copy, cuBLAS bf16 8192^3) and the GEMM at decode (rows per expert
// 1..16, all 256 experts; and T=1 top-8) and prefill (T=4096, k=8, E=256, random routing) on the deepseek-v3
// shapes (GEMM1 N=2*2048 K=7168 SwiGLU, GEMM2 N=7168 K=2048 f32). Each launch is timed by CUDA events, median
// of 50 after warm-up, rotating over 8 distinct prepared weight sets so L2 never holds the weights.
// The tile configs run the dynamic tile schedule, as the layer launches them (Sm90GemmArgs::tile_counter; since
// dc5bd99); GEMM_MICROBENCH_STATIC=1 runs the static round-robin of the results before it. The JSON says which.
// GEMM_MICROBENCH_STAGGER_NS=N: the consumer stagger (Sm90GemmArgs::consumer_stagger_ns; default 0), in the JSON.
// Prints one JSON object per line (and the summary table last).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cuda/sm90_nvfp4_grouped_gemm.h"

using namespace nvfp4moe::cuda;

// The library defines this in moe_kernels.cu (NVFP4MOE_PDL); standalone launches here, timed one by one.
namespace nvfp4moe::cuda {
bool pdl_enabled() { return false; }
}  // namespace nvfp4moe::cuda

#define CK(x)                                                                                      \
  do {                                                                                             \
    cudaError_t e_ = (x);                                                                          \
    if (e_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_),    \
                   sm90_gemm_last_error_message());                                                \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
__global__ void fill_bytes(uint8_t* p, size_t n, uint32_t seed, int scales) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i * 0x9E3779B97F4A7C15ull + seed);
    p[i] = scales ? static_cast<uint8_t>(0x28 + h % 0x30) : static_cast<uint8_t>(h);
  }
}
__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(i + (uint64_t(seed) << 40));
    p[i] = static_cast<uint16_t>(0x3C00 | (h & 0x807F)) + ((h >> 8) & 0x0180);  // |x| in ~[2^-7, 2^0)
  }
}
__global__ void read_sum(const uint4* p, size_t n, unsigned long long* out) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) atomicAdd(out, 1ull);
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Ceil { double copy_tbs, read_tbs, bf16_tflops; };

static Ceil ceilings() {
  Ceil c{};
  const size_t bytes = size_t(4) << 30;
  uint8_t *a, *b;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  fill_bytes<<<4096, 256>>>(a, bytes, 1, 0);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int i = 0; i < 23; ++i) {
    cudaEventRecord(e0);
    CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  c.copy_tbs = 2.0 * bytes / (median(t) * 1e-3) / 1e12;
  unsigned long long* dummy;
  CK(cudaMalloc(&dummy, 8));
  t.clear();
  for (int i = 0; i < 23; ++i) {
    cudaEventRecord(e0);
    read_sum<<<132 * 8, 512>>>(reinterpret_cast<const uint4*>(a), bytes / 16, dummy);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  CK(cudaGetLastError());
  c.read_tbs = double(bytes) / (median(t) * 1e-3) / 1e12;
  // cuBLAS bf16 8192^3, random data.
  const int n = 8192;
  uint16_t *x, *y, *z;
  CK(cudaMalloc(&x, size_t(n) * n * 2));
  CK(cudaMalloc(&y, size_t(n) * n * 2));
  CK(cudaMalloc(&z, size_t(n) * n * 2));
  fill_bf16<<<4096, 256>>>(x, size_t(n) * n, 3);
  fill_bf16<<<4096, 256>>>(y, size_t(n) * n, 4);
  cublasHandle_t h;
  cublasCreate(&h);
  const float one = 1.0f, zero = 0.0f;
  t.clear();
  for (int i = 0; i < 23; ++i) {
    cudaEventRecord(e0);
    cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, x, CUDA_R_16BF, n, y, CUDA_R_16BF, n,
                                     &zero, z, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    if (st != CUBLAS_STATUS_SUCCESS) { std::fprintf(stderr, "cublas failed %d\n", int(st)); std::exit(1); }
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  c.bf16_tflops = 2.0 * n * n * double(n) / (median(t) * 1e-3) / 1e12;
  cublasDestroy(h);
  cudaFree(x); cudaFree(y); cudaFree(z); cudaFree(a); cudaFree(b); cudaFree(dummy);
  return c;
}

struct WeightSets {
  Sm90PreparedShape shape;
  std::vector<uint8_t*> sets;
};

static WeightSets make_sets(int E, int N, int K, bool gated, int nsets) {
  WeightSets w;
  w.shape = sm90_prepared_shape(E, N, K, gated);
  uint8_t *packed, *scales;
  const size_t pb = size_t(E) * N * K / 2, sb = size_t(E) * N * K / 16;
  CK(cudaMalloc(&packed, pb));
  CK(cudaMalloc(&scales, sb));
  fill_bytes<<<4096, 256>>>(packed, pb, 11, 0);
  fill_bytes<<<4096, 256>>>(scales, sb, 12, 1);
  for (int i = 0; i < nsets; ++i) {
    uint8_t* p;
    CK(cudaMalloc(&p, w.shape.bytes));
    CK(sm90_prepare_weights(packed, scales, w.shape, p, nullptr));
    w.sets.push_back(p);
  }
  CK(cudaDeviceSynchronize());
  cudaFree(packed);
  cudaFree(scales);
  return w;
}

struct Result { double us, tbs, tflops; };

// A gathered A (Sm90GemmArgs::a_gather_*): GEMM row r reads src[perm[r] / top_k].
struct GatherCase {
  const uint16_t* src = nullptr;
  int64_t src_rows = 0;
  const int32_t* perm = nullptr;
  int top_k = 1;
};

// counts[e] rows per expert; returns the median time of one launch.
static Result run_case(const WeightSets& w, const std::vector<int>& counts, Sm90GemmEpilogue epi,
                       const Sm90GemmConfig& cfg, FILE* json, const std::string& name, const Ceil& c,
                       const GatherCase* gather = nullptr) {
  const int E = w.shape.num_experts, N = w.shape.n, K = w.shape.k;
  std::vector<int32_t> off(E + 1, 0);
  int touched = 0;
  for (int e = 0; e < E; ++e) {
    off[e + 1] = off[e] + counts[e];
    touched += counts[e] > 0;
  }
  const int64_t rows = std::max(off[E], 1);
  uint16_t* a;
  void* out;
  int32_t* doff;
  float* alpha;
  CK(cudaMalloc(&a, size_t(rows) * K * 2));
  const int n_out = epi == Sm90GemmEpilogue::kSwiGLU ? N / 2 : N;
  CK(cudaMalloc(&out, size_t(rows) * n_out * 4));
  CK(cudaMalloc(&doff, (E + 1) * 4));
  CK(cudaMalloc(&alpha, E * 4));
  fill_bf16<<<1024, 256>>>(a, size_t(rows) * K, 5);
  std::vector<float> al(E, 1e-3f);
  CK(cudaMemcpy(doff, off.data(), (E + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(alpha, al.data(), E * 4, cudaMemcpyHostToDevice));
  // The dynamic tile schedule's counter (zero once; every launch leaves it zero).
  const bool dynamic = std::getenv("GEMM_MICROBENCH_STATIC") == nullptr;
  int32_t* tile_counter = nullptr;
  if (dynamic) {
    CK(cudaMalloc(&tile_counter, sizeof(int32_t)));
    CK(cudaMemset(tile_counter, 0, sizeof(int32_t)));
  }
  // GEMM_MICROBENCH_MIXED=1: the mixed last pass (Sm90GemmArgs::mixed_last_pass; the prefill tiles take it).
  const bool mixed_last_pass = std::getenv("GEMM_MICROBENCH_MIXED") != nullptr;
  const char* stagger_env = std::getenv("GEMM_MICROBENCH_STAGGER_NS");
  const int stagger_ns = stagger_env != nullptr ? std::atoi(stagger_env) : 0;
  Sm90GemmArgs args;
  args.tile_counter = tile_counter;
  args.consumer_stagger_ns = stagger_ns;
  args.mixed_last_pass = mixed_last_pass;
  args.a = a;
  args.a_rows_capacity = rows;
  args.shape = w.shape;
  args.offsets = doff;
  args.alpha0 = alpha;
  args.alpha1 = alpha;
  args.out = out;
  args.epilogue = epi;
  if (gather != nullptr) {
    args.a_gather_src = gather->src;
    args.a_gather_src_rows = gather->src_rows;
    args.a_gather_perm = gather->perm;
    args.a_gather_top_k = gather->top_k;
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  const int warm = 8, reps = 56;
  for (int i = 0; i < warm + reps; ++i) {
    args.w = w.sets[i % w.sets.size()];
    cudaEventRecord(e0);
    CK(sm90_nvfp4_grouped_gemm(args, cfg, nullptr));
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= warm) t.push_back(ms);
  }
  CK(cudaGetLastError());
  const double us = median(t) * 1e3;
  const double wbytes = double(touched) * w.shape.units * w.shape.k_tiles * 4608.0;
  const double flops = 2.0 * double(off[E]) * N * K;
  Result r{us, wbytes / (us * 1e-6) / 1e12, flops / (us * 1e-6) / 1e12};
  std::fprintf(json,
               "{\"case\":\"%s\",\"N\":%d,\"K\":%d,\"E\":%d,\"rows\":%d,\"experts_touched\":%d,\"config\":\"%s\","
               "\"us\":%.2f,\"weight_MB\":%.1f,\"weight_TBps\":%.3f,\"frac_read_bw\":%.3f,\"TFLOPs\":%.1f,"
               "\"frac_bf16\":%.3f,\"schedule\":\"%s\",\"consumer_stagger_ns\":%d,\"a_gathered\":%s}\n",
               name.c_str(), N, K, E, off[E], touched, to_string(cfg).c_str(), us, wbytes / 1e6, r.tbs,
               r.tbs / c.read_tbs, r.tflops, r.tflops / c.bf16_tflops,
               cfg.warp_stream ? "warp-stream" : dynamic ? "dynamic" : "static", stagger_ns,
               gather != nullptr ? "true" : "false");
  std::fflush(json);
  cudaFree(a); cudaFree(out); cudaFree(doff); cudaFree(alpha); cudaFree(tile_counter);
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  return r;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "gemm_bench.jsonl";
  FILE* json = std::fopen(path, "w");
  if (!json) return 1;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const Ceil c = ceilings();
  std::fprintf(json, "{\"gpu\":\"%s\",\"sms\":%d,\"copy_TBps\":%.3f,\"read_TBps\":%.3f,\"cublas_bf16_TFLOPs\":%.1f}\n",
               prop.name, prop.multiProcessorCount, c.copy_tbs, c.read_tbs, c.bf16_tflops);
  std::printf("ceilings: copy %.2f TB/s, read %.2f TB/s, cuBLAS bf16 %.0f TFLOP/s\n", c.copy_tbs, c.read_tbs,
              c.bf16_tflops);
  const int E = 256;
  const WeightSets g1 = make_sets(E, 4096, 7168, true, 8);   // deepseek-v3 w13: 2I = 4096, H = 7168
  const WeightSets g2 = make_sets(E, 7168, 2048, false, 8);  // deepseek-v3 w2: H = 7168, I = 2048
  std::printf("%-24s %-6s %-14s %9s %8s %7s %8s %7s\n", "case", "gemm", "config", "us", "TB/s", "of_rd", "TFLOP/s",
              "of_bf16");
  auto row = [&](const char* name, const char* gemm, const Sm90GemmConfig& cfg, const Result& r) {
    std::printf("%-24s %-6s %-14s %9.1f %8.3f %7.3f %8.1f %7.3f\n", name, gemm, to_string(cfg).c_str(), r.us, r.tbs,
                r.tbs / c.read_tbs, r.tflops, r.tflops / c.bf16_tflops);
  };
  std::mt19937 rng(42);
  // GEMM_MICROBENCH_ONLY=<case prefix>: run only the cases whose name starts with it (for ncu).
  const char* only_env = std::getenv("GEMM_MICROBENCH_ONLY");
  const std::string only = only_env ? only_env : "";
  auto wanted = [&](const std::string& n) { return only.empty() || n.rfind(only, 0) == 0; };
  // GEMM_MICROBENCH_QUICK=1: rows/expert 1, 8 and 16 on the bt16 configs and the bt128 prefill only (A/B runs).
  const bool quick = std::getenv("GEMM_MICROBENCH_QUICK") != nullptr;
  // decode, T = 1 top-8: 8 experts with one row (scattered experts), and its variants: the same 8 experts
  // contiguous (0..7), and 1 row in each of 32 experts (4 tiles per CTA instead of 1).
  for (int variant = 0; variant < 3; ++variant) {
    const char* vname = variant == 0 ? "decode_T1_k8" : variant == 1 ? "decode_T1_k8_contig" : "decode_1row_32exp";
    if (!wanted(vname) || (variant > 0 && !quick && only.empty())) continue;
    const int nexp = variant == 2 ? 32 : 8;
    std::vector<int> counts(E, 0);
    for (int j = 0; j < nexp; ++j) counts[variant == 0 ? (j * 37 + 5) % E : variant == 1 ? j : j * 8] = 1;
    const auto cfg = sm90_pick_config(Sm90GemmLoad{nexp, E, g1.shape.units, prop.multiProcessorCount});
    row(vname, "gemm1", cfg, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json, std::string(vname) + "_gemm1", c));
    if (variant == 0)  // GEMM2 on GEMM1's config (as this case always ran)
      row(vname, "gemm2", cfg, run_case(g2, counts, Sm90GemmEpilogue::kF32, cfg, json, std::string(vname) + "_gemm2", c));
    if (variant == 0 && quick)  // and every other bt16 config (the A/B of the tile choice at T = 1)
      for (const auto& other : sm90_gemm_configs()) {
        if (other.block_t != 16 || to_string(other) == to_string(cfg)) continue;
        const std::string n = std::string(vname) + "_" + to_string(other);
        row(vname, "gemm1", other, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, other, json, n + "_gemm1", c));
        row(vname, "gemm2", other, run_case(g2, counts, Sm90GemmEpilogue::kF32, other, json, n + "_gemm2", c));
      }
  }
  // qwen3-30b decode, T = 1 top-8 (E = 128; GEMM1 12 and GEMM2 16 units per expert: 96 / 128 units, fewer
  // two-unit tiles than SMs), every bt16 config: where the half-unit tiles (a unit on two warpgroups) should win.
  if (wanted("q30_T1_k8")) {
    const WeightSets q1 = make_sets(128, 1536, 2048, true, 8);
    const WeightSets q2 = make_sets(128, 2048, 768, false, 8);
    std::vector<int> counts(128, 0);
    for (int j = 0; j < 8; ++j) counts[(j * 37 + 5) % 128] = 1;
    const auto picked1 = sm90_pick_config(Sm90GemmLoad{8, 128, q1.shape.units, prop.multiProcessorCount});
    const auto picked2 = sm90_pick_config(Sm90GemmLoad{8, 128, q2.shape.units, prop.multiProcessorCount});
    std::printf("q30_T1_k8: heuristic picks %s (gemm1), %s (gemm2)\n", to_string(picked1).c_str(),
                to_string(picked2).c_str());
    for (const auto& cfg : sm90_gemm_configs()) {
      if (cfg.block_t != 16) continue;
      const std::string n = "q30_T1_k8_" + to_string(cfg);
      row("q30_T1_k8", "gemm1", cfg, run_case(q1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json, n + "_gemm1", c));
      row("q30_T1_k8", "gemm2", cfg, run_case(q2, counts, Sm90GemmEpilogue::kF32, cfg, json, n + "_gemm2", c));
    }
  }
  for (int r : {1, 2, 4, 8, 16}) {
    if ((quick && r != 1 && r != 8 && r != 16) || !wanted("decode_rpe" + std::to_string(r))) continue;
    std::vector<int> counts(E, r);
    const std::string n = "decode_rpe" + std::to_string(r);
    for (const auto& cfg : sm90_gemm_configs()) {  // every config that holds r rows in one tile, up to 64
      if (cfg.block_t < r || cfg.block_t > 64 || (r > 1 && r < 16 && cfg.block_t > 16)) continue;
      if (quick && cfg.block_t != 16) continue;
      row(n.c_str(), "gemm1", cfg, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json, n + "_gemm1", c));
      row(n.c_str(), "gemm2", cfg, run_case(g2, counts, Sm90GemmEpilogue::kF32, cfg, json, n + "_gemm2", c));
    }
  }
  // prefill_rows<R>: every expert exactly R rows, GEMM1 and GEMM2 on the prefill tiles (bt128, bt144). Prices an
  // expert's partial last pass against its full ones: at bt144, R = 144 is one pass, 160 / 208 / 272 add a pass of
  // N = 16 / 64 / 128, 288 two full passes; R = 128 / 256 are the balanced T = 4096 / 8192 loads. The question it
  // answers (docs/gemm.md, "Where this plan stands after the forty-second session"): how much of a full pass a
  // narrow last pass costs, i.e. what running it beside a full pass of the same unit could save.
  for (int r : {128, 144, 160, 208, 256, 272, 288}) {
    const std::string n = "prefill_rows" + std::to_string(r);
    if (only.empty() || !wanted(n)) continue;  // (only when asked: GEMM_MICROBENCH_ONLY=prefill_rows)
    std::vector<int> counts(E, r);
    for (const auto& cfg : sm90_gemm_configs()) {
      if (cfg.block_t != 128 && cfg.block_t != 144) continue;
      if (cfg.warp_stream || cfg.mma_sync || cfg.warpgroups_per_unit != 1) continue;
      row(n.c_str(), "gemm1", cfg, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json, n + "_gemm1", c));
      row(n.c_str(), "gemm2", cfg, run_case(g2, counts, Sm90GemmEpilogue::kF32, cfg, json, n + "_gemm2", c));
    }
  }
  // prefill: T = 4096, k = 8, uniform random distinct experts per token. GEMM1 also with its A gathered by the
  // kernel (sm90_gather_configs(): `hidden` [4096, 7168] read through the permutation of the (token, slot) pairs
  // in expert order, token order within an expert, as the plan makes it) against the pre-gathered rows.
  {
    const int T = 4096, k = 8;
    std::vector<int> counts(E, 0);
    std::vector<std::vector<int32_t>> pairs_of(E);
    for (int tkn = 0; tkn < T; ++tkn) {
      std::vector<int> ids;
      while (static_cast<int>(ids.size()) < k) {
        const int e = rng() % E;
        if (std::find(ids.begin(), ids.end(), e) == ids.end()) ids.push_back(e);
      }
      for (int j = 0; j < k; ++j) {
        ++counts[ids[j]];
        pairs_of[ids[j]].push_back(tkn * k + j);
      }
    }
    std::vector<int32_t> perm;
    for (const auto& v : pairs_of) perm.insert(perm.end(), v.begin(), v.end());
    uint16_t* hidden;
    int32_t* dperm;
    CK(cudaMalloc(&hidden, size_t(T) * 7168 * 2));
    CK(cudaMalloc(&dperm, perm.size() * 4));
    fill_bf16<<<1024, 256>>>(hidden, size_t(T) * 7168, 6);
    CK(cudaMemcpy(dperm, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice));
    const GatherCase gc{hidden, T, dperm, k};
    for (const auto& cfg : sm90_gemm_configs()) {
      if (cfg.block_t < (quick ? 128 : 64) || !wanted("prefill")) continue;
      row("prefill_T4096_k8", "gemm1", cfg, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json, "prefill_T4096_k8_gemm1", c));
      if (sm90_gather_available(cfg))
        row("prefill_T4096_k8", "gemm1g", cfg, run_case(g1, counts, Sm90GemmEpilogue::kSwiGLU, cfg, json,
                                                        "prefill_T4096_k8_gemm1_gathered", c, &gc));
      row("prefill_T4096_k8", "gemm2", cfg, run_case(g2, counts, Sm90GemmEpilogue::kF32, cfg, json, "prefill_T4096_k8_gemm2", c));
    }
    cudaFree(hidden);
    cudaFree(dperm);
  }
  std::fclose(json);
  return 0;
}
